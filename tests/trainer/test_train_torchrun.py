"""The trainer end to end: `torchrun --nproc_per_node=2 -m trainer` on the CPU with gloo.

Each launch costs seconds of process start-up, so one run carries many assertions: the
reference run checks learning, data sharding, context width, stopping, validation and export;
a crashed-and-restarted pair checks resuming against it; one short run per other strategy.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer.torchrun_util import run_trainer, tiny_args
from tests.trainer.train_torchrun_common import (
    FAIL_AT_STEP,
    MAX_STEPS,
    SEQ_LEN,
    _assert_set_aside_and_resumed,
    _steps_logged,
    _truncate,
    reference_args,
)
from trainer.tiny_assets import TinyAssets

pytestmark = pytest.mark.slow


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

    # One metrics file across the three starts, as a pod's run directory keeps it.
    metrics = tmp_path / "metrics.jsonl"
    crashed = run_trainer(args, metrics_file=metrics, appended_only=True)
    assert crashed.returncode != 0
    assert "--fail_at_step 13: exiting abruptly" in crashed.output
    assert _steps_logged(crashed) == list(range(1, FAIL_AT_STEP + 1))
    # A save that died half-way: the step dir exists but was never marked complete.
    shutil.copytree(checkpoint_dir / "step-10", checkpoint_dir / "step-12")
    (checkpoint_dir / "step-12" / "COMPLETE").unlink()
    (checkpoint_dir / ".tmp-step-13").mkdir()

    resumed = run_trainer(args, metrics_file=metrics, appended_only=True)
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
    fallback = run_trainer(args, metrics_file=metrics, appended_only=True)
    assert fallback.returncode == 0, fallback.output[-4000:]
    _assert_set_aside_and_resumed(fallback, str(checkpoint_dir / "step-20"), str(checkpoint_dir))
    [aside] = checkpoint_dir.glob("step-20.unreadable-*")
    assert (aside / "COMPLETE").is_file() and (aside / "__1_0.distcp").is_file()
    assert _steps_logged(fallback) == list(range(11, MAX_STEPS + 1))
    assert fallback.losses() == resumed.losses()
    assert (checkpoint_dir / "step-20" / "COMPLETE").exists()  # saved again

    # The configuration is logged at the first start only (issue 28 item 14); each restart
    # points at the run line, which the metrics file keeps at every start.
    assert crashed.output.count("] config: {") == 1
    for restart in (resumed, fallback):
        assert "] config: {" not in restart.output
        assert "] config: as at start 1 (the run line of the metrics file holds it)" in (
            restart.output
        )
    starts = (crashed, resumed, fallback)
    runs = [next(r for r in start.metrics if r["kind"] == "run") for start in starts]
    assert [r["start"]["attempt"] for r in runs] == [1, 2, 3]
    assert runs[0]["config"] == runs[1]["config"] == runs[2]["config"]


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
    # With `--preflight warn` the same failure is logged and the run trains: the no_shard
    # case of test_every_sharding_strategy_trains carries that launch.


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
        # A failed preflight check under `--preflight warn` is logged, and the run trains.
        (
            "no_shard",
            {
                "gradient_accumulation_steps": 2,
                "tie_word_embeddings": 1,
                "progress_bar": 1,
                "preflight": "warn",
                "preflight_fail_check": "efa",
            },
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
    if extra.get("preflight") == "warn":
        assert "preflight failed: node " in result.output
        assert "rank 1: efa: injected by --preflight_fail_check" in result.output
