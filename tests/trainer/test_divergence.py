"""The rollback rule on the figures a logging step already has."""

from __future__ import annotations

import math

import torch

from trainer.divergence import DivergenceGuard

CPU = torch.device("cpu")
BAD, GOOD = torch.tensor(1.0), torch.tensor(0.0)


def test_consecutive_skips_roll_back_and_a_good_step_resets_the_count() -> None:
    guard = DivergenceGuard(rollback_after=3, spike_factor=0, device=CPU)
    for skipped in (BAD, BAD, GOOD, BAD, BAD):
        guard.observe(skipped)
    assert guard.verdict(math.nan) is None  # two in a row since the good step
    guard.observe(BAD)
    assert guard.verdict(math.nan) == "3 consecutive non-finite steps"
    guard.reset()
    assert guard.verdict(math.nan) is None


def test_a_loss_spike_over_the_recent_average_rolls_back_once_there_is_history() -> None:
    guard = DivergenceGuard(rollback_after=0, spike_factor=3, device=CPU)
    assert guard.verdict(100.0) is None  # no history yet: the first losses are not spikes
    guard.reset()
    for loss in (2.0, 2.2, 1.8, 2.0, 2.0):
        assert guard.verdict(loss) is None
    reason = guard.verdict(7.0)
    assert reason is not None and "above 3 x its recent average" in reason


def test_switched_off_it_never_rolls_back() -> None:
    guard = DivergenceGuard(rollback_after=0, spike_factor=0, device=CPU)
    for _ in range(10):
        guard.observe(BAD)
        assert guard.verdict(math.nan) is None
