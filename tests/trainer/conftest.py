"""Fixtures shared by all trainer tests: tiny offline assets, built once per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from trainer.tiny_assets import TinyAssets, ensure_tiny_assets


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> TinyAssets:
    """The tiny corpus (train + validation jsonl) and a tokenizer trained on it (no network)."""
    return ensure_tiny_assets(tmp_path_factory.mktemp("tiny_assets"))


@pytest.fixture(scope="session")
def hf_datasets_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private ``datasets`` cache: pass as ``cache_dir=`` (or ``HF_DATASETS_CACHE`` to a
    subprocess) so tests never write Arrow copies into the user's ``~/.cache``."""
    return str(tmp_path_factory.mktemp("hf_datasets_cache"))


@pytest.fixture
def gloo_world_of_one(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group for the test (FSDP2 and DCP's collective paths)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'pg-store'}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(autouse=True)
def no_process_group_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves the default process group initialised breaks the next test of its
    worker that makes one ("initialize the default process group twice"), wherever pytest-xdist
    happens to schedule it: fail the test that leaked it instead. A module's own group (a
    module-scoped fixture) is that module's to destroy."""
    before = dist.is_initialized()
    yield
    if not before and dist.is_initialized() and "single_rank_group" not in request.fixturenames:
        dist.destroy_process_group()
        pytest.fail(f"{request.node.nodeid} left the default process group initialised")
