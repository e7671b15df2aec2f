"""Follow the logs of rank 0 of a training run (the pod that prints loss and throughput).

    python scripts/logs.py --stack llama31-8b-p5            # follow, like kubectl logs -f
    python scripts/logs.py --stack llama31-8b-p5 --loss     # only the `Batch N Loss: ...` lines
    python scripts/logs.py --job exp --namespace training --tail 200 --no-follow

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
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.run_target import (
    RunTarget,
    TargetError,
    add_target_arguments,
    kubectl_json,
    resolve,
)

CONTAINER = "pytorch"
LOSS_LINE = re.compile(r"Loss:")
"""What the trainer's progress lines contain (`Batch N Loss: X, Speed: ...`, validation too)."""


def rank0_pod(job: Mapping[str, Any]) -> str:
    """Name of the pod that runs rank 0 of a PyTorchJob (`kubectl get pytorchjob -o json`)."""
    name = job["metadata"]["name"]
    replicas = (job.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    role = "master" if "Master" in replicas else "worker"
    return f"{name}-{role}-0"


def logs_command(
    target: RunTarget,
    pod: str,
    *,
    follow: bool = True,
    tail: int | None = None,
    previous: bool = False,
) -> list[str]:
    args = ["logs", pod, "-c", CONTAINER]
    if follow:
        args.append("--follow")
    if tail is not None:
        args.append(f"--tail={tail}")
    if previous:
        args.append("--previous")  # the container before its last restart
    return target.kubectl(*args)


def copy_lines(lines: Iterable[str], out: IO[str], *, only_loss: bool) -> int:
    """Write `lines` to `out` as they come (filtered to loss lines if asked); count written."""
    written = 0
    for line in lines:
        if only_loss and not LOSS_LINE.search(line):
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
    options = parser.parse_args(argv)
    try:
        target = resolve(options)
        pod = rank0_pod(kubectl_json(target, "get", "pytorchjob", target.require_job()))
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
            copy_lines(process.stdout, sys.stdout, only_loss=options.loss)
        except KeyboardInterrupt:  # Ctrl-C ends the follow, not the run
            process.terminate()
            return 0
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
