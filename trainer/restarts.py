"""What each start of a run cost: why it restarted, the steps and wall time lost, the goodput.

The metrics file is appended across restarts (`trainer.metrics.JsonlSink`) and lives beside
the checkpoints, so at each start rank 0 reads what the previous attempts wrote and records
one `start` entry in the run's `run` line. How the previous attempt ended is what it wrote
last: a `stop` line (SIGTERM: preemption, drain, deadline, `trainer.preemption`), a `hang`
line (`trainer.watchdog`), or nothing after its last step (a crash, an OOM kill, a lost
node). Wall time lost to a restart is everything after the step the run resumes from:
the steps trained again and the time no step ran. Goodput is the share of wall time since
the first start that was not lost that way (start-up and checkpoint saves count as spent).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class StartRecord:
    """One start of the run, as the metrics file's `run` line carries it (`start`)."""

    attempt: int
    """1 for the first start."""
    after: str
    """How the previous attempt ended: `fresh` (none), `stop:<signal>`, `hang`, `crash`."""
    resumed_step: int
    steps_lost: int
    """Steps the previous attempt finished beyond the checkpoint this start resumes from."""
    wall_lost_s: float
    total_wall_lost_s: float
    """Over every restart so far."""
    since_first_start_s: float
    goodput: float
    """1 - total_wall_lost_s / since_first_start_s (1.0 on the first start)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        if self.attempt == 1:
            return "first start"
        return (
            f"start {self.attempt} after {self.after}: resumed at step {self.resumed_step}, "
            f"{self.steps_lost} step(s) and {self.wall_lost_s:.0f} s lost; goodput "
            f"{self.goodput:.1%} over {self.since_first_start_s:.0f} s"
        )


def read_records(path: str | Path | None) -> list[dict[str, Any]]:
    """The metrics file's lines (none when it does not exist yet); a torn last line (a
    writer killed mid-line) is skipped."""
    if path is None or not Path(path).is_file():
        return []
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def _last_attempt(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    starts = [i for i, r in enumerate(records) if r.get("kind") == "run"]
    return records[starts[-1] :] if starts else []


def _ending(attempt: Iterable[Mapping[str, Any]]) -> str:
    last = "crash"
    for record in attempt:
        if record.get("kind") == "stop":
            last = f"stop:{record.get('signal', 'SIGTERM')}"
        elif record.get("kind") == "hang":
            last = "hang"
        elif record.get("kind") == "train":
            last = "crash"  # a step after a stop/hang line: that line was not the end
    return last


def account_start(records: list[dict[str, Any]], *, resumed_step: int, now: float) -> StartRecord:
    """The start about to happen at `now`, resuming at `resumed_step`, after `records`."""
    runs = [r for r in records if r.get("kind") == "run"]
    if not runs:
        return StartRecord(1, "fresh", resumed_step, 0, 0.0, 0.0, 0.0, 1.0)
    first = float(runs[0].get("time", now))
    previous = _last_attempt(records)
    trained = [r for r in previous if r.get("kind") == "train"]
    last_step = max((int(r["step"]) for r in trained), default=resumed_step)
    # When the resumed step was last reached: its train line, else the nearest before it,
    # else the previous attempt's own start (nothing it did was kept).
    kept = [r for r in trained if int(r["step"]) <= resumed_step]
    reached = float(kept[-1]["time"]) if kept else float(previous[0].get("time", now))
    wall_lost = max(now - reached, 0.0)
    earlier = sum(float(r.get("start", {}).get("wall_lost_s", 0.0)) for r in runs)
    total = earlier + wall_lost
    since_first = max(now - first, 0.0)
    goodput = 1.0 - total / since_first if since_first > 0 else 1.0
    return StartRecord(
        attempt=len(runs) + 1,
        after=_ending(previous),
        resumed_step=resumed_step,
        steps_lost=max(last_step - resumed_step, 0),
        wall_lost_s=wall_lost,
        total_wall_lost_s=total,
        since_first_start_s=since_first,
        goodput=max(goodput, 0.0),
    )
