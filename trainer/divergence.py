"""When skipping bad updates is not enough: roll back to the last checkpoint.

One non-finite step is skipped (`trainer.optim.step_unless_non_finite`). Several in a row, or
a loss that jumps far above its recent average, mean the weights or the optimizer's moments
have gone bad, and the batches just seen may be what drove them there. The trainer then
reloads the last complete checkpoint and skips the data window between that checkpoint and
the bad step, so training goes on from good weights with data it has not choked on.

The decision is taken on logging steps only, from figures every rank already shares: the
count of consecutive skipped updates (identical on every rank, the gradient norm being
global) and the loss averaged over ranks. So every rank rolls back at the same step, and an
ordinary step pays nothing: the running count stays on the device until a logging step
reads it, next to the loss it already reads.
"""

from __future__ import annotations

import math
from collections import deque

import torch

RECENT_LOSSES = 20
"""Logged losses the spike rule compares with: recent, and enough to average out noise."""
MIN_LOSSES_FOR_SPIKES = 5


class DivergenceGuard:
    """Counts consecutive skipped updates on the device; judges them on logging steps."""

    def __init__(self, *, rollback_after: int, spike_factor: float, device: torch.device) -> None:
        self.rollback_after = rollback_after
        self.spike_factor = spike_factor
        self._device = device
        self._consecutive = torch.zeros((), device=device)
        self._losses: deque[float] = deque(maxlen=RECENT_LOSSES)

    def observe(self, skipped: torch.Tensor) -> None:
        """After every step: `skipped` is 1.0 when its update was skipped. No sync."""
        self._consecutive = (self._consecutive + skipped) * skipped

    def verdict(self, mean_loss: float) -> str | None:
        """On a logging step: why the run must roll back now, or None."""
        consecutive = int(self._consecutive.item())
        if self.rollback_after and consecutive >= self.rollback_after:
            return f"{consecutive} consecutive non-finite steps"
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
            self._losses.append(mean_loss)
        return None

    def reset(self) -> None:
        """After a rollback: the history belongs to the weights that were thrown away."""
        self._consecutive = torch.zeros((), device=self._device)
        self._losses.clear()
