"""Kueue's objects for a cluster the stack creates, rendered as plain dicts (no pulumi), so the
tests validate exactly what `infra.platform.kueue` registers against the pinned CRD schemas.

ResourceFlavor `gpu`, a ClusterQueue covering every requested resource, and a
ProvisioningRequest AdmissionCheck of class `best-effort-atomic-scale-up` (kueue v0.19.2
`apis/kueue/v1beta2/`). Each object's why, with sources: docs/design/platform.md#kueue_manifests
"""

from __future__ import annotations

from typing import Any

from infra.config.stack import StackConfig
from infra.job.placement import EFA_RESOURCE, GPU_RESOURCE, gpu_placement
from infra.job.queueing import KUEUE_GROUP, KUEUE_VERSION

API_VERSION = f"{KUEUE_GROUP}/{KUEUE_VERSION}"
FLAVOR = "gpu"
CLUSTER_QUEUE = "fsdp-eks"
ADMISSION_CHECK = "atomic-provisioning"
PROVISIONING_CONFIG = "atomic-provisioning"
PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
MAX_FLAVOR_LABELS = 8


def flavor_labels(config: StackConfig) -> dict[str, str]:
    """The labels that select the GPU group's nodes: exactly what the job's pods already select
    (`infra.job.placement.gpu_placement`, the instance type, which only the GPU group has on a
    created cluster). Kueue merges a flavor's nodeLabels into the admitted job's pod template
    (v0.19.2 `pkg/podset/podset.go` `FromAssignment`, `Merge`), so the same labels leave the
    template as Pulumi rendered it."""
    labels = dict(gpu_placement(config.gpu_nodes).node_selector)
    assert len(labels) <= MAX_FLAVOR_LABELS, labels  # the CRD's maxProperties
    return labels


def group_quota(config: StackConfig) -> dict[str, str]:
    """The GPU group at its maximum size (`gpuNodes.count` nodes), per resource the job's pods
    request: GPUs, EFA interfaces (EFA nodes only), vCPUs and memory."""
    facts, nodes = config.instance, config.gpu_nodes.count
    quota = {
        GPU_RESOURCE: str(nodes * facts.gpus),
        "cpu": str(nodes * facts.vcpus),
        "memory": f"{nodes * facts.memory_gib}Gi",
    }
    efa = config.gpu_nodes.efa_interface_count
    if efa:
        quota[EFA_RESOURCE] = str(nodes * efa)
    return quota


def kueue_objects(config: StackConfig) -> list[dict[str, Any]]:
    """ResourceFlavor, ClusterQueue, LocalQueue (the job's namespace), AdmissionCheck and
    ProvisioningRequestConfig, in the order they refer to each other."""
    local_queue = config.scheduling.local_queue
    assert local_queue is not None, "rendered only with scheduling.kueue"
    quota = group_quota(config)
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": FLAVOR},
            "spec": {"nodeLabels": flavor_labels(config)},
        },
        {
            "apiVersion": API_VERSION,
            "kind": "ProvisioningRequestConfig",
            "metadata": {"name": PROVISIONING_CONFIG},
            "spec": {
                "provisioningClassName": ATOMIC_SCALE_UP,
                # Only pod sets that ask for GPUs need nodes brought up.
                "managedResources": [GPU_RESOURCE],
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "AdmissionCheck",
            "metadata": {"name": ADMISSION_CHECK},
            "spec": {
                "controllerName": PROVISIONING_CONTROLLER,
                "parameters": {
                    "apiGroup": KUEUE_GROUP,
                    "kind": "ProvisioningRequestConfig",
                    "name": PROVISIONING_CONFIG,
                },
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "ClusterQueue",
            "metadata": {"name": CLUSTER_QUEUE},
            "spec": {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": config.job.namespace}
                },
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [
                            {
                                "name": FLAVOR,
                                "resources": [
                                    {"name": name, "nominalQuota": value}
                                    for name, value in quota.items()
                                ],
                            }
                        ],
                    }
                ],
                "admissionChecksStrategy": {"admissionChecks": [{"name": ADMISSION_CHECK}]},
            },
        },
        {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {"name": local_queue, "namespace": config.job.namespace},
            "spec": {"clusterQueue": CLUSTER_QUEUE},
        },
    ]


def manager_config_yaml(frameworks: tuple[str, ...]) -> str:
    """The chart's `managerConfig.controllerManagerConfigYaml` (a whole Configuration, so it
    repeats the chart's own defaults, v0.19.2 `charts/kueue/values.yaml`) with only the job
    API's integration switched on."""
    listed = "\n".join(f'    - "{framework}"' for framework in frameworks)
    return (
        "apiVersion: config.kueue.x-k8s.io/v1beta2\n"
        "kind: Configuration\n"
        "health:\n  healthProbeBindAddress: :8081\n"
        "metrics:\n  bindAddress: :8443\n"
        "webhook:\n  port: 9443\n"
        "leaderElection:\n  leaderElect: true\n  resourceName: c1f6bfd2.kueue.x-k8s.io\n"
        "controller:\n  groupKindConcurrency:\n"
        "    Job.batch: 5\n    Pod: 5\n    Workload.kueue.x-k8s.io: 10\n"
        "    LocalQueue.kueue.x-k8s.io: 5\n    ClusterQueue.kueue.x-k8s.io: 5\n"
        "    ResourceFlavor.kueue.x-k8s.io: 1\n"
        "clientConnection:\n  qps: 300\n  burst: 500\n"
        f"integrations:\n  frameworks:\n{listed}\n"
    )
