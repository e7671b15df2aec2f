"""`fsdp-eks stop` and `fsdp-eks start`: the run suspended with the platform and checkpoints
kept, and resumed from its latest checkpoint, consistently with Pulumi's state.

The change is `infra.job.suspension.set_suspended` (a queued job's: `infra.job.queue_hold`);
the waits bound the pods' graceful stop and the resumed start. Nothing here prints.
The waits, and what the next `pulumi up` does: docs/design/job.md#stop_start
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from infra.job.job_api import PYTORCHJOB, TRAININGRUNTIME, JobApi
from infra.job.kube_client import KubeClient, KubernetesApiError, KubernetesCredentialError
from infra.job.queue_hold import is_deactivated, set_active, workload_of
from infra.job.queueing import is_queued, kueue_integrations
from infra.job.start_rule import DEFAULT_START_TIMEOUT_S
from infra.job.start_wait import (
    DEFAULT_POLL_SECONDS,
    MAX_TRANSIENT_ERRORS,
    TRANSIENT_HTTP,
    WatchedJob,
    wait_for_start,
)
from infra.job.suspension import (
    finished,
    is_suspended,
    job_urn,
    set_suspended,
    suspend_owners,
    suspend_requested,
    true_condition,
)

DEFAULT_GRACE_S = 30
"""A pod's `terminationGracePeriodSeconds` when its spec leaves it out (k8s.io/api
`core/v1/types.go` `DefaultTerminationGracePeriodSeconds`)."""

STOP_MARGIN_S = 120.0
"""Beyond the pods' grace period: the operator's reconcile after the change, the kubelet
noticing the deletion, and the API server removing the pods once their containers exited."""

STOP_POLL_S = 5.0
"""Pods go within seconds to a grace period (minutes): poll often enough to say so early."""

STOPPED_AND_PULUMI = (
    "A `pulumi up` that leaves the job unchanged (with or without --refresh) leaves it "
    "stopped; one that changes it (a new image, other trainer flags or node count) replaces "
    "the job, which starts at once and resumes from the latest checkpoint if the trainer "
    "flags are unchanged."
)


@dataclass(frozen=True)
class Pacing:
    """How stop/start poll and tell time: the real intervals and clock unless a caller (a
    test) hands in a clock whose sleep only advances it."""

    poll_s: float = STOP_POLL_S
    watch_poll_s: float = DEFAULT_POLL_SECONDS
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


class JobControlError(RuntimeError):
    """The job cannot be stopped or started as asked; the message says why, for the user."""


class JobNotFoundError(JobControlError):
    """No job of that name in that namespace."""


class JobFinishedError(JobControlError):
    """The job succeeded or failed: the operator ignores `suspend` on a finished job."""


class PodsRemainError(JobControlError):
    """The job's pods did not go within the bound (the change itself was made)."""


class SuspendUnsupportedError(JobControlError):
    """The cluster's job CRD does not keep the suspend field."""


def _apply_suspend(
    api: KubeClient, namespace: str, name: str, suspended: bool, job_api: JobApi = PYTORCHJOB
) -> None:
    """`set_suspended`, checked against the job the API server stored.

    `runPolicy.suspend` came with training-operator v1.7.0 (`pkg/apis/kubeflow.org/v1/
    common_types.go`: absent in v1.6.0). The API server prunes fields a structural CRD schema
    does not declare (kubernetes/apiextensions-apiserver `pkg/apiserver/schema/pruning`) and
    answers the apply with 200 all the same, so on an older operator the stop would wait for a
    suspension nothing asked for and time out with the pods still running."""
    stored = set_suspended(api, namespace, name, suspended, job_api)
    if suspend_requested(stored, job_api) is not suspended:
        upgrade = (
            " (it keeps the field from training-operator v1.7.0; this project installs "
            "v1.9.0): nothing was changed, the operator needs an upgrade first"
            if job_api is PYTORCHJOB
            else ": nothing was changed"
        )
        raise SuspendUnsupportedError(
            f"{job_api.kind} {namespace}/{name}: the cluster's {job_api.kind} CRD dropped "
            f"{'.'.join(job_api.suspend_path)}={str(suspended).lower()}{upgrade}"
        )


class NoWorkloadError(JobControlError):
    """A queued job without its Kueue Workload: nothing holds or queues it yet."""


def _queued_workload(
    api: KubeClient, job: Mapping[str, Any], job_api: JobApi = PYTORCHJOB
) -> dict[str, Any]:
    meta = job.get("metadata") or {}
    workload = workload_of(api, job, job_api)
    if workload is None:
        raise NoWorkloadError(
            f"{job_api.kind} {meta.get('namespace')}/{meta.get('name')} is queued (label "
            "kueue.x-k8s.io/queue-name) but has no Kueue Workload: Kueue is not managing it "
            f"(is Kueue running, with its {kueue_integrations(job_api.name)[0]} integration "
            "on? `kubectl -n kueue-system logs deploy/kueue-controller-manager`); nothing was "
            "changed"
        )
    return workload


def _is_held(api: KubeClient, job: Mapping[str, Any], job_api: JobApi = PYTORCHJOB) -> bool:
    """Stopped: a queued job's Workload deactivated, any other job suspended
    (infra.job.queue_hold says why a queued job is held through its Workload)."""
    if is_queued(job):
        return is_deactivated(_queued_workload(api, job, job_api))
    return is_suspended(job, job_api)


def _hold(
    api: KubeClient, job: Mapping[str, Any], held: bool, job_api: JobApi = PYTORCHJOB
) -> None:
    meta = job.get("metadata") or {}
    if is_queued(job):
        set_active(api, _queued_workload(api, job, job_api), not held)
    else:
        _apply_suspend(api, str(meta.get("namespace")), str(meta.get("name")), held, job_api)


@dataclass(frozen=True)
class StopResult:
    namespace: str
    name: str
    already_stopped: bool
    """The job was suspended before this stop (it is held by `fsdp-eks` now either way)."""
    waited_s: float
    """How long the pods took to go."""
    message: str
    """What happened and what the next `pulumi up` / `fsdp-eks start` do, for the user."""


@dataclass(frozen=True)
class StartResult:
    namespace: str
    name: str
    was_running: bool
    """The job was not stopped: nothing was changed, only its workers were waited for."""
    progress: str
    """The start wait's last line (`N/N workers running ...`); empty when not waited for."""
    message: str


def grace_seconds(
    job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None, api: JobApi = PYTORCHJOB
) -> int:
    """The worker pods' `terminationGracePeriodSeconds`, as the job's template sets it (a
    TrainJob's is in its `runtime`)."""
    template = api.pod_template(job, runtime)
    value = (template.get("spec") or {}).get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_S if value is None else int(value)


def stop_timeout_seconds(
    job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None, api: JobApi = PYTORCHJOB
) -> float:
    """How long a stop may take: the pods' grace period (the trainer's checkpoint) plus
    `STOP_MARGIN_S`."""
    return grace_seconds(job, runtime, api) + STOP_MARGIN_S


def read_runtime(
    api: KubeClient, namespace: str, job: Mapping[str, Any], job_api: JobApi
) -> dict[str, Any] | None:
    """The TrainingRuntime a TrainJob's pods come from (None for a PyTorchJob, or when it is
    gone: the defaults then apply)."""
    name = job_api.runtime_name(job)
    if name is None:
        return None
    try:
        return api.get_job(TRAININGRUNTIME, namespace, name)
    except KubernetesApiError as err:
        if err.status != 404:
            raise
    return None


def _read_job(
    api: KubeClient, namespace: str, name: str, stack: str | None, job_api: JobApi = PYTORCHJOB
) -> dict[str, Any]:
    try:
        return api.get_job(job_api, namespace, name)
    except KubernetesApiError as err:
        if err.status != 404:
            raise
    refresh = f"pulumi up --refresh -s {stack}" if stack else "pulumi up --refresh"
    raise JobNotFoundError(
        f"{job_api.kind} {namespace}/{name} not found on the cluster (deleted outside Pulumi, "
        f"or the stack is not deployed): `{refresh}` recreates it"
    )


def _refuse_finished(
    job: Mapping[str, Any], verb: str, stack: str | None, job_api: JobApi = PYTORCHJOB
) -> None:
    outcome = finished(job, job_api)
    if outcome is None:
        return
    meta = job.get("metadata") or {}
    urn = job_urn(stack, job_api) if stack else f"<the {job_api.kind}'s URN>"
    stack_flag = f" -s {stack}" if stack else ""
    raise JobFinishedError(
        f"{job_api.kind} {meta.get('namespace')}/{meta.get('name')} has finished ({outcome}): "
        f"there is nothing to {verb}; `pulumi up --replace '{urn}'{stack_flag}` relaunches it "
        "from its latest checkpoint"
    )


class _Poller:
    """Reads the job and its pods, riding out a few transient API errors."""

    def __init__(
        self, api: KubeClient, namespace: str, name: str, job_api: JobApi = PYTORCHJOB
    ) -> None:
        self.api = api
        self.job_api = job_api
        self.namespace, self.name = namespace, name
        self.selector = job_api.pod_selector(name)
        self.transient = 0

    def read(self) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """(job, pods), or None after a transient error (raises after too many)."""
        try:
            job = self.api.get_job(self.job_api, self.namespace, self.name)
            pods = self.api.list_pods(self.namespace, self.selector)
        except KubernetesCredentialError:
            raise
        except KubernetesApiError as err:
            transient = err.status is None or err.status in TRANSIENT_HTTP
            if not transient or self.transient >= MAX_TRANSIENT_ERRORS:
                raise
            self.transient += 1
            return None
        self.transient = 0
        return job, pods


def _pods_line(pods: list[dict[str, Any]]) -> str:
    terminating = sum(1 for p in pods if (p.get("metadata") or {}).get("deletionTimestamp"))
    line = f"{len(pods)} pod(s) of the job left"
    if terminating:
        line += f", {terminating} terminating (SIGTERM: the trainer saves a checkpoint)"
    return line


def stop_job(
    api: KubeClient,
    namespace: str,
    name: str,
    *,
    stack: str | None = None,
    timeout_s: float | None = None,
    poll_s: float = STOP_POLL_S,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    job_api: JobApi = PYTORCHJOB,
) -> StopResult:
    """Suspend the job and wait until the operator reports it `Suspended` and its pods are
    gone; `timeout_s` defaults to `stop_timeout_seconds` of the job.

    Raises `JobNotFoundError`, `JobFinishedError`, `PodsRemainError` (the job is suspended,
    but pods remain at the limit) or `KubernetesApiError` (refused, or no answer).
    """
    report = on_progress or (lambda _line: None)
    kind = job_api.kind
    job = _read_job(api, namespace, name, stack, job_api)
    _refuse_finished(job, "stop", stack, job_api)
    already = _is_held(api, job, job_api)
    before = suspend_owners(job, job_api)
    runtime = read_runtime(api, namespace, job, job_api)
    # Also when already suspended: the apply makes fsdp-eks an owner of `true`, which an
    # owner Pulumi takes over (kubectl's) alone would not keep (infra.job.suspension).
    _hold(api, job, True, job_api)
    limit = stop_timeout_seconds(job, runtime, job_api) if timeout_s is None else timeout_s
    started = clock()
    deadline = started + limit
    poller = _Poller(api, namespace, name, job_api)
    last = ""
    while True:
        state = poller.read()
        if state is not None:
            job, pods = state
            suspended = true_condition(job, job_api.suspended_condition) is not None
            if suspended and not pods:
                break
            line = _pods_line(pods) if pods else "waiting for the operator to mark it Suspended"
            if line != last:
                report(line)
                last = line
        if clock() >= deadline:
            raise PodsRemainError(
                f"{kind} {namespace}/{name} is suspended, but {limit:.0f} s later: "
                f"{last or 'the API server did not answer'}; the operator (is it running?) or "
                f"the kubelet has not finished: see `kubectl -n {namespace} get pods -l "
                f"{job_api.pod_selector(name)}`"
            )
        sleep(poll_s)
    waited = clock() - started
    resume = f"fsdp-eks start {stack}" if stack else "fsdp-eks start <stack>"
    if already:
        held = f" (held by {', '.join(before)})" if before else ""
        head = f"{kind} {namespace}/{name} was already stopped{held}; it is held by fsdp-eks now."
    else:
        head = (
            f"Stopped {kind} {namespace}/{name} in {waited:.0f} s: its pods are gone, so "
            "the autoscaler removes its GPU nodes; the platform and checkpoints stay."
        )
    message = f"{head}\n`{resume}` resumes it from its latest checkpoint.\n{STOPPED_AND_PULUMI}"
    return StopResult(namespace, name, already, waited, message)


def _wait_for_pods_to_go(
    poller: _Poller,
    limit_s: float,
    *,
    poll_s: float,
    report: Callable[[str], None],
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> None:
    deadline = clock() + limit_s
    last = ""
    while True:
        state = poller.read()
        if state is not None and not state[1]:
            return
        if state is not None:
            line = _pods_line(state[1]) + ": waiting for them to go before resuming"
            if line != last:
                report(line)
                last = line
        if clock() >= deadline:
            raise PodsRemainError(
                f"{limit_s:.0f} s later: {last or 'the API server did not answer'}; the "
                "resumed pods take the same names, so start again once they are gone"
            )
        sleep(poll_s)


def start_job(
    api: KubeClient,
    namespace: str,
    name: str,
    *,
    stack: str | None = None,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    wait: bool = True,
    limit_s: float | None = None,
    terminating_timeout_s: float | None = None,
    poll_s: float = STOP_POLL_S,
    watch_poll_s: float = DEFAULT_POLL_SECONDS,
    on_progress: Callable[[str], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    job_api: JobApi = PYTORCHJOB,
) -> StartResult:
    """Resume a stopped job and (with `wait`) wait until every worker trains, as `pulumi up`
    does: `start_timeout_s` is the stack's start budget (the run plan's
    `timeouts.start_budget_seconds`), `limit_s` the whole wait (default: that budget plus a
    stable minute). Pods still terminating are waited for first, up to
    `terminating_timeout_s` (default: `stop_timeout_seconds` of the job).

    Raises `JobNotFoundError`, `JobFinishedError`, `PodsRemainError`, `KubernetesApiError`,
    and `infra.job.start_rule.JobStartError` when the workers cannot start (the job is then
    suspended again so that it holds no GPU node: the message says so).
    """
    report = on_progress or (lambda _line: None)
    kind = job_api.kind
    job = _read_job(api, namespace, name, stack, job_api)
    _refuse_finished(job, "start", stack, job_api)
    runtime = read_runtime(api, namespace, job, job_api)
    watched = WatchedJob(
        namespace,
        name,
        workers=job_api.workers(job),
        backoff_limit=job_api.backoff_limit(job, runtime),
        start_timeout_s=start_timeout_s,
        stack=stack,
        api=job_api,
    )
    was_running = not _is_held(api, job, job_api)
    if not was_running:
        poller = _Poller(api, namespace, name, job_api)
        limit = (
            stop_timeout_seconds(job, runtime, job_api)
            if terminating_timeout_s is None
            else terminating_timeout_s
        )
        _wait_for_pods_to_go(poller, limit, poll_s=poll_s, report=report, clock=clock, sleep=sleep)
        _hold(api, job, False, job_api)
        report(f"resumed {kind} {namespace}/{name}: waiting for its workers")
    progress = ""
    if wait:
        progress = wait_for_start(
            api,
            watched,
            limit_s=limit_s,
            poll_s=watch_poll_s,
            clock=clock,
            sleep=sleep,
            on_progress=report,
        )
    if was_running:
        message = f"{kind} {namespace}/{name} was not stopped; nothing was changed."
    else:
        message = (
            f"Started {kind} {namespace}/{name}: it resumes from its latest checkpoint. "
            "job.maxRunHours (the job's deadline) counts afresh from this start, so "
            "cost.maxUsdPerRun bounds each start, not the whole run."
        )
    if progress:
        message += f"\n{progress}"
    return StartResult(namespace, name, was_running, progress, message)
