"""What the two end-to-end torchrun files share: the reference run's flags and constants, the
helpers that read a run's log and S3 objects. The fixtures (the one reference run, moto's S3
server) live in tests/trainer/conftest.py."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3

from tests.trainer.torchrun_util import RunResult, tiny_args
from trainer.tiny_assets import TinyAssets

MAX_STEPS = 20
CHECKPOINT_FREQ = 10
FAIL_AT_STEP = 13
SEQ_LEN = 64
S3_BUCKET = "fsdp-eks-torchrun-test"
DISK_FULL_BUCKET = "fsdp-eks-disk-full-test"


def reference_args(assets: TinyAssets, checkpoint_dir: Path, **extra: Any) -> list[str]:
    """The reference run's flags, `extra` added or replacing them."""
    values: dict[str, Any] = {
        "max_steps": MAX_STEPS,
        "max_context_width": SEQ_LEN,
        "checkpoint_dir": checkpoint_dir,
        "resume_from_checkpoint": checkpoint_dir,
        "checkpoint_freq": CHECKPOINT_FREQ,
        "validation_freq": CHECKPOINT_FREQ,
        "validation_batches": 2,
        "val_batch_size": 2,
    }
    return tiny_args(assets, **{**values, **extra})


def _steps_logged(result: RunResult) -> list[int]:
    return [r["step"] for r in result.train_records()]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _assert_set_aside_and_resumed(result: RunResult, newest: str, root: str) -> None:
    """One line (the same on every rank) names the unreadable checkpoint and where it went;
    step 10 is resumed."""
    [line] = {  # the log lines' timestamps may differ
        line.partition(" checkpoint: ")[2]
        for line in result.output.splitlines()
        if f"checkpoint: {newest} cannot be" in line
    }
    assert re.search(
        rf"^{re.escape(newest)} cannot be loaded: rank \d[^:]*: .+; set aside as "
        rf"{re.escape(root)}/step-20\.unreadable-\d+$",
        line,
    ), line
    assert f"resumed from {root}/step-10 at step 10" in result.output


def _s3_client(env: dict[str, str]) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=env["AWS_ENDPOINT_URL"],
        region_name=env["AWS_REGION"],
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    )


def _s3_objects(env: dict[str, str], prefix: str) -> dict[str, bytes]:
    client = _s3_client(env)
    listing = client.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix).get("Contents", [])
    return {
        item["Key"].removeprefix(prefix): client.get_object(Bucket=S3_BUCKET, Key=item["Key"])[
            "Body"
        ].read()
        for item in listing
    }
