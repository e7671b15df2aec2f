"""The `scheduling` section: whether the run waits in a Kueue queue, and which.

`kueue: true` (create mode: the stack installs Kueue with a ProvisioningRequest admission
check) or `queue` (existing mode: the operators' LocalQueue). Both names are Kueue label
values (kueue v0.19.2 `pkg/controller/constants/constants.go`), so DNS-1123 labels.
Both ways, with sources: docs/design/config.md#scheduling
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator

from infra.config.base import ConfigSection

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DEFAULT_LOCAL_QUEUE = "fsdp-eks"
"""The LocalQueue the stack creates with `kueue: true` when `queue` names none."""


def _dns_label(value: str | None, key: str) -> str | None:
    if value is not None and not _DNS1123_LABEL.match(value):
        raise ValueError(
            f"{key} {value!r} is not a DNS-1123 label (what Kueue's label and object names "
            "take): lowercase letters, digits and '-', starting and ending alphanumeric, at "
            "most 63 characters"
        )
    return value


class SchedulingConfig(ConfigSection):
    """`fsdp-eks:scheduling`: the run queued by Kueue, or submitted directly (the default)."""

    kueue: bool = Field(
        default=False,
        description=(
            "cluster.mode create only: install Kueue (pinned chart) with a ClusterQueue whose "
            "quota is the GPU node group, a LocalQueue in the job's namespace and a "
            "ProvisioningRequest admission check, so the job is admitted only once the cluster "
            "autoscaler has asked for all of its nodes at once."
        ),
    )
    queue: str | None = Field(
        default=None,
        description=(
            "The LocalQueue (in the job's namespace) the job is submitted to, as the label "
            "kueue.x-k8s.io/queue-name. cluster.mode existing: the cluster's queue (e.g. a "
            "HyperPod task governance team's); create with kueue: true: the name of the queue "
            f"the stack creates (default {DEFAULT_LOCAL_QUEUE!r})."
        ),
    )
    priority_class: str | None = Field(
        default=None,
        description=(
            "cluster.mode existing with a queue: the cluster's WorkloadPriorityClass for the "
            "job, as the label kueue.x-k8s.io/priority-class."
        ),
    )

    @field_validator("queue")
    @classmethod
    def _queue_name(cls, value: str | None) -> str | None:
        return _dns_label(value, "scheduling.queue")

    @field_validator("priority_class")
    @classmethod
    def _priority_class_name(cls, value: str | None) -> str | None:
        return _dns_label(value, "scheduling.priorityClass")

    @property
    def queued(self) -> bool:
        """Whether Kueue admits the job (so it waits for admission before any pod exists)."""
        return self.kueue or self.queue is not None

    @property
    def local_queue(self) -> str | None:
        """The LocalQueue the job is labelled for; None when it is not queued."""
        if self.kueue:
            return self.queue or DEFAULT_LOCAL_QUEUE
        return self.queue


def scheduling_problems(
    config: SchedulingConfig,
    *,
    cluster_mode: str,
    autoscaler_installed: bool,
    creates_namespace: bool = False,
) -> list[str]:
    """What cannot work between `scheduling` and the cluster, one line each naming the key."""
    problems: list[str] = []
    if cluster_mode == "existing" and config.queue is not None and creates_namespace:
        # A LocalQueue is namespaced: a namespace the stack makes holds none of the cluster's.
        problems.append(
            f"scheduling.queue {config.queue!r} is a LocalQueue in job.namespace, which this "
            "stack creates (job.createNamespace true), so it cannot hold the cluster's queue; "
            "allowed: job.namespace set to the namespace of the cluster's LocalQueue with "
            "job.createNamespace false (`kubectl get localqueues -A`)"
        )
    if cluster_mode == "existing" and config.kueue:
        problems.append(
            "scheduling.kueue true installs Kueue, which a stack does only on a cluster it "
            "creates; allowed with cluster.mode existing: false, and scheduling.queue naming "
            "the cluster's LocalQueue (`kubectl get localqueues -n <job namespace>`)"
        )
    if cluster_mode == "create" and config.queue is not None and not config.kueue:
        problems.append(
            f"scheduling.queue {config.queue!r} names a queue, but the cluster this stack "
            "creates runs no Kueue; allowed: set scheduling.kueue: true (the stack creates the "
            "queue under that name), or unset scheduling.queue"
        )
    if config.priority_class is not None and cluster_mode == "create":
        problems.append(
            f"scheduling.priorityClass {config.priority_class!r}: the cluster this stack "
            "creates has no WorkloadPriorityClass and runs one job; allowed with cluster.mode "
            "create: unset it"
        )
    elif config.priority_class is not None and config.queue is None:
        problems.append(
            f"scheduling.priorityClass {config.priority_class!r} needs a queue: Kueue reads it "
            "only on a queued job; allowed: set scheduling.queue too, or unset it"
        )
    if config.kueue and cluster_mode == "create" and not autoscaler_installed:
        problems.append(
            "scheduling.kueue true needs the cluster autoscaler, which serves Kueue's "
            "ProvisioningRequests; allowed: addons.clusterAutoscaler.install true, or "
            "scheduling.kueue false"
        )
    return problems
