"""Fixtures shared by all trainer tests: tiny offline assets, built once per test session."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist
from filelock import FileLock

from tests.trainer.torchrun_util import RunResult, run_trainer
from tests.trainer.train_torchrun_common import S3_BUCKET, reference_args
from trainer.tiny_assets import TinyAssets, ensure_tiny_assets


def session_shared_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """A directory that every pytest-xdist worker of this test session shares (a worker's
    basetemp is `popen-gwN` under the session's: pytest-xdist docs, how-to.html "Making
    session-scoped fixtures execute only once"); without xdist, the session's own basetemp."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    path = base / name
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> TinyAssets:
    """The tiny corpus (train + validation jsonl) and a tokenizer trained on it (no network);
    built once for all workers (ensure_tiny_assets locks), so runs on two workers read the same
    paths."""
    return ensure_tiny_assets(session_shared_dir(tmp_path_factory, "tiny_assets"))


@pytest.fixture(scope="session")
def reference_run(
    tiny_assets: TinyAssets, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, RunResult]:
    """An uninterrupted 20-step run with checkpoints, validation and an export: launched once
    per test session and read by both end-to-end files (the first worker to ask runs it under
    a lock, the other reads its saved result). Tests only read its directory."""
    root = session_shared_dir(tmp_path_factory, "reference")
    saved = root / "result.json"
    with FileLock(str(root.parent / "reference.lock")):
        if not saved.exists():
            args = reference_args(tiny_assets, root / "ckpt", export_dir=root / "export")
            result = run_trainer(args, metrics_file=root / "metrics.jsonl")
            saved.write_text(json.dumps(dataclasses.asdict(result)))
    result = RunResult(**json.loads(saved.read_text()))
    assert result.returncode == 0, result.output[-4000:]
    return root, result


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """moto's S3 server and the environment that points a trainer process at it."""
    import boto3

    from tests.s3_server import moto_server_endpoint, s3_environment

    with moto_server_endpoint() as endpoint:
        env = s3_environment(endpoint)
        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=env["AWS_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        ).create_bucket(Bucket=S3_BUCKET)
        yield env


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
