"""Python's cycle collector on the step loop's schedule: the same steps on every rank.

Left automatic, each rank collects when its own allocations cross a threshold, and the other
ranks wait for it at the next collective (torchtitan `tools/utils.py` `GarbageCollection`,
"used to avoid stragglers"; Megatron-LM's `--manual-gc`). Figures: docs/benchmarks.md
"The cycle collector on the step loop's schedule".
"""

from __future__ import annotations

import gc
import time

from trainer.cadence import Every
from trainer.log import get_logger

logger = get_logger("garbage")


def hold_automatic_collection(every: int) -> None:
    """From the process's start when the loop is to collect (`every` > 0): the trainer's
    imports alone ran 1,048 automatic collections, 0.6 of their 3.7 CPU-seconds."""
    if every > 0:
        gc.disable()


class CollectionCadence:
    """A full collection every `every` steps; 0 leaves Python's automatic collector on."""

    def __init__(self, every: int) -> None:
        self.due = Every(every)
        self.scheduled = every > 0
        if not self.scheduled:
            gc.enable()
            return
        gc.disable()
        # What setup built (modules, model, loaders) lives for the whole run: frozen, it is
        # never scanned again, so each collection in the loop scans what the loop made.
        self._collect("after setup")
        gc.freeze()

    def after_step(self, step: int) -> None:
        if self.scheduled and self.due(step):
            self._collect(f"step {step}")

    def close(self) -> None:
        """Python's automatic collector back, over everything (a trainer built in a test)."""
        if self.scheduled:
            gc.unfreeze()
            gc.enable()

    @staticmethod
    def _collect(when: str) -> None:
        began = time.perf_counter()
        found = gc.collect()
        logger.debug("gc %s: %d unreachable in %.3f s", when, found, time.perf_counter() - began)
