"""Checkpoints in S3 through AWS's s3torchconnector, against moto's S3 server over HTTP.

The same protocol tests as for a directory (tests/trainer/test_checkpoint.py), for the store
without a rename: the marker object is the commit, and whatever makes a ``step-N/`` incomplete
again deletes the marker first. The multi-process crash-and-resume runs under torchrun in
tests/trainer/test_train_torchrun.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from tests.s3_server import moto_server_endpoint, s3_environment
from tests.trainer.test_checkpoint import Run, _round_trip, _save
from trainer import checkpoint as ckpt_module
from trainer.checkpoint import (
    CheckpointError,
    CheckpointManager,
    UnreadableCheckpointError,
    find_latest,
)
from trainer.checkpoint_store import S3Store, open_store
from trainer.config import InjectedFaultConfig
from trainer.faults import FaultInjector

BUCKET = "fsdp-eks-ckpt-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_server_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Any:
    """A boto3 client for checking what landed, and an empty prefix per test."""
    for key, value in s3_environment(s3_endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    client = boto3.client("s3")
    if BUCKET not in [b["Name"] for b in client.list_buckets().get("Buckets", [])]:
        client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture
def root(s3: Any, request: pytest.FixtureRequest) -> str:
    return f"s3://{BUCKET}/runs/{request.node.name}"


def keys(client: Any, uri: str) -> list[str]:
    prefix = uri.removeprefix(f"s3://{BUCKET}/") + "/"
    listing = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return sorted(item["Key"].removeprefix(prefix) for item in listing)


def test_round_trip_through_s3_continues_identically(root: str, s3: Any) -> None:
    _round_trip(root, shard=False)
    stored = keys(s3, root)
    assert "step-3/COMPLETE" in stored
    assert "step-3/.metadata" in stored
    assert "step-3/train_state/rank-00000.pt" in stored
    assert any(k.startswith("step-3/__0_") and k.endswith(".distcp") for k in stored)
    marker = json.loads(
        s3.get_object(Bucket=BUCKET, Key=_key(root, "step-3/COMPLETE"))["Body"].read()
    )
    assert (marker["step"], marker["world_size"]) == (3, 1)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # as below
def test_asynchronous_save_to_s3_holds_the_step_it_was_given(root: str) -> None:
    _round_trip(root, shard=False, async_save=True)


def test_asynchronous_save_fsdp2_gloo_holds_the_step_it_was_given(
    root: str, gloo_world_of_one: None
) -> None:
    _round_trip(root, shard=True, async_save=True)


def _key(root: str, name: str) -> str:
    return f"{root.removeprefix(f's3://{BUCKET}/')}/{name}"


def test_crash_mid_save_leaves_the_previous_checkpoint_as_latest(
    root: str, s3: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(root, keep_last=3)
    first = _save(manager, 1, run)
    run.step()
    real_save = ckpt_module.dcp.save

    def dying_save(state: Any, **kwargs: Any) -> Any:
        real_save(state, **kwargs)  # every shard and .metadata written...
        raise KeyboardInterrupt("node lost")  # ...and the process dies before the marker

    monkeypatch.setattr(ckpt_module.dcp, "save", dying_save)
    with pytest.raises(KeyboardInterrupt):
        _save(manager, 2, run)
    monkeypatch.setattr(ckpt_module.dcp, "save", real_save)

    assert "step-2/.metadata" in keys(s3, root)  # the crash left its objects...
    assert "step-2/COMPLETE" not in keys(s3, root)
    assert manager.latest() == first  # ...but resume never picks them
    assert find_latest(root) == first
    assert find_latest(f"{root}/step-2") is None

    # A leftover object from the crashed save (another world size's shard) is cleared by the
    # retried save, so it cannot mix with the new one.
    s3.put_object(Bucket=BUCKET, Key=_key(root, "step-2/__7_0.distcp"), Body=b"stale")
    second = _save(manager, 2, run)
    assert manager.latest() == second == f"{root}/step-2"
    assert "step-2/__7_0.distcp" not in keys(s3, root)
    _, state = manager.load(
        second, model=run.model, optimizer=run.optimizer, lr_scheduler=run.scheduler
    )
    assert state == {"step_seen": 2}


def test_keep_last_prunes_oldest_and_crashed_saves(root: str, s3: Any) -> None:
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(root, keep_last=2)
    # A crashed save of an earlier step: no marker, older than what will be saved.
    s3.put_object(Bucket=BUCKET, Key=_key(root, "step-0/__0_0.distcp"), Body=b"partial")
    s3.put_object(Bucket=BUCKET, Key=_key(root, "metrics.jsonl"), Body=b"{}\n")
    for step in (1, 2, 3, 4):
        _save(manager, step, run)
    tops = sorted({k.split("/")[0] for k in keys(s3, root)})
    assert tops == ["metrics.jsonl", "step-3", "step-4"]  # other objects are left alone
    assert [s for s, _ in manager.store.complete_steps()] == [3, 4]


def test_saving_the_same_step_twice_keeps_the_newer(root: str, s3: Any) -> None:
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(root, keep_last=2)
    for version in (1, 2):
        manager.save(
            7, model=run.model, optimizer=None, lr_scheduler=None, train_state={"v": version}
        )
    _, state = manager.load(f"{root}/step-7", model=run.model, optimizer=None, lr_scheduler=None)
    assert state == {"v": 2}


# Without a process group the save runs in DCP's thread executor, whose thread warns outside
# the manager's own filter (trainer.checkpoint `_quiet_single_process_dcp`).
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_failed_publish_is_an_error_and_publishes_nothing(root: str, s3: Any) -> None:
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(root, keep_last=2, async_save=True)

    def denied(step: int, location: str, record: dict[str, Any]) -> str:
        raise PermissionError("AccessDenied: s3:PutObject")

    manager.store.publish = denied  # type: ignore[method-assign]
    _save(manager, 1, run)
    with pytest.raises(CheckpointError, match=r"publishing .*step-1 failed on rank 0: .*Denied"):
        manager.wait()
    assert manager.latest() is None


def test_store_is_chosen_by_the_uri(tmp_path: Any) -> None:
    assert isinstance(open_store("s3://bucket/a/b/"), S3Store)
    assert open_store("s3://bucket/a/b/").root == "s3://bucket/a/b"
    assert not isinstance(open_store(tmp_path), S3Store)


def test_a_missing_region_is_one_clear_error(root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_REGION")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ValueError, match="AWS_REGION"):
        CheckpointManager(root, keep_last=1).latest()


def test_a_failed_upload_is_one_error_naming_the_object_and_the_cause(
    root: str, s3: Any, gloo_world_of_one: None
) -> None:
    """ENOSPC inside s3torchconnector's write stream, in the upload process: one
    CheckpointError line, the marker never written."""
    run = Run(seed=0, shard=True)
    run.step()
    faults = FaultInjector(InjectedFaultConfig(disk_full_at_step=1), rank=0, world_size=1)
    manager = CheckpointManager(root, keep_last=2, async_save=True)
    try:
        _save(manager, 1, run, faults=faults)
        with pytest.raises(CheckpointError) as failed:
            manager.wait()
    finally:
        manager.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(f"writing {root}/step-1 failed: rank 0: OSError: [Errno 28] ")
    assert f"{root}/step-1/__0_0.distcp" in message
    assert "step-1/COMPLETE" not in keys(s3, root)


def test_an_unreadable_checkpoint_is_set_aside_by_copy_not_deleted(root: str, s3: Any) -> None:
    run = Run(seed=0, shard=False)
    manager = CheckpointManager(root, keep_last=3)
    _save(manager, 1, run)
    newest = _save(manager, 2, run)
    shard = _key(root, "step-2/__0_0.distcp")
    body = s3.get_object(Bucket=BUCKET, Key=shard)["Body"].read()
    s3.put_object(Bucket=BUCKET, Key=shard, Body=body[: len(body) // 2])
    with pytest.raises(UnreadableCheckpointError, match=rf"^{newest} cannot be loaded: "):
        manager.load(newest, model=run.model, optimizer=run.optimizer, lr_scheduler=None)
    aside = manager.set_aside(newest)
    name = aside.removeprefix(f"{root}/")
    assert name.startswith("step-2.unreadable-")
    stored = keys(s3, root)
    assert f"{name}/__0_0.distcp" in stored and f"{name}/COMPLETE" in stored
    assert not any(k.startswith("step-2/") for k in stored)
    assert manager.latest() == f"{root}/step-1"
    _save(manager, 3, run)  # pruning leaves what was set aside alone
    assert f"{name}/__0_0.distcp" in keys(s3, root)
