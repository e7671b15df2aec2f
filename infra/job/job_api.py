"""The job API a run is submitted as: its group, version, kind, suspend field, pod labels and
condition names, in one place that every verb reads (stop/start, the start watch, status,
logs), so that a second job API is one more instance.

`PYTORCHJOB` is Kubeflow training-operator v1's (v1.9.0 `pkg/apis/kubeflow.org/v1/
pytorch_types.go`, `common_types.go`); `TRAINJOB` is Kubeflow Trainer v2's (v2.3.0
`pkg/apis/trainer/v1alpha1/trainjob_types.go`): `spec.suspend`, pods made by JobSet, the pod
template in the TrainingRuntime it names. Where a verb needs the worker count, restart limit or
pod template, it asks the job's API (`workers`, `backoff_limit`, `pod_template`), handing in
the runtime for a TrainJob (`runtime_name`), never reading either layout itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CustomKind:
    """A custom resource as the API server serves it."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def resource(self) -> str:
        """The resource as RBAC and kubectl name it (`pytorchjobs.kubeflow.org`)."""
        return f"{self.plural}.{self.group}"

    @property
    def kubectl_name(self) -> str:
        """What a person types after `kubectl get` (`pytorchjob`)."""
        return self.kind.lower()


TRAININGRUNTIME = CustomKind(
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainingruntimes",
    kind="TrainingRuntime",
)
"""Kubeflow Trainer v2.3.0's namespaced runtime (`trainingruntime_types.go`): the JobSet
template a TrainJob's pods come from."""


@dataclass(frozen=True)
class JobApi(CustomKind):
    name: str
    """The `job.api` value that selects it."""
    suspend_path: tuple[str, ...]
    """Where the job's `suspend` switch sits in the object."""
    job_name_label: str
    """The label the controller puts on every pod of a job, valued with the job's name."""
    suspended_condition: str = "Suspended"
    succeeded_condition: str = "Succeeded"
    failed_condition: str = "Failed"
    container_name: str = "pytorch"
    """The trainer container in each pod."""
    first_worker_suffix: str | None = "-worker-0"
    """Worker 0's pod name after the job's name; None where pod names carry a random suffix
    (then `first_worker_selector` finds it)."""
    first_worker_label: str = "training.kubeflow.org/replica-index"
    """The label whose value 0 marks worker 0's pod."""
    worker_label: tuple[str, str] = ("training.kubeflow.org/replica-type", "worker")
    """(label, value) on every trainer pod of the job."""
    controller: str = "the training operator"
    """Who reconciles the job, for messages."""

    def pod_selector(self, name: str) -> str:
        """The label selector of the job's pods."""
        return f"{self.job_name_label}={name}"

    def is_worker(self, pod: Mapping[str, Any]) -> bool:
        """Whether `pod` is one of the job's trainer pods."""
        label, value = self.worker_label
        return bool((_at(pod, "metadata", "labels") or {}).get(label) == value)

    def picked_up(self, job: Mapping[str, Any]) -> bool:
        """Whether the controller has written any status yet (the operator adds `Created` at
        once; Trainer v2 writes `jobsStatus` from the JobSet and no condition while running)."""
        status = job.get("status") or {}
        return bool(status.get("conditions") or status.get("jobsStatus"))

    def first_worker_selector(self, name: str) -> str:
        """The label selector of worker 0's pod."""
        return f"{self.pod_selector(name)},{self.first_worker_label}=0"

    def runtime_name(self, job: Mapping[str, Any]) -> str | None:
        """The TrainingRuntime whose template the job's pods come from (None: the job holds
        its pod template itself)."""
        if self is not TRAINJOB:
            return None
        ref = _at(job, "spec", "runtimeRef")
        if (
            not isinstance(ref, Mapping)
            # The CRD defaults a missing kind to ClusterTrainingRuntime (v2.3.0 trainjob_types.go).
            or ref.get("kind", "ClusterTrainingRuntime") != TRAININGRUNTIME.kind
        ):
            return None
        name = ref.get("name")
        return str(name) if name else None

    def workers(self, job: Mapping[str, Any]) -> int:
        """The number of worker pods (nodes) the job runs."""
        if self is TRAINJOB:
            value = _at(job, "spec", "trainer", "numNodes")
        else:
            value = _at(job, "spec", "pytorchReplicaSpecs", "Worker", "replicas")
        return 1 if value is None else int(value)

    def _worker_job(self, runtime: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The runtime's trainer Job spec (TrainJob)."""
        jobs = _at(runtime or {}, "spec", "template", "spec", "replicatedJobs") or []
        for replicated in jobs:
            labels = _at(replicated, "template", "metadata", "labels") or {}
            if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") == "trainer":
                return _at(replicated, "template", "spec") or {}
        return {}

    def backoff_limit(
        self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> int:
        """Restarts of the job's pods before it fails (PyTorchJob `runPolicy.backoffLimit`;
        TrainJob: the runtime's trainer Job's `backoffLimit`, see infra.job.trainjob_manifest)."""
        if self is TRAINJOB:
            value = self._worker_job(runtime).get("backoffLimit")
        else:
            value = _at(job, "spec", "runPolicy", "backoffLimit")
        return 3 if value is None else int(value)

    def pod_template(
        self, job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None
    ) -> Mapping[str, Any]:
        """The worker pods' template ({} when not known)."""
        if self is TRAINJOB:
            return self._worker_job(runtime).get("template") or {}
        return _at(job, "spec", "pytorchReplicaSpecs", "Worker", "template") or {}

    def suspend_patch(self, namespace: str, name: str, suspended: bool) -> dict[str, Any]:
        """The apply configuration: the object's identity and the suspend field only."""
        body: dict[str, Any] = {"apiVersion": self.api_version, "kind": self.kind}
        body["metadata"] = {"name": name, "namespace": namespace}
        node = body
        for step in self.suspend_path[:-1]:
            node = node.setdefault(step, {})
        node[self.suspend_path[-1]] = suspended
        return body

    def suspend_requested(self, job: Mapping[str, Any]) -> bool | None:
        """The suspend field as stored (None when absent)."""
        value: Any = job
        for step in self.suspend_path:
            value = value.get(step) if isinstance(value, Mapping) else None
        return None if value is None else bool(value)


def _at(document: Any, *steps: str) -> Any:
    for step in steps:
        document = document.get(step) if isinstance(document, Mapping) else None
    return document


PYTORCHJOB = JobApi(
    name="pytorchjob",
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    kind="PyTorchJob",
    suspend_path=("spec", "runPolicy", "suspend"),
    job_name_label="training.kubeflow.org/job-name",
)
"""training-operator v1.9.0's PyTorchJob: `runPolicy.suspend` (since v1.7.0), pods labelled
`training.kubeflow.org/job-name` (`common_types.go` `JobNameLabel`)."""


TRAINJOB = JobApi(
    name="trainjob",
    group="trainer.kubeflow.org",
    version="v1alpha1",
    plural="trainjobs",
    kind="TrainJob",
    suspend_path=("spec", "suspend"),
    job_name_label="jobset.sigs.k8s.io/jobset-name",
    succeeded_condition="Complete",
    container_name="node",
    first_worker_suffix=None,
    first_worker_label="batch.kubernetes.io/job-completion-index",
    worker_label=("jobset.sigs.k8s.io/replicatedjob-name", "node"),
    controller="Kubeflow Trainer v2 and JobSet",
)
"""Kubeflow Trainer v2.3.0's TrainJob: `spec.suspend`, copied onto its JobSet (`plugins/jobset/
jobset.go` `Build`); conditions `Suspended`, `Complete`, `Failed` (`trainjob_types.go`), no
`Running`; pods labelled `jobset.sigs.k8s.io/jobset-name` = the TrainJob's name (the JobSet
takes it: jobset v0.12.0 `api/jobset/v1alpha2/jobset_types.go` `JobSetNameKey`) and, as
Indexed Job pods, `batch.kubernetes.io/job-completion-index`; the trainer container is `node`."""

JOB_APIS = {api.name: api for api in (PYTORCHJOB, TRAINJOB)}


def job_api(name: str) -> JobApi:
    """The job API `job.api` names (the config model allows only these)."""
    return JOB_APIS[name]
