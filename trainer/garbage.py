"""Python's cycle collector on the step loop's schedule: the same steps on every rank.

Left automatic, each rank collects when its own allocations cross a threshold, and the other
ranks wait for it at the next collective (torchtitan `tools/utils.py` `GarbageCollection`,
"used to avoid stragglers"; Megatron-LM's `--manual-gc`). Figures: docs/benchmarks.md
"The cycle collector on the loop's schedule".
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator

from trainer.cadence import Every
from trainer.log import get_logger

logger = get_logger("garbage")


@contextlib.contextmanager
def collector_held(every: int) -> Iterator[None]:
    """With a cadence (`every` > 0), no automatic pass while the trainer's libraries import
    (they ran 1,048 of them, 0.6 of the imports' 3.7 CPU-seconds), then a freeze of what they
    made, modules mostly, so that setup's automatic passes scan only what setup makes. Not
    collected first: a full pass took 0.3-0.5 CPU-seconds to find 11,000 unreachable objects,
    frozen with the rest until the loop's end (`CollectionCadence.close`)."""
    if every <= 0:
        yield
        return
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


class CollectionCadence:
    """A full pass every `every` steps of the loop; 0 leaves Python's automatic collector on.

    Made last in setup, which keeps the automatic collector (a pretrained model's load leaves
    garbage that should not wait). torch.compile makes passes of its own after each compile
    (`_dynamo/convert_frame.py`, `run_gc_after_compile`): on every rank at the same first steps.
    """

    def __init__(self, every: int) -> None:
        self.due = Every(every)
        self.scheduled = every > 0
        self._enabled_before = gc.isenabled()
        self._first_pass_to_freeze = True
        if self.scheduled:
            gc.disable()
            self.settle(thaw=False)

    def settle(self, *, thaw: bool = True) -> None:
        """Collect, then freeze what survives: frozen objects are neither scanned nor collected
        (CPython `gc.freeze`) until thawed. After setup, over what setup made; after a
        rollback, thawed first, over everything (the state setup loaded was replaced)."""
        if self.scheduled:
            if thaw:
                gc.unfreeze()
            self._collect("settle")
            gc.freeze()

    def after_step(self, step: int) -> None:
        if not (self.scheduled and self.due(step)):
            return
        self._collect(f"step {step}")
        if self._first_pass_to_freeze:
            # All that is alive now, mostly the run's own (optimizer state, compiled graphs);
            # what of it turns to garbage later waits for a rollback's settle or the loop's end.
            gc.freeze()
            self._first_pass_to_freeze = False

    def close(self) -> None:
        """Python's automatic collector back, as it was, over everything: after the last step
        (the final save and export are no loop), and for a trainer built in a test."""
        if self.scheduled:
            self.scheduled = False
            gc.unfreeze()
            if self._enabled_before:
                gc.enable()

    @staticmethod
    def _collect(when: str) -> None:
        began = time.perf_counter()
        found = gc.collect()
        logger.debug("gc %s: %d unreachable in %.3f s", when, found, time.perf_counter() - began)
