"""`fsdp-eks status`: where a run stands: the job's state, its pods, the GPU lease, restarts,
time left and money spent."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from infra.job.job_api import PYTORCHJOB, TRAINJOB, JobApi
from scripts.cli.support.errors import CliError
from scripts.cli.support.stacks import stack_arguments
from scripts.cli.support.target import RunTarget, run_options

if TYPE_CHECKING:
    from infra.job.kube_client import KubeClient

GPU_POOL_SELECTOR = "fsdp-eks/node-pool=gpu"
"""The GPU node group's label (`infra.platform.gpu_nodes.gpu_labels`)."""
SCALE_DOWN_TAINT = "ToBeDeletedByClusterAutoscaler"
"""The taint Cluster Autoscaler puts on a node it is removing (kubernetes/autoscaler
`cluster-autoscaler/utils/taints/taints.go`)."""


@dataclass(frozen=True)
class PodRow:
    name: str
    phase: str
    node: str
    restarts: int


@dataclass(frozen=True)
class NodeRow:
    name: str
    state: str
    """ready, not ready, or removing (cordoned, or tainted for scale-down)."""


def node_rows(nodes: Mapping[str, Any]) -> list[NodeRow]:
    """The GPU nodes (`kubectl get nodes -o json`) and where each stands in the lease."""
    rows = []
    for node in nodes.get("items") or []:
        spec, status = node.get("spec") or {}, node.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        removing = spec.get("unschedulable") or any(
            t.get("key") == SCALE_DOWN_TAINT for t in spec.get("taints") or []
        )
        state = "removing" if removing else "ready" if ready else "not ready"
        rows.append(NodeRow(node["metadata"]["name"], state))
    return sorted(rows, key=lambda r: r.name)


@dataclass(frozen=True)
class JobStatus:
    name: str
    namespace: str
    state: str
    """The newest true condition: Created, Running, Restarting, Succeeded or Failed."""
    message: str
    started: str | None
    elapsed_s: float | None
    deadline_s: int | None
    replicas: dict[str, dict[str, int]]
    pods: list[PodRow]
    usd_per_hour: float | None
    gpu_nodes: list[NodeRow] | None = None
    """None: the nodes could not be read (no permission to list nodes)."""
    restarts: str | None = None
    """The run's restart history from its metrics file (`trainer.restarts`), when readable."""
    admission: str | None = None
    """A queued job's Kueue admission (`queue <name>: <state>`); None: not queued."""

    @property
    def spent_usd(self) -> float | None:
        if self.usd_per_hour is None or self.elapsed_s is None:
            return None
        return round(self.usd_per_hour * self.elapsed_s / 3600, 2)


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str):
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def trainjob_status(job: Mapping[str, Any], pods: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainJob's status in the PyTorchJob's terms: no `Running` condition and no
    `startTime` (kubeflow/trainer v2.3.0 `trainjob_types.go`), so it runs while its pods do,
    started when it was created or last resumed (the deadline's own start:
    `pkg/controller/trainjob_controller.go` `reconcileDeadline`), its replicas from
    `jobsStatus`."""
    status = dict(job.get("status") or {})
    conditions = list(status.get("conditions") or [])
    resumed = next(
        (c for c in conditions if c.get("type") == TRAINJOB.suspended_condition
         and c.get("status") == "False"),
        None,
    )  # fmt: skip
    started = (resumed or {}).get("lastTransitionTime") or job.get("metadata", {}).get(
        "creationTimestamp"
    )
    live = [p for p in pods.get("items") or [] if (p.get("status") or {}).get("phase") == "Running"]
    if live and not any(c.get("status") == "True" for c in conditions):
        conditions.append({"type": "Running", "status": "True", "lastTransitionTime": started})
    return {
        "conditions": conditions,
        "startTime": started,
        "replicaStatuses": {
            str(j.get("name")): {k: v for k, v in j.items() if k != "name"}
            for j in status.get("jobsStatus") or []
        },
    }


def summarize(
    job: Mapping[str, Any],
    pods: Mapping[str, Any],
    *,
    now: datetime,
    usd_per_hour: float | None,
    api: JobApi = PYTORCHJOB,
) -> JobStatus:
    """The status of a job (`kubectl get pytorchjob|trainjob -o json`) and its pods."""
    status = trainjob_status(job, pods) if api is TRAINJOB else job.get("status") or {}
    true_conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    latest: Mapping[str, Any] = max(
        true_conditions, key=lambda c: c.get("lastTransitionTime") or "", default={}
    )
    started = _parse_time(status.get("startTime"))
    ended = _parse_time(status.get("completionTime"))
    terminal = (api.succeeded_condition, api.failed_condition)
    if ended is None and latest.get("type") in terminal:
        ended = _parse_time(latest.get("lastTransitionTime"))
    elapsed = ((ended or now) - started).total_seconds() if started else None
    rows = [
        PodRow(
            name=pod["metadata"]["name"],
            phase=(pod.get("status") or {}).get("phase", "Unknown"),
            node=(pod.get("spec") or {}).get("nodeName") or "-",
            restarts=sum(
                c.get("restartCount", 0)
                for c in (pod.get("status") or {}).get("containerStatuses") or []
            ),
        )
        for pod in pods.get("items") or []
    ]
    spec = job.get("spec") or {}
    deadline = (spec.get("runPolicy") or spec).get("activeDeadlineSeconds")
    return JobStatus(
        name=job["metadata"]["name"],
        namespace=job["metadata"].get("namespace", "default"),
        state=latest.get("type", "Pending"),
        message=latest.get("message", ""),
        started=status.get("startTime"),
        elapsed_s=elapsed,
        deadline_s=int(deadline) if deadline else None,
        replicas={k: dict(v) for k, v in (status.get("replicaStatuses") or {}).items()},
        pods=sorted(rows, key=lambda r: r.name),
        usd_per_hour=usd_per_hour,
    )


def _duration(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_status(status: JobStatus) -> str:
    lines = [f"job {status.name} ({status.namespace}): {status.state}"]
    if status.message:
        lines[0] += f" - {status.message}"
    if status.admission is not None:
        lines.append(f"  {status.admission}")
    if status.elapsed_s is not None:
        timing = f"  started {status.started}, {_duration(status.elapsed_s)} elapsed"
        if status.deadline_s:
            left = max(0.0, status.deadline_s - status.elapsed_s)
            timing += f", deadline in {_duration(left)}"
        lines.append(timing)
    for replica, counts in sorted(status.replicas.items()):
        summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()) if isinstance(n, int))
        lines.append(f"  {replica.lower()}s: {summary or 'none'}")
    if status.spent_usd is not None:
        lines.append(
            f"  GPU nodes so far: ~${status.spent_usd:,.2f} (at ${status.usd_per_hour:,.2f}/h, "
            f"estimate; nodes also bill while idle)"
        )
    if status.gpu_nodes is not None:
        lines.append(f"  GPU nodes: {gpu_node_summary(status.gpu_nodes)}")
    if status.restarts is not None:
        lines.append(f"  {status.restarts}")
    if status.pods:
        width = max(len(p.name) for p in status.pods)
        lines.append(f"  {'POD'.ljust(width)}  PHASE      RESTARTS  NODE")
        lines.extend(
            f"  {p.name.ljust(width)}  {p.phase.ljust(9)}  {str(p.restarts).ljust(8)}  {p.node}"
            for p in status.pods
        )
    else:
        lines.append("  no pods (not scheduled yet, or cleaned up after the run)")
    return "\n".join(lines)


def restart_summary(records: list[dict[str, Any]]) -> str | None:
    """One line from the `start` entries the trainer writes at each start; None before any."""
    starts = [r["start"] for r in records if r.get("kind") == "run" and "start" in r]
    if not starts:
        return None
    last = starts[-1]
    restarts = int(last.get("attempt", 1)) - 1
    if restarts == 0:
        return "restarts: none (first start)"
    lost_steps = sum(int(s.get("steps_lost", 0)) for s in starts)
    return (
        f"restarts: {restarts} (the last after {last.get('after')}, resumed at step "
        f"{last.get('resumed_step')}); {lost_steps} step(s) and "
        f"{float(last.get('total_wall_lost_s', 0)) / 60:.0f} min lost, goodput "
        f"{float(last.get('goodput', 1)):.1%}"
    )


def read_restarts(target: RunTarget) -> str | None:
    """The restart line from the run's metrics file in S3; None when it cannot be read."""
    try:
        uri = f"{target.require_checkpoint_uri()}/metrics.jsonl"
    except CliError:
        return None
    from botocore.exceptions import BotoCoreError, ClientError

    from scripts.cli.support.s3 import fetch_object
    from trainer.restarts import read_records

    with tempfile.TemporaryDirectory() as scratch:
        try:
            return restart_summary(read_records(fetch_object(uri, Path(scratch))))
        except (BotoCoreError, ClientError) as error:
            return f"restarts: unknown ({uri} not readable: {error})"


def gpu_node_summary(nodes: list[NodeRow]) -> str:
    """One line on the lease: none (scaled to zero, or not up yet), or counts by state."""
    if not nodes:
        return "none (scaled to zero, or still coming up for pending pods)"
    counts: dict[str, int] = {}
    for node in nodes:
        counts[node.state] = counts.get(node.state, 0) + 1
    return ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))


def admission(client: KubeClient, job: Mapping[str, Any], api: JobApi = PYTORCHJOB) -> str | None:
    """Where a queued job's Kueue Workload (the one it owns) stands; None: not queued."""
    from infra.job.kube_client import KubernetesApiError
    from infra.job.queue_hold import workload_of
    from infra.job.queueing import QUEUE_LABEL, admission_state, is_queued

    if not is_queued(job):
        return None
    queue = f"queue {job['metadata']['labels'][QUEUE_LABEL]}"
    try:
        workload = workload_of(client, job, api)
    except KubernetesApiError as error:
        return f"{queue}: admission unknown (Kueue Workloads not readable: {error})"
    if workload is None:
        return f"{queue}: no Kueue Workload (is Kueue running with this job's integration on?)"
    return f"{queue}: {admission_state(workload)} (workload {workload['metadata']['name']})"


def fetch_status(target: RunTarget, *, now: datetime | None = None) -> JobStatus:
    name = target.require_job()
    client = target.client()
    api = target.api
    job = client.get_job(api, target.namespace, name)
    pods = {"items": client.list_pods(target.namespace, api.pod_selector(name))}
    summary = summarize(
        job, pods, now=now or datetime.now(UTC), usd_per_hour=target.usd_per_hour, api=api
    )
    summary = replace(
        summary, restarts=read_restarts(target), admission=admission(client, job, api)
    )
    from infra.job.kube_client import KubernetesApiError

    try:
        nodes = node_rows({"items": client.list_nodes(GPU_POOL_SELECTOR)})
    except KubernetesApiError:
        return summary  # listing nodes is cluster-wide: a namespaced user may not
    return replace(summary, gpu_nodes=nodes)


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(target: RunTarget, as_json: bool) -> int:
    """Where a run stands: the job's state, its pods, the GPU lease, restarts, spend.

    \b
        fsdp-eks status llama31-8b-p5
        fsdp-eks status llama31-8b-p5 --json

    Exit status: 0 while the job is pending, running, stopped or done; 1 when it failed.
    """
    found = fetch_status(target)
    if as_json:
        click.echo(json.dumps({**asdict(found), "spent_usd": found.spent_usd}, indent=2))
    else:
        from scripts.cli.support.live_metrics import stack_live_text

        click.echo(format_status(found))
        click.echo(stack_live_text(target.outputs, target.stack_file))
    return 1 if found.state == "Failed" else 0
