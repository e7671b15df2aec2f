"""Stop at a step boundary when the pod is told to go: SIGTERM, checkpoint, exit.

The kubelet SIGTERMs torchrun, which forwards it to every worker (torch
`distributed/elastic/agent/server/api.py` `_shutdown`). A spot interruption signals one node's
ranks only, so each step all-reduces (MAX) a "stop requested" flag over a gloo group, started
when the step begins and awaited when it ends: no GPU stream, no host-device sync.
Why and sources: docs/design/trainer.md#preemption
"""

from __future__ import annotations

import signal
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist

from trainer.distributed import DEFAULT_TIMEOUT
from trainer.log import get_logger

logger = get_logger("preemption")

STOP_SIGNALS = (signal.SIGTERM,)
"""What Kubernetes and torchrun send before a kill. SIGINT stays Python's KeyboardInterrupt,
so Ctrl-C of a local run still stops at once."""


class PreemptedError(Exception):
    """The run stopped early at a step boundary, its state saved; exit with `exit_code`."""

    def __init__(self, signal_name: str, step: int, exit_code: int) -> None:
        super().__init__(f"{signal_name} received: stopped after step {step}")
        self.signal_name = signal_name
        self.step = step
        self.exit_code = exit_code


class StopRequests:
    """Local stop signals, and the collective decision of every rank to stop after a step."""

    def __init__(self, group: Any | None) -> None:
        """`group`: a gloo process group spanning every rank (None: a one-process run)."""
        self._group = group
        self._flag = torch.zeros(1)
        self._work: Any = None
        self.signal_name: str | None = None
        self._signum = 0
        self._previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is None:
            logger.warning("%s received: stopping after this step", signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name
        self._signum = signum

    def request(self, signum: int = signal.SIGTERM) -> None:
        """As if `signum` had arrived (what `--signal_at_step` injects for tests)."""
        signal.raise_signal(signum)

    def begin_step(self) -> None:
        """Share this rank's flag with the others while the step runs."""
        self._flag.fill_(1.0 if self.signal_name is not None else 0.0)
        if self._group is not None:
            self._work = dist.all_reduce(
                self._flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True
            )

    def agreed(self) -> bool:
        """Whether any rank was asked to stop before this step began (the same on every rank)."""
        if self._work is not None:
            self._work.wait()
            self._work = None
        return bool(self._flag.item())  # a CPU tensor: no device sync

    def stop(self, step: int) -> PreemptedError:
        """The exception to end the run with, once its state is saved."""
        name = self.signal_name or "SIGTERM (on another rank)"
        signum = self._signum or signal.SIGTERM
        # 128 + the signal: what a shell reports for a signalled process, and what the
        # training operator's ExitCode policy counts as retryable (>= 128).
        return PreemptedError(name, step, 128 + int(signum))

    def close(self) -> None:
        """Give the signals back to their previous handlers. A flag exchange still in flight
        is dropped, not awaited: after a crash another rank may never join it, and waiting
        would hold this rank's exit for the whole collective timeout."""
        self._work = None
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def control_group() -> Any | None:
    """A gloo group over every rank for CPU-side control flags; None in a one-process run.
    Collective: every rank must call it, at the same point of its setup."""
    if dist.get_world_size() == 1:
        return None
    return dist.new_group(backend="gloo", timeout=DEFAULT_TIMEOUT)
