"""Follow the logs of a training run: rank 0 (loss and throughput), one node, or all of them.

    python scripts/cli/logs.py --stack llama31-8b-p5            # follow, like kubectl logs -f
    python scripts/cli/logs.py --stack llama31-8b-p5 --loss     # only the `Batch N Loss: ...` lines
    python scripts/cli/logs.py --stack llama31-8b-p5 --node all --errors   # every pod, errors only
    python scripts/cli/logs.py --job exp --namespace training --tail 200 --no-follow

With `--node all` every worker pod is followed at once, each line prefixed with its pod
(`kubectl logs --selector ... --prefix`); `--node N` follows worker N.

Rank 0 runs in the master pod when the job has a Master replica, else in worker 0 (our jobs
are workers only: the operator makes worker 0 the rendezvous master). The container is
`pytorch`, the name the training operator requires.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

if __package__ in (None, ""):  # run as a script: make `scripts.*` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cli.run_target import (
    RunTarget,
    TargetError,
    add_target_arguments,
    kubectl_json,
    resolve,
)

CONTAINER = "pytorch"
LOSS_LINE = re.compile(r"Loss:")
"""What the trainer's progress lines contain (`Batch N Loss: X, Speed: ...`, validation too)."""
ERROR_LINE = re.compile(
    r"ERROR|Error|Traceback|Exception|exitcode|NCCL WARN|out of memory|non-finite|hang", re.I
)
"""Lines worth seeing when something went wrong: Python errors and tracebacks, torchrun's
failed-worker reports (`exitcode`), NCCL warnings, OOMs, the trainer's NaN and hang reports."""
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
"""Set on every pod of a PyTorchJob by the training operator."""
MAX_LOG_REQUESTS = 64
"""Pods `--node all` follows at once (kubectl's default is 5)."""


def rank0_pod(job: Mapping[str, Any]) -> str:
    """Name of the pod that runs rank 0 of a PyTorchJob (`kubectl get pytorchjob -o json`)."""
    return worker_pod(job, 0)


def worker_pod(job: Mapping[str, Any], index: int) -> str:
    """Name of node `index`'s pod: rank 0 is the master pod when the job has one, else worker
    0; the operator names pods `<job>-<role>-<index>`. An index beyond the replicas is an
    error that says how many there are."""
    name = job["metadata"]["name"]
    replicas = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    if "Master" in replicas:
        return f"{name}-master-0" if index == 0 else f"{name}-worker-{index - 1}"
    workers = int((replicas.get("Worker") or {}).get("replicas", 1))
    if index >= workers:
        raise TargetError(
            f"--node {index}: PyTorchJob {name} has {workers} worker(s), 0-{workers - 1}"
        )
    return f"{name}-worker-{index}"


def logs_command(
    target: RunTarget,
    pod: str | None,
    *,
    follow: bool = True,
    tail: int | None = None,
    previous: bool = False,
) -> list[str]:
    """`kubectl logs` of one pod, or (`pod` None) of every pod of the job, prefixed."""
    if pod is None:
        args = [
            "logs",
            f"--selector={JOB_NAME_LABEL}={target.require_job()}",
            "-c",
            CONTAINER,
            "--prefix",
            f"--max-log-requests={MAX_LOG_REQUESTS}",
        ]
    else:
        args = ["logs", pod, "-c", CONTAINER]
    if follow:
        args.append("--follow")
    if tail is not None:
        args.append(f"--tail={tail}")
    if previous:
        args.append("--previous")  # the container before its last restart
    return target.kubectl(*args)


def copy_lines(
    lines: Iterable[str], out: IO[str], *, only_loss: bool, only_errors: bool = False
) -> int:
    """Write `lines` to `out` as they come (filtered to loss or error lines if asked); count
    written."""
    written = 0
    for line in lines:
        if only_loss and not LOSS_LINE.search(line):
            continue
        if only_errors and not ERROR_LINE.search(line):
            continue
        out.write(line)
        out.flush()
        written += 1
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_target_arguments(parser)
    parser.add_argument("--no-follow", action="store_true", help="print and exit")
    parser.add_argument("--tail", type=int, help="start with the last N lines")
    parser.add_argument("--previous", action="store_true", help="the crashed container's logs")
    parser.add_argument("--loss", action="store_true", help="only the loss lines")
    parser.add_argument("--errors", action="store_true", help="only errors and warnings")
    parser.add_argument(
        "--node", default="0", help="worker N (default 0: rank 0), or `all` (every pod, prefixed)"
    )
    options = parser.parse_args(argv)
    if options.node != "all" and not options.node.isdigit():
        parser.error(f"--node {options.node!r}: a worker index (0, 1, ...) or `all`")
    try:
        target = resolve(options)
        job = kubectl_json(target, "get", "pytorchjob", target.require_job())
        pod = None if options.node == "all" else worker_pod(job, int(options.node))
    except TargetError as error:
        print(f"logs: {error}", file=sys.stderr)
        return 2
    command = logs_command(
        target, pod, follow=not options.no_follow, tail=options.tail, previous=options.previous
    )
    print(f"# {' '.join(command)}", file=sys.stderr)
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, bufsize=1) as process:
        assert process.stdout is not None
        try:
            copy_lines(
                process.stdout, sys.stdout, only_loss=options.loss, only_errors=options.errors
            )
        except KeyboardInterrupt:  # Ctrl-C ends the follow, not the run
            process.terminate()
            return 0
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
