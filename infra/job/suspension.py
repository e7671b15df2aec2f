"""Suspending and resuming the PyTorchJob without disturbing Pulumi's hold on it.

`spec.runPolicy.suspend` (training-operator v1.9.0 `pkg/controller.v1/common/job.go`), set in
exactly one way: a server-side apply of only that field, as field manager `FIELD_MANAGER`,
forced, with `false` applied explicitly to resume.
Why apply, why forced, why this manager name, with sources: docs/design/job.md#suspension
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from infra.job.job_api import PYTORCHJOB, JobApi

if TYPE_CHECKING:  # the start rule reads jobs without the client
    from infra.job.kube_client import KubeClient

FIELD_MANAGER = "fsdp-eks"
"""The field manager `fsdp-eks stop` / `start` and the start watch's release apply as."""

SUSPEND_FIELD = PYTORCHJOB.suspend_path

JOB_URN = (
    "urn:pulumi:{stack}::fsdp-eks::fsdp-eks:job:TrainingJob"
    "$kubernetes:{api_version}:{kind}::job-{plural_kind}"
)
"""The job's URN in stack `{stack}` (the program's `TrainingJob("job")` registering
`job-pytorchjob` or `job-trainjob`; tests/infra/golden/urns.json holds every shipped stack's)."""


def job_urn(stack: str, api: JobApi = PYTORCHJOB) -> str:
    """What `pulumi up --replace` takes to relaunch the stack's job."""
    return JOB_URN.format(
        stack=stack, api_version=api.api_version, kind=api.kind, plural_kind=api.kind.lower()
    )


def suspend_patch(namespace: str, name: str, suspended: bool) -> dict[str, Any]:
    """The apply configuration: the object's identity and `spec.runPolicy.suspend` only."""
    return PYTORCHJOB.suspend_patch(namespace, name, suspended)


def set_suspended(
    client: KubeClient, namespace: str, name: str, suspended: bool, api: JobApi = PYTORCHJOB
) -> dict[str, Any]:
    """Suspend (True) or resume (False) the job: a forced apply of only that field as
    `FIELD_MANAGER`. Returns the job as stored; raises `KubernetesApiError`."""
    return client.apply_job(
        api,
        namespace,
        name,
        api.suspend_patch(namespace, name, suspended),
        field_manager=FIELD_MANAGER,
        force=True,
    )


def true_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The job's condition of type `kind` if its status is True (v1.9.0 `pkg/util/status.go`
    `isStatusConditionTrue`)."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def suspend_requested(job: Mapping[str, Any], api: JobApi = PYTORCHJOB) -> bool | None:
    """The suspend field as stored (None when absent: the PyTorchJob CRD defaults it to false,
    a TrainJob may leave it out)."""
    return api.suspend_requested(job)


def is_suspended(job: Mapping[str, Any], api: JobApi = PYTORCHJOB) -> bool:
    """Whether the job is stopped or being stopped: its spec asks for it, or (a document
    without the field) the operator reports it `Suspended`. A job whose spec says false while
    the condition is still True is being resumed, not stopped."""
    requested = suspend_requested(job, api)
    if requested is not None:
        return requested
    return true_condition(job, api.suspended_condition) is not None


def finished(job: Mapping[str, Any], api: JobApi = PYTORCHJOB) -> str | None:
    """`Succeeded` (`Complete`) or `Failed` for a finished job: the operator then ignores
    `suspend` (v1.9.0 `ReconcileJobs` handles finished jobs before suspension; Trainer v2.3.0
    no longer builds a finished TrainJob's JobSet: `pkg/controller/trainjob_controller.go`)."""
    for kind in (api.succeeded_condition, api.failed_condition):
        if true_condition(job, kind) is not None:
            return kind
    return None


def suspend_owners(job: Mapping[str, Any], api: JobApi = PYTORCHJOB) -> list[str]:
    """The field managers that own the suspend field (from `metadata.managedFields`, FieldsV1
    `{"f:spec": {"f:runPolicy": {"f:suspend": {}}}}` on a PyTorchJob), as `name (Operation)`."""
    owners = []
    for entry in (job.get("metadata") or {}).get("managedFields") or []:
        fields: Any = entry.get("fieldsV1") or {}
        for step in api.suspend_path:
            fields = fields.get(f"f:{step}") if isinstance(fields, dict) else None
        if fields is not None:
            owners.append(f"{entry.get('manager')} ({entry.get('operation')})")
    return owners
