"""Turn a hang into a restart: no step for too long, dump where every thread is, exit.

A thread fed a heartbeat after each step; after `factor` x the recent median step time (at
least `floor_s`) without a beat it dumps every thread's stack and torch's flight recorder and
exits with `HANG_EXIT_CODE`, which the training operator retries (training-operator v1.9.0
`pkg/util/train/train_util.go`). It arms at the first beat; a beat is a clock read.
Why: docs/design/trainer.md#watchdog
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from trainer.log import get_logger

logger = get_logger("watchdog")

HANG_EXIT_CODE = 142
"""128 + SIGALRM: a timer ran out. Retryable for the operator, distinct from a crash (1), a
SIGTERM stop (143) or a kill (137)."""

RECENT_STEPS = 20
"""Step times the bound is the median of: recent enough to follow a slower phase (a longer
context, a bigger batch after a restart), long enough that one slow step does not move it."""


FLIGHT_RECORDER_PREFIX = "/tmp/nccl_trace_rank_"
"""Where a dump goes when `TORCH_FR_DUMP_TEMP_FILE` does not say (torch's own default prefix;
the rank is appended, as torch does for its dumps on a collective timeout)."""


def dump_flight_recorder() -> str | None:
    """Write this rank's flight recorder (the ring of recent collectives of every process
    group, recorded when `TORCH_FR_BUFFER_SIZE` / `TORCH_NCCL_TRACE_BUFFER_SIZE` is set;
    torch `distributed_c10d.py`) to `TORCH_FR_DUMP_TEMP_FILE` + rank, the file torch itself
    writes on a collective timeout and `torchfrtrace` reads. None when there is nothing."""
    try:
        from torch._C._distributed_c10d import _dump_fr_trace  # type: ignore[attr-defined]
    except ImportError:  # a build without the recorder
        return None
    try:
        trace = _dump_fr_trace()
    except RuntimeError:
        return None
    if not trace:
        return None
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE", FLIGHT_RECORDER_PREFIX)
    path = f"{prefix}{os.environ.get('RANK', '0')}"
    Path(path).write_bytes(trace)
    return path


class HangWatchdog:
    """A daemon thread that ends the process when the training loop stops beating."""

    def __init__(
        self,
        *,
        factor: float,
        floor_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_hang: Callable[[str], None] | None = None,
        poll_s: float | None = None,
    ) -> None:
        if factor <= 1 or floor_s <= 0:
            raise ValueError(f"watchdog needs factor > 1 and floor_s > 0, got {factor}, {floor_s}")
        self.factor = factor
        self.floor_s = floor_s
        self._clock = clock
        self._on_hang = on_hang or self.exit
        self._last: float | None = None
        self._step = 0
        self._times: deque[float] = deque(maxlen=RECENT_STEPS)
        self._stop = threading.Event()
        self._poll_s = poll_s if poll_s is not None else min(5.0, floor_s / 4)
        self._thread = threading.Thread(target=self._watch, name="hang-watchdog", daemon=True)
        self._thread.start()

    def beat(self, step: int) -> None:
        """The loop finished `step` (and whatever came with it: a save, a validation)."""
        now = self._clock()
        if self._last is not None:
            self._times.append(now - self._last)
        self._last = now
        self._step = step

    def bound_s(self) -> float:
        """How long the loop may go without a beat."""
        if not self._times:
            return self.floor_s
        return max(self.floor_s, self.factor * statistics.median(self._times))

    def overdue(self) -> str | None:
        """Why the loop counts as hung now; None while it is not (or not armed yet)."""
        if self._last is None:
            return None
        waited = self._clock() - self._last
        bound = self.bound_s()
        if waited <= bound:
            return None
        return (
            f"no training step for {waited:.0f} s after step {self._step} (bound {bound:.0f} s: "
            f"{self.factor:g} x the recent median step, at least {self.floor_s:g} s)"
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self._poll_s):
            reason = self.overdue()
            if reason is not None:
                self._on_hang(reason)
                return

    @staticmethod
    def exit(reason: str) -> None:
        """Dump every thread's stack and the flight recorder, then end the process."""
        logger.error("watchdog: %s; dumping every thread's stack and exiting", reason)
        sys.stderr.flush()
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        path = dump_flight_recorder()
        if path is not None:
            logger.error("watchdog: flight recorder of the recent collectives written to %s", path)
        sys.stderr.flush()
        os._exit(HANG_EXIT_CODE)
