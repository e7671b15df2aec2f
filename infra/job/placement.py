"""Where GPU work may run: the GPU nodes' labels and taints, and what a pod needs to land there.

One source for both sides of the match: the node group is created with these labels and
taints (and the autoscaler's node template advertises them), the job, the cluster checks and
the device plugins select and tolerate the same ones. A second copy could drift, and a pod
that tolerates one taint fewer than the nodes carry waits for a node that never comes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from infra.config.cluster import (
    AUTOSCALER_LABEL_TAG_PREFIX,
    GPU_TAINT_KEY,
    NODE_POOL_LABEL,
    GpuNodesConfig,
    TaintConfig,
)
from infra.facts.instances import accelerator_label_value

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""Set by the kubelet on every node (Kubernetes well-known labels): the job selects by it."""
GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource the NVIDIA device plugin advertises."""
EFA_RESOURCE = "vpc.amazonaws.com/efa"
"""Extended resource the EFA device plugin advertises: without a request NCCL uses TCP."""
ACCELERATOR_LABEL = "k8s.amazonaws.com/accelerator"
"""Cluster Autoscaler's GPU label on AWS (kubernetes/autoscaler cluster-autoscaler-1.35.0
`cloudprovider/aws/aws_cloud_provider.go` `GPULabel`). A ready node with this label but no
GPU allocatable yet (the NVIDIA plugin has not registered) counts as unready
(`processors/customresources/gpu_processor.go` `FilterOutNodesWithUnreadyResources`); without
it, a joining GPU node is a ready node without GPUs, and the autoscaler may add more nodes for
pods it cannot yet place there. Its value only names the model in CA's metrics."""
TEMPLATE_TAG = AUTOSCALER_LABEL_TAG_PREFIX.removesuffix("/label/")
"""Prefix of the tags that describe a node group's nodes to Cluster Autoscaler while it has
none (`cloudprovider/aws/aws_manager.go` `buildNodeFromTemplate`)."""


@dataclass(frozen=True)
class Placement:
    """Where the worker pods may run: the GPU nodes' selector and the taints they tolerate."""

    node_selector: dict[str, str]
    tolerations: list[dict[str, Any]] = field(default_factory=list)


def gpu_taints(config: GpuNodesConfig) -> list[TaintConfig]:
    """The GPU taint, then the stack's extra taints."""
    gpu = TaintConfig.model_validate({"key": GPU_TAINT_KEY, "value": "true"})
    return [gpu, *config.taints]


def gpu_tolerations(config: GpuNodesConfig) -> list[dict[str, Any]]:
    """Tolerations that let a pod onto the GPU nodes: every taint of `gpu_taints`."""
    tolerations: list[dict[str, Any]] = [
        {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    ]
    tolerations += [
        {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
        for t in config.taints
    ]
    return tolerations


def gpu_labels(config: GpuNodesConfig) -> dict[str, str]:
    """Node labels: the pool, GPU presence (the NVIDIA device plugin's default affinity), the
    autoscaler's GPU label, EFA."""
    labels = {
        NODE_POOL_LABEL: "gpu",
        "nvidia.com/gpu.present": "true",
        ACCELERATOR_LABEL: accelerator_label_value(config.facts.gpu_model),
    }
    if config.efa_enabled:
        labels["vpc.amazonaws.com/efa.present"] = "true"
    return {**labels, **config.labels}


def node_template_resources(config: GpuNodesConfig, efa_interfaces: int) -> dict[str, str]:
    """Tags that give a GPU node's extended resources (what the job's pods request) before one
    exists: on the ASG, and on the node group itself, which the autoscaler reads through
    DescribeNodegroup and prefers ("ManagedNodeGroup resource-indicating tags override
    conflicting tags on the ASG", `buildNodeFromTemplate`)."""
    tags = {f"{TEMPLATE_TAG}/resources/{GPU_RESOURCE}": str(config.facts.gpus)}
    if config.efa_enabled and efa_interfaces:
        tags[f"{TEMPLATE_TAG}/resources/{EFA_RESOURCE}"] = str(efa_interfaces)
    return tags


def gpu_placement(config: GpuNodesConfig) -> Placement:
    """Nodes of the stack's instance type (a label on every EKS node, created or existing),
    tolerating the GPU taint and the stack's extra taints."""
    return Placement(
        node_selector={INSTANCE_TYPE_LABEL: config.instance_type},
        tolerations=gpu_tolerations(config),
    )
