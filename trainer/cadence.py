"""When a periodic task is due: the one rule each component keeps for its own schedule.

The step loop asks nobody's schedule itself (torchtitan's components do the same:
`components/checkpoint.py` `_should_save`, `components/validate.py` `should_validate`, tag
v0.2.0): logging, validation and checkpoints each hold an `Every` and decide when they run.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Every:
    """Due on every `steps`-th step (0: never), and on `last` when given."""

    steps: int
    last: int | None = None

    def __call__(self, step: int) -> bool:
        return (self.steps > 0 and step % self.steps == 0) or step == self.last
