"""The run leases its GPUs: the Kubernetes Cluster Autoscaler scales the GPU nodes 0 -> N -> 0.

Cluster Autoscaler over a managed node group, not Karpenter: EKS rolls and auto-repairs the
managed group (EKS user guide `capacity-blocks-mng`, `ml-node-groups`), and all-or-nothing
starts need ProvisioningRequest (`cluster-autoscaler/proposals/provisioning-request.md`),
which Karpenter does not implement (kubernetes-sigs/karpenter#742). The ASG tag, discovery and
IAM facts the lease rests on (kubernetes/autoscaler `cluster-autoscaler/cloudprovider/aws/`):
docs/design/platform.md#autoscaler
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.cluster import GpuNodesConfig
from infra.job.placement import (
    NODE_POOL_LABEL,
    TEMPLATE_TAG,
    gpu_labels,
    gpu_taints,
    node_template_resources,
)
from infra.platform.iam import pod_identity_role

CHART_REPO = "https://kubernetes.github.io/autoscaler"
CHART = "cluster-autoscaler"
CHART_VERSION = "9.59.0"
"""kubernetes/autoscaler `cluster-autoscaler/charts/cluster-autoscaler/Chart.yaml`: chart
9.59.0 ships Cluster Autoscaler 1.35.0, the minor of `infra.facts.eks_versions`' default Kubernetes
version (the autoscaler's minor should match the cluster's)."""
NAMESPACE = "kube-system"
SERVICE_ACCOUNT = "cluster-autoscaler"
SYSTEM_NODE_SELECTOR = {NODE_POOL_LABEL: "system"}
"""Where the autoscaler runs: the system nodes (`infra.platform.cluster`), never a GPU node it may
remove."""
GPU_POOL_TAG = f"{TEMPLATE_TAG}/label/{NODE_POOL_LABEL}"
"""The GPU ASG's node-template tag for the pool label (`node_template_tags`): on no other ASG."""

READ_ACTIONS = (
    "autoscaling:DescribeAutoScalingGroups",
    "autoscaling:DescribeAutoScalingInstances",
    "autoscaling:DescribeLaunchConfigurations",
    "autoscaling:DescribeScalingActivities",
    "autoscaling:DescribeTags",
    "ec2:DescribeImages",
    "ec2:DescribeInstanceTypes",
    "ec2:DescribeLaunchTemplateVersions",
    "ec2:GetInstanceTypesFromInstanceRequirements",
    "eks:DescribeNodegroup",
)
"""The README's "full features" read set: Describe calls take no resource ARN."""
WRITE_ACTIONS = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
)


def node_template_tags(config: GpuNodesConfig, efa_interfaces: int | None = None) -> dict[str, str]:
    """ASG tags that describe a GPU node before one exists: its extended resources (what the
    job's pods request), labels (what they select) and taints (what they tolerate)."""
    efa = config.efa_interface_count if efa_interfaces is None else efa_interfaces
    tags = node_template_resources(config, efa)
    for key, value in gpu_labels(config).items():
        tags[f"{TEMPLATE_TAG}/label/{key}"] = value
    for taint in gpu_taints(config):
        tags[f"{TEMPLATE_TAG}/taint/{taint.key}"] = f"{taint.value or ''}:{taint.effect}"
    return tags


def asg_arn(partition: str, region: str, account: str, asg_name: str) -> str:
    """An Auto Scaling group's ARN by name, its id left open (the README's minimal policy)."""
    return (
        f"arn:{partition}:autoscaling:{region}:{account}:autoScalingGroup:*:"
        f"autoScalingGroupName/{asg_name}"
    )


def permissions(gpu_asg_arn: str) -> dict[str, Any]:
    """The autoscaler's IAM policy: reads anywhere (Describe calls take no resource), scaling
    only the GPU group's ASG."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "Discover", "Effect": "Allow", "Action": list(READ_ACTIONS), "Resource": "*"},
            {
                "Sid": "ScaleTheGpuGroup",
                "Effect": "Allow",
                "Action": list(WRITE_ACTIONS),
                "Resource": gpu_asg_arn,
            },
        ],
    }


def discovery_tags(cluster_name: str) -> list[str]:
    """`--node-group-auto-discovery=asg:tag=...`: the chart's two default tags, which EKS puts
    on every managed group's ASG, and the GPU pool's template tag, which only the GPU ASG
    carries: the autoscaler finds the GPU group and leaves the system group to the stack."""
    return [
        "k8s.io/cluster-autoscaler/enabled",
        f"k8s.io/cluster-autoscaler/{cluster_name}",
        f"{GPU_POOL_TAG}=gpu",
    ]


PROVISIONING_REQUEST_ARGS = {
    "enable-provisioning-requests": "true",
    "kube-api-content-type": "application/json",
}
"""What serving Kueue's ProvisioningRequests takes (cluster-autoscaler-1.35.2 `FAQ.md`,
"Enabling ProvisioningRequest Support", steps 2 and 3; `config/flags/flags.go`
`enable-provisioning-requests`, default false). The chart's ClusterRole already grants
`provisioningrequests` and `podtemplates` (chart 9.59.0 `templates/clusterrole.yaml`); the CRD is
`infra.platform.kueue`'s."""


def chart_values(
    cluster_name: str,
    region: str,
    system_selector: Mapping[str, str],
    scale_down_minutes: int,
    *,
    provisioning_requests: bool = False,
) -> dict[str, Any]:
    """Values of the pinned chart (keys of its `values.yaml`); `extraArgs` are flags of
    Cluster Autoscaler 1.35.0 (`cluster-autoscaler/config/flags/flags.go`). The chart joins
    `autoDiscovery.tags` into `--node-group-auto-discovery=asg:tag=<tags>` (chart 9.59.0
    `templates/deployment.yaml`). `provisioning_requests` (Kueue's admission check) adds
    `PROVISIONING_REQUEST_ARGS`; without it the values are what they always were."""
    values: dict[str, Any] = {
        "cloudProvider": "aws",
        "awsRegion": region,
        "autoDiscovery": {"clusterName": cluster_name, "tags": discovery_tags(cluster_name)},
        "rbac": {"serviceAccount": {"create": True, "name": SERVICE_ACCOUNT}},
        "nodeSelector": dict(system_selector),
        "extraArgs": {
            # GPU nodes leave this long after their last training pod is gone.
            "scale-down-unneeded-time": f"{scale_down_minutes}m",
            "scale-down-delay-after-add": f"{scale_down_minutes}m",
            # A pod's emptyDir (the trainer's scratch, /dev/shm) must not pin a GPU node.
            "skip-nodes-with-local-storage": "false",
            "balance-similar-node-groups": "false",
            "expander": "least-waste",
        },
    }
    if provisioning_requests:
        values["extraArgs"] = {**values["extraArgs"], **PROVISIONING_REQUEST_ARGS}
    return values


def _value_of(key: str) -> Callable[[Mapping[str, str]], str]:
    return lambda tags: tags[key]


@dataclass
class ClusterAutoscalerArgs:
    cluster_name: pulumi.Input[str]
    region: pulumi.Input[str]
    k8s_provider: k8s.Provider
    system_selector: Mapping[str, str]
    scale_down_minutes: int
    gpu_asg_name: pulumi.Input[str]
    gpu_nodes: GpuNodesConfig
    efa_interfaces: pulumi.Input[int]
    provisioning_requests: bool = False
    """Serve Kueue's ProvisioningRequests (`scheduling.kueue`)."""
    cluster_ready: Sequence[pulumi.Resource] = ()
    tags: Mapping[str, str] = field(default_factory=dict)


class ClusterAutoscaler(pulumi.ComponentResource):
    """The autoscaler's role, its Pod Identity binding, the Helm release, and the GPU ASG's
    node-template tags."""

    release: k8s.helm.v3.Release
    template_tags: dict[str, aws.autoscaling.Tag]
    ready: list[pulumi.Resource]
    """What the job waits for: the release and every node-template tag, so that the
    autoscaler's first look at the GPU group sees the node the pods need."""

    def __init__(
        self, name: str, args: ClusterAutoscalerArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:autoscaler:ClusterAutoscaler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        gpu_asg = pulumi.Output.all(
            aws.get_partition_output(opts=invoke).partition,
            args.region,
            aws.get_caller_identity_output(opts=invoke).account_id,
            args.gpu_asg_name,
        ).apply(lambda v: asg_arn(*(str(part) for part in v)))
        identity = pod_identity_role(
            name,
            cluster_name=args.cluster_name,
            namespace=NAMESPACE,
            service_account=SERVICE_ACCOUNT,
            policy=gpu_asg.apply(lambda arn: json.dumps(permissions(arn))),
            description="Cluster Autoscaler (Pod Identity): scale the GPU node group",
            parent=self,
            cluster_ready=args.cluster_ready,
            tags=args.tags,
        )
        # One tag resource per key: the ASG is EKS's, so the stack adds tags, never owns it.
        template = pulumi.Output.from_input(args.efa_interfaces).apply(
            lambda efa: node_template_tags(args.gpu_nodes, efa)
        )
        self.template_tags: dict[str, aws.autoscaling.Tag] = {}
        for key in node_template_tags(args.gpu_nodes):
            slug = re.sub(r"[^a-z0-9]+", "-", key.removeprefix(TEMPLATE_TAG).lower()).strip("-")
            self.template_tags[key] = aws.autoscaling.Tag(
                f"{name}-{slug}",
                autoscaling_group_name=args.gpu_asg_name,
                tag=aws.autoscaling.TagTagArgs(
                    key=key,
                    value=template.apply(_value_of(key)),
                    propagate_at_launch=False,
                ),
                opts=child,
            )
        values = pulumi.Output.all(args.cluster_name, args.region).apply(
            lambda cr: chart_values(
                cr[0],
                cr[1],
                args.system_selector,
                args.scale_down_minutes,
                provisioning_requests=args.provisioning_requests,
            )
        )
        self.release = k8s.helm.v3.Release(
            f"{name}-release",
            name=CHART,
            chart=CHART,
            version=CHART_VERSION,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=CHART_REPO),
            namespace=NAMESPACE,
            values=values,
            # Pod Identity injects credentials only into pods created after the association;
            # its first scan of the ASGs must find the node template complete.
            opts=pulumi.ResourceOptions(
                parent=self,
                provider=args.k8s_provider,
                depends_on=[
                    identity.association,
                    *args.cluster_ready,
                    *self.template_tags.values(),
                ],
            ),
        )
        self.ready = [self.release, *self.template_tags.values()]
        self.register_outputs({})
