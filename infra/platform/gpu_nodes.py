"""The GPU node group: an EKS managed node group on our own launch template.

The template carries what pulumi-eks's `ManagedNodeGroup(enable_efa_support=True)` cannot: one
EFA interface per network card with both security groups, the reservation target or
capacity-block market, IMDSv2 hop limit 1, and the locked-memory limit EFA needs.
Why each, and the deploy-time EFA check: docs/design/platform.md#gpu_nodes
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws

from infra.config.cluster import GpuNodesConfig, TaintConfig
from infra.job.placement import gpu_labels, gpu_taints, node_template_resources

GPU_AMI_TYPE = "AL2023_x86_64_NVIDIA"
ROOT_DEVICE = "/dev/xvda"
"""Root device of the AL2023 EKS AMIs."""
IMDS_HOP_LIMIT = 1
"""IMDSv2 answers only processes on the node itself (host network), not pods: with 2, any pod
could read the node role's credentials. Set on the GPU and the system nodes' launch templates
(`node_metadata_options`). Nothing on the GPU nodes needs IMDS from a pod network:
the trainer calls no AWS API (checkpoints go to FSx or the pod's own volume), the FSx CSI
driver's credentials come from EKS Pod Identity (its agent is a host-network DaemonSet on
169.254.170.23), the FSx CSI node plugin falls back to the
Kubernetes API for its instance data when IMDS is unreachable (aws-fsx-csi-driver
`pkg/cloud/metadata.go` `NewMetadataService`), the EFA device plugin runs on the host network
(eks-charts `aws-efa-k8s-device-plugin` daemonset, `hostNetwork: true`) and the NVIDIA one
talks only to the driver. terraform-aws-eks made 1 its default in v21 (docs/UPGRADE-21.0.md)."""

RLIMIT_NOFILE_DEFAULT = {"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}
"""The AL2023 AMI's only default rlimit (awslabs/amazon-eks-ami v20260724
`nodeadm/internal/containerd/base-runtime-spec.json`), restated because a NodeConfig's list
replaces the default's whole (see NODE_CONFIG)."""
MEMLOCK_BYTES = 10**18
"""RLIMIT_MEMLOCK of every container on the GPU nodes: far above any node's memory, so it never
binds (locked pages still count against the pod's memory limit). Not RLIM_INFINITY (2**64-1):
nodeadm merges the spec through `map[string]interface{}` (`internal/util/merge.go` `Merge`,
json.Unmarshal), so every number passes through a Go float64, and 2**64-1 comes out as
18446744073709552000, which overflows the OCI spec's uint64 and stops containerd's CRI plugin
from loading the file: the node would never become Ready. 10**18 is exact in a float64 and Go
writes it back digit for digit."""

NODE_CONFIG: dict[str, Any] = {
    "apiVersion": "node.eks.aws/v1alpha1",
    "kind": "NodeConfig",
    "spec": {
        "containerd": {
            "baseRuntimeSpec": {
                "process": {
                    "rlimits": [
                        RLIMIT_NOFILE_DEFAULT,
                        {"type": "RLIMIT_MEMLOCK", "soft": MEMLOCK_BYTES, "hard": MEMLOCK_BYTES},
                    ]
                }
            }
        }
    },
}
"""What nodeadm adds to the containers' base OCI spec on the GPU nodes.

The trainer runs unprivileged with every capability dropped, so EFA's memory registration
(`ibv_reg_mr` -> the kernel's `ib_umem_get`, drivers/infiniband/core/umem.c) is bounded by
RLIMIT_MEMLOCK: `new_pinned > lock_limit && !capable(CAP_IPC_LOCK)` is ENOMEM. The AMI's base
spec sets only RLIMIT_NOFILE, so containers inherit containerd's memlock, which neither
containerd's unit nor the AMI's drop-in (`containerd.service.d/00-runtime-slice.conf`) raises:
the kernel default of 8 MiB, too little for libfabric's EFA packet pools. Raising the limit is
the least privilege: CAP_IPC_LOCK would bypass it instead, and the CRI puts an added capability
only in the bounding, effective and permitted sets, which a non-root process loses at exec.

nodeadm (`nodeadm/api/v1alpha1/nodeconfig_types.go` `ContainerdOptions.BaseRuntimeSpec`,
since v20240615) merges this partial spec into its default one
(`internal/containerd/base_runtime_spec.go` `writeBaseRuntimeSpec`, mergo with override: maps
key by key, lists whole: e2e case `containerd-base-runtime-spec`), writes
/etc/containerd/base-runtime-spec.json, and containerd's default runtime (`nvidia` on the
NVIDIA AMI) bases every container on it (`internal/containerd/config2.template.toml`
`base_runtime_spec`). `trainer.preflight` checks the limit on every node before step 1."""

USER_DATA_BOUNDARY = "FSDPEKS"


def gpu_node_user_data() -> str:
    """The GPU launch template's user data (base64): a MIME multi-part document with one
    `application/node.eks.aws` part, NODE_CONFIG.

    No `spec.cluster`: with an EKS AMI and no `image_id` in the launch template, EKS adds its
    own NodeConfig part (endpoint, CA, CIDR) and nodeadm merges every part in order
    (`internal/configprovider/mime.go` `ParseMultipart`, nodeadm/doc/examples.md); the part's
    content type is how nodeadm finds it."""
    document = "\n".join(
        [
            "MIME-Version: 1.0",
            f'Content-Type: multipart/mixed; boundary="{USER_DATA_BOUNDARY}"',
            "",
            f"--{USER_DATA_BOUNDARY}",
            "Content-Type: application/node.eks.aws",
            "",
            # nodeadm decodes a part as JSON or YAML (`internal/api/bridge/decode.go`).
            json.dumps(NODE_CONFIG, indent=2),
            "",
            f"--{USER_DATA_BOUNDARY}--",
            "",
        ]
    )
    return base64.b64encode(document.encode()).decode()


_CAPACITY_TYPES = {
    "on-demand": "ON_DEMAND",
    "spot": "SPOT",
    "reservation": "ON_DEMAND",  # an ODCR is consumed by on-demand launches that target it
    "block": "CAPACITY_BLOCK",
}
_TAINT_EFFECTS = {
    "NoSchedule": "NO_SCHEDULE",
    "NoExecute": "NO_EXECUTE",
    "PreferNoSchedule": "PREFER_NO_SCHEDULE",
}


def node_metadata_options() -> aws.ec2.LaunchTemplateMetadataOptionsArgs:
    """IMDSv2 only, for the node's own processes (IMDS_HOP_LIMIT)."""
    return aws.ec2.LaunchTemplateMetadataOptionsArgs(
        http_endpoint="enabled", http_tokens="required", http_put_response_hop_limit=IMDS_HOP_LIMIT
    )


def root_volume(size_gib: int, **ebs: Any) -> aws.ec2.LaunchTemplateBlockDeviceMappingArgs:
    """An encrypted gp3 root volume of the AL2023 EKS AMIs, deleted with its node."""
    return aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
        device_name=ROOT_DEVICE,
        ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
            volume_size=size_gib,
            volume_type="gp3",
            encrypted="true",
            delete_on_termination="true",
            **ebs,
        ),
    )


def efa_network_interfaces(
    count: int, security_group_ids: list[str]
) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """One EFA interface per network card.

    Card 0 is `efa` (EFA with ENA: the node's IP and TCP traffic) at device index 0; the other
    cards are `efa-only` at device index 1, which take no IP address, so a p5 does not burn 32
    subnet IPs and Linux sees no extra routes.
    """
    if count < 1:
        raise ValueError(f"EFA interface count must be >= 1, got {count}")
    return [
        aws.ec2.LaunchTemplateNetworkInterfaceArgs(
            network_card_index=card,
            device_index=0 if card == 0 else 1,
            interface_type="efa" if card == 0 else "efa-only",
            security_groups=list(security_group_ids),
            delete_on_termination="true",
        )
        for card in range(count)
    ]


def confirm_efa_interfaces(
    config: GpuNodesConfig, opts: pulumi.InvokeOutputOptions | None = None
) -> pulumi.Output[int]:
    """EFA interfaces per node as AWS reports them, failing if `infra/facts/instances.py` disagrees.

    A wrong table would silently give nodes fewer EFA devices than the hardware has (NCCL then
    runs slower) or ask for more than exist (launches fail much later); a clear error at
    `pulumi up` names the fix instead.
    """
    expected = config.facts.efa_interfaces
    instance = aws.ec2.get_instance_type_output(instance_type=config.instance_type, opts=opts)

    def check(values: list[Any]) -> int:
        supported, maximum = bool(values[0]), int(values[1] or 0)
        reported = maximum if supported else 0
        if reported != expected:
            raise ValueError(
                f"gpuNodes.instanceType {config.instance_type!r}: AWS reports {reported} EFA "
                f"interfaces (efa_supported={supported}), infra/facts/instances.py says "
                f"{expected}; correct the facts table before deploying"
            )
        return reported

    return pulumi.Output.all(instance.efa_supported, instance.efa_maximum_interfaces).apply(check)


def _first_asg_name(resources: Any) -> str:
    """`resources[0].autoscaling_groups[0].name` of an `aws.eks.NodeGroup` (empty until known)."""
    for resource in resources or []:
        for group in getattr(resource, "autoscaling_groups", None) or []:
            return str(group.name)
    return ""


@dataclass
class GpuNodeGroupArgs:
    """Inputs of `GpuNodeGroup`; cluster values are the scalar outputs of the EKS cluster."""

    config: GpuNodesConfig
    cluster_name: pulumi.Input[str]
    cluster_security_group_id: pulumi.Input[str]
    vpc_id: pulumi.Input[str]
    subnet_id: pulumi.Input[str]
    """The GPU subnet: one AZ, the capacity's."""
    node_role_arn: pulumi.Input[str]
    kubernetes_version: pulumi.Input[str] | None = None
    depends_on: list[pulumi.Resource] = field(default_factory=list)
    """What the node group must wait for beyond its inputs (the node role's policies: nodes
    without them cannot join). Given here because a component's own `depends_on` is not
    passed on to its children by the Python SDK."""
    tags: Mapping[str, str] = field(default_factory=dict)


class GpuNodeGroup(pulumi.ComponentResource):
    """GPU nodes: EFA security group, placement group, launch template, managed node group."""

    node_group: aws.eks.NodeGroup
    launch_template: aws.ec2.LaunchTemplate
    efa_security_group: aws.ec2.SecurityGroup | None
    placement_group: aws.ec2.PlacementGroup | None
    efa_interface_count: pulumi.Output[int]
    """EFA interfaces per node, as confirmed by AWS (0 without EFA)."""
    labels: dict[str, str]
    taints: list[TaintConfig]
    asg_name: pulumi.Output[str]
    """The Auto Scaling group EKS made for the node group (what the autoscaler scales)."""

    def __init__(
        self, name: str, args: GpuNodeGroupArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:gpu_nodes:GpuNodeGroup", name, None, opts)
        config = args.config
        child = pulumi.ResourceOptions(parent=self)
        tags = {**args.tags, "fsdp-eks/node-pool": "gpu"}
        self.labels = gpu_labels(config)
        self.taints = gpu_taints(config)

        self.efa_security_group = None
        if config.efa_enabled:
            self.efa_security_group = self._efa_security_group(name, args.vpc_id, tags)
            self.efa_interface_count = confirm_efa_interfaces(
                config, pulumi.InvokeOutputOptions(parent=self)
            )
        else:
            self.efa_interface_count = pulumi.Output.from_input(0)

        self.placement_group = None
        if config.placement_group_enabled:
            self.placement_group = aws.ec2.PlacementGroup(
                f"{name}-placement",
                strategy="cluster",  # EFA latency: all nodes on one network spine
                tags=tags,
                opts=child,
            )

        self.launch_template = self._launch_template(name, args, tags)
        self.node_group = aws.eks.NodeGroup(
            f"{name}-nodes",
            cluster_name=args.cluster_name,
            node_role_arn=args.node_role_arn,
            subnet_ids=[args.subnet_id],
            ami_type=GPU_AMI_TYPE,
            instance_types=[config.instance_type],
            capacity_type=_CAPACITY_TYPES[config.capacity.type],
            version=args.kubernetes_version,
            # Leased (infra.platform.autoscaler): created at zero nodes, the Cluster Autoscaler
            # raises it to `count` for the job's pods and lowers it after; Pulumi must not fight it,
            # so the desired size is ignored after creation. A capacity block's group must be
            # at zero to be updated outside its window. Kept warm: `count` all along.
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=config.count if config.keep_warm else 0,
                min_size=config.count if config.keep_warm else 0,
                max_size=config.count,
            ),
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=self.launch_template.id,
                version=self.launch_template.latest_version.apply(str),
            ),
            labels=self.labels,
            # EKS replaces (or reboots) a node the node monitoring agent reports unhealthy, a
            # GPU with XID errors among them (EKS API NodeRepairConfig; the agent is a cluster
            # add-on, infra.platform.cluster): a broken GPU node otherwise stays in the group,
            # and every restart of the job lands on it again.
            node_repair_config=aws.eks.NodeGroupNodeRepairConfigArgs(enabled=True),
            taints=[
                aws.eks.NodeGroupTaintArgs(
                    key=t.key, value=t.value, effect=_TAINT_EFFECTS[t.effect]
                )
                for t in self.taints
            ],
            # The node-template resource tags here too: the autoscaler reads them through
            # DescribeNodegroup (infra.platform.autoscaler), and these exist from the group's
            # creation, before the ASG's own tags are added.
            tags=self.efa_interface_count.apply(
                lambda efa: {
                    **tags,
                    "fsdp-eks/efa-interfaces": str(efa),
                    **node_template_resources(config, int(efa)),
                }
            ),
            # Reserved capacity has no room for a second group while the first still holds it.
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=args.depends_on,
                delete_before_replace=config.capacity.is_reserved,
                ignore_changes=[] if config.keep_warm else ["scalingConfig.desiredSize"],
            ),
        )
        self.asg_name = self.node_group.resources.apply(_first_asg_name)
        self.register_outputs(
            {
                "nodeGroupName": self.node_group.node_group_name,
                "efaInterfaceCount": self.efa_interface_count,
            }
        )

    def _efa_security_group(
        self, name: str, vpc_id: pulumi.Input[str], tags: Mapping[str, str]
    ) -> aws.ec2.SecurityGroup:
        """The group EFA requires: all traffic to and from its own members, nothing else.

        It has no other egress on purpose; the cluster SG on the same interfaces carries the
        nodes' general traffic.
        """
        child = pulumi.ResourceOptions(parent=self)
        group = aws.ec2.SecurityGroup(
            f"{name}-efa",
            vpc_id=vpc_id,
            description="EFA: all traffic between the GPU nodes' EFA interfaces",
            tags={**tags, "Name": f"{name}-efa"},
            opts=child,
        )
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-efa-in-self",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="EFA: all traffic from members",
            opts=child,
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-efa-out-self",
            security_group_id=group.id,
            referenced_security_group_id=group.id,
            ip_protocol="-1",
            description="EFA: all traffic to members",
            opts=child,
        )
        return group

    def _launch_template(
        self, name: str, args: GpuNodeGroupArgs, tags: Mapping[str, str]
    ) -> aws.ec2.LaunchTemplate:
        config = args.config
        network_interfaces: pulumi.Input[list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]] | None
        network_interfaces = None
        if self.efa_security_group is not None:
            network_interfaces = pulumi.Output.all(
                self.efa_interface_count,
                self.efa_security_group.id,
                args.cluster_security_group_id,
            ).apply(lambda v: efa_network_interfaces(int(v[0]), [str(v[1]), str(v[2])]))

        placement = None
        if self.placement_group is not None:
            placement = aws.ec2.LaunchTemplatePlacementArgs(group_name=self.placement_group.name)

        reservation = None
        market = None
        if config.capacity.is_reserved:
            target = (
                aws.ec2.LaunchTemplateCapacityReservationSpecificationCapacityReservationTargetArgs
            )
            reservation = aws.ec2.LaunchTemplateCapacityReservationSpecificationArgs(
                capacity_reservation_target=target(
                    capacity_reservation_id=config.capacity.reservation_id
                )
            )
        if config.capacity.type == "block":
            market = aws.ec2.LaunchTemplateInstanceMarketOptionsArgs(market_type="capacity-block")

        return aws.ec2.LaunchTemplate(
            f"{name}-lt",
            description=f"GPU nodes ({config.instance_type}) for EKS",
            update_default_version=True,
            metadata_options=node_metadata_options(),
            # image pulls of a ~20 GB trainer image are throughput-bound
            block_device_mappings=[root_volume(config.root_volume_gib, throughput=500, iops=6000)],
            network_interfaces=network_interfaces,
            user_data=gpu_node_user_data(),
            placement=placement,
            capacity_reservation_specification=reservation,
            instance_market_options=market,
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type="instance", tags={**tags, "Name": f"{name}-gpu"}
                )
            ],
            tags=dict(tags),
            opts=pulumi.ResourceOptions(parent=self),
        )
