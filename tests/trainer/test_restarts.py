"""Restart accounting over metrics-file lines as the trainer writes them."""

from __future__ import annotations

from typing import Any

import pytest

from trainer.restarts import account_start


def run(t: float, **start: Any) -> dict[str, Any]:
    return {"time": t, "kind": "run", "step": 0, **({"start": start} if start else {})}


def train(t: float, step: int) -> dict[str, Any]:
    return {"time": t, "kind": "train", "step": step, "loss": 1.0}


def test_the_first_start_lost_nothing() -> None:
    start = account_start([], resumed_step=0, now=100.0)
    assert (start.attempt, start.after, start.goodput) == (1, "fresh", 1.0)
    assert start.summary() == "first start"


@pytest.mark.parametrize(
    ("last", "after"),
    [
        ({"kind": "stop", "step": 14, "signal": "SIGTERM", "saved": True}, "stop:SIGTERM"),
        ({"kind": "hang", "step": 13, "reason": "no step"}, "hang"),
        (None, "crash"),
    ],
)
def test_how_the_previous_attempt_ended_and_what_it_cost(
    last: dict[str, Any] | None, after: str
) -> None:
    records = [run(0.0), *(train(10.0 * s, s) for s in range(1, 14))]
    if last is not None:
        records.append({"time": 135.0, **last})
    start = account_start(records, resumed_step=10, now=200.0)
    assert (start.attempt, start.after, start.resumed_step, start.steps_lost) == (
        2,
        after,
        10,
        3,
    )
    assert start.wall_lost_s == pytest.approx(100.0)  # everything after step 10 (t=100)
    assert start.goodput == pytest.approx(0.5)


def test_losses_add_up_over_restarts_and_a_stop_followed_by_steps_is_not_the_end() -> None:
    records = [
        run(0.0),
        train(10.0, 1),
        run(50.0, attempt=2, wall_lost_s=40.0),
        train(60.0, 2),
        {"time": 61.0, "kind": "stop", "step": 2, "signal": "SIGTERM", "saved": True},
        train(70.0, 3),  # the stop line did not end the attempt
    ]
    start = account_start(records, resumed_step=2, now=100.0)
    assert start.after == "crash"
    assert start.wall_lost_s == pytest.approx(40.0)  # since step 2 at t=60
    assert start.total_wall_lost_s == pytest.approx(80.0)
    assert start.goodput == pytest.approx(0.2)
