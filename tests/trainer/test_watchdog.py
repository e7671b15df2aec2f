"""The hang bound: armed at the first beat, `factor` x the recent median step, never below
the floor; what fires is the reason, on the watchdog's own thread."""

from __future__ import annotations

import threading

import pytest

from trainer.watchdog import HangWatchdog


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watchdog(clock: Clock) -> HangWatchdog:
    # A long poll: these tests ask `overdue()` themselves.
    return HangWatchdog(factor=3, floor_s=60, clock=clock, poll_s=3600)


def test_not_armed_before_the_first_step() -> None:
    clock = Clock()
    dog = watchdog(clock)
    clock.now += 10_000  # model building, checkpoint loading, compilation
    assert dog.overdue() is None
    dog.close()


def test_the_bound_follows_the_median_step_above_the_floor() -> None:
    clock = Clock()
    dog = watchdog(clock)
    dog.beat(1)
    for step, seconds in enumerate([30, 30, 300, 30], start=2):  # one slow step: a save
        clock.now += seconds
        dog.beat(step)
    assert dog.bound_s() == 90  # 3 x the median 30 s, not pulled up by the save
    clock.now += 89
    assert dog.overdue() is None
    clock.now += 2
    reason = dog.overdue()
    assert reason is not None and "no training step for 91 s after step 5" in reason
    dog.close()


def test_fast_steps_keep_the_floor() -> None:
    clock = Clock()
    dog = watchdog(clock)
    for step in range(1, 6):
        clock.now += 0.5
        dog.beat(step)
    assert dog.bound_s() == 60
    dog.close()


def test_the_thread_reports_a_hang_once() -> None:
    fired: list[str] = []
    done = threading.Event()

    def on_hang(reason: str) -> None:
        fired.append(reason)
        done.set()

    clock = Clock()
    dog = HangWatchdog(factor=3, floor_s=60, clock=clock, on_hang=on_hang, poll_s=0.01)
    dog.beat(1)
    clock.now += 61
    assert done.wait(5)
    dog.close()
    assert len(fired) == 1 and "after step 1" in fired[0]


@pytest.mark.parametrize(("factor", "floor"), [(1, 60), (3, 0)])
def test_a_bound_that_cannot_work_is_refused(factor: float, floor: float) -> None:
    with pytest.raises(ValueError, match="factor > 1 and floor_s > 0"):
        HangWatchdog(factor=factor, floor_s=floor)
