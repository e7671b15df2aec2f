"""Run a stack's training job on this machine, for free, before it costs money on EKS.

    python3 scripts/dev.py local                  # the cheap `dev` stack
    python3 scripts/dev.py local llama31-8b-p5    # any stack under stacks/ (or a path)

It reads the stack file with the same config model (and so the same checks) the Pulumi program
and the offline plan use, renders the exact `torchrun ... -m trainer <args>` the PyTorchJob
would run, and rehearses the job's topology in miniature: one torchrun agent per node (at most
two), joined through the c10d rendezvous settings the job renders, all of them with one
directory playing where the job keeps the run (FSx, or its prefix in S3). The trainer is
scaled to this machine: the `tiny` model preset, a small corpus and tokenizer generated here
(no network), a short context, CPU processes with gloo (or this machine's GPUs), a few hundred
steps. The run is interrupted on purpose half way
(`--fail_at_step`) and started again with the *same* commands, which resume from the latest
checkpoint, as restarted pods do on the cluster. At the end it prints loss and throughput and
writes a loss plot (PNG).

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
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

from infra.config import StackConfigError  # noqa: E402
from infra.job.stack_checks import plan_stack_file  # noqa: E402
from scripts.cli.local_topology import (  # noqa: E402
    LocalAgent,
    LocalPlan,
    agent_command,
    agent_env,
    describe_topology,
    plan_local_run,
)

logger = logging.getLogger("local_run")

DEFAULT_STACK = "dev"
DEFAULT_OUT = REPO_ROOT / ".local-run"
AGENT_GRACE_S = 60
"""How long the other agents may take to notice that one failed before they are stopped."""


def local_devices(requested: str) -> tuple[str, int]:
    """(`cuda`, GPUs) when this machine has GPUs and they are wanted, else (`cpu`, 2)."""
    if requested != "cpu":
        import torch  # the local group has it; imported late so `--help` is instant

        if torch.cuda.is_available():
            return "cuda", torch.cuda.device_count()
        if requested == "cuda":
            raise SystemExit("--device cuda: torch sees no CUDA device on this machine")
    return "cpu", 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_log(plan: LocalPlan, agent: LocalAgent) -> Path:
    """Where a quiet launch writes agent `agent`'s output."""
    return plan.metrics_file.parent / f"node-{agent.index}" / "agent.log"


def run_agents(plan: LocalPlan, *, quiet: bool) -> int:
    """Launch every agent, wait for all; the first non-zero exit code, else 0.

    One failed agent ends the launch, as one failed pod fails the job: the others get
    AGENT_GRACE_S to see it (a broken collective) and are then stopped with SIGTERM, which
    torchrun's agent passes on to its workers.
    """
    endpoint = f"127.0.0.1:{_free_port()}"
    base_env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    processes: list[subprocess.Popen[bytes]] = []
    logs = []
    for agent in plan.agents:
        output: Any = None
        if quiet:
            log = agent_log(plan, agent)
            log.parent.mkdir(parents=True, exist_ok=True)
            output = log.open("ab")  # a relaunch appends, as `kubectl logs --previous` keeps
            logs.append(output)
        processes.append(
            subprocess.Popen(
                agent_command(plan, agent),
                cwd=REPO_ROOT,
                env={**base_env, **agent_env(plan, agent, endpoint=endpoint)},
                stdout=output,
                stderr=subprocess.STDOUT if quiet else None,
            )
        )
    try:
        return _wait_for_agents(processes)
    finally:
        for log_file in logs:
            log_file.close()


def _wait_for_agents(processes: list[subprocess.Popen[bytes]]) -> int:
    failed_at: float | None = None
    first_failure = 0
    while any(p.poll() is None for p in processes):
        codes = [p.returncode for p in processes if p.returncode not in (None, 0)]
        if codes and failed_at is None:
            failed_at, first_failure = time.monotonic(), codes[0]
        if failed_at is not None and time.monotonic() - failed_at > AGENT_GRACE_S:
            for process in processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            break
        time.sleep(0.2)
    codes = [p.returncode for p in processes if p.returncode not in (None, 0)]
    return first_failure or (codes[0] if codes else 0)


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


def _print_failure_logs(plan: LocalPlan) -> None:
    """After a quiet launch failed: the end of each agent's log (the trainer's error)."""
    for agent in plan.agents:
        log = agent_log(plan, agent)
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"--- node {agent.index}: {log} (last lines)\n" + "\n".join(tail))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[local] %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    if args.steps < 4:
        raise SystemExit("--steps must be at least 4 (checkpoint, interrupt, resume)")
    try:
        # The same parser and whole-stack checks as the plan and the Pulumi program, so a
        # stack they refuse stops here with the very message `scripts/cli/plan.py` prints.
        run = plan_stack_file(args.stack)
    except (StackConfigError, FileNotFoundError) as err:
        print(err, file=sys.stderr)
        return 2
    config = run.config
    stack_name = Path(args.stack).name.removeprefix("Pulumi.").removesuffix(".yaml")
    out_dir = args.out.resolve()
    # Each local run starts from scratch; only the generated corpus and tokenizer are reused.
    shutil.rmtree(out_dir / stack_name, ignore_errors=True)
    device, nproc = local_devices(args.device)
    plan = plan_local_run(
        run,
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
    print(f"Here, scaled to the {plan.preset!r} preset: {describe_topology(plan)}\n")
    print(
        f"The data is the generated tiny corpus and tokenizer, not {config.data.dataset!r} and "
        f"{config.data.tokenizer!r}: no download, no hfToken or other secret needed.\n"
    )
    print("  torchrun " + shlex.join([*agent_command(plan, plan.agents[0])[3:]]) + "\n")
    if len(plan.agents) > 1:
        print(f"  (and {len(plan.agents) - 1} more agent(s) like it, joining its rendezvous)\n")
    plan.metrics_file.unlink(missing_ok=True)

    code = run_agents(plan, quiet=args.quiet)
    if code == 0:
        print("The first launch finished before the planned interruption.")
    else:
        from trainer.checkpoint import find_latest

        latest = find_latest(plan.run_dir)
        print(
            f"\nFirst launch stopped at step {plan.fail_at_step} as planned (exit {code}); the "
            f"latest checkpoint is {Path(latest).name if latest else 'none'}. Starting the same "
            "commands again, as the operator restarts failed pods.\n"
        )
        code = run_agents(plan, quiet=args.quiet)
        if code != 0:
            if args.quiet:
                _print_failure_logs(plan)
            print(f"The resumed launch failed (exit {code}); see the trainer's output above.")
            return code

    records = read_metrics(plan.metrics_file)
    summary = summarise(records)
    png = plot_loss(
        records,
        plan.metrics_file.parent / "loss.png",
        title=(
            f"{stack_name}: {plan.preset} preset on {len(plan.agents)} node(s) x "
            f"{plan.agents[0].nproc} {device}"
        ),
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
