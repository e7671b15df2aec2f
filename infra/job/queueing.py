"""The job in a Kueue queue: its labels, which Kueue integration serves it, what the plan says,
and its Workload's admission state as `status` shows it.

Kueue v0.19.2 facts: the queue and priority labels, created suspended by its webhook, then
owning `suspend`; the Workload's conditions and admission checks say where admission stands.
Each fact with its source: docs/design/job.md#queueing
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from infra.config.scheduling import SchedulingConfig

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
"""The storage version of every Kueue v0.19.2 CRD (v1beta1 is served, deprecated)."""
WORKLOAD_VERSION = "v1beta1"
"""The version the verbs read and apply Workloads in: v1beta2 came with Kueue v0.15.0, and an
existing cluster (HyperPod task governance) may run an older Kueue; v0.19.2 still serves
v1beta1 (`charts/kueue/templates/crd/`), and `spec.active` and the conditions read here are
the same in both."""
WORKLOAD_PLURAL = "workloads"

KUEUE_FRAMEWORKS = {
    "pytorchjob": "kubeflow.org/pytorchjob",
    "trainjob": "trainer.kubeflow.org/trainjob",
}
"""Kueue's integration per job API (`FrameworkName` in v0.19.2 `pkg/controller/jobs/kubeflow/
jobs/pytorchjob/pytorchjob_controller.go` and `pkg/controller/jobs/trainjob/
trainjob_controller.go`)."""

DEPRECATED_FRAMEWORKS = {
    "kubeflow.org/pytorchjob": (
        "Kueue has deprecated its PyTorchJob (Kubeflow Trainer v1) integration and plans to "
        "remove it, tentatively in v0.20 (kueue v0.19.2 site/content/en/docs/tasks/run/kubeflow/"
        "pytorchjobs.md); Kubeflow Trainer v2's TrainJob is the integration Kueue keeps"
    ),
}
"""Why each deprecated integration is; the plan adds who switches it on (Kueue v0.19's chart
leaves `kubeflow.org/pytorchjob` out of `integrations.frameworks`, `charts/kueue/values.yaml`)."""


def kueue_integrations(job_api: str) -> tuple[str, ...]:
    """The one place that decides which Kueue integration is on: the one for `job_api`
    (`job.api`: `pytorchjob`, the default, or `trainjob`), and no other, so Kueue manages
    nothing else the cluster runs."""
    try:
        return (KUEUE_FRAMEWORKS[job_api],)
    except KeyError:
        raise ValueError(
            f"job API {job_api!r} has no Kueue integration here; allowed: "
            f"{', '.join(sorted(KUEUE_FRAMEWORKS))}"
        ) from None


def queue_labels(scheduling: SchedulingConfig) -> dict[str, str]:
    """The labels that put the job in its queue (empty when it is not queued)."""
    labels: dict[str, str] = {}
    if scheduling.local_queue is not None:
        labels[QUEUE_LABEL] = scheduling.local_queue
    if scheduling.priority_class is not None:
        labels[PRIORITY_CLASS_LABEL] = scheduling.priority_class
    return labels


def is_queued(job: Mapping[str, Any]) -> bool:
    """Whether a job as stored is Kueue's (it carries the queue label)."""
    return QUEUE_LABEL in ((job.get("metadata") or {}).get("labels") or {})


def plan_lines(scheduling: SchedulingConfig, *, cluster_mode: str, job_api: str) -> list[str]:
    """What the plan says about the queue: where the job waits, what admits it, deprecations."""
    if not scheduling.queued:
        return []
    where = f"LocalQueue {scheduling.local_queue!r}"
    if scheduling.priority_class is not None:
        where += f", WorkloadPriorityClass {scheduling.priority_class!r}"
    lines = []
    wait = "`pulumi up` waits for it up to job.startTimeoutMinutes, then leaves the job queued"
    if cluster_mode == "create":
        lines.append(
            f"queued: Kueue (installed by this stack), {where}; the job waits for admission: "
            "quota in the stack's ClusterQueue and a ProvisioningRequest for all its nodes at "
            "once (class best-effort-atomic-scale-up), which the cluster autoscaler accepts "
            "before any pod is created (on AWS not atomic: EC2 may still grant fewer nodes, "
            f"so the worst partial start stays priced); {wait}"
        )
    else:
        lines.append(
            f"queued: the cluster's Kueue, {where}; the job waits for admission by the "
            "cluster's ClusterQueue (quota, priority, preemption are its operators' policy) "
            f"before any pod is created; {wait}"
        )
    for framework in kueue_integrations(job_api):
        if framework in DEPRECATED_FRAMEWORKS:
            who = (
                "this stack's Kueue switches it on"
                if cluster_mode == "create"
                else f"the cluster's Kueue must list {framework} in integrations.frameworks "
                "(v0.19 leaves it out by default: `kubectl -n kueue-system get configmap "
                "kueue-manager-config -o yaml`)"
            )
            lines.append(f"note: {DEPRECATED_FRAMEWORKS[framework]}; {who}")
    return lines


def owned_workloads(
    workloads: Sequence[Mapping[str, Any]], *, kind: str, name: str, uid: str | None = None
) -> list[Mapping[str, Any]]:
    """The Workloads whose ownerReferences name the job (by uid when it is known)."""
    found = []
    for workload in workloads:
        for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("kind") != kind or owner.get("name") != name:
                continue
            if uid is not None and owner.get("uid") != uid:
                continue
            found.append(workload)
            break
    return found


def is_deactivated(workload: Mapping[str, Any] | None) -> bool:
    """Whether the Workload is held out of its queue (`spec.active: false`; default true)."""
    return workload is not None and (workload.get("spec") or {}).get("active") is False


def _condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _is_true(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    condition = _condition(workload, kind)
    return condition if condition is not None and condition.get("status") == "True" else None


def admission_state(workload: Mapping[str, Any]) -> str:
    """One line: where the Workload's admission stands, and why when it waits or was refused."""
    checks = ", ".join(
        f"{check.get('name')} {check.get('state')}"
        for check in (workload.get("status") or {}).get("admissionChecks") or []
    )
    checks_text = f" (checks: {checks})" if checks else ""
    if (done := _is_true(workload, "Finished")) is not None:
        return f"finished: {done.get('reason') or ''}".rstrip(": ")
    if is_deactivated(workload):
        return "deactivated (spec.active false): not queued until it is set true"
    evicted = _is_true(workload, "Evicted")
    # Kueue keeps Evicted/Deactivated after `spec.active` is true again, until the Workload
    # gets quota (v0.19.2 `pkg/workload/workload.go` `SetQuotaReservation`): it is pending.
    if evicted is not None and evicted.get("reason") != "Deactivated":
        return f"evicted ({evicted.get('reason')}): {evicted.get('message') or ''}".rstrip(": ")
    if _is_true(workload, "Admitted") is not None:
        return f"admitted{checks_text}"
    if (reserved := _is_true(workload, "QuotaReserved")) is not None:
        queue = (reserved.get("message") or "").strip()
        return f"quota reserved, waiting for admission checks{checks_text}" + (
            f": {queue}" if queue and not checks else ""
        )
    pending = _condition(workload, "QuotaReserved")
    reason = (pending or {}).get("message") or "not yet seen by Kueue"
    return f"pending: {reason}{checks_text}"
