"""Who holds the GPU nodes, and when they bill: the lease line of the plan and `gpuLease` output.

On a cluster the stack creates, the lease is the stack's own (`infra.platform.autoscaler` scales the
node group from zero for the job's pods and back after it; `gpuNodes.keepWarm` opts out). On an
existing cluster the stack never touches the autoscaling (its operators own it): it only looks, at
`pulumi preview`, at the EKS managed node groups that offer the job's instance type, and says
whether they can go to zero and who pays for idle nodes. What it reads is what EKS reports
(`DescribeNodegroup` `scalingConfig`: minSize / desiredSize / maxSize; `DescribeCluster`
`computeConfig.enabled` for Auto Mode); whether an autoscaler runs on the cluster is a
Kubernetes fact it does not have the access to check, so it says so rather than guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.estimates.cost import lease_tail_hours

if TYPE_CHECKING:
    from infra.config import StackConfig


@dataclass(frozen=True)
class NodeGroupScaling:
    """What EKS reports about one managed node group's size."""

    name: str
    instance_types: tuple[str, ...]
    min_size: int
    desired_size: int
    max_size: int
    launch_template: str | None = None
    """The group's launch template, when it sets the instance type: EKS then reports no
    `instanceTypes` (API reference, `Nodegroup.instanceTypes`: "If the node group was deployed
    with a launch template, then this is null"), common for EFA groups."""


def lease_line(config: StackConfig) -> str:
    """The plan's "GPUs" line: how many GPUs (on how many nodes) bill now, during the job and
    after it."""
    nodes = config.gpu_nodes
    per_node = config.instance.gpus
    total = nodes.count * per_node
    gpus = (
        f"{total} GPU{'s' if total != 1 else ''} ({nodes.count} x {nodes.instance_type}, "
        f"{per_node} each)"
    )
    start = (
        f"all {nodes.count} node{'s' if nodes.count != 1 else ''} placed within "
        f"{config.job.start_timeout_minutes} min or none"
    )
    if config.cluster.mode != "create":
        return (
            f"{gpus} from the existing cluster's node groups ({start}); the stack does not scale "
            "them: whether they go to zero after the job, and who pays for idle ones, is the "
            "cluster's operators' (looked up at preview: output gpuLease)"
        )
    tail = lease_tail_hours(config)
    if tail is not None:
        return (
            f"0 now, {gpus} while the job runs ({start}), 0 about {tail * 60:.0f} min after it "
            "ends (cluster autoscaler)"
        )
    why = "gpuNodes.keepWarm" if nodes.keep_warm else "addons.clusterAutoscaler.install false"
    return (
        f"{gpus} from `pulumi up` until `pulumi destroy`, with or without a job ({why}): every "
        "node-hour bills"
    )


def existing_lease_report(
    instance_type: str, count: int, groups: Sequence[NodeGroupScaling], *, auto_mode: bool
) -> tuple[str, list[str]]:
    """What the existing cluster's node groups say about the job's GPU nodes: the report, and
    the warnings worth a line in `pulumi preview` (idle nodes that bill, too few to start)."""
    matching = [g for g in groups if instance_type in g.instance_types]
    templated = [g for g in groups if not g.instance_types and g.launch_template]
    warnings: list[str] = []
    if not matching and templated:
        return _templated_report(instance_type, templated)
    if not matching:
        where = (
            "EKS Auto Mode or another provisioner"
            if auto_mode
            else "self-managed nodes, Karpenter or another provisioner"
        )
        report = (
            f"no EKS managed node group offers {instance_type}: its nodes come from {where}, "
            "which the stack cannot see; whether they scale to zero after the job, and who pays "
            "for idle ones, is the cluster's operators'"
        )
        return report, warnings
    parts = []
    for group in matching:
        sizes = f"min {group.min_size}, now {group.desired_size}, max {group.max_size}"
        if group.min_size == 0:
            parts.append(
                f"node group {group.name} ({sizes}) can scale to zero if the cluster runs an "
                "autoscaler (not checked: the stack neither owns nor reads it)"
            )
        else:
            parts.append(
                f"node group {group.name} ({sizes}) keeps {group.min_size} node(s) billing "
                "while no job runs"
            )
            warnings.append(
                f"existing node group {group.name} has minSize {group.min_size}: "
                f"{group.min_size} x {instance_type} bill with or without this job (the "
                "cluster's operators pay; the stack does not change it)"
            )
    room = sum(g.max_size for g in matching)
    if room < count:
        warnings.append(
            f"the existing node groups of {instance_type} allow {room} node(s) at most "
            f"(maxSize), the job needs {count}: its workers cannot all start, and `pulumi up` "
            f"will suspend the job after job.startTimeoutMinutes"
        )
    return "; ".join(parts), warnings


def _templated_report(
    instance_type: str, groups: Sequence[NodeGroupScaling]
) -> tuple[str, list[str]]:
    """Groups whose launch template sets the instance type: they may be the job's. The
    template is not read (its default and the group's pinned version can differ), so each is
    reported as a candidate and its idle nodes as a possible cost."""
    parts, warnings = [], []
    for group in groups:
        sizes = f"min {group.min_size}, now {group.desired_size}, max {group.max_size}"
        parts.append(
            f"node group {group.name} ({sizes}) sets its instance type in launch template "
            f"{group.launch_template} (not read here: it may be the {instance_type} group)"
        )
        if group.min_size:
            warnings.append(
                f"existing node group {group.name} (launch template {group.launch_template}) "
                f"has minSize {group.min_size}: if it is the {instance_type} group, "
                f"{group.min_size} node(s) bill with or without this job"
            )
    return "; ".join(parts), warnings


def _scaling(result: aws.eks.GetNodeGroupResult) -> NodeGroupScaling:
    (size,) = result.scaling_configs
    templates = result.launch_templates or []
    template = (templates[0].name or templates[0].id) if templates else None
    return NodeGroupScaling(
        name=result.node_group_name,
        instance_types=tuple(result.instance_types or ()),
        min_size=int(size.min_size),
        desired_size=int(size.desired_size),
        max_size=int(size.max_size),
        launch_template=template,
    )


def existing_gpu_lease(
    cluster_name: pulumi.Input[str],
    *,
    instance_type: str,
    count: int,
    auto_mode: pulumi.Input[bool],
    parent: pulumi.Resource,
) -> pulumi.Output[str]:
    """The `gpuLease` report of an existing cluster, from its managed node groups as EKS
    describes them (`ListNodegroups`, then `DescribeNodegroup` each); warnings go to
    `pulumi preview`/`up`."""
    invoke = pulumi.InvokeOutputOptions(parent=parent)
    names = aws.eks.get_node_groups_output(cluster_name=cluster_name, opts=invoke).names

    def describe(values: list[Any]) -> pulumi.Output[list[aws.eks.GetNodeGroupResult]]:
        cluster, group_names = values
        return pulumi.Output.all(
            *(
                aws.eks.get_node_group_output(
                    cluster_name=cluster, node_group_name=group, opts=invoke
                )
                for group in sorted(group_names or [])
            )
        )

    def report(values: list[Any]) -> str:
        described, auto = values
        text, warnings = existing_lease_report(
            instance_type, count, [_scaling(result) for result in described], auto_mode=bool(auto)
        )
        for warning in warnings:
            pulumi.log.warn(warning, resource=parent)
        return text

    described: pulumi.Output[list[aws.eks.GetNodeGroupResult]] = pulumi.Output.all(
        cluster_name, names
    ).apply(describe)
    return pulumi.Output.all(described, auto_mode).apply(report)
