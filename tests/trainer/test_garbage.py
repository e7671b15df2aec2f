"""The cycle collector runs on the loop's cadence: no automatic pass between, one full pass
at each due step, a thaw and pass after a rollback, and Python's own collector back after
the last step.

Collections are observed through `gc.callbacks`, which CPython calls at the start and stop of
every collection, automatic or asked for (`Modules/gcmodule.c` `invoke_gc_callback`).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.torchrun_util import tiny_args
from trainer.config import parse_args
from trainer.garbage import CollectionCadence, collector_held
from trainer.tiny_assets import TinyAssets

ROOT = Path(__file__).resolve().parents[2]


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
    gc.unfreeze()  # whatever an earlier test left frozen
    gc.collect()  # generation 0's count from zero: no automatic pass in the next few lines
    gc.callbacks.append(record)
    try:
        yield seen
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        if enabled:
            gc.enable()


def _churn() -> None:
    """Far past the automatic threshold (generation 0: 700 allocations, 10,000 in the tests)."""
    churn = [[i] for i in range(50_000)]
    del churn


def test_only_due_steps_collect_and_what_lives_on_is_frozen(collections: list[int]) -> None:
    cadence = CollectionCadence(3)
    assert not gc.isenabled()
    frozen_at_setup = gc.get_freeze_count()
    assert frozen_at_setup > 0  # this process's objects so far: the "setup"
    assert collections == [2]  # the one full pass before the freeze
    garbage = Cycle()
    alive = weakref.ref(garbage)
    del garbage
    _churn()
    cadence.after_step(1)
    cadence.after_step(2)
    assert collections == [2] and alive() is not None
    # Counts, not equalities: a frozen object freed by its reference count leaves the
    # permanent generation at any time (one did, in one run of the suite).
    kept = [Cycle() for _ in range(100)]  # lives past the first due pass, as optimizer state
    cadence.after_step(3)
    assert collections == [2, 2] and alive() is None
    assert gc.get_freeze_count() >= frozen_at_setup + len(kept)  # frozen with the first pass
    frozen_after_first = gc.get_freeze_count()
    later = [Cycle() for _ in range(100)]  # made after it: a second freeze would take them
    cadence.after_step(6)
    assert collections == [2, 2, 2]
    assert gc.get_freeze_count() <= frozen_after_first  # only the first pass freezes
    cadence.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    del kept, later


def test_settle_thaws_what_setup_froze_and_a_due_pass_does_not(collections: list[int]) -> None:
    setup_state = [Cycle()]  # state setup loaded, which a rollback replaces
    replaced = weakref.ref(setup_state[0])
    cadence = CollectionCadence(3)
    setup_state.clear()
    cadence.after_step(3)
    assert replaced() is not None  # frozen: out of every pass's reach
    cadence.settle()
    assert replaced() is None and not gc.isenabled() and gc.get_freeze_count() > 0
    cadence.close()


def test_zero_leaves_pythons_automatic_collector(collections: list[int]) -> None:
    cadence = CollectionCadence(0)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    cadence.after_step(50)
    cadence.settle()
    assert collections == []
    _churn()
    assert collections  # Python's own, on its allocation thresholds
    cadence.close()
    assert gc.isenabled()


def test_close_puts_back_the_collector_as_it_was(collections: list[int]) -> None:
    gc.disable()
    CollectionCadence(5).close()
    assert not gc.isenabled() and gc.get_freeze_count() == 0
    gc.enable()
    cadence = CollectionCadence(5)
    cadence.close()  # after the loop
    assert gc.isenabled()
    gc.disable()
    cadence.close()  # again by Trainer.close: nothing left to put back
    assert not gc.isenabled()


def test_the_hold_covers_the_block_then_freezes_and_restores(collections: list[int]) -> None:
    with collector_held(50):
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    gc.unfreeze()
    gc.disable()
    with collector_held(50):
        pass
    assert not gc.isenabled() and gc.get_freeze_count() > 0


def test_no_hold_without_a_cadence(collections: list[int]) -> None:
    with collector_held(0):
        assert gc.isenabled()
    assert gc.get_freeze_count() == 0


def test_a_negative_cadence_is_refused_naming_the_flag(
    tiny_assets: TinyAssets, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args([*tiny_args(tiny_assets), "--gc_every", "-1"])
    assert exit_info.value.code == 2
    assert "--gc_every must be >= 0 (0: automatic), got -1" in capsys.readouterr().err


WATCH_TORCH_IMPORT = """
import gc, sys
seen = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(gc.isenabled())
sys.meta_path.insert(0, Watch())
from trainer.__main__ import main
code = main(sys.argv[1:])
print("collector on at import torch:", seen[0])
print("collector on after main:", gc.isenabled(), "frozen:", gc.get_freeze_count() > 0)
sys.exit(code)
"""


def test_the_entry_point_imports_torch_with_the_collector_held(
    tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """`python -m trainer`'s own path: a bad dataset ends it after the imports, with exit 2."""
    args = tiny_args(tiny_assets, dataset=str(tmp_path / "none"), metrics_port=0)
    done = subprocess.run(
        [sys.executable, "-c", WATCH_TORCH_IMPORT, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": "",
            "HOME": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "HF_DATASETS_CACHE": str(tmp_path / "cache"),
            "OMP_NUM_THREADS": "1",
        },
    )
    assert done.returncode == 2, done.stderr
    lines = done.stdout.splitlines()
    # The bad dataset stops setup before the loop: the imports' freeze is what remains.
    assert lines == [
        "collector on at import torch: False",
        "collector on after main: True frozen: True",
    ]


def test_the_trainer_collects_at_its_due_steps_and_after_a_rollback_only(
    tiny_assets: TinyAssets, tmp_path: Path, collections: list[int]
) -> None:
    from trainer.train import Trainer

    metrics = tmp_path / "metrics.jsonl"
    args = tiny_args(
        tiny_assets,
        max_steps=8,
        logging_freq=4,
        checkpoint_dir=tmp_path / "ckpt",
        checkpoint_freq=4,
        async_checkpoint=0,
        nan_at_step=5,
        nan_steps=2,
        rollback_after_nonfinite=2,
        gc_every=3,
        metrics_file=metrics,
        metrics_port=0,
    )
    run = Trainer(parse_args(args))
    try:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        steps_at_collection: list[int] = []

        def record(phase: str, info: dict[str, Any]) -> None:
            if phase == "start" and not gc.isenabled():  # not an automatic pass after the loop
                steps_at_collection.append(run.step)

        gc.callbacks.append(record)
        try:
            run.train()
        finally:
            gc.callbacks.remove(record)
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        [rollback] = [r for r in records if r["kind"] == "rollback"]
        assert gc.isenabled()  # after the last step, Python's own collector
    finally:
        run.close()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    # Steps 3 and 6, the rollback's pass (judged at logging step 8, back to step 4), step 6.
    assert (rollback["step"], rollback["to_step"]) == (8, 4)
    assert steps_at_collection == [3, 6, 4, 6]
