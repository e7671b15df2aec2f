"""`fsdp-eks local`: a stack's training run on this machine, for free, before it costs money.

The same config model and the exact rendered `torchrun ... -m trainer` command, scaled to this
machine (`tiny` preset, generated corpus, at most two agents), interrupted half way on purpose
and resumed from the checkpoint. Needs only the `local` dependency group: no pulumi, no AWS.
What it rehearses, step by step: docs/design/cli.md#local
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import click

from scripts.cli.support.errors import CliError, CommandFailedError
from scripts.cli.support.stacks import name_of, stack_arguments

if TYPE_CHECKING:
    from scripts.cli.support.local_topology import LocalAgent, LocalPlan

REPO_ROOT = Path(__file__).resolve().parents[2]

logger = logging.getLogger("local_run")

DEFAULT_STACK = "dev"
DEFAULT_OUT = REPO_ROOT / ".local-run"
RUN_MARKER = ".fsdp-eks-local"
"""Written into each run folder `local` makes; a folder is removed for a fresh run only if it
has one, so `--out` naming a folder of the user's never loses what is in it."""
AGENT_GRACE_S = 60
"""How long the other agents may take to notice that one failed before they are stopped."""


PREVIOUS_PREFIX = "previous-"
"""The figures of the run before, kept in the new run's folder under this prefix."""


def fresh_run_root(out_dir: Path, stack_name: str) -> Path:
    """`out_dir/<stack>`, emptied for a new run: a folder an earlier run of this command made
    (its `RUN_MARKER`, or anywhere under the repository's own `.local-run/`) is removed, any
    other one is refused in one line. The last run's figures (`loss.png`, a `plot` of its
    metrics) stay, as `previous-<name>.png`: a re-run is not the place to lose them."""
    from scripts.cli.support.local_topology import local_run_root

    run_root = local_run_root(out_dir, stack_name)
    if run_root.exists() or run_root.is_symlink():
        ours = not run_root.is_symlink() and (
            (run_root / RUN_MARKER).is_file() or out_dir == DEFAULT_OUT.resolve()
        )
        if not ours:
            raise CliError(
                f"--out {out_dir}: {run_root} exists and was not made by `fsdp-eks local` (no "
                f"{RUN_MARKER} in it), so it is not removed: pass another --out, or remove it"
            )
        figures = {
            png.name.removeprefix(PREVIOUS_PREFIX): png.read_bytes()
            for png in sorted(run_root.glob("*.png"))
            if not png.name.startswith(PREVIOUS_PREFIX)
        }
        shutil.rmtree(run_root)
    else:
        figures = {}
    run_root.mkdir(parents=True)
    for name, data in figures.items():
        (run_root / f"{PREVIOUS_PREFIX}{name}").write_bytes(data)
    (run_root / RUN_MARKER).write_text("made by `fsdp-eks local`; its next run removes it\n")
    return run_root


def local_devices(requested: str) -> tuple[str, int]:
    """(`cuda`, GPUs) when this machine has GPUs and they are wanted, else (`cpu`, 2)."""
    if requested != "cpu":
        import torch  # the local group has it; imported late so `--help` is instant

        if torch.cuda.is_available():
            return "cuda", torch.cuda.device_count()
        if requested == "cuda":
            raise CliError("--device cuda: torch sees no CUDA device on this machine")
    return "cpu", 2


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_log(plan: LocalPlan, agent: LocalAgent) -> Path:
    """Where agent `agent`'s whole output is kept (a relaunch appends to it)."""
    return plan.metrics_file.parent / f"node-{agent.index}" / "agent.log"


REPORT_STARTS = (
    "Traceback (most recent call last):",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
    # multiprocessing's header before a child's traceback (`BaseProcess._bootstrap`): DCP's
    # checkpoint process, torn down by the planned exit, printed it cut off from its report.
    "Process SpawnProcess-",
)
"""Lines where torchrun's account of a failed worker begins: after the planned interruption it
is ~40 lines of elastic-agent traceback and a `Root Cause` box about an exit we asked for."""


TORCH_INFO_LINE = re.compile(r"^\[\d+\] \d{4}-\d\d-\d\d [\d:,]+ - root - INFO - ")
"""torch's own INFO lines: DCP's checkpoint background process sets the root logger to INFO
with its own `[rank] time - root - INFO - ...` handler (torch `distributed/checkpoint/logger.py`
`_init_logger`, called in `_async_process_executor._checkpointing_subprocess`), a process the
trainer's logging never reaches. Kept in the agent's log, not shown."""


@dataclass
class AgentOutput:
    """One agent's output: every line to its log, live lines to the terminal (unless quiet),
    and once a line starts torchrun's failure report, the rest held back for a verdict."""

    log: IO[str]
    shown: IO[str] | None
    prefix: str
    held: list[str] = field(default_factory=list)

    def feed(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.log.write(line)
            self.log.flush()
            if self.held or line.lstrip().startswith(REPORT_STARTS):
                self.held.append(line)
            elif self.shown is not None and not TORCH_INFO_LINE.match(line):
                self.shown.write(self.prefix + line)
                self.shown.flush()

    def release(self, *, planned: bool, log_path: Path) -> None:
        """After the launch: torchrun's report in full, or one line for a planned exit."""
        if not self.held or self.shown is None:
            return
        if planned:
            self.shown.write(
                f"{self.prefix}torchrun reported the planned exit ({len(self.held)} lines, "
                f"kept in {log_path})\n"
            )
        else:
            self.shown.writelines(self.prefix + line for line in self.held)
        self.shown.flush()


@dataclass(frozen=True)
class Launch:
    """How one launch of every agent ended."""

    code: int
    """The first non-zero exit code, else 0."""
    planned_exit: bool
    """An agent exited with the planned interruption's code: `trainer.launch` exits with its
    failed worker's code, and `--fail_at_step` exits with `trainer.faults.FAULT_EXIT_CODE`."""


def run_agents(plan: LocalPlan, *, quiet: bool, planned: bool = False) -> Launch:
    """Launch every agent, wait for all; how the launch ended.

    One failed agent ends the launch, as one failed pod fails the job: the others get
    AGENT_GRACE_S to see it (a broken collective) and are then stopped with SIGTERM, which
    torchrun's agent passes on to its workers. Each agent's output goes to its log; on the
    terminal (unless `quiet`) it is shown live up to torchrun's failure report, which is shown
    whole unless the launch is the `planned` interruption and a worker logged it so.
    """
    from scripts.cli.support.local_topology import agent_command, agent_env

    endpoint = f"127.0.0.1:{_free_port()}"
    base_env = {
        **os.environ,
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    processes: list[subprocess.Popen[str]] = []
    outputs: list[AgentOutput] = []
    readers: list[threading.Thread] = []
    several = len(plan.agents) > 1
    for agent in plan.agents:
        log = agent_log(plan, agent)
        log.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(
            agent_command(plan, agent),
            cwd=REPO_ROOT,
            env={**base_env, **agent_env(plan, agent, endpoint=endpoint)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        # A relaunch appends, as `kubectl logs --previous` keeps the crashed container's.
        output = AgentOutput(
            log=log.open("a", encoding="utf-8"),
            shown=None if quiet else sys.stdout,
            prefix=f"[node {agent.index}] " if several else "",
        )
        assert process.stdout is not None
        reader = threading.Thread(target=output.feed, args=(process.stdout,), daemon=True)
        reader.start()
        processes.append(process)
        outputs.append(output)
        readers.append(reader)
    try:
        code = _wait_for_agents(processes)
    finally:
        for reader in readers:
            reader.join(timeout=30)
        for output in outputs:
            output.log.close()
    from trainer.faults import FAULT_EXIT_CODE

    as_planned = planned and any(p.returncode == FAULT_EXIT_CODE for p in processes)
    for agent, output in zip(plan.agents, outputs, strict=True):
        output.release(planned=as_planned, log_path=agent_log(plan, agent))
    return Launch(code, as_planned)


def _wait_for_agents(processes: list[subprocess.Popen[str]]) -> int:
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
        raise CommandFailedError(
            "the run wrote no training metrics; see the trainer's output above"
        )
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


def _print_failure_logs(plan: LocalPlan) -> None:
    """After a quiet launch failed: the end of each agent's log (the trainer's error)."""
    for agent in plan.agents:
        log = agent_log(plan, agent)
        if log.exists():
            tail = log.read_text(errors="replace").splitlines()[-15:]
            print(f"--- node {agent.index}: {log} (last lines)\n" + "\n".join(tail))


@click.command()
@stack_arguments(default=DEFAULT_STACK)
@click.option("--steps", type=click.IntRange(min=4), default=300, show_default=True,
              help="Optimizer steps (at least 4: checkpoint, interrupt, resume).")  # fmt: skip
@click.option("--context", type=click.IntRange(min=8), default=128, show_default=True,
              help="Tokens per sequence (at most the stack's).")  # fmt: skip
@click.option("--batch-size", type=click.IntRange(min=1), default=8, show_default=True,
              help="Sequences per process.")  # fmt: skip
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True,
              help="auto: this machine's GPUs if any, else 2 CPU processes with gloo.")  # fmt: skip
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_OUT,
              help="Output directory (default: .local-run/ in the repository).")  # fmt: skip
@click.option("--quiet", is_flag=True, help="Hide the trainer's own output (its logs keep it).")
def local(
    stack: str, steps: int, context: int, batch_size: int, device: str, out: Path, quiet: bool
) -> int:
    """Rehearse a stack's run on this machine, for free: its exact command and topology, at a
    size that fits, interrupted half way on purpose and resumed from its checkpoint.

    \b
        fsdp-eks local                    # the dev stack
        fsdp-eks local llama31-8b-p5      # any stack (two agents sharing one directory as FSx)

    Without a stack it runs `dev`. It writes .local-run/<stack>/ (checkpoints, metrics, each
    node's log, loss.png; the run before's figures kept as previous-*.png) and needs no AWS
    account, Pulumi or secret.
    """
    from infra.job.stack_checks import plan_stack_file
    from scripts.cli.support.local_topology import (
        agent_command,
        describe_topology,
        metrics_line,
        plan_local_run,
    )

    logging.basicConfig(level=logging.INFO, format="[local] %(message)s")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    # The same parser and whole-stack checks as the plan and the Pulumi program, so a stack
    # they refuse stops here with the very message `fsdp-eks plan` prints.
    run = plan_stack_file(stack)
    config = run.config
    stack_name = name_of(stack)
    out_dir = out.resolve()
    # Each local run starts from scratch; only the generated corpus and tokenizer are reused.
    fresh_run_root(out_dir, stack_name)
    chosen_device, nproc = local_devices(device)
    plan = plan_local_run(
        run,
        stack_name,
        out_dir=out_dir,
        assets_dir=out_dir / "tiny-assets",
        steps=steps,
        context=context,
        batch_size=batch_size,
        device=chosen_device,
        nproc=nproc,
    )
    say = click.echo
    say(f"Stack {stack_name!r}: on EKS each of {config.gpu_nodes.count} node(s) runs\n")
    say("  " + shlex.join(plan.cluster_command) + "\n")
    say(f"Here, scaled to the {plan.preset!r} preset: {describe_topology(plan)}\n")
    say(
        f"The data is the generated tiny corpus and tokenizer, not {config.data.dataset!r} and "
        f"{config.data.tokenizer!r}: no download, no hfToken or other secret needed.\n"
    )
    if plan.replaced:
        say(
            "Replaced for a model this small (the cluster runs the stack's): "
            + ", ".join(plan.replaced)
        )
    say("  torchrun " + shlex.join([*agent_command(plan, plan.agents[0])[3:]]) + "\n")
    if len(plan.agents) > 1:
        say(f"  (and {len(plan.agents) - 1} more agent(s) like it, joining its rendezvous)\n")
    say(metrics_line(plan) + "\n")
    say(
        f"The first launch stops on purpose at step {plan.fail_at_step} (--fail_at_step), as "
        "a failed node would; the second resumes from its latest checkpoint.\n"
    )
    plan.metrics_file.unlink(missing_ok=True)

    first = run_agents(plan, quiet=quiet, planned=True)
    if first.code == 0:
        say("The first launch finished before the planned interruption.")
    elif not first.planned_exit:
        if quiet:
            _print_failure_logs(plan)
        raise CommandFailedError(
            f"the first launch failed (exit {first.code}) before the planned interruption"
        )
    else:
        from trainer.checkpoint import find_latest

        latest = find_latest(plan.run_dir)
        say(
            f"\nFirst launch stopped at step {plan.fail_at_step} as planned; the latest "
            f"checkpoint is {Path(latest).name if latest else 'none'}. Starting the same "
            "commands again, as the operator restarts failed pods.\n"
        )
        code = run_agents(plan, quiet=quiet).code
        if code != 0:
            if quiet:
                _print_failure_logs(plan)
            raise CommandFailedError(
                f"the resumed launch failed (exit {code}); see the trainer's output"
            )

    records = read_metrics(plan.metrics_file)
    summary = summarise(records)
    png = plot_loss(
        records,
        plan.metrics_file.parent / "loss.png",
        title=(
            f"{stack_name}: {plan.preset} preset on {len(plan.agents)} node(s) x "
            f"{plan.agents[0].nproc} {chosen_device}"
        ),
        fail_at=plan.fail_at_step,
    )
    say(
        f"\nDone: {summary.last_step} steps, loss {summary.first_loss:.3f} -> "
        f"{summary.last_loss:.3f}, {summary.mean_tokens_per_sec:,.0f} tokens/s "
        f"({summary.mean_samples_per_sec:.1f} samples/s), resumed after the interruption: "
        f"{'yes' if summary.resumed else 'no'}"
    )
    say(f"Checkpoints: {plan.run_dir}\nMetrics:     {plan.metrics_file}\nLoss plot:   {png}")
    kept = sorted(png.parent.glob(f"{PREVIOUS_PREFIX}*.png"))
    if kept:
        say(f"Kept from the run before: {', '.join(str(path) for path in kept)}")
    return 0
