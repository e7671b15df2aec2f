"""Wait until every worker of a PyTorchJob trains, or fail fast with the reason.

The loop behind `pulumi up`'s start watch (`infra.launch.start_watch`, a dynamic resource)
and `fsdp-eks start`: it polls the job, its pods and (while a pod is Pending) their Warning
events through the Kubernetes API and asks `infra.job.start_rule.assess` what they mean.
Pure (no pulumi), so the command-line tool runs the very same wait.

The caller needs read access to PyTorchJobs, Pods and Events in the job's namespace (without
the last, mount failures are only reported at the time limit), and patch on PyTorchJobs, to
suspend a job that cannot start so that its GPU nodes are released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from infra.job.job_api import PYTORCHJOB, JobApi
from infra.job.kube_client import KubeClient, KubernetesApiError, KubernetesCredentialError
from infra.job.queue_hold import set_active, workload_of
from infra.job.queueing import is_queued
from infra.job.start_rule import (
    DEFAULT_START_TIMEOUT_S,
    STABLE_RUNNING_S,
    JobStartError,
    StartHistory,
    assess,
)
from infra.job.suspension import is_suspended, job_urn, set_suspended

logger = logging.getLogger(__name__)

DEFAULT_POLL_SECONDS = 15.0
"""Pods change state over tens of seconds; faster polling only loads the API server."""

TRANSIENT_HTTP = frozenset({429, 500, 502, 503, 504})
MAX_TRANSIENT_ERRORS = 8


def wait_limit_seconds(start_timeout_s: float) -> float:
    """The longest `up` waits: the last worker may start at the end of the start budget and
    must then run `STABLE_RUNNING_S`. `start_rule.assess` fails most stuck jobs much sooner."""
    return start_timeout_s + STABLE_RUNNING_S


@dataclass(frozen=True)
class WatchedJob:
    namespace: str
    name: str
    workers: int
    backoff_limit: int = 3
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S
    stack: str | None = None
    """The stack the job belongs to, for the commands the messages suggest (None: unknown,
    as in the Pulumi program's dynamic provider; the messages say `<stack>`)."""
    api: JobApi = PYTORCHJOB
    """The job's API (`job.api`)."""

    @property
    def stack_or_placeholder(self) -> str:
        return self.stack or "<stack>"


def release_gpus(
    api: KubeClient, job: WatchedJob, workload: Mapping[str, Any] | None = None
) -> str:
    """All or nothing: a job that cannot start all its workers must not hold the nodes it got.

    Suspending the PyTorchJob makes the operator delete its pods and services (training-
    operator v1.9.0 `pkg/controller.v1/common/job.go`: `IsJobSuspended` -> `CleanUpResources`
    -> `DeletePodsAndServices`, every pod of an unfinished job), so the autoscaler scales the
    GPU nodes back to zero. Suspended exactly as `fsdp-eks stop` does it
    (`infra.job.suspension.set_suspended`), so `fsdp-eks start` resumes it whatever the next
    `pulumi up` does; a queued job (its Kueue `workload` given) is held through the Workload
    instead, as `fsdp-eks stop` holds it. Returns the sentence to add to the error.
    """
    stack = job.stack_or_placeholder
    try:
        if workload is not None:  # queued: Kueue would undo a suspend (infra.job.queue_hold)
            set_active(api, workload, False)
        else:
            set_suspended(api, job.namespace, job.name, True, job.api)
    except KubernetesApiError as err:
        return (
            f"; could not suspend the job to release its GPU nodes ({err}): `fsdp-eks stop "
            f"{stack}` or delete its pods, or the nodes it holds keep billing"
        )
    how = "its Kueue Workload was deactivated" if workload is not None else "the job was suspended"
    return (
        f"; {how} so its pods and GPU nodes are released (to try again as it "
        f"is: `fsdp-eks start {stack}`)"
    )


def _queued_workload(
    api: KubeClient, job: dict[str, Any], job_api: JobApi
) -> dict[str, Any] | None:
    """A queued job's Kueue Workload; None when not queued, none yet, or not readable (403:
    the watcher may not read Workloads; 404: no Kueue CRDs), when the wait reads the job alone."""
    if not is_queued(job):
        return None
    try:
        return workload_of(api, job, job_api)
    except KubernetesApiError as err:
        if err.status in (403, 404):
            return None
        raise


def _pending(pods: list[dict[str, Any]]) -> bool:
    return any(p.get("status", {}).get("phase") == "Pending" for p in pods)


def wait_for_start(
    api: KubeClient,
    job: WatchedJob,
    *,
    limit_s: float | None = None,
    poll_s: float = DEFAULT_POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_progress: Callable[[str], None] | None = None,
) -> str:
    """Poll until every worker runs (returns the progress line) or raise `JobStartError`;
    `limit_s` defaults to the job's start budget plus a stable minute. Each new progress
    line goes to `on_progress` (default: this module's logger)."""
    report = on_progress or (lambda line: logger.info("%s", line))
    if limit_s is None:
        limit_s = wait_limit_seconds(job.start_timeout_s)
    kind = job.api.kind
    selector = job.api.pod_selector(job.name)
    # Event field selectors: pkg/registry/core/event/strategy.go `ToSelectableFields`.
    warnings = "involvedObject.kind=Pod,type=Warning"
    read_events = True
    history = StartHistory()
    workload: dict[str, Any] | None = None
    admitted = True  # not queued, or queued and past admission (its job unsuspended)
    deadline = clock() + limit_s
    transient = 0
    last_progress = ""
    follow = f"kubectl -n {job.namespace} describe {job.api.kubectl_name} {job.name}"
    urn = job_urn(job.stack, job.api) if job.stack else f"<the {kind}'s URN>"
    while True:
        try:
            document = api.get_job(job.api, job.namespace, job.name)
            pods = api.list_pods(job.namespace, selector)
            workload = _queued_workload(api, document, job.api)
            events: list[dict[str, Any]] = []
            if read_events and _pending(pods):
                try:
                    events = api.list_events(job.namespace, warnings)
                except KubernetesApiError as err:
                    if err.status is None or err.status in TRANSIENT_HTTP:
                        raise
                    read_events = False
                    logger.info(
                        "cannot read Events (HTTP %s): mount failures show at the limit",
                        err.status,
                    )
            transient = 0
        except KubernetesCredentialError as err:
            raise JobStartError(str(err)) from None
        except KubernetesApiError as err:
            if err.status in (401, 403):
                raise JobStartError(
                    f"the Kubernetes API refused to show {kind} {job.namespace}/{job.name} "
                    f"(HTTP {err.status}): the identity the kubeconfig signs as needs read "
                    f"access to {job.api.plural} and pods in that namespace (an EKS access "
                    "entry); "
                    f"{err}"
                ) from None
            if err.status == 404:
                raise JobStartError(
                    f"{kind} {job.namespace}/{job.name} disappeared while waiting for "
                    "it to start (deleted by someone, or its CRD was removed)"
                ) from None
            if err.status is None and transient >= MAX_TRANSIENT_ERRORS:
                raise JobStartError(
                    f"the Kubernetes API server stopped answering while waiting for "
                    f"{kind} {job.name}: {err}"
                ) from None
            if err.status is not None and (
                err.status not in TRANSIENT_HTTP or transient >= MAX_TRANSIENT_ERRORS
            ):
                raise JobStartError(f"watching {kind} {job.name}: {err}") from None
            transient += 1
        else:
            admitted_now = not (is_queued(document) and is_suspended(document, job.api))
            if admitted_now and not admitted:
                # Admitted after a wait in the queue: the start budget counts from admission,
                # or a long wait would leave the nodes no time to come up before the release.
                deadline = clock() + limit_s
            admitted = admitted_now
            now = datetime.now(UTC)
            history.observe(pods, now)
            verdict = assess(
                document,
                pods,
                workers=job.workers,
                now=now,
                backoff_limit=job.backoff_limit,
                start_timeout_s=job.start_timeout_s,
                events=events,
                history=history,
                stack=job.stack,
                workload=workload,
                api=job.api,
            )
            if verdict.failure is not None and verdict.progress == "stopped":
                raise JobStartError(verdict.failure)
            if verdict.failure is not None:
                holds_nodes = verdict.progress in ("cannot start", "restarting")
                released = release_gpus(api, job, workload) if holds_nodes else ""
                # A later `up` does not relaunch an unchanged job: it would report this again.
                raise JobStartError(
                    f"{verdict.failure}{released} (details: `{follow}`; to relaunch the same "
                    f"job, `pulumi up --replace {urn}`)"
                )
            if verdict.done:
                report(verdict.progress)
                return verdict.progress
            if verdict.progress != last_progress:
                report(verdict.progress)
                last_progress = verdict.progress
        timed_out = clock() >= deadline
        if timed_out and not admitted:
            # Not admitted, it holds no node: it stays in its queue and starts when admitted.
            raise JobStartError(
                f"{kind} {job.name}: not admitted by Kueue within {limit_s / 60:.0f} min "
                f"({last_progress or 'no status'}); it stays queued and starts once admitted "
                f"(`fsdp-eks status {job.stack_or_placeholder}` shows where it waits; "
                f"`fsdp-eks stop {job.stack_or_placeholder}` takes it out of the queue)"
            )
        if timed_out:
            raise JobStartError(
                f"{kind} {job.name}: not every worker started within "
                f"{limit_s / 60:.0f} min ({last_progress or 'no status'})"
                f"{release_gpus(api, job, workload)}; see `{follow}`"
            )
        sleep(poll_s)
