"""`fsdp-eks logs`: follow a run's logs: rank 0 (loss and throughput), one node, or all.

Rank 0 runs in the master pod when the job has a Master replica, else in worker 0 (our jobs
are workers only: the operator makes worker 0 the rendezvous master). The container is
`pytorch`, the name the training operator requires. A TrainJob's pods carry a random suffix
(Indexed Job pods of its JobSet): node N is the pod labelled with completion index N, in
container `node` (`infra.job.job_api.TRAINJOB`).
"""

from __future__ import annotations

import queue
import re
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import IO, TYPE_CHECKING, Any

import click

from infra.job.job_api import PYTORCHJOB, JobApi
from scripts.cli.support.errors import CliError
from scripts.cli.support.stacks import stack_arguments
from scripts.cli.support.target import RunTarget, run_options

if TYPE_CHECKING:
    from infra.job.kube_client import KubeClient

CONTAINER = "pytorch"
LOSS_LINE = re.compile(r"Loss:")
"""What the trainer's progress lines contain (`Batch N Loss: X, Speed: ...`, validation too)."""
ERROR_LINE = re.compile(
    r"ERROR|Error|Traceback|Exception|exitcode|NCCL WARN|out of memory|non-finite|hang", re.I
)
"""Lines worth seeing when something went wrong: Python errors and tracebacks, torchrun's
failed-worker reports (`exitcode`), NCCL warnings, OOMs, the trainer's NaN and hang reports."""
JOB_NAME_LABEL = PYTORCHJOB.job_name_label
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
        raise CliError(
            f"--node {index}: PyTorchJob {name} has {workers} worker(s), 0-{workers - 1}"
        )
    return f"{name}-worker-{index}"


def trainjob_worker_pod(
    client: KubeClient, api: JobApi, namespace: str, job: Mapping[str, Any], index: int
) -> str:
    """Name of node `index`'s pod of a TrainJob: the newest pod with that completion index."""
    name = job["metadata"]["name"]
    workers = api.workers(job)
    if index >= workers:
        raise CliError(f"--node {index}: {api.kind} {name} has {workers} node(s), 0-{workers - 1}")
    selector = f"{api.pod_selector(name)},{api.first_worker_label}={index}"
    found = client.list_pods(namespace, selector)
    if not found:
        raise CliError(f"{api.kind} {name} has no pod for node {index} now (stopped, or not up)")
    newest = max(found, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
    return str(newest["metadata"]["name"])


def logs_command(
    target: RunTarget,
    pod: str | None,
    *,
    follow: bool = True,
    tail: int | None = None,
    previous: bool = False,
) -> list[str]:
    """The `kubectl logs` a person would type for the same lines (printed as a hint)."""
    api = target.api
    base = ["kubectl", *(["--context", target.context] if target.context else [])]
    base += ["-n", target.namespace]
    if pod is None:
        args = [
            "logs",
            f"--selector={api.pod_selector(target.require_job())}",
            "-c",
            api.container_name,
            "--prefix",
            f"--max-log-requests={MAX_LOG_REQUESTS}",
        ]
    else:
        args = ["logs", pod, "-c", api.container_name]
    if follow:
        args.append("--follow")
    if tail is not None:
        args.append(f"--tail={tail}")
    if previous:
        args.append("--previous")  # the container before its last restart
    return [*base, *args]


def pod_lines(
    client: KubeClient,
    namespace: str,
    pods: list[str],
    *,
    prefixed: bool,
    follow: bool,
    tail: int | None,
    previous: bool,
    container: str = CONTAINER,
) -> Iterator[str]:
    """The pods' log lines as they come; with `prefixed`, each led by `[pod/NAME/pytorch] `
    as `kubectl logs --prefix` writes it, one stream per pod on its own thread."""

    def stream(pod: str) -> Iterator[str]:
        return client.pod_log_lines(
            namespace, pod, container, follow=follow, tail=tail, previous=previous
        )

    if not prefixed:
        for pod in pods:
            yield from stream(pod)
        return
    if len(pods) > MAX_LOG_REQUESTS:
        raise CliError(
            f"--node all: {len(pods)} pods, more than the {MAX_LOG_REQUESTS} log streams "
            "followed at once: name one with --node N"
        )
    lines: queue.Queue[tuple[str, str | BaseException | None]] = queue.Queue()

    def copy(pod: str) -> None:
        try:
            for line in stream(pod):
                lines.put((pod, f"[pod/{pod}/{CONTAINER}] {line}"))
        except BaseException as error:  # handed to the reader, which raises it
            lines.put((pod, error))
        lines.put((pod, None))

    for pod in pods:
        threading.Thread(target=copy, args=(pod,), daemon=True).start()
    open_streams = len(pods)
    while open_streams:
        _pod, item = lines.get()
        if item is None:
            open_streams -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield item


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


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option(
    "--node",
    default="0",
    show_default=True,
    help="Worker N (0: rank 0), or `all`: every pod at once, each line prefixed.",
)
@click.option("--loss", "only_loss", is_flag=True, help="Only the loss lines.")
@click.option("--errors", "only_errors", is_flag=True, help="Only errors and warnings.")
@click.option("--tail", type=click.IntRange(0), help="Start with the last N lines.")
@click.option("--previous", is_flag=True, help="The crashed container's logs.")
@click.option("--no-follow", is_flag=True, help="Print what there is and exit.")
def logs(
    target: RunTarget,
    node: str,
    only_loss: bool,
    only_errors: bool,
    tail: int | None,
    previous: bool,
    no_follow: bool,
) -> int:
    """Follow a run's logs: rank 0 (loss and throughput), one node, or all of them.

    \b
        fsdp-eks logs llama31-8b-p5                   # follow rank 0
        fsdp-eks logs llama31-8b-p5 --loss            # only `Batch N Loss: ...` lines
        fsdp-eks logs llama31-8b-p5 --node all --errors
    """
    if node != "all" and not node.isdigit():
        raise click.BadParameter(
            f"{node!r}: a worker index (0, 1, ...) or `all`", param_hint="--node"
        )
    client = target.client()
    name = target.require_job()
    api = target.api
    job = client.get_job(api, target.namespace, name)
    if node == "all":
        pod = None
    elif api is PYTORCHJOB:
        pod = worker_pod(job, int(node))
    else:
        pod = trainjob_worker_pod(client, api, target.namespace, job, int(node))
    command = logs_command(target, pod, follow=not no_follow, tail=tail, previous=previous)
    click.echo(f"# {' '.join(command)}", err=True)
    if pod is None:
        found = client.list_pods(target.namespace, api.pod_selector(name))
        pods = sorted(str(p["metadata"]["name"]) for p in found)
    else:
        pods = [pod]
    lines = pod_lines(
        client,
        target.namespace,
        pods,
        prefixed=pod is None,
        follow=not no_follow,
        tail=tail,
        previous=previous,
        container=api.container_name,
    )
    try:
        copy_lines(lines, sys.stdout, only_loss=only_loss, only_errors=only_errors)
    except KeyboardInterrupt:  # Ctrl-C ends the follow, not the run
        return 0
    return 0
