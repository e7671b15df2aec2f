"""Suspending and resuming the PyTorchJob without disturbing Pulumi's hold on it.

A run is stopped by setting the job's `spec.runPolicy.suspend` to true: the training operator
then deletes every pod and service of the unfinished job, gracefully (SIGTERM, the pod's grace
period: the trainer saves a checkpoint), marks it `Suspended=True` and `Running=False`, and
the autoscaler removes the idle GPU nodes; false brings it back with new pods that resume
from the latest checkpoint (training-operator v1.9.0 `pkg/controller.v1/common/job.go`
`ReconcileJobs`; `pkg/controller.v1/control/pod_control.go` `DeletePod`).

How it is set decides what the next `pulumi up` does, so there is exactly one way: a
server-side apply of only that field, as field manager `FIELD_MANAGER`, forced.

* Apply, not a merge patch: an apply makes its manager own every field it sends, changed or
  not, while an update claims only what it changed (kubernetes-sigs/structured-merge-diff
  v6.4.0 `merge/update.go` `Updater.Apply` / `Updater.Update`). So stopping a job that
  someone already suspended with `kubectl patch` still makes `fsdp-eks` an owner of
  `suspend: true`, and Pulumi's takeover of kubectl's fields (below) cannot prune it.
* Forced: the job's creator owns `suspend: false`. pulumi-kubernetes creates a job with a
  plain POST as manager `pulumi-kubernetes` (v4.32.0 `provider/pkg/await/await.go`
  `Creation`), the CRD defaults `suspend` to false while decoding (`+kubebuilder:default`
  in v1.9.0 `pkg/apis/kubeflow.org/v1/common_types.go`; kubernetes/apiextensions-apiserver
  `customresource_handler.go` `unstructuredDefaulter`), and the create's field manager owns
  what it stored. An unforced apply of `true` conflicts with that owner (409).
* The manager's name starts with none of `kubectl`, `before-first-apply`,
  `pulumi-kubernetes`, `pulumi-resource-kubernetes`: on every in-place update
  pulumi-kubernetes moves the fields of managers with those prefixes into its own manager
  (v4.32.0 `await.go` `fixCSAFieldManagers`, fluxcd/pkg `ssa/patch.go` `matchFieldManager`
  prefix match) and then applies its manifest, which omits `suspend`, so the field would be
  pruned and defaulted back to false: the job would silently start.
* Resuming applies `suspend: false` explicitly rather than dropping the field: another owner
  of `true` (an older all-or-nothing release, recorded as `Python-urllib`) would otherwise keep
  the job stopped.

The program never renders `suspend` (`infra.job.manifest.render_job` says why), so Pulumi has
no opinion on it: its diff compares inputs with the live object pruned to the inputs' shape
(pulumi-kubernetes `provider/pkg/provider/provider.go` `Diff`, `pruneLiveState`).
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
