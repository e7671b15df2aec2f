"""The trainer's fault handling end to end, under `torchrun --nproc_per_node=2 -m trainer`.

Split from test_train_torchrun.py so that pytest-xdist's `--dist loadfile` runs the two halves
on two workers; both read the one reference run (tests/trainer/conftest.py).
"""

from __future__ import annotations

import json
import math
import pickle
import re
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.torchrun_util import run_trainer, tiny_args
from tests.trainer.train_torchrun_common import (
    CHECKPOINT_FREQ,
    DISK_FULL_BUCKET,
    FAIL_AT_STEP,
    MAX_STEPS,
    S3_BUCKET,
    SEQ_LEN,
    _assert_set_aside_and_resumed,
    _s3_client,
    _s3_objects,
    _steps_logged,
    reference_args,
)
from trainer.tiny_assets import TinyAssets

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("store", ["filesystem", "s3"])
def test_a_full_disk_ends_the_run_with_one_line_naming_the_file_and_the_cause(
    store: str, tiny_assets: TinyAssets, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The last rank's checkpoint writer runs out of space inside DCP's write of the step-2
    shards (in the upload process). Every rank learns of it when the next save waits for
    this one, and ends with the same single line: no CheckpointException traceback, no
    "Exception in thread", the marker never written."""
    env: dict[str, str] | None = None
    if store == "s3":
        env = request.getfixturevalue("s3_env")
        _s3_client(env).create_bucket(Bucket=DISK_FULL_BUCKET)
        root = f"s3://{DISK_FULL_BUCKET}/checkpoints/disk-full"
    else:
        root = str(tmp_path / "ckpt")
    args = tiny_args(
        tiny_assets, max_steps=4, checkpoint_dir=root, checkpoint_freq=2, disk_full_at_step=2
    )
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl", env=env)
    assert result.returncode != 0
    written = ".tmp-step-2" if store == "filesystem" else "step-2"
    lines = {line for line in result.output.splitlines() if "trainer: CheckpointError: " in line}
    assert len(lines) == 1, result.output[-4000:]
    assert re.search(
        rf"trainer: CheckpointError: writing {re.escape(f'{root}/{written}')} failed: rank 1: "
        rf"OSError: \[Errno 28\] No space left on device: "
        rf"'{re.escape(f'{root}/{written}/__1_0.distcp')}'$",
        lines.pop(),
    )
    for noise in ("CheckpointException", "Exception in thread", "[rank0]: Traceback"):
        assert noise not in result.output
    [failed] = [r for r in result.metrics if r["kind"] == "checkpoint"]
    assert (failed["step"], failed["durable_s"]) == (2, None)
    if store == "filesystem":
        assert not (tmp_path / "ckpt" / "step-2").exists()
    else:
        listing = _s3_client(env or {}).list_objects_v2(Bucket=DISK_FULL_BUCKET)["Contents"]
        keys = {item["Key"] for item in listing}
        assert "checkpoints/disk-full/step-2/train_state/rank-00001.pt" in keys
        assert "checkpoints/disk-full/step-2/COMPLETE" not in keys


def test_s3_checkpoints_survive_a_rank_lost_mid_save_and_resume_exactly(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path, s3_env: dict[str, str]
) -> None:
    """No FSx: checkpoints, metrics, TensorBoard events and the export go to S3 (moto's server,
    through s3torchconnector). The last rank dies inside its write of the step-20 checkpoint,
    an asynchronous save, after its train_state and before its shards. The restart resumes
    from step 10 and reproduces the uninterrupted losses; the metrics file in S3 holds both
    starts."""
    _, reference = reference_run
    run = "checkpoints/run-s3"
    uri = f"s3://{S3_BUCKET}/{run}"
    args = tiny_args(
        tiny_assets,
        max_steps=MAX_STEPS,
        max_context_width=SEQ_LEN,
        checkpoint_dir=uri,
        resume_from_checkpoint=uri,
        checkpoint_freq=CHECKPOINT_FREQ,
        validation_freq=CHECKPOINT_FREQ,
        validation_batches=2,
        val_batch_size=2,
        tensorboard_dir=f"{uri}/tensorboard",
        export_dir=f"{uri}/export",
        staging_dir=tmp_path / "staging",
        crash_in_save_at_step=MAX_STEPS,
    )
    metrics = tmp_path / "metrics.jsonl"
    crashed = run_trainer(args, metrics_file=metrics, env=s3_env, pass_metrics_file=False)
    assert crashed.returncode != 0
    assert "dying inside this rank's checkpoint write" in crashed.output
    objects = _s3_objects(s3_env, f"{run}/")
    assert "step-10/COMPLETE" in objects
    assert "step-20/train_state/rank-00001.pt" in objects  # the lost save began...
    assert "step-20/COMPLETE" not in objects  # ...and was never published

    resumed = run_trainer(args, metrics_file=metrics, env=s3_env, pass_metrics_file=False)
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert f"resumed from {uri}/step-10 at step 10" in resumed.output
    objects = _s3_objects(s3_env, f"{run}/")
    assert json.loads(objects["step-20/COMPLETE"])["world_size"] == 2
    assert sorted(k for k in objects if k.endswith("/COMPLETE")) == [
        "step-10/COMPLETE",
        "step-20/COMPLETE",
    ]
    records = [json.loads(line) for line in objects["metrics.jsonl"].decode().splitlines()]
    starts = [r["start"] for r in records if r["kind"] == "run"]
    assert [(s["attempt"], s["resumed_step"]) for s in starts] == [(1, 0), (2, 10)]
    losses = {r["step"]: r["loss"] for r in records if r["kind"] == "train"}
    assert sorted(losses) == list(range(1, MAX_STEPS + 1))
    expected = reference.losses()
    for step, loss in losses.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step
    assert any(k.startswith("tensorboard/events.out.tfevents") for k in objects)
    assert {"export/config.json", "export/model.safetensors"} <= set(objects)
    # Nothing outside the run's prefix: all the pods' role may write (checkpoint_access).
    assert all(key.startswith(f"{run}/") for key in _s3_objects(s3_env, ""))

    # Rank 1's shard of the newest checkpoint is cut short in the bucket: the next start
    # names it, copies it aside and resumes from step 10 with the uninterrupted losses.
    shard = f"{run}/step-20/__1_0.distcp"
    body = objects["step-20/__1_0.distcp"]
    _s3_client(s3_env).put_object(Bucket=S3_BUCKET, Key=shard, Body=body[: len(body) // 2])
    fallback = run_trainer(args, metrics_file=metrics, env=s3_env, pass_metrics_file=False)
    assert fallback.returncode == 0, fallback.output[-4000:]
    _assert_set_aside_and_resumed(fallback, f"{uri}/step-20", uri)
    objects = _s3_objects(s3_env, f"{run}/")
    [aside] = {k.split("/")[0] for k in objects if k.startswith("step-20.unreadable-")}
    assert objects[f"{aside}/__1_0.distcp"] == body[: len(body) // 2]
    assert "step-20/COMPLETE" in objects  # saved again
    records = [json.loads(line) for line in objects["metrics.jsonl"].decode().splitlines()]
    third = [i for i, r in enumerate(records) if r["kind"] == "run"][-1]
    trained = [r for r in records[third:] if r["kind"] == "train"]
    assert [r["step"] for r in trained] == list(range(11, MAX_STEPS + 1))
    for record in trained:
        assert record["loss"] == pytest.approx(expected[record["step"]], rel=1e-5)


def test_sigterm_on_one_rank_saves_the_next_step_and_the_restart_matches(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """One node interrupted: only the last rank gets SIGTERM after step 13. Every rank agrees
    after step 14, saves it, exits 143; the restart resumes at 14 and reproduces the
    uninterrupted losses."""
    _, reference = reference_run
    checkpoint_dir = tmp_path / "ckpt"
    args = reference_args(tiny_assets, checkpoint_dir, signal_at_step=FAIL_AT_STEP)

    stopped = run_trainer(args, metrics_file=tmp_path / "first.jsonl")
    assert stopped.returncode != 0
    assert "exitcode  : 143" in stopped.output
    assert _steps_logged(stopped) == list(range(1, FAIL_AT_STEP + 2))
    [stop] = [r for r in stopped.metrics if r.get("kind") == "stop"]
    # Rank 0 writes the metrics: it learned of the signal from the last rank.
    assert (stop["step"], stop["signal"], stop["saved"]) == (
        FAIL_AT_STEP + 1,
        "SIGTERM (on another rank)",
        True,
    )
    assert (checkpoint_dir / f"step-{FAIL_AT_STEP + 1}" / "COMPLETE").exists()

    resumed = run_trainer(args, metrics_file=tmp_path / "second.jsonl")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert _steps_logged(resumed) == list(range(FAIL_AT_STEP + 2, MAX_STEPS + 1))
    expected = reference.losses()
    for step, loss in {**stopped.losses(), **resumed.losses()}.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step


def test_a_stop_during_an_upload_lets_it_land_and_saves_only_the_next_step(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """The step-10 upload is in flight (held, in the last rank's upload process, until SIGTERM
    reaches that process) when torchrun is told to stop and signals every worker's process
    group, as a pod deletion does. The upload processes record the signal and write on, so
    step 10 lands; the stop after step 11 waits for it and then saves step 11. The restart
    resumes there and reproduces the uninterrupted losses."""
    _, reference = reference_run
    checkpoint_dir = tmp_path / "ckpt"
    args = reference_args(tiny_assets, checkpoint_dir, stop_in_upload_at_step=CHECKPOINT_FREQ)
    # The agent's own limit before it SIGKILLs the workers: generous on a busy test machine.
    env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "170"}

    stopped = run_trainer(args, metrics_file=tmp_path / "first.jsonl", env=env)
    assert stopped.returncode != 0
    assert "lost with its upload process" not in stopped.output, stopped.output[-4000:]
    saves = {r["step"]: r for r in stopped.metrics if r.get("kind") == "checkpoint"}
    assert sorted(saves) == [CHECKPOINT_FREQ, CHECKPOINT_FREQ + 1], stopped.output[-4000:]
    assert saves[CHECKPOINT_FREQ]["durable_s"] is not None
    assert saves[CHECKPOINT_FREQ]["staged_bytes"] > 0  # the upload, not a rewrite
    [stop] = [r for r in stopped.metrics if r.get("kind") == "stop"]
    assert (stop["step"], stop["saved"]) == (CHECKPOINT_FREQ + 1, True)
    assert "Checkpoint background process is still alive" not in stopped.output
    for step in (CHECKPOINT_FREQ, CHECKPOINT_FREQ + 1):
        assert (checkpoint_dir / f"step-{step}" / "COMPLETE").exists()

    resumed = run_trainer(args, metrics_file=tmp_path / "second.jsonl")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert _steps_logged(resumed) == list(range(CHECKPOINT_FREQ + 2, MAX_STEPS + 1))
    expected = reference.losses()
    for step, loss in {**stopped.losses(), **resumed.losses()}.items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step


def test_a_stalled_rank_ends_in_a_stack_dump_and_the_restart_resumes(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """The last rank stops making progress after step 13; every rank's watchdog fires once
    no step has ended for its floor (15 s, far above a step or a save here), dumps stacks and
    exits 142; the restart resumes from step 10 and reproduces the uninterrupted losses.
    A save at step 5 starts the upload processes, so the step-10 save, which the watchdog
    lets land for up to its floor, is a write, not a process start on a busy machine
    (test_launch.py covers a hang during the first save)."""
    _, reference = reference_run
    checkpoint_dir = tmp_path / "ckpt"
    watchdog = {"watchdog_factor": 3, "watchdog_floor_s": 15}
    args = reference_args(
        tiny_assets,
        checkpoint_dir,
        stall_at_step=FAIL_AT_STEP,
        checkpoint_freq=CHECKPOINT_FREQ // 2,
        **watchdog,
    )
    env = {"TORCH_FR_BUFFER_SIZE": "64", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}

    metrics = tmp_path / "metrics.jsonl"  # one file across restarts, as in the job
    hung = run_trainer(args, metrics_file=metrics, env=env)
    assert hung.returncode != 0
    assert "exitcode  : 142" in hung.output
    assert "no training step for 1" in hung.output and f"after step {FAIL_AT_STEP}" in hung.output
    assert 'File "' in hung.output and "in _stall" in hung.output  # the stalled rank's stack
    assert _steps_logged(hung) == list(range(1, FAIL_AT_STEP + 1))
    # Each rank's flight recorder, in the format torch's `torchfrtrace` reads: the waiting
    # rank's last collective is still scheduled, never completed.
    for rank in (0, 1):
        trace = pickle.loads((tmp_path / f"fr_{rank}").read_bytes())
        assert trace["entries"], rank
    assert pickle.loads((tmp_path / "fr_0").read_bytes())["entries"][-1]["state"] != "completed"

    assert [r["kind"] for r in hung.metrics][-1] == "hang"

    resumed = run_trainer(args, metrics_file=metrics)
    assert resumed.returncode == 0, resumed.output[-4000:]
    [_, second] = [i for i, r in enumerate(resumed.metrics) if r["kind"] == "run"]
    start = resumed.metrics[second]["start"]
    assert (start["attempt"], start["after"], start["resumed_step"], start["steps_lost"]) == (
        2,
        "hang",
        10,
        FAIL_AT_STEP - 10,
    )
    # Lost: steps 11-13 and the watchdog's wait (its 15 s floor at least).
    assert start["wall_lost_s"] >= 15 and 0 < start["goodput"] < 1
    assert "start 2 after hang: resumed at step 10, 3 step(s)" in resumed.output
    steps = [r["step"] for r in resumed.metrics[second:] if r["kind"] == "train"]
    assert steps == list(range(11, MAX_STEPS + 1))
    expected = reference.losses()
    for step, loss in resumed.losses().items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step


def test_a_non_finite_step_is_skipped_and_consecutive_ones_roll_back_past_the_bad_data(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """Two faults in one run. Only the last rank's loss at step 5 (batch 5) is NaN: FSDP's
    gradient reduction spreads it to every rank's shard, the global norm is NaN everywhere, and
    every rank skips that update; applied, it would make every later loss NaN. Steps 12 and 13
    are NaN too: both skipped, then (2 in a row) every rank reloads step 10 and skips the
    batches of steps 11-13, so the next step trains on what was step 14's batch."""
    _, reference = reference_run
    args = reference_args(
        tiny_assets,
        tmp_path / "ckpt",
        nan_batches="5",
        nan_at_step=12,
        nan_steps=2,
        rollback_after_nonfinite=2,
    )
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    records = result.train_records()
    by_step = {r["step"]: r for r in records}  # a step run again after the rollback: the last
    expected = reference.losses()

    # The single NaN: skipped on every rank, and training goes on.
    assert math.isnan(by_step[5]["loss"])
    assert all(math.isfinite(by_step[s]["loss"]) for s in range(6, MAX_STEPS + 1))
    assert "step 5: 1 update(s) skipped for a non-finite gradient norm" in result.output
    for step in range(1, 5):
        assert by_step[step]["loss"] == pytest.approx(expected[step], rel=1e-5)
    # Step 6 trains from the weights after step 4, as if step 5's batch had not been seen.
    assert by_step[MAX_STEPS]["loss"] < by_step[1]["loss"] - 1.0

    # The two in a row: skipped, then the rollback to step 10.
    [rollback] = [r for r in result.metrics if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["skipped_batches"]) == (13, 10, 3)
    assert "2 consecutive non-finite steps: rolled back to step 10" in result.output
    after = records[[r["step"] for r in records].index(13) + 1 :]
    assert [r["step"] for r in after] == list(range(11, MAX_STEPS + 1))
    # The same batches as the uninterrupted run, three steps further on.
    reference_records = {r["step"]: r for r in reference.train_records()}
    assert after[0]["batch_digests"] == reference_records[14]["batch_digests"]
    assert all(math.isfinite(r["loss"]) for r in after)
    # Every skipped update is counted, across the rollback: step 5's, then 12's and 13's.
    before = records[: len(records) - len(after)]
    assert [r["skipped_updates"] for r in before] == [0] * 4 + [1] * 7 + [2, 3]
    assert {r["skipped_updates"] for r in after} == {3}


def test_non_finite_steps_between_logging_steps_roll_back_and_each_rollback_skips_more(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """A corrupt patch of data: batches 11-12 and 16-17 of the last rank make its loss NaN.
    Steps 11 and 12 are non-finite but step 13 is fine again, before the logging step 15: the
    rollback is still taken there (the latch was set on the device at step 12). It skips the
    5 batches read since step 10, so the next steps meet batches 16-17, and the second
    rollback to step 10 skips all 10 batches read since it, beyond the patch, instead of the
    same 5 again (which would meet batches 16-17 until --max_rollbacks ended the run)."""
    _, reference = reference_run
    args = reference_args(
        tiny_assets,
        tmp_path / "ckpt",
        nan_batches="11-12,16-17",
        rollback_after_nonfinite=2,
        max_rollbacks=2,
        logging_freq=5,
    )
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    rollbacks = [r for r in result.metrics if r["kind"] == "rollback"]
    assert [(r["step"], r["to_step"], r["skipped_batches"]) for r in rollbacks] == [
        (15, 10, 5),
        (15, 10, 10),
    ]
    assert all(r["reason"] == "2 consecutive non-finite steps" for r in rollbacks)
    logged = [(r["step"], r["skipped_updates"]) for r in result.train_records()]
    assert logged == [(5, 0), (10, 0), (15, 2), (15, 4), (15, 4), (20, 4)]
    # Up to the checkpoint, the uninterrupted run's losses; after, finite and still learning.
    expected = reference.losses()
    for record in result.train_records()[:2]:
        assert record["loss"] == pytest.approx(expected[record["step"]], rel=1e-5)
    final = result.train_records()[-1]
    assert math.isfinite(final["loss"]) and final["loss"] < expected[1] - 1.0
