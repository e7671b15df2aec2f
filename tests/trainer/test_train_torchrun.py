"""The trainer end to end: `torchrun --nproc_per_node=2 -m trainer` on the CPU with gloo.

Each launch costs seconds of process start-up, so one run carries many assertions: the
reference run checks learning, data sharding, context width, stopping, validation and export;
a crashed-and-restarted pair checks resuming against it; one short run per other strategy.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import torch

from tests.s3_server import moto_server_endpoint, s3_environment
from tests.trainer.torchrun_util import RunResult, run_trainer, tiny_args
from trainer.tiny_assets import TinyAssets

pytestmark = pytest.mark.slow

MAX_STEPS = 20
CHECKPOINT_FREQ = 10
FAIL_AT_STEP = 13
SEQ_LEN = 64
S3_BUCKET = "fsdp-eks-torchrun-test"
DISK_FULL_BUCKET = "fsdp-eks-disk-full-test"


def reference_args(assets: TinyAssets, checkpoint_dir: Path, **extra: Any) -> list[str]:
    return tiny_args(
        assets,
        max_steps=MAX_STEPS,
        max_context_width=SEQ_LEN,
        checkpoint_dir=checkpoint_dir,
        resume_from_checkpoint=checkpoint_dir,
        checkpoint_freq=CHECKPOINT_FREQ,
        validation_freq=CHECKPOINT_FREQ,
        validation_batches=2,
        val_batch_size=2,
        **extra,
    )


@pytest.fixture(scope="module")
def reference_run(tiny_assets: TinyAssets, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An uninterrupted 20-step run with checkpoints, validation and an export."""
    root = tmp_path_factory.mktemp("reference")
    args = reference_args(tiny_assets, root / "ckpt", export_dir=root / "export")
    result = run_trainer(args, metrics_file=root / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    return root, result


def _steps_logged(result: RunResult) -> list[int]:
    return [r["step"] for r in result.train_records()]


def test_reference_run_learns_shards_data_and_stops_exactly(reference_run: Any) -> None:
    root, result = reference_run
    records = result.train_records()
    # Stops at exactly --max_steps, having logged every step (--logging_freq 1).
    assert _steps_logged(result) == list(range(1, MAX_STEPS + 1))
    # The loss is finite from the first step (initialised weights) and falls clearly.
    losses = [r["loss"] for r in records]
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(512), rel=0.1)  # uniform over the tiny vocab
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0
    for record in records:
        # Sequences are exactly the context width.
        assert record["micro_batch_shape"] == [4, SEQ_LEN]
        # The two ranks read different batches at every step.
        first, second = record["batch_digests"]
        assert first != second
    # And no rank ever sees the same batch twice in this short run.
    digests = [d for r in records for d in r["batch_digests"]]
    assert len(set(digests)) == len(digests)
    # The log line keeps the seed's prefix, on rank 0 only.
    assert "Batch 20 Loss: " in result.output
    assert result.output.count("Batch 20 Loss: ") == 1
    assert "samples/sec, lr: " in result.output
    # Checkpoints every --checkpoint_freq steps, the last one being the final step.
    complete = sorted(p.name for p in (root / "ckpt").glob("step-*") if (p / "COMPLETE").exists())
    assert complete == ["step-10", "step-20"]
    validations = [r for r in result.metrics if r["kind"] == "validation"]
    assert [v["step"] for v in validations] == [10, 20]
    # The metrics file opens with the run's whole configuration.
    run = result.metrics[0]
    assert (run["kind"], run["world_size"], run["resumed_from"]) == ("run", 2, None)
    assert run["config"]["model"]["max_context_width"] == SEQ_LEN
    assert validations[1]["val_loss"] < validations[0]["val_loss"]


def test_export_loads_in_transformers_with_the_trained_logits(
    reference_run: Any, tiny_assets: TinyAssets
) -> None:
    """The exported model reproduces the trainer's own final validation loss."""
    from transformers import AutoModelForCausalLM

    from trainer.config import DataConfig
    from trainer.data import build_val_loader, load_tokenizer

    root, result = reference_run
    model = AutoModelForCausalLM.from_pretrained(root / "export")
    model.eval()
    tokenizer = load_tokenizer(str(root / "export"))
    per_rank = []
    for rank in range(2):
        data = DataConfig(
            dataset=str(tiny_assets.corpus_dir), dataset_config_name=None, val_batch_size=2
        )
        batches = build_val_loader(
            data,
            tokenizer=tokenizer,
            seq_len=SEQ_LEN,
            max_batches=2,
            dp_rank=rank,
            dp_world_size=2,
            seed=1234,
        )
        with torch.no_grad():
            losses = [float(model(**batch).loss) for batch in batches]
        per_rank.append(sum(losses) / len(losses))
    final_val = [r for r in result.metrics if r["kind"] == "validation"][-1]
    assert final_val["step"] == MAX_STEPS
    assert sum(per_rank) / 2 == pytest.approx(final_val["val_loss"], rel=1e-4)


def test_crash_and_restart_resumes_and_reproduces_the_losses(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    _, reference = reference_run
    checkpoint_dir = tmp_path / "ckpt"
    args = reference_args(tiny_assets, checkpoint_dir, fail_at_step=FAIL_AT_STEP)

    crashed = run_trainer(args, metrics_file=tmp_path / "first.jsonl")
    assert crashed.returncode != 0
    assert "--fail_at_step 13: exiting abruptly" in crashed.output
    assert _steps_logged(crashed) == list(range(1, FAIL_AT_STEP + 1))
    # A save that died half-way: the step dir exists but was never marked complete.
    shutil.copytree(checkpoint_dir / "step-10", checkpoint_dir / "step-12")
    (checkpoint_dir / "step-12" / "COMPLETE").unlink()
    (checkpoint_dir / ".tmp-step-13").mkdir()

    resumed = run_trainer(args, metrics_file=tmp_path / "second.jsonl")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert f"resumed from {checkpoint_dir / 'step-10'} at step 10" in resumed.output
    assert _steps_logged(resumed) == list(range(11, MAX_STEPS + 1))
    assert resumed.metrics[0]["resumed_from"] == str(checkpoint_dir / "step-10")
    expected = reference.losses()
    for step, loss in resumed.losses().items():
        assert loss == pytest.approx(expected[step], rel=1e-5), step
    # The steps 11..13 the crashed run had already taken match too (same data, same RNG).
    for step in range(11, FAIL_AT_STEP + 1):
        assert crashed.losses()[step] == pytest.approx(expected[step], rel=1e-5)
    assert (checkpoint_dir / "step-20" / "COMPLETE").exists()

    # The newest complete checkpoint's shard of rank 1 is cut short: the next start names it,
    # sets it aside and resumes from step 10, with the losses of the run resumed from there.
    _truncate(checkpoint_dir / "step-20" / "__1_0.distcp")
    fallback = run_trainer(args, metrics_file=tmp_path / "third.jsonl")
    assert fallback.returncode == 0, fallback.output[-4000:]
    _assert_set_aside_and_resumed(fallback, str(checkpoint_dir / "step-20"), str(checkpoint_dir))
    [aside] = checkpoint_dir.glob("step-20.unreadable-*")
    assert (aside / "COMPLETE").is_file() and (aside / "__1_0.distcp").is_file()
    assert _steps_logged(fallback) == list(range(11, MAX_STEPS + 1))
    assert fallback.losses() == resumed.losses()
    assert (checkpoint_dir / "step-20" / "COMPLETE").exists()  # saved again


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


@pytest.fixture(scope="module")
def s3_env() -> Iterator[dict[str, str]]:
    """moto's S3 server and the environment that points a trainer process at it."""
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


def test_a_non_finite_step_is_skipped_on_every_rank_and_training_goes_on(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """Only the last rank's loss at step 5 is NaN; FSDP's gradient reduction spreads it to
    every rank's shard, the global norm is NaN everywhere, and every rank skips that update.
    Applied, it would make every later loss NaN."""
    _, reference = reference_run
    args = reference_args(tiny_assets, tmp_path / "ckpt", nan_at_step=5)
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    records = {r["step"]: r for r in result.train_records()}
    assert math.isnan(records[5]["loss"])
    assert all(math.isfinite(records[s]["loss"]) for s in range(6, MAX_STEPS + 1))
    assert [records[s]["skipped_updates"] for s in range(1, MAX_STEPS + 1)] == [0] * 4 + [1] * 16
    assert "step 5: 1 update(s) skipped for a non-finite gradient norm" in result.output
    expected = reference.losses()
    for step in range(1, 5):
        assert records[step]["loss"] == pytest.approx(expected[step], rel=1e-5)
    # Step 6 trains from the weights after step 4, as if step 5's batch had not been seen.
    assert records[MAX_STEPS]["loss"] < records[1]["loss"] - 1.0


def test_a_stalled_rank_ends_in_a_stack_dump_and_the_restart_resumes(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """The last rank stops making progress after step 13; every rank's watchdog fires once
    no step has ended for its floor (15 s, far above a step or a save here), dumps stacks and
    exits 142; the restart resumes from step 10 and reproduces the uninterrupted losses."""
    _, reference = reference_run
    checkpoint_dir = tmp_path / "ckpt"
    watchdog = {"watchdog_factor": 3, "watchdog_floor_s": 15}
    args = reference_args(tiny_assets, checkpoint_dir, stall_at_step=FAIL_AT_STEP, **watchdog)
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


def test_a_failing_preflight_check_exits_before_step_1_with_one_line(
    tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    args = reference_args(tiny_assets, tmp_path / "ckpt", preflight_fail_check="efa")
    failed = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert failed.returncode != 0 and "exitcode  : 140" in failed.output
    # One line per rank, the same on both: the last rank's failure.
    line = re.search(r"trainer: preflight failed: node \S+ rank 1: efa: [^\n]*", failed.output)
    assert line is not None
    assert line.group(0).endswith("rank 1: efa: injected by --preflight_fail_check")
    assert failed.output.count("trainer: preflight failed: node ") == 2
    # No trace from the trainer (torchrun still prints its own ChildFailedError report).
    assert "PreflightError" not in failed.output and "trainer/train.py" not in failed.output
    assert failed.train_records() == []

    warned = run_trainer(
        [*args, "--preflight", "warn", "--max_steps", "2"],
        metrics_file=tmp_path / "warned.jsonl",
    )
    assert warned.returncode == 0, warned.output[-3000:]
    assert "preflight failed: node " in warned.output
    assert _steps_logged(warned) == [1, 2]


def test_consecutive_non_finite_steps_roll_back_past_the_bad_data(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """Steps 12 and 13 are NaN: both skipped, then (2 in a row) every rank reloads step 10 and
    skips the batches of steps 11-13, so the next step trains on what was step 14's batch."""
    _, reference = reference_run
    args = reference_args(
        tiny_assets, tmp_path / "ckpt", nan_at_step=12, nan_steps=2, rollback_after_nonfinite=2
    )
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    [rollback] = [r for r in result.metrics if r["kind"] == "rollback"]
    assert (rollback["step"], rollback["to_step"], rollback["skipped_batches"]) == (13, 10, 3)
    assert "2 consecutive non-finite steps: rolled back to step 10" in result.output
    records = result.train_records()
    after = records[[r["step"] for r in records].index(13) + 1 :]
    assert [r["step"] for r in after] == list(range(11, MAX_STEPS + 1))
    expected = {r["step"]: r for r in reference.train_records()}
    # The same batches as the uninterrupted run, three steps further on.
    assert after[0]["batch_digests"] == expected[14]["batch_digests"]
    assert all(math.isfinite(r["loss"]) for r in after)


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


def test_resume_on_another_world_size_with_the_flag(
    reference_run: Any, tiny_assets: TinyAssets, tmp_path: Path
) -> None:
    """Two ranks wrote the checkpoint; one rank resumes it (weights and optimizer reshard)."""
    root, reference = reference_run
    args = tiny_args(
        tiny_assets,
        max_steps=MAX_STEPS + 2,
        max_context_width=SEQ_LEN,
        checkpoint_dir=tmp_path / "ckpt",
        resume_from_checkpoint=root / "ckpt",
        allow_world_size_change=1,
    )
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl", nproc=1)
    assert result.returncode == 0, result.output[-4000:]
    assert f"resumed from {root / 'ckpt' / f'step-{MAX_STEPS}'} at step {MAX_STEPS}" in (
        result.output
    )
    assert "was written by 2 ranks but this run has 1" in result.output
    records = result.train_records()
    assert [r["step"] for r in records] == [MAX_STEPS + 1, MAX_STEPS + 2]
    # It continues from the trained weights, not from a fresh model's ln(512) ~ 6.2.
    assert records[0]["loss"] < reference.losses()[MAX_STEPS] + 0.5


@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        # Two ranks as two "nodes" of one: the replicate dimension is 2, so gradients are
        # all-reduced across replicas as in a multi-node HSDP job.
        (
            "hybrid",
            {"hsdp_shard_size": 1, "bf16": 1, "activation_checkpointing": 1, "model": "tiny-moe"},
        ),
        # Fine-tunes the reference run's export: pretrained weights read into real shards.
        (
            "shard_grad_op",
            {
                "activation_checkpointing": "selective",
                "ac_every": 2,
                "cpu_offload": 1,
                "model": None,
                "tokenizer": None,  # defaults to the --init_from directory's tokenizer
            },
        ),
        (
            "no_shard",
            {"gradient_accumulation_steps": 2, "tie_word_embeddings": 1, "progress_bar": 1},
        ),
    ],
)
def test_every_sharding_strategy_trains(
    strategy: str,
    extra: dict[str, Any],
    tiny_assets: TinyAssets,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    # The side features ride along with one strategy each, to keep the number of launches down.
    if strategy == "hybrid":
        extra = {**extra, "tensorboard_dir": tmp_path / "tb", "export_dir": tmp_path / "export"}
    pretrained = strategy == "shard_grad_op"
    if pretrained:
        reference_root, reference = request.getfixturevalue("reference_run")
        extra = {**extra, "init_from": reference_root / "export"}
    args = tiny_args(tiny_assets, sharding_strategy=strategy, max_steps=8, logging_freq=4, **extra)
    result = run_trainer(args, metrics_file=tmp_path / "metrics.jsonl")
    assert result.returncode == 0, result.output[-4000:]
    assert f"strategy={strategy}" in result.output
    if strategy in ("hybrid", "no_shard"):
        assert "mesh={'replicate': 2, 'shard': 1}" in result.output
        assert "replicas identical across the 2-way replicate dimension" in result.output
    records = result.train_records()
    assert [r["step"] for r in records] == [4, 8]
    assert all(math.isfinite(r["loss"]) for r in records)
    assert records[-1]["loss"] < math.log(512) - 0.3
    assert records[0]["batch_digests"][0] != records[0]["batch_digests"][1]
    if strategy == "hybrid":
        assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
        # A bf16 run exports the bf16 weights its forward used, not the fp32 master copy.
        exported = json.loads((tmp_path / "export" / "config.json").read_text())
        assert exported["dtype"] == "bfloat16"
    if "cpu_offload" in extra:
        assert "cpu_offload=True" in result.output
    if pretrained:
        assert "loaded pretrained weights from" in result.output
        # It starts where the reference run ended, far below a fresh model's ~6.2.
        final_reference_loss = reference.losses()[MAX_STEPS]
        assert records[0]["loss"] < final_reference_loss + 0.5
    if "progress_bar" in extra:
        assert re.search(r"100%\|.*\| 8/8 \[", result.output), result.output[-2000:]
