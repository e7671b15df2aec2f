"""When has a PyTorchJob started, and when has it failed to? A pure rule over status documents.

`pulumi.com/waitFor` cannot fail early nor tell a crash loop from training, so
`infra.launch.start_watch` polls and asks `assess`: failed, succeeded, suspended, queued,
stably running (`STABLE_RUNNING_S`), stuck pods, uncounted restarts, no operator pickup.
Shapes: training-operator v1.9.0 CRD and core/v1 Pods.
Each rule with its source: docs/design/job.md#start_rule
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from infra.config.job import DEFAULT_START_TIMEOUT_MINUTES
from infra.job.job_api import JOB_APIS, PYTORCHJOB, JobApi
from infra.job.queueing import admission_state, is_deactivated, is_queued
from infra.job.suspension import is_suspended

STABLE_RUNNING_S = 60
"""How long every trainer container must run without a restart before the job counts as
started. Longer than kubelet's first crash back-offs (10 s, 20 s, 40 s), so a worker that
crashes on start never looks started between two crashes."""

STUCK_CONTAINER_S = 600
"""How long a container may sit in an image or configuration error before `up` fails. Kubelet
retries image pulls with a back-off capped at 5 minutes, so 10 minutes is two failed retries;
a 20 GB pull in progress is `ContainerCreating`, never one of these reasons."""

OPERATOR_PICKUP_S = 300
"""How long a new job may stay without any condition (the operator adds `Created` at once)."""

DEFAULT_START_TIMEOUT_S = DEFAULT_START_TIMEOUT_MINUTES * 60
"""How long a worker may stay unschedulable unless the stack says otherwise
(`job.startTimeoutMinutes`): scaling GPU nodes up from zero takes minutes, a missing quota or
capacity never ends."""

WORKER_REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
"""Set on every pod by the operator (v1.9.0 `pkg/apis/kubeflow.org/v1/common_types.go`)."""
JOB_NAME_LABEL = PYTORCHJOB.job_name_label

STUCK_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)
"""Container waiting reasons that do not clear by themselves (kubelet `images` and
`kuberuntime` error reasons); `ContainerCreating` and `PodInitializing` are normal progress."""

STUCK_EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume", "FailedCreatePodSandBox"})
"""Warning events kubelet repeats while a pod cannot get past `ContainerCreating`: a volume it
cannot mount (an FSx file system whose Lustre port 988 is blocked, a PVC bound to nothing) or
a sandbox it cannot build (the VPC CNI has no IP to give). The pod's status only says
`ContainerCreating`, as it does during a long image pull, so the events are the only tell."""


class JobStartError(RuntimeError):
    """The job failed or its workers cannot start; the message says why, for the user."""


@dataclass
class StartHistory:
    """What one watch has seen across polls, for the rules a single snapshot cannot decide."""

    stuck_since: dict[tuple[str, str], datetime] = field(default_factory=dict)
    """(pod uid, container) -> when the container was first seen in a `STUCK_REASONS` state."""
    uids: dict[str, list[str]] = field(default_factory=dict)
    """Pod name -> every uid seen under it, oldest first: more than one is a recreation."""
    last_exit: str | None = None
    """The latest non-zero trainer exit seen on any worker, kept after its pod is deleted."""

    def observe(self, pods: Sequence[Mapping[str, Any]], now: datetime) -> None:
        """Record `pods` (one poll's worker pods) as seen at `now`."""
        stuck_now: set[tuple[str, str]] = set()
        for pod in pods:
            uid = str(pod.get("metadata", {}).get("uid", ""))
            if uid and uid not in (seen := self.uids.setdefault(_name(pod), [])):
                seen.append(uid)
            status = pod.get("status", {})
            for container in _all_containers(status):
                waiting = container.get("state", {}).get("waiting") or {}
                if waiting.get("reason") in STUCK_REASONS:
                    key = (uid, str(container.get("name")))
                    stuck_now.add(key)
                    self.stuck_since.setdefault(key, now)
        self.stuck_since = {k: v for k, v in self.stuck_since.items() if k in stuck_now}
        self.last_exit = _last_termination(pods) or self.last_exit

    def recreations(self) -> int:
        return sum(max(len(uids) - 1, 0) for uids in self.uids.values())


@dataclass(frozen=True)
class Verdict:
    """What the job's state means for `pulumi up`."""

    done: bool
    failure: str | None
    """Set when `up` should fail now; the reason to show the user."""
    progress: str
    """One line on where the job stands (shown while waiting, and on timeout)."""


def parse_time(value: str) -> datetime:
    """A Kubernetes RFC 3339 timestamp (`2026-11-23T21:00:00Z`) as an aware datetime."""
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _seconds_since(value: str | None, now: datetime) -> float:
    return 0.0 if not value else (now - parse_time(value)).total_seconds()


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return condition
    return None


TRAINER_CONTAINERS = frozenset(api.container_name for api in JOB_APIS.values())
"""The trainer container's name under each job API (one app container per pod)."""


def _trainer_status(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    for status in pod.get("status", {}).get("containerStatuses") or []:
        if status.get("name") in TRAINER_CONTAINERS:
            return status
    return {}


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("name", "?"))


def _last_termination(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """The most recent trainer exit seen on any worker: exit code, reason and message."""
    latest: tuple[str, str] | None = None
    for pod in pods:
        status = _trainer_status(pod)
        for state in (status.get("state", {}), status.get("lastState", {})):
            ended = state.get("terminated")
            if not ended or ended.get("exitCode", 0) == 0:
                continue
            text = f"{_name(pod)} exited with {_exit_text(ended).removeprefix('exit ')}"
            when = ended.get("finishedAt") or ""
            if latest is None or when > latest[0]:
                latest = (when, text)
    return latest[1] if latest else None


def _all_containers(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _exit_text(terminated: Mapping[str, Any]) -> str:
    text = f"exit code {terminated.get('exitCode')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    if terminated.get("message"):
        text += f": {str(terminated['message']).strip()[-500:]}"
    return text


def _event_start(event: Mapping[str, Any]) -> str | None:
    """When a (possibly repeated) event first happened: core/v1 `firstTimestamp`, or the
    `eventTime` of events written through events.k8s.io/v1 (which leave the former unset)."""
    return event.get("firstTimestamp") or event.get("eventTime")


def _stuck(
    pod: Mapping[str, Any],
    now: datetime,
    *,
    backoff_limit: int,
    unschedulable_s: float,
    events: Sequence[Mapping[str, Any]],
    history: StartHistory | None,
) -> str | None:
    """Why this pod cannot start, once it has been so for longer than its bound."""
    status = pod.get("status", {})
    uid = pod.get("metadata", {}).get("uid")
    created = pod.get("metadata", {}).get("creationTimestamp")
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            waited = _seconds_since(created, now)
            if waited > unschedulable_s:
                return (
                    f"{_name(pod)} could not be scheduled for {waited / 60:.0f} min: "
                    f"{condition.get('message', 'Unschedulable')}"
                )
    started = status.get("startTime") or created
    for container in _all_containers(status):
        waiting = container.get("state", {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason not in STUCK_REASONS:
            continue
        first_seen = (
            history.stuck_since.get((str(uid), str(container.get("name")))) if history else None
        )
        waited = (now - first_seen).total_seconds() if first_seen else _seconds_since(started, now)
        if waited > STUCK_CONTAINER_S:
            detail = f": {waiting['message']}" if waiting.get("message") else ""
            return f"{_name(pod)} container {container.get('name')}: {reason}{detail}"
    if status.get("phase") == "Pending":
        limit = max(backoff_limit, 1)
        for init in status.get("initContainerStatuses") or []:
            if int(init.get("restartCount", 0)) >= limit:
                ended = (init.get("lastState") or {}).get("terminated") or {}
                last = f"; last {_exit_text(ended)}" if ended else ""
                return (
                    f"{_name(pod)} init container {init.get('name')} failed "
                    f"{init['restartCount']} times (the operator does not count restarts of a "
                    f"pod that is not Running against backoffLimit {backoff_limit}){last}"
                )
        for event in events:
            involved = event.get("involvedObject") or {}
            if involved.get("uid") != uid or event.get("reason") not in STUCK_EVENT_REASONS:
                continue
            waited = _seconds_since(_event_start(event), now)
            if waited > STUCK_CONTAINER_S:
                return (
                    f"{_name(pod)} stuck in ContainerCreating for {waited / 60:.0f} min: "
                    f"{event['reason']}: {str(event.get('message', '')).strip()[-500:]}"
                )
    return None


def _stably_running(pod: Mapping[str, Any], now: datetime) -> bool:
    if pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    if pod.get("status", {}).get("phase") != "Running":
        return False
    trainer = _trainer_status(pod)
    running = trainer.get("state", {}).get("running")
    if not running or not trainer.get("ready", False):
        return False
    return _seconds_since(running.get("startedAt"), now) >= STABLE_RUNNING_S


def _pod_summary(pod: Mapping[str, Any]) -> str:
    status = pod.get("status", {})
    trainer = _trainer_status(pod)
    waiting = (trainer.get("state") or {}).get("waiting") or {}
    what = waiting.get("reason") or status.get("phase", "Unknown")
    restarts = trainer.get("restartCount", 0)
    return f"{_name(pod)} {what}" + (f" ({restarts} restarts)" if restarts else "")


def assess(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    *,
    workers: int,
    now: datetime,
    backoff_limit: int = 3,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    events: Sequence[Mapping[str, Any]] = (),
    history: StartHistory | None = None,
    stack: str | None = None,
    workload: Mapping[str, Any] | None = None,
    api: JobApi = PYTORCHJOB,
) -> Verdict:
    """What `job` (a PyTorchJob), its `pods` and their Warning `events` mean at `now` for a job
    of `workers` nodes whose workers may take `start_timeout_s` to be placed; `history` is what
    earlier polls of the same watch saw (already updated with `pods`); `stack` names the
    stack in the command a stopped job's message gives (None: `<stack>`); `workload` is a
    queued job's Kueue Workload (None: not queued, or none yet)."""
    name = job.get("metadata", {}).get("name", "?")
    status = job.get("status") or {}
    kind = api.kind
    worker_pods = [p for p in pods if api.is_worker(p)]
    failed = _condition(status, api.failed_condition)
    if failed is not None:
        reason = f"{kind} {name} failed ({failed.get('reason', 'Failed')}): "
        reason += str(failed.get("message", "")).strip() or "no message"
        last = _last_termination(worker_pods) or (history.last_exit if history else None)
        return Verdict(False, reason + (f"; last worker exit: {last}" if last else ""), "failed")
    if _condition(status, api.succeeded_condition) is not None:
        return Verdict(True, None, f"{kind} {name} succeeded")
    if is_queued(job) and is_suspended(job, api):
        # Kueue holds a queued job suspended until its Workload is admitted
        # (infra.job.queueing); only a deactivated Workload means someone stopped it.
        if is_deactivated(workload):
            return Verdict(
                False,
                f"{kind} {name} is stopped (its Kueue Workload is deactivated): `fsdp-eks "
                f"start {stack or '<stack>'}` queues it again",
                "stopped",
            )
        state = admission_state(workload) if workload is not None else "no Workload yet"
        return Verdict(False, None, f"{kind} {name}: waiting for Kueue's admission: {state}")
    if is_suspended(job, api):
        return Verdict(
            False,
            f"{kind} {name} is stopped (suspended): `fsdp-eks start {stack or '<stack>'}` "
            "resumes it from its latest checkpoint",
            "stopped",
        )
    if not api.picked_up(job):
        waited = _seconds_since(job.get("metadata", {}).get("creationTimestamp"), now)
        if waited > OPERATOR_PICKUP_S and api is PYTORCHJOB:
            return Verdict(
                False,
                f"PyTorchJob {name} has no status after {waited / 60:.0f} min: no training "
                "operator is reconciling PyTorchJobs on this cluster (install one with "
                "addons.trainingOperator.install: true, or check the operator's logs)",
                "not picked up",
            )
        if waited > OPERATOR_PICKUP_S:
            return Verdict(
                False,
                f"{kind} {name} has no status after {waited / 60:.0f} min: Kubeflow Trainer v2 "
                "is not reconciling TrainJobs on this cluster (check its controller and "
                "JobSet's in kubeflow-system, or cluster.trainerV2)",
                "not picked up",
            )
        return Verdict(False, None, f"{kind} {name}: waiting for {api.controller}")
    for pod in worker_pods:
        problem = _stuck(
            pod,
            now,
            backoff_limit=backoff_limit,
            unschedulable_s=start_timeout_s,
            events=events,
            history=history,
        )
        if problem is not None:
            return Verdict(False, f"{kind} {name}: worker {problem}", "cannot start")
    if history is not None and history.recreations() >= max(backoff_limit, 1):
        last = f"; last worker exit: {history.last_exit}" if history.last_exit else ""
        return Verdict(
            False,
            f"{kind} {name}: workers were recreated {history.recreations()} times before "
            f"all of them started (restartPolicy ExitCode: the operator recreates a pod on a "
            f"retryable exit code without counting it against backoffLimit {backoff_limit})" + last,
            "restarting",
        )
    running = sum(1 for pod in worker_pods if _stably_running(pod, now))
    progress = f"{running}/{workers} workers running"
    if worker_pods:
        progress += ": " + ", ".join(_pod_summary(p) for p in worker_pods)
    return Verdict(running >= workers, None, progress)
