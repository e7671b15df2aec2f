"""The trainer's configuration line is logged at a run's first start only (issue 28 item 14:
the local rehearsal printed the ~2,000-character config JSON once per launch): a restart of the
same run runs the same flags, which name its run directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer.torchrun_util import run_trainer, tiny_args
from trainer.tiny_assets import TinyAssets

# Two torchrun launches: the full tier only (tests/tiers.py).
pytestmark = pytest.mark.slow


def test_a_restart_does_not_log_the_config_again(tiny_assets: TinyAssets, tmp_path: Path) -> None:
    checkpoint_dir = tmp_path / "ckpt"
    args = tiny_args(
        tiny_assets,
        max_steps=4,
        checkpoint_dir=str(checkpoint_dir),
        resume_from_checkpoint=str(checkpoint_dir),
        checkpoint_freq=2,
        fail_at_step=3,
        max_context_width=16,
        train_batch_size=2,
    )
    metrics = tmp_path / "metrics.jsonl"
    first = run_trainer(args, metrics_file=metrics, nproc=1)
    assert first.returncode != 0 and "--fail_at_step 3: exiting abruptly" in first.output
    second = run_trainer(args, metrics_file=metrics, nproc=1)
    assert second.returncode == 0, second.output[-3000:]
    assert first.output.count("] config: {") == 1
    assert "] config: {" not in second.output
    assert "] config: as at start 1 (the run line of the metrics file holds it)" in second.output
    runs = [r for r in second.metrics if r.get("kind") == "run"]
    assert [r["start"]["attempt"] for r in runs] == [1, 2]
    assert runs[0]["config"] == runs[1]["config"]  # the metrics file keeps it at every start
