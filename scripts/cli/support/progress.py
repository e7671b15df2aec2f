"""Where a run has got to, from its metrics file (`trainer.metrics`: one JSON record a line):
the last step, the run's `maxSteps`, the trainer's ETA, how it last stopped, and how long the
GPU nodes have trained so far, summed over its starts.

The file can be large (a line every logging step for days): only its head (the first `run`
record, with the run's config) and its tail (the latest records) are read, each a ranged GET.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from scripts.cli.support.s3 import s3_client, split_s3_uri

WINDOW_BYTES = 64 * 1024
METRICS_FILE = "metrics.jsonl"


@dataclass(frozen=True)
class Progress:
    step: int | None
    max_steps: int | None
    eta_s: float | None
    """The trainer's ETA at its last logged step, less the time since (None: not running)."""
    state: str
    """running, stopped, done, crashed, or not started."""
    trained_hours: float
    """Wall hours of every start, first record to last: what the nodes have billed so far."""
    updated: datetime | None


def parse_lines(text: str) -> list[dict[str, Any]]:
    """The whole JSON lines of `text` (a torn first or last line, where a range cut it, and
    anything else that is not a record, left out)."""
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_window(uri: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(head records, tail records) of the metrics file at `uri`; both empty when it is absent."""
    bucket, key = split_s3_uri(uri)
    client = s3_client()
    try:
        size = int(client.head_object(Bucket=bucket, Key=key)["ContentLength"])
    except Exception as error:  # botocore ClientError 404/403: no file (yet), or not ours
        if getattr(error, "response", {}).get("Error", {}).get("Code") in ("404", "NoSuchKey"):
            return [], []
        raise

    def ranged(start: int, end: int) -> str:
        body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"]
        return str(body.read().decode("utf-8", errors="replace"))

    head = ranged(0, min(size, WINDOW_BYTES) - 1) if size else ""
    tail = head if size <= WINDOW_BYTES else ranged(size - WINDOW_BYTES, size - 1)
    return parse_lines(head), parse_lines(tail)


def _time(record: dict[str, Any]) -> datetime | None:
    value = record.get("time")
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value, UTC)
    if isinstance(value, str):
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    return None


def progress(
    head: list[dict[str, Any]], tail: list[dict[str, Any]], *, now: datetime | None = None
) -> Progress:
    """Where the run stands, from the head and tail of its metrics file."""
    now = now or datetime.now(UTC)
    runs = [r for r in head + tail if r.get("kind") == "run"]
    max_steps = None
    if runs:
        max_steps = ((runs[0].get("config") or {}).get("optim") or {}).get("max_steps")
    trains = [r for r in tail if r.get("kind") == "train"]
    last = tail[-1] if tail else None
    if last is None:
        return Progress(None, max_steps, None, "not started", 0.0, None)
    step = trains[-1].get("step") if trains else last.get("step")
    updated = _time(last)
    if isinstance(step, int) and isinstance(max_steps, int) and step >= max_steps:
        state = "done"
    elif last.get("kind") == "stop":
        state = "stopped"
    elif last.get("kind") in ("hang",):
        state = "crashed"
    else:
        state = "running"
    eta = None
    if state == "running" and trains and updated is not None:
        eta = max(0.0, float(trains[-1].get("eta_s", 0.0)) - (now - updated).total_seconds())
    # Each `run` record starts an attempt; the tail's last record ends the latest one. What
    # the start records say of the time before (`start.since_first_start_s` less the lost wall
    # time) covers the earlier attempts.
    trained = 0.0
    first = _time(runs[0]) if runs else None
    if first is not None and updated is not None:
        trained = (updated - first).total_seconds() / 3600
        latest_start = (runs[-1].get("start") or {}) if runs else {}
        idle = float(latest_start.get("total_wall_lost_s", 0.0) or 0.0)
        trained = max(0.0, trained - idle / 3600)
    return Progress(
        step if isinstance(step, int) else None, max_steps, eta, state, trained, updated
    )
