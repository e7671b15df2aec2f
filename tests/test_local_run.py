"""The README's first command: a stack's job, scaled to this machine, interrupted and resumed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import load_stack_file
from scripts import local_run
from trainer.config import parse_args

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_local_plan_keeps_the_stacks_choices_and_scales_the_rest(tmp_path: Path) -> None:
    config = load_stack_file("llama31-8b-p5")
    plan = local_run.plan_local_run(
        config,
        "llama31-8b-p5",
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=40,
        context=64,
        batch_size=4,
        device="cpu",
        nproc=2,
    )
    cluster = parse_args(plan.cluster_command[5:])
    local = parse_args(plan.local_args)
    assert cluster.model.preset_name == "llama3.1-8b"
    assert cluster.model.max_context_width == 8192
    assert local.model.preset_name == "tiny"
    assert local.model.max_context_width == 64
    assert local.data.tokenizer == str(tmp_path / "assets" / "tokenizer")
    assert local.parallel.device == "cpu" and not local.parallel.bf16
    # What the stack decides and a laptop can honour is kept.
    assert local.parallel.sharding_strategy == cluster.parallel.sharding_strategy
    assert local.optim.lr_decay_style == cluster.optim.lr_decay_style
    # A checkpoint exists before the interruption, and the interruption is not on one.
    every = local.checkpoint.checkpoint_freq
    assert every <= plan.fail_at_step < local.optim.max_steps
    assert plan.fail_at_step % every != 0
    assert local.checkpoint.resume_from_checkpoint == local.checkpoint.checkpoint_dir


def test_mixture_of_experts_stacks_run_the_tiny_moe_locally(tmp_path: Path) -> None:
    plan = local_run.plan_local_run(
        load_stack_file("mixtral-8x7b-p5"),
        "mixtral-8x7b-p5",
        out_dir=tmp_path,
        assets_dir=tmp_path / "assets",
        steps=20,
        context=64,
        batch_size=2,
        device="cpu",
        nproc=2,
    )
    assert parse_args(plan.local_args).model.shape().num_local_experts > 0


def test_local_run_needs_no_pulumi() -> None:
    code = (
        "import sys; import scripts.local_run; "
        "bad = [m for m in ('pulumi', 'pulumi_aws', 'pulumi_kubernetes') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_local_run_trains_is_interrupted_resumes_and_plots(tmp_path: Path) -> None:
    code = local_run.main(
        ["dev", "--steps", "12", "--context", "32", "--batch-size", "4", "--device", "cpu",
         "--quiet", "--out", str(tmp_path)]
    )  # fmt: skip
    assert code == 0
    run = tmp_path / "dev"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    steps = [r["step"] for r in train]
    assert steps[-1] == 12
    summary = local_run.summarise(records)
    assert summary.resumed, steps  # the restart replayed steps after the last checkpoint
    assert summary.last_loss < summary.first_loss
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-10", "step-12"]
