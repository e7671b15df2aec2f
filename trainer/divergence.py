"""When skipping bad updates is not enough: roll back to the last checkpoint.

Several non-finite steps in a row, or a loss far above its recent average, mean the state has
gone bad: the trainer reloads the last complete checkpoint and skips every batch read since it.
The run of skipped updates is counted on the device with no host sync; the guard judges at
points where the host syncs anyway (a logging step, before every save), so a spiked state is
never saved. Why: docs/design/trainer.md#divergence
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import torch

from trainer.distributed import all_reduce_mean

RECENT_LOSSES = 20
"""Logged losses the spike rule compares with: recent, and enough to average out noise."""
MIN_LOSSES_FOR_SPIKES = 5


def _never(_step: int) -> bool:
    return False


class DivergenceGuard:
    """Counts consecutive skipped updates on the device every step; judges at sync points."""

    def __init__(
        self,
        *,
        rollback_after: int,
        spike_factor: float,
        device: torch.device,
        saves_due: Callable[[int], bool] = _never,
    ) -> None:
        """`saves_due(step)`: whether the state after `step` is about to be saved (the
        checkpoint manager's own cadence), so the guard judges it first."""
        self.rollback_after = rollback_after
        self.spike_factor = spike_factor
        self._device = device
        self._saves_due = saves_due
        self._consecutive = torch.zeros((), device=device)
        self._longest = torch.zeros((), device=device)
        self._losses: deque[float] = deque(maxlen=RECENT_LOSSES)
        self._judged_step = -1

    def judge(self, step: int, loss: torch.Tensor, mean_loss: float | None = None) -> str | None:
        """At the end of `step`: why the run must roll back now, or None. `mean_loss` is the
        loss over ranks when the step logged it; the guard judges then, and before a save
        (averaging `loss`, this rank's, over ranks itself); any other step costs nothing.
        Collective when it averages: every rank keeps the same cadence."""
        if mean_loss is None:
            if not self._saves_due(step):
                return None
            return self.judge_before_save(step, loss)
        self._judged_step = step
        return self.verdict(mean_loss)

    def judge_before_save(self, step: int, loss: torch.Tensor) -> str | None:
        """Before a save of the state after `step` that the cadence did not foresee (a
        stop's), unless the guard judged this step already. Syncs: a save does anyway. The
        loss is judged for a spike but kept out of the history, which holds logged losses."""
        if self._judged_step == step:
            return None
        self._judged_step = step
        return self.verdict(float(all_reduce_mean(loss).item()), remember=False)

    def observe(self, skipped: torch.Tensor) -> None:
        """After every step: `skipped` is 1.0 when its update was skipped. No sync."""
        self._consecutive = (self._consecutive + skipped) * skipped
        self._longest = torch.maximum(self._longest, self._consecutive)

    def nonfinite_verdict(self) -> str | None:
        """At a sync point: why the run must roll back for non-finite steps, or None."""
        if not self.rollback_after:
            return None
        longest = int(self._longest.item())
        if longest >= self.rollback_after:
            return f"{longest} consecutive non-finite steps"
        return None

    def verdict(self, mean_loss: float, *, remember: bool = True) -> str | None:
        """Why the run must roll back now, or None; a finite loss that is no spike joins the
        recent history when `remember`."""
        reason = self.nonfinite_verdict()
        if reason is not None:
            return reason
        if math.isfinite(mean_loss):
            if (
                self.spike_factor
                and len(self._losses) >= MIN_LOSSES_FOR_SPIKES
                and mean_loss > self.spike_factor * (sum(self._losses) / len(self._losses))
            ):
                average = sum(self._losses) / len(self._losses)
                return (
                    f"loss {mean_loss:.4f} is above {self.spike_factor:g} x its recent "
                    f"average {average:.4f}"
                )
            if remember:
                self._losses.append(mean_loss)
        return None

    def reset(self) -> None:
        """After a rollback: the history belongs to the weights that were thrown away."""
        self._consecutive = torch.zeros((), device=self._device)
        self._longest = torch.zeros((), device=self._device)
        self._losses.clear()
