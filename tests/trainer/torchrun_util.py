"""Launch `python -m trainer` under torchrun on the CPU, the way a real job does, for tests."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.tiers import require_slow_tier
from trainer.tiny_assets import TinyAssets

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunResult:
    returncode: int
    output: str
    metrics: list[dict[str, Any]]

    def train_records(self) -> list[dict[str, Any]]:
        return [r for r in self.metrics if r.get("kind") == "train"]

    def losses(self) -> dict[int, float]:
        """Loss by step; for a step logged twice (a resumed run's replay), the last wins."""
        return {r["step"]: r["loss"] for r in self.train_records()}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun(nproc: int) -> list[str]:
    """`torchrun --standalone` of `nproc` processes on a free loopback port (this interpreter)."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        f"--master_port={free_port()}",
    ]


def tiny_args(assets: TinyAssets, **overrides: Any) -> list[str]:
    """Flags for a few-second CPU run of the tiny preset on the tiny corpus; `None` drops one."""
    values: dict[str, Any] = {
        "model": "tiny",
        "dataset": str(assets.corpus_dir),
        "tokenizer": str(assets.tokenizer_dir),
        "max_context_width": 64,
        "train_batch_size": 4,
        "max_steps": 20,
        "lr": 3e-3,
        "min_lr": 3e-4,
        "warmup": 2,
        "weight_decay": 0.0,
        "bf16": 0,
        "activation_checkpointing": 0,
        "logging_freq": 1,
        "digest_freq": 1,
        "seed": 1234,
        "device": "cpu",
        "progress_bar": 0,
    }
    values.update(overrides)
    argv: list[str] = []
    for name, value in values.items():
        if value is not None:
            argv += [f"--{name}", str(int(value) if isinstance(value, bool) else value)]
    return argv


def run_trainer(
    args: list[str],
    *,
    metrics_file: Path,
    nproc: int = 2,
    pass_metrics_file: bool = True,
    env: dict[str, str] | None = None,
    timeout: float = 180,
    appended_only: bool = False,
) -> RunResult:
    """Run `torchrun --nproc_per_node=nproc -m trainer ARGS`; reads back the JSONL metrics.

    `pass_metrics_file=False` leaves the metrics where the trainer puts them by default (the
    caller reads them); `metrics_file`'s directory still holds the datasets cache.
    `appended_only`: the records this launch added to a file earlier launches wrote (a restart
    appends to its run's file, as in a pod)."""
    require_slow_tier(f"torchrun with {nproc} trainer processes")
    command = [
        *torchrun(nproc),
        "-m",
        "trainer",
        *args,
        *(["--metrics_file", str(metrics_file)] if pass_metrics_file else []),
    ]
    full_env = {
        **os.environ,
        # One thread per rank: two ranks share two cores, more threads only contend.
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        # Tests never write Arrow copies of their corpora into the user's ~/.cache.
        "HF_DATASETS_CACHE": str(metrics_file.parent / "hf_datasets_cache"),
        "PYTHONPATH": str(REPO_ROOT),
        **(env or {}),
    }
    earlier = metrics_file.stat().st_size if appended_only and metrics_file.exists() else 0
    completed = subprocess.run(
        command,
        cwd=REPO_ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    metrics: list[dict[str, Any]] = []
    if metrics_file.exists():
        added = metrics_file.read_bytes()[earlier:].decode()
        metrics = [json.loads(line) for line in added.splitlines() if line]
    return RunResult(completed.returncode, completed.stdout + completed.stderr, metrics)


def run_torchrun_script(
    script: Path, *args: str, nproc: int = 2, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`torchrun --standalone --nproc_per_node=nproc SCRIPT ARGS` from the repository root, for
    tests that count what a few distributed steps do (collectives, timeouts)."""
    require_slow_tier(f"torchrun with {nproc} processes running {script.name}")
    return subprocess.run(
        [*torchrun(nproc), str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO_ROOT,
        # One thread per process: the ranks share the machine's cores.
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
