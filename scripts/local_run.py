"""Run a stack's training job on this machine, for free, before it costs money on EKS.

    python3 scripts/dev.py local                  # the cheap `dev` stack
    python3 scripts/dev.py local llama31-8b-p5    # any stack under stacks/ (or a path)

It reads the stack file with the same config model the Pulumi program uses, renders the exact
`torchrun ... -m trainer <args>` the PyTorchJob would run, and scales it to this machine: the
`tiny` model preset, a small corpus and tokenizer generated here (no network), a short context,
CPU processes with gloo (or this machine's GPUs), a few hundred steps. The run is interrupted
on purpose half way (`--fail_at_step`) and started again with the *same* command, which resumes
from the latest checkpoint, as a restarted pod does on the cluster. At the end it prints loss
and throughput and writes a loss plot (PNG).

Needs only the `local` dependency group (torch, transformers, datasets, matplotlib, pydantic,
pyyaml): no pulumi, no AWS credentials.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from infra.config import StackConfig, load_stack_file  # noqa: E402
from infra.job_args import run_paths, torchrun_command, trainer_flags  # noqa: E402
from trainer.config import format_args, parse_args  # noqa: E402

logger = logging.getLogger("local_run")

DEFAULT_STACK = "dev"
DEFAULT_OUT = REPO_ROOT / ".local-run"

# What a laptop can do in a few minutes on two CPU cores: a ~1M-parameter model, short
# sequences, a learning rate a tiny model learns quickly with.
LOCAL_OVERRIDES: dict[str, Any] = {
    "num_layers": None,
    "hidden_width": None,
    "num_heads": None,
    "num_key_value_heads": None,
    "intermediate_size": None,
    "vocab_size": None,
    "init_from": None,
    "attn_implementation": "sdpa",
    "dataset_config_name": "",
    "text_column": "text",
    "num_workers": 0,
    "gradient_accumulation_steps": 1,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "weight_decay": 0.0,
    "activation_checkpointing": False,
    "compile": False,
    "cpu_offload": False,
    "validation_freq": 0,
    "export_dir": None,
    "tensorboard_dir": None,
    "progress_bar": False,
}


@dataclass(frozen=True)
class LocalPlan:
    """The stack's cluster command and the scaled command this machine runs instead."""

    stack_name: str
    cluster_command: list[str]
    local_args: list[str]
    nproc: int
    device: str
    run_dir: Path
    metrics_file: Path
    fail_at_step: int
    max_steps: int
    preset: str


def local_devices(requested: str) -> tuple[str, int]:
    """(`cuda`, GPUs) when this machine has GPUs and they are wanted, else (`cpu`, 2)."""
    if requested != "cpu":
        import torch  # the local group has it; imported late so `--help` is instant

        if torch.cuda.is_available():
            return "cuda", torch.cuda.device_count()
        if requested == "cuda":
            raise SystemExit("--device cuda: torch sees no CUDA device on this machine")
    return "cpu", 2


def plan_local_run(
    config: StackConfig,
    stack_name: str,
    *,
    out_dir: Path,
    assets_dir: Path,
    steps: int,
    context: int,
    batch_size: int,
    device: str,
    nproc: int,
) -> LocalPlan:
    """Scale the stack's trainer flags to this machine, keeping everything else it sets."""
    from trainer.tiny_assets import ensure_tiny_assets

    cluster_command = torchrun_command(config, run_paths(config))
    assets = ensure_tiny_assets(assets_dir)
    run_dir = out_dir / stack_name / "checkpoints"
    metrics_file = out_dir / stack_name / "metrics.jsonl"
    checkpoint_every = max(1, steps // 5)
    # Interrupt half way between two checkpoints, so the restart visibly replays a few steps.
    fail_at = (steps // 2 // checkpoint_every) * checkpoint_every + max(1, checkpoint_every // 2)
    flags = {
        **trainer_flags(config),
        **LOCAL_OVERRIDES,
        # The same kind of model at debug size: mixture-of-experts stacks get the tiny MoE.
        "model": "tiny-moe" if config.model_shape().num_local_experts else "tiny",
        "dataset": str(assets.corpus_dir),
        "tokenizer": str(assets.tokenizer_dir),
        "max_context_width": min(context, config.training.context_width),
        "train_batch_size": batch_size,
        "max_steps": steps,
        "warmup": max(1, steps // 20),
        "checkpoint_freq": checkpoint_every,
        "keep_last_checkpoints": 2,
        "logging_freq": max(1, steps // 30),
        "checkpoint_dir": str(run_dir),
        "resume_from_checkpoint": str(run_dir),
        "metrics_file": str(metrics_file),
        "fail_at_step": fail_at,
        "device": device,
        "bf16": device == "cuda" and config.training.bf16,
    }
    if config.training.sharding_strategy == "hybrid":
        flags["hsdp_shard_size"] = nproc  # one "node": this machine
    else:
        flags["hsdp_shard_size"] = None
    args = format_args(flags)
    parse_args(args)  # the scaled command must still be one the trainer accepts
    return LocalPlan(
        stack_name=stack_name,
        cluster_command=cluster_command,
        local_args=args,
        nproc=nproc,
        device=device,
        run_dir=run_dir,
        metrics_file=metrics_file,
        fail_at_step=fail_at,
        max_steps=steps,
        preset=str(flags["model"]),
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_torchrun(plan: LocalPlan, *, quiet: bool) -> int:
    """One `torchrun --standalone` launch of the scaled command; returns its exit code."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={plan.nproc}",
        f"--master_port={_free_port()}",
        "-m",
        "trainer",
        *plan.local_args,
    ]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    output = subprocess.DEVNULL if quiet else None
    completed = subprocess.run(
        command, cwd=REPO_ROOT, env=env, stdout=output, stderr=output, check=False
    )
    return completed.returncode


def read_metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class RunSummary:
    first_loss: float
    last_loss: float
    last_step: int
    resumed: bool
    mean_tokens_per_sec: float
    mean_samples_per_sec: float


def summarise(records: list[dict[str, Any]]) -> RunSummary:
    train = [r for r in records if r.get("kind") == "train"]
    if not train:
        raise SystemExit("the run wrote no training metrics; see the trainer's output above")
    steps = [r["step"] for r in train]
    # The resumed run logs steps the first run already logged: the step sequence goes back.
    resumed = any(b <= a for a, b in itertools.pairwise(steps))
    steady = train[1:] or train
    return RunSummary(
        first_loss=train[0]["loss"],
        last_loss=train[-1]["loss"],
        last_step=train[-1]["step"],
        resumed=resumed,
        mean_tokens_per_sec=sum(r["tokens_per_sec"] for r in steady) / len(steady),
        mean_samples_per_sec=sum(r["samples_per_sec"] for r in steady) / len(steady),
    )


def plot_loss(records: list[dict[str, Any]], out: Path, *, title: str, fail_at: int) -> Path:
    """Loss over steps, the two launches in two colours, the interruption marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if r.get("kind") == "train"]
    runs: list[list[dict[str, Any]]] = [[]]
    for record in train:
        if runs[-1] and record["step"] <= runs[-1][-1]["step"]:
            runs.append([])
        runs[-1].append(record)
    figure, axis = plt.subplots(figsize=(8, 4.5))
    for index, run in enumerate(runs):
        label = "first launch" if index == 0 else "after restart (resumed)"
        axis.plot([r["step"] for r in run], [r["loss"] for r in run], label=label)
    if fail_at:
        axis.axvline(fail_at, color="grey", linestyle="--", label=f"interrupted at {fail_at}")
    axis.set_xlabel("step")
    axis.set_ylabel("training loss")
    axis.set_title(title)
    axis.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "stack",
        nargs="?",
        default=DEFAULT_STACK,
        help=f"stack name under stacks/ or a stack file path (default: {DEFAULT_STACK})",
    )
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps (default 300)")
    parser.add_argument("--context", type=int, default=128, help="tokens per sequence (max)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per process")
    parser.add_argument(
        "--device",
        choices=["auto", "cpu", "cuda"],
        default="auto",
        help="auto: this machine's GPUs if any, else 2 CPU processes with gloo",
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    parser.add_argument(
        "--quiet", action="store_true", help="hide the trainer's own output (tests)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[local] %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.steps < 4:
        raise SystemExit("--steps must be at least 4 (checkpoint, interrupt, resume)")
    config = load_stack_file(args.stack)
    stack_name = Path(args.stack).name.removeprefix("Pulumi.").removesuffix(".yaml")
    out_dir = args.out.resolve()
    # Each local run starts from scratch; only the generated corpus and tokenizer are reused.
    shutil.rmtree(out_dir / stack_name, ignore_errors=True)
    device, nproc = local_devices(args.device)
    plan = plan_local_run(
        config,
        stack_name,
        out_dir=out_dir,
        assets_dir=out_dir / "tiny-assets",
        steps=args.steps,
        context=args.context,
        batch_size=args.batch_size,
        device=device,
        nproc=nproc,
    )
    print(f"Stack {stack_name!r}: on EKS each of {config.gpu_nodes.count} node(s) runs\n")
    print("  " + shlex.join(plan.cluster_command) + "\n")
    print(f"Here: {nproc} process(es) on {device}, scaled to the {plan.preset!r} preset:\n")
    print(
        "  torchrun --standalone "
        + f"--nproc_per_node={nproc} -m trainer "
        + shlex.join(plan.local_args)
        + "\n"
    )
    plan.metrics_file.unlink(missing_ok=True)

    code = run_torchrun(plan, quiet=args.quiet)
    if code == 0:
        print("The first launch finished before the planned interruption.")
    else:
        from trainer.checkpoint import find_latest

        latest = find_latest(plan.run_dir)
        print(
            f"\nFirst launch stopped at step {plan.fail_at_step} as planned (exit {code}); the "
            f"latest checkpoint is {latest.name if latest else 'none'}. Starting the same "
            "command again, as the operator restarts a failed pod.\n"
        )
        code = run_torchrun(plan, quiet=args.quiet)
        if code != 0:
            print(f"The resumed launch failed (exit {code}); see the trainer's output above.")
            return code

    records = read_metrics(plan.metrics_file)
    summary = summarise(records)
    png = plot_loss(
        records,
        plan.metrics_file.parent / "loss.png",
        title=f"{stack_name}: {plan.preset} preset on {nproc} x {device}",
        fail_at=plan.fail_at_step,
    )
    print(
        f"\nDone: {summary.last_step} steps, loss {summary.first_loss:.3f} -> "
        f"{summary.last_loss:.3f}, {summary.mean_tokens_per_sec:,.0f} tokens/s "
        f"({summary.mean_samples_per_sec:.1f} samples/s), resumed after the interruption: "
        f"{'yes' if summary.resumed else 'no'}"
    )
    print(f"Checkpoints: {plan.run_dir}\nMetrics:     {plan.metrics_file}\nLoss plot:   {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
