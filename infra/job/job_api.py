"""The job API a run is submitted as: its group, version, kind, suspend field, pod labels and
condition names, in one place that every verb reads (stop/start, the start watch, status,
logs), so that a second job API is one more instance.

`PYTORCHJOB` is Kubeflow training-operator v1's (v1.9.0 `pkg/apis/kubeflow.org/v1/
pytorch_types.go`, `common_types.go`). Kubeflow Trainer v2's TrainJob
(`trainer.kubeflow.org/v1alpha1`) would be another: `spec.suspend`, pods labelled by JobSet.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JobApi:
    group: str
    version: str
    plural: str
    kind: str
    suspend_path: tuple[str, ...]
    """Where the job's `suspend` switch sits in the object."""
    job_name_label: str
    """The label the controller puts on every pod of a job, valued with the job's name."""
    suspended_condition: str = "Suspended"
    succeeded_condition: str = "Succeeded"
    failed_condition: str = "Failed"
    running_condition: str = "Running"

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

    def pod_selector(self, name: str) -> str:
        """The label selector of the job's pods."""
        return f"{self.job_name_label}={name}"

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


PYTORCHJOB = JobApi(
    group="kubeflow.org",
    version="v1",
    plural="pytorchjobs",
    kind="PyTorchJob",
    suspend_path=("spec", "runPolicy", "suspend"),
    job_name_label="training.kubeflow.org/job-name",
)
"""training-operator v1.9.0's PyTorchJob: `runPolicy.suspend` (since v1.7.0), pods labelled
`training.kubeflow.org/job-name` (`common_types.go` `JobNameLabel`)."""
