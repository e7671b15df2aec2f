"""The cycle collector runs on the loop's cadence: no automatic pass between, one full pass
at each due step, and Python's own collector back when the trainer closes.

Collections are observed through `gc.callbacks`, which CPython calls at the start and stop of
every collection, automatic or asked for (`Modules/gcmodule.c` `invoke_gc_callback`).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from tests.trainer.torchrun_util import tiny_args
from trainer.config import parse_args
from trainer.garbage import CollectionCadence, hold_automatic_collection
from trainer.tiny_assets import TinyAssets


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def collections() -> Iterator[list[int]]:
    """The generation of every collection from here on; gc's state put back afterwards."""
    seen: list[int] = []

    def record(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    enabled = gc.isenabled()
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        if enabled:
            gc.enable()


def test_only_due_steps_collect_and_the_setup_is_frozen(collections: list[int]) -> None:
    cadence = CollectionCadence(3)
    assert not gc.isenabled()
    assert gc.get_freeze_count() > 0  # this process's objects so far: the "setup"
    assert collections == [2]  # the one full pass before the freeze
    garbage = Cycle()
    alive = weakref.ref(garbage)
    del garbage
    # Far past the automatic threshold (generation 0: 700 allocations, 10,000 in the tests).
    churn = [[i] for i in range(50_000)]
    del churn
    cadence.after_step(1)
    cadence.after_step(2)
    assert collections == [2] and alive() is not None
    cadence.after_step(3)
    assert collections == [2, 2] and alive() is None
    cadence.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_zero_leaves_pythons_automatic_collector(collections: list[int]) -> None:
    gc.disable()  # as a process started with the hold, then configured with 0
    cadence = CollectionCadence(0)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    cadence.after_step(50)
    assert collections == []
    churn = [[i] for i in range(50_000)]
    del churn
    assert collections  # Python's own, on its allocation thresholds
    cadence.close()
    assert gc.isenabled()


def test_the_hold_at_start_follows_the_flag(collections: list[int]) -> None:
    hold_automatic_collection(0)
    assert gc.isenabled()
    hold_automatic_collection(50)
    assert not gc.isenabled()


def test_a_negative_cadence_is_refused_naming_the_flag(
    tiny_assets: TinyAssets, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*tiny_args(tiny_assets), "--gc_every", "-1"])
    assert exit_info.value.code == 2
    assert "--gc_every must be >= 0 (0: automatic), got -1" in capsys.readouterr().err


def test_the_trainer_collects_at_its_due_steps_and_at_no_other(
    tiny_assets: TinyAssets, collections: list[int]
) -> None:
    from trainer.train import Trainer

    run = Trainer(parse_args(tiny_args(tiny_assets, max_steps=5, gc_every=2, metrics_port=0)))
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        built = len(collections)
        steps_at_collection: list[int] = []
        gc.callbacks.append(
            lambda phase, info: steps_at_collection.append(run.step) if phase == "start" else None
        )
        try:
            run.train()
        finally:
            gc.callbacks.pop()
        # Each pass runs after its step's increment: steps 2 and 4, none automatic.
        assert steps_at_collection == [2, 4]
        assert collections[built:] == [2, 2]
    finally:
        run.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0
