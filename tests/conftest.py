"""Settings every test runs under."""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import evaluation_memo
from tests.tiers import TIER_ENV, first_files_first, is_long, require_slow_tier

evaluation_memo.install()  # before any test module imports `infra.offline.evaluate`

COLLECTOR_THRESHOLDS = (10_000, 10, 10)
"""Generation 0 collected every 10,000 allocations, not 700: at Python's default each fast-tier
worker spent 11-15 of its ~55 CPU-seconds collecting (mostly full passes over torch's and
Pulumi's objects), 4.5-8 at this (docs/benchmarks.md "The cycle collector on the loop's
schedule")."""


INTRA_OP_THREADS = "1"
"""torch's CPU threads in each test process, as `run_trainer` gives every rank: on 2 cores
with 3 workers, a second OpenMP thread only waits at each op's barrier for a core. The
in-process training tests took 10% less CPU (docs/benchmarks.md "Test suite")."""


def pytest_configure(config: pytest.Config) -> None:
    gc.set_threshold(*COLLECTOR_THRESHOLDS)  # before collection imports torch and Pulumi
    # Read once, when torch loads OpenMP: set before collection imports it. The workers, and
    # every process a test starts, inherit it; a value the caller set is kept.
    os.environ.setdefault("OMP_NUM_THREADS", INTRA_OP_THREADS)


@pytest.fixture(scope="session", autouse=True)
def children_temp_dir() -> Iterator[Path]:
    """The temp dir of every process the tests start, removed with the session: ranks leave
    through `os._exit` (trainer.distributed), so multiprocessing's `pymp-*` dirs outlive them,
    and torchrun makes a `torchelastic_*` log dir per launch; neither then piles up in /tmp."""
    path = Path(tempfile.mkdtemp(prefix="fsdp-eks-tests-"))  # short: AF_UNIX paths are limited
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TMPDIR", str(path))
        yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_plan_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan a test makes is evaluated: a kept plan would hide what a test changed in the
    process (tests/cli/test_plan_cache.py turns the cache on for itself)."""
    monkeypatch.setenv("FSDP_EKS_CACHE", "off")


@pytest.fixture(autouse=True)
def local_runs_are_slow(monkeypatch: pytest.MonkeyPatch) -> None:
    """`fsdp-eks local` launching its torchrun agents is a multi-process training run."""
    from scripts.cli import local

    launch = local.run_agents

    def guarded(*args: Any, **kwargs: Any) -> Any:
        require_slow_tier("the local rehearsal's torchrun agents")
        return launch(*args, **kwargs)

    monkeypatch.setattr(local, "run_agents", guarded)


COLLECTED_IDS = pytest.StashKey[frozenset[str]]()
"""Every test this session collected, before `-m` deselects (tests/test_tiers.py reads it)."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark LONG_TESTS `long` before `-m` chooses the tier (pytest's own hook runs after), and
    put the longest files first (tests/tiers.py FIRST_FILES; dev.py keeps xdist from
    reordering them by their number of tests)."""
    config.stash[COLLECTED_IDS] = frozenset(item.nodeid for item in items)
    for item in items:
        if is_long(item.nodeid):
            item.add_marker(pytest.mark.long)
    items[:] = [items[i] for i in first_files_first([item.nodeid for item in items])]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Whether this test may start multi-process training runs (tests/tiers.py): set before
    any of its fixtures, module-scoped ones included, are made."""
    os.environ[TIER_ENV] = "1" if item.get_closest_marker("slow") is not None else "0"
