"""The EKS cluster the job runs on: created and owned by the stack, or an existing one by name.

`create`: a pulumi-eks cluster (access entries only, KMS-encrypted secrets, owned log group,
OIDC provider, Pod Identity agent, system and GPU node groups, EKS add-ons). `existing`:
`aws.eks.get_cluster` by name, nothing registered. In both the Kubernetes provider's kubeconfig
is built here (infra/job/kubeconfig.py says why); versions per infra/facts/eks_versions.py.
Construction and the exports other stacks read: docs/design/platform.md#cluster
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_eks as eks
import pulumi_kubernetes as k8s

from infra.config import StackConfigError
from infra.config.cluster import ClusterConfig, GpuNodesConfig
from infra.facts.eks_versions import UPGRADE_SUPPORT_TYPE
from infra.job.kubeconfig import kubernetes_access, same_iam_principal
from infra.job.placement import NODE_POOL_LABEL
from infra.platform.gpu_nodes import (
    GpuNodeGroup,
    GpuNodeGroupArgs,
    node_metadata_options,
    root_volume,
)
from infra.platform.iam import aws_managed_policy_arn, node_role, service_trust_policy
from infra.platform.kube_access import cluster_kubeconfig, deployer_principal_arn
from infra.platform.network import Network

SYSTEM_AMI_TYPE = "AL2023_x86_64_STANDARD"
POD_IDENTITY_AGENT = "eks-pod-identity-agent"
COREDNS = "coredns"
"""EKS installs CoreDNS self-managed at creation and never upgrades it; pulumi-eks creates its
add-on only with a default node group, Fargate or Auto Mode (v4.3.0 `nodejs/eks/cluster/
cluster.ts` `createCore`: `fargate || !skipDefaultNodeGroup || autoMode`), none of which a
cluster here has, so the stack manages it as the EKS add-on itself."""
NODE_MONITORING_AGENT = "eks-node-monitoring-agent"
"""EKS's node health agent: NodeConditions (AcceleratedHardwareReady for GPU XID errors among
them) that managed node group auto-repair acts on. Its node agent tolerates every taint
(aws/eks-node-monitoring-agent `charts/eks-node-monitoring-agent/values.yaml`
`nodeAgent.tolerations: [{operator: Exists}]`), so it runs on the GPU nodes too; the chart's
separate DCGM DaemonSet has no tolerations (`dcgmAgent.tolerations: []`) and so stays off the
tainted GPU nodes: there the agent reads the kernel's GPU errors, not DCGM diagnostics."""
CLUSTER_ADMIN_POLICY = "AmazonEKSClusterAdminPolicy"
"""Well-known label every node carries: selects the GPU nodes in both modes (an existing
cluster's nodes do not carry this stack's own labels)."""


def confirm_system_instance_type(instance_type: str, parent: pulumi.Resource) -> None:
    """EC2's word on the system nodes' type, before anything of the cluster is registered.

    The config model refuses what is not an x86_64 type name; a name EC2 does not have (or an
    arm64 one the pattern let through) would otherwise reach CreateNodegroup only after the
    control plane was created, 10 minutes into `pulumi up`. A synchronous invoke: it answers
    (or fails) before the next line registers the control plane's key and role."""
    key = "cluster.systemNodes.instanceType"
    try:
        found = aws.ec2.get_instance_type(
            instance_type=instance_type, opts=pulumi.InvokeOptions(parent=parent)
        )
    except Exception as error:  # the SDK raises a plain Exception for a failed invoke
        raise StackConfigError(
            [
                f"{key} {instance_type!r}: EC2 does not describe it in this region ({error}); "
                "allowed: an x86_64 type EC2 offers here, e.g. m6i.xlarge (the default)"
            ]
        ) from None
    architectures = list(found.supported_architectures or [])
    if "x86_64" not in architectures:
        raise StackConfigError(
            [
                f"{key} {instance_type!r} runs {', '.join(architectures) or 'no known'} "
                "architecture, but the system nodes' AMI is AL2023_x86_64_STANDARD; allowed: "
                "an x86_64 type, e.g. m6i.xlarge (the default)"
            ]
        )


def existing_efa_memlock_warning(instance_type: str, stack: str) -> str:
    """What an EFA stack on an existing cluster must check before its nodes cost anything.

    Only the GPU launch template this project creates lifts the containers' RLIMIT_MEMLOCK
    (infra/platform/gpu_nodes.py NODE_CONFIG); the AL2023 AMI's base runtime spec sets only
    RLIMIT_NOFILE, so another team's nodes most likely give containers containerd's 8 MiB,
    and every worker's preflight refuses only after the nodes came up and pulled the image."""
    return (
        f"cluster.mode existing with EFA ({instance_type}): the cluster's GPU nodes must lift "
        "the containers' locked-memory limit (RLIMIT_MEMLOCK), which EKS's AMI leaves at "
        "containerd's 8 MiB, or every worker's preflight refuses after the nodes are up; "
        f"check with `fsdp-eks validate {stack} --skip nccl` (memlock per node) and fix by "
        "adding RLIMIT_MEMLOCK to the nodes' nodeadm NodeConfig "
        "spec.containerd.baseRuntimeSpec (docs/operations.md, 'EFA on an existing cluster')"
    )


def default_cluster_name(project: str, stack: str) -> str:
    """`<project>-<stack>` made a valid EKS cluster name (stack names may contain dots)."""
    name = re.sub(r"[^A-Za-z0-9_-]", "-", f"{project}-{stack}")
    return name[:100]


@dataclass
class ClusterArgs:
    """Inputs of `Cluster`: the `cluster` and `gpuNodes` sections, and the network (create)."""

    cluster: ClusterConfig
    gpu_nodes: GpuNodesConfig
    network: Network | None = None
    aws_profile: str | None = None
    """The stack's `aws:profile`: the Kubernetes provider signs its tokens with it too."""
    tags: Mapping[str, str] = field(default_factory=dict)


class Cluster(pulumi.ComponentResource):
    """EKS (created or looked up), its Kubernetes provider and the GPU node wiring."""

    name: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    k8s_provider: k8s.Provider
    cluster_security_group_id: pulumi.Output[str]
    """The EKS cluster security group; every node (and every EFA interface) carries it."""
    oidc_provider_arn: pulumi.Output[str]
    oidc_issuer_url: pulumi.Output[str]
    vpc_id: pulumi.Output[str]
    gpu_subnet_id: pulumi.Output[str]
    efa_interfaces_per_node: pulumi.Output[int]
    """EFA devices a job pod on a GPU node may request (`vpc.amazonaws.com/efa`)."""
    pod_identity_agent: aws.eks.Addon | None
    coredns: aws.eks.Addon | None
    """CoreDNS as the EKS add-on (created clusters only)."""
    node_monitoring_agent: aws.eks.Addon | None
    """EKS's node monitoring agent add-on (created clusters only)."""
    gpu_nodes: GpuNodeGroup | None
    """The GPU node group the stack created (None on an existing cluster)."""
    ready: list[pulumi.Resource]
    """What a workload on the GPU nodes must wait for (node groups, Pod Identity agent)."""
    auto_mode: pulumi.Output[bool]
    """Whether EKS Auto Mode provisions the cluster's nodes (never on a cluster created here)."""

    def __init__(
        self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:cluster:Cluster", name, None, opts)
        self.pod_identity_agent = None
        self.coredns = None
        self.node_monitoring_agent = None
        self.gpu_nodes = None
        self.ready = []
        if args.cluster.mode == "create":
            self._create(name, args)
        else:
            self._use_existing(name, args)
        self.register_outputs(
            {
                "name": self.name,
                "clusterSecurityGroupId": self.cluster_security_group_id,
                "oidcProviderArn": self.oidc_provider_arn,
                "vpcId": self.vpc_id,
                "gpuSubnetId": self.gpu_subnet_id,
            }
        )

    # -- create ---------------------------------------------------------------------------

    def _create(self, name: str, args: ClusterArgs) -> None:
        config = args.cluster
        network = args.network
        if network is None:
            raise ValueError(
                "cluster.mode 'create' needs the Network component (ClusterArgs.network)"
            )
        confirm_system_instance_type(config.system_nodes.instance_type, parent=self)
        tags = dict(args.tags)
        child = pulumi.ResourceOptions(parent=self)
        cluster_name = config.name or default_cluster_name(pulumi.get_project(), pulumi.get_stack())

        key_arn: pulumi.Input[str]
        if config.secrets_kms_key_arn is not None:
            key_arn = config.secrets_kms_key_arn
        else:
            key = aws.kms.Key(
                f"{name}-secrets",
                description=f"EKS secrets envelope encryption for {cluster_name}",
                enable_key_rotation=True,
                deletion_window_in_days=7,
                tags=tags,
                opts=child,
            )
            key_arn = key.arn
        service_role, service_role_policies = self._service_role(name, key_arn, tags)

        # The control plane checks its role's permissions (KMS included) at creation.
        depends_on: list[pulumi.Resource] = [service_role, *service_role_policies]
        if config.log_types:
            # EKS would create this group itself, with no retention and outside the stack.
            depends_on.append(
                aws.cloudwatch.LogGroup(
                    f"{name}-control-plane-logs",
                    name=f"/aws/eks/{cluster_name}/cluster",
                    retention_in_days=config.log_retention_days,
                    tags=tags,
                    opts=child,
                )
            )

        if not config.public_endpoint:
            # terraform-aws-eks's default too; but `up` registers Kubernetes objects right after
            # the cluster, so from outside the VPC it would fail only then, after ~15 minutes.
            pulumi.log.warn(
                "the cluster's API endpoint is private (cluster.publicAccessCidrs is not set): "
                "`pulumi up` and kubectl must run from inside the VPC (a runner or bastion "
                "there), or list your networks in cluster.publicAccessCidrs "
                "(docs/operations.md, 'The API endpoint')",
                resource=self,
            )
        deployer = deployer_principal_arn(self)
        if config.admin_role_arn is None:
            # EKS admits only the creator: anyone else running this stack later is locked out.
            pulumi.log.warn(
                "cluster.adminRoleArn is not set: only the principal creating the cluster "
                f"({deployer}) will be its admin, and `pulumi up` run by anyone else (CI, a "
                "colleague) gets Unauthorized from every Kubernetes call; set "
                "cluster.adminRoleArn to a role that everyone who runs this stack can assume "
                "(docs/operations.md, 'Who can reach the cluster')",
                resource=self,
            )
        access_entries = {}
        if config.admin_role_arn is not None and not same_iam_principal(
            config.admin_role_arn, deployer
        ):
            # The deployer is admitted by EKS as the cluster creator; a second entry for the
            # same principal would fail with ResourceInUseException.
            access_entries["admin"] = eks.AccessEntryArgs(
                principal_arn=config.admin_role_arn,
                access_policies={
                    "cluster-admin": eks.AccessPolicyAssociationArgs(
                        policy_arn=pulumi.Output.concat(
                            "arn:",
                            aws.get_partition_output(
                                opts=pulumi.InvokeOutputOptions(parent=self)
                            ).partition,
                            f":eks::aws:cluster-access-policy/{CLUSTER_ADMIN_POLICY}",
                        ),
                        access_scope=aws.eks.AccessPolicyAssociationAccessScopeArgs(type="cluster"),
                    )
                },
            )

        cluster = eks.Cluster(
            f"{name}-eks",
            name=cluster_name,
            version=config.kubernetes_version,
            # Explicit: EKS defaults new clusters to EXTENDED, which starts billing extended
            # support the day the version leaves standard support (infra/facts/eks_versions.py).
            upgrade_policy=aws.eks.ClusterUpgradePolicyArgs(support_type=UPGRADE_SUPPORT_TYPE),
            vpc_id=network.vpc_id,
            private_subnet_ids=network.private_subnet_ids,
            endpoint_private_access=config.endpoint_private_access,
            # Public only to the CIDRs the stack lists (infra/config/cluster.py); never EKS's
            # implicit 0.0.0.0/0.
            endpoint_public_access=config.public_endpoint,
            public_access_cidrs=config.public_access_cidrs if config.public_endpoint else None,
            authentication_mode=eks.AuthenticationMode.API,
            access_entries=access_entries,
            encryption_config_key_arn=key_arn,
            enabled_cluster_log_types=list(config.log_types),
            create_oidc_provider=True,
            # Without it the VPC CNI enforces no NetworkPolicy (chart aws/amazon-vpc-cni-k8s
            # v1.23.0 `enableNetworkPolicy: "false"`): docs/design/platform.md#network-policy
            vpc_cni_options=eks.VpcCniOptionsArgs(enable_network_policy=True),
            service_role=service_role,
            skip_default_node_group=True,
            # Managed node groups use the EKS-created cluster SG; no extra groups to leak.
            skip_default_security_groups=True,
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends_on),
        )
        # A scalar output resolves only once the cluster exists: resources given this name
        # therefore wait for the cluster (pulumi-eks's resource-typed outputs are not used).
        name_after_cluster = cluster.cluster_security_group_id.apply(lambda _: cluster_name)

        self.name = name_after_cluster
        # Not pulumi-eks's kubeconfigJson: it carries neither aws:profile nor the admin role.
        access = kubernetes_access(config.admin_role_arn, args.aws_profile, deployer)
        created = aws.eks.get_cluster_output(
            name=name_after_cluster, opts=pulumi.InvokeOutputOptions(parent=self)
        )
        self.kubeconfig = cluster_kubeconfig(created, access, self)
        self.k8s_provider = k8s.Provider(f"{name}-k8s", kubeconfig=self.kubeconfig, opts=child)
        self.cluster_security_group_id = cluster.cluster_security_group_id
        self.oidc_provider_arn = cluster.oidc_provider_arn
        self.oidc_issuer_url = cluster.oidc_provider_url
        self.vpc_id = network.vpc_id
        self.gpu_subnet_id = network.gpu_subnet_id

        system = config.system_nodes
        system_role = node_role(f"{name}-system-nodes", parent=self, tags=tags)
        # Our own launch template, IMDS hop limit 1: pulumi-eks's (v4.3.0 `nodejs/eks/nodes/
        # nodegroup.ts` `createMNGCustomLaunchTemplate`) and EKS's set 2, letting every pod read
        # the node role's credentials. No image_id: EKS adds its own bootstrap to the user data.
        # Why nothing there needs IMDS: docs/design/platform.md#system-node-imds
        system_template = aws.ec2.LaunchTemplate(
            f"{name}-system-lt",
            description=f"System nodes ({system.instance_type}) for EKS",
            update_default_version=True,
            metadata_options=node_metadata_options(),
            block_device_mappings=[root_volume(system.disk_size_gib)],
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type="instance",
                    tags={**tags, NODE_POOL_LABEL: "system", "Name": f"{name}-system"},
                )
            ],
            tags=tags,
            opts=child,
        )
        system_nodes = eks.ManagedNodeGroup(
            f"{name}-system",
            cluster=cluster,
            node_role=system_role.role,
            instance_types=[system.instance_type],
            ami_type=SYSTEM_AMI_TYPE,
            # Explicit: beside a launch template pulumi-eks leaves `version` unset (v4.3.0
            # `nodejs/eks/nodes/nodegroup.ts` `createManagedNodeGroupInternal`), and EKS keeps
            # the group at the version it was created with when the control plane moves on.
            version=config.kubernetes_version,
            subnet_ids=network.private_subnet_ids,
            scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                desired_size=system.desired_size,
                min_size=system.min_size,
                max_size=system.max_size,
            ),
            # IMDS and the root volume are the launch template's (pulumi-eks refuses
            # `enable_imd_sv2` beside a launch template, EKS `disk_size` beside one).
            launch_template=aws.eks.NodeGroupLaunchTemplateArgs(
                id=system_template.id, version=system_template.latest_version.apply(str)
            ),
            labels={NODE_POOL_LABEL: "system"},
            tags=tags,
            opts=pulumi.ResourceOptions(parent=self, depends_on=system_role.ready),
        )
        gpu_role = node_role(f"{name}-gpu-nodes", parent=self, tags=tags)
        gpu = GpuNodeGroup(
            f"{name}-gpu",
            GpuNodeGroupArgs(
                config=args.gpu_nodes,
                cluster_name=name_after_cluster,
                cluster_security_group_id=cluster.cluster_security_group_id,
                vpc_id=network.vpc_id,
                subnet_id=network.gpu_subnet_id,
                node_role_arn=gpu_role.role.arn,
                kubernetes_version=config.kubernetes_version,
                depends_on=[cluster, *gpu_role.ready],
                tags=tags,
            ),
            opts=child,
        )
        self.efa_interfaces_per_node = gpu.efa_interface_count
        self.auto_mode = pulumi.Output.from_input(False)
        self.ready = [system_nodes, gpu.node_group]
        self.gpu_nodes = gpu
        # Both need nodes to run on before EKS reports them ACTIVE: the system nodes.
        self.coredns = self._versioned_addon(
            name, COREDNS, name_after_cluster, config.kubernetes_version, [system_nodes], tags,
            # Takes over the Deployment EKS created; `preserve` keeps DNS running should the
            # add-on resource ever go (pulumi-eks v4.3.0 sets the same for its own).
            resolve_conflicts_on_create="OVERWRITE", resolve_conflicts_on_update="OVERWRITE",
            preserve=True,
        )  # fmt: skip
        self.ready.append(self.coredns)
        self.node_monitoring_agent = self._versioned_addon(
            name, NODE_MONITORING_AGENT, name_after_cluster, config.kubernetes_version,
            [system_nodes], tags,
        )  # fmt: skip
        if config.installs_pod_identity_agent:
            self._install_pod_identity_agent(name, name_after_cluster, [system_nodes], tags)

    def _service_role(
        self, name: str, key_arn: pulumi.Input[str], tags: Mapping[str, str]
    ) -> tuple[aws.iam.Role, list[pulumi.Resource]]:
        """The control plane's role: AmazonEKSClusterPolicy plus use of the one secrets key."""
        child = pulumi.ResourceOptions(parent=self)
        invoke = pulumi.InvokeOutputOptions(parent=self)
        role = aws.iam.Role(
            f"{name}-control-plane",
            assume_role_policy=service_trust_policy(
                "eks.amazonaws.com", actions=("sts:AssumeRole", "sts:TagSession"), opts=invoke
            ),
            description="EKS control plane",
            tags=dict(tags),
            opts=child,
        )
        cluster_policy = aws.iam.RolePolicyAttachment(
            f"{name}-control-plane-AmazonEKSClusterPolicy",
            role=role.name,
            policy_arn=aws_managed_policy_arn(
                "AmazonEKSClusterPolicy", aws.get_partition_output(opts=invoke).partition
            ),
            opts=child,
        )
        key_policy = aws.iam.RolePolicy(
            f"{name}-control-plane-secrets-key",
            role=role.name,
            policy=pulumi.Output.from_input(key_arn).apply(
                lambda arn: (
                    aws.iam.get_policy_document_output(
                        statements=[
                            aws.iam.GetPolicyDocumentStatementArgs(
                                sid="EnvelopeEncryptSecrets",
                                actions=[
                                    "kms:Encrypt",
                                    "kms:Decrypt",
                                    "kms:ListGrants",
                                    "kms:DescribeKey",
                                ],
                                resources=[arn],
                            )
                        ],
                        opts=invoke,
                    ).json
                )
            ),
            opts=child,
        )
        return role, [cluster_policy, key_policy]

    def _versioned_addon(
        self,
        name: str,
        addon_name: str,
        cluster_name: pulumi.Input[str],
        kubernetes_version: str,
        after: list[pulumi.Resource],
        tags: Mapping[str, str],
        **options: Any,
    ) -> aws.eks.Addon:
        """An EKS add-on at EKS's default version for the cluster's Kubernetes version, so it
        moves with `cluster.kubernetesVersion` (an unset `addon_version` stays where it was
        created: EKS upgrades no add-on itself)."""
        version = aws.eks.get_addon_version_output(
            addon_name=addon_name,
            kubernetes_version=kubernetes_version,
            opts=pulumi.InvokeOutputOptions(parent=self),
        ).version
        return aws.eks.Addon(
            f"{name}-{addon_name.removeprefix('eks-')}",
            cluster_name=cluster_name,
            addon_name=addon_name,
            addon_version=version,
            tags=dict(tags),
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
            **options,
        )

    def _install_pod_identity_agent(
        self,
        name: str,
        cluster_name: pulumi.Input[str],
        after: list[pulumi.Resource],
        tags: Mapping[str, str],
    ) -> None:
        """The agent DaemonSet that hands Pod Identity credentials to pods (FSx CSI, S3)."""
        self.pod_identity_agent = aws.eks.Addon(
            f"{name}-pod-identity-agent",
            cluster_name=cluster_name,
            addon_name=POD_IDENTITY_AGENT,
            tags=dict(tags),
            # Its pods need nodes to become ACTIVE.
            opts=pulumi.ResourceOptions(parent=self, depends_on=after),
        )
        self.ready.append(self.pod_identity_agent)

    # -- existing -------------------------------------------------------------------------

    def _use_existing(self, name: str, args: ClusterArgs) -> None:
        config = args.cluster
        assert config.name is not None  # the config model requires it in existing mode
        invoke = pulumi.InvokeOutputOptions(parent=self)
        found = aws.eks.get_cluster_output(name=config.name, opts=invoke)
        platform = (
            pulumi.StackReference(
                f"{name}-platform",
                stack_name=config.platform_stack,
                opts=pulumi.ResourceOptions(parent=self),
            )
            if config.platform_stack
            else None
        )

        self.name = found.name
        # adminRoleArn here: a role with an access entry on that cluster, assumed for every
        # Kubernetes call (the cluster's creator is rarely the one running this stack).
        access = kubernetes_access(
            config.admin_role_arn, args.aws_profile, deployer_principal_arn(self)
        )
        self.kubeconfig = cluster_kubeconfig(found, access, self)
        self.k8s_provider = k8s.Provider(
            f"{name}-k8s", kubeconfig=self.kubeconfig, opts=pulumi.ResourceOptions(parent=self)
        )
        self.cluster_security_group_id = found.vpc_config.cluster_security_group_id
        self.vpc_id = found.vpc_config.vpc_id
        # Invoke results are dicts keyed by the Python names; subscripts read both forms.
        self.oidc_issuer_url = found.identities.apply(lambda ids: ids[0]["oidcs"][0]["issuer"])
        account = aws.get_caller_identity_output(opts=invoke).account_id
        partition = aws.get_partition_output(opts=invoke).partition
        derived_oidc_arn = pulumi.Output.all(partition, account, self.oidc_issuer_url).apply(
            lambda v: f"arn:{v[0]}:iam::{v[1]}:oidc-provider/{v[2].removeprefix('https://')}"
        )
        self.oidc_provider_arn = (
            _platform_output(platform, "oidcProviderArn", derived_oidc_arn)
            if platform is not None
            else derived_oidc_arn
        )
        self.gpu_subnet_id = self._existing_gpu_subnet(config, found, platform)
        self.efa_interfaces_per_node = pulumi.Output.from_input(args.gpu_nodes.efa_interface_count)
        if args.gpu_nodes.efa_enabled:
            pulumi.log.warn(
                existing_efa_memlock_warning(args.gpu_nodes.instance_type, pulumi.get_stack()),
                resource=self,
            )
        # DescribeCluster `computeConfig.enabled`: Auto Mode's node pools provision the nodes.
        self.auto_mode = found.compute_configs.apply(
            lambda configs: any(c["enabled"] for c in configs or [])
        )
        if config.installs_pod_identity_agent:
            self._install_pod_identity_agent(name, config.name, [], dict(args.tags))

    def _existing_gpu_subnet(
        self,
        config: ClusterConfig,
        found: pulumi.Output[aws.eks.GetClusterResult],
        platform: pulumi.StackReference | None,
    ) -> pulumi.Output[str]:
        """The subnet FSx goes in: configured, else the platform stack's `gpuSubnetId`, else the
        cluster's first subnet (which may sit in another AZ than the GPU nodes)."""
        if config.network.gpu_subnet_id is not None:
            return pulumi.Output.from_input(config.network.gpu_subnet_id)
        from_platform: pulumi.Output[Any] = (
            platform.get_output("gpuSubnetId")
            if platform is not None
            else pulumi.Output.from_input(None)
        )

        def choose(values: list[Any]) -> str:
            stacked, cluster_subnets = values
            if stacked:
                return str(stacked)
            if platform is not None:
                # The stack config admits FSx on the strength of platformStack alone; say so
                # when that stack cannot tell, rather than pick another AZ in silence.
                pulumi.log.warn(
                    f"cluster.platformStack {config.platform_stack!r} exports no gpuSubnetId: "
                    f"using the cluster's first subnet {cluster_subnets[0]!r}, which may be in "
                    "another AZ than the GPU nodes (FSx goes there); set "
                    "cluster.network.gpuSubnetId",
                    resource=self,
                )
            # Otherwise the fallback only feeds exports: creating FSx on an existing cluster
            # with no known subnet is rejected by the stack config (infra.config.stack).
            return str(cluster_subnets[0])

        return pulumi.Output.all(from_platform, found.vpc_config.subnet_ids).apply(choose)


def _platform_output(
    platform: pulumi.StackReference, key: str, fallback: pulumi.Output[str]
) -> pulumi.Output[str]:
    """`key` from the platform stack's outputs, or `fallback` when that stack lacks it."""
    return pulumi.Output.all(platform.get_output(key), fallback).apply(
        lambda v: str(v[0]) if v[0] else str(v[1])
    )
