"""The `cluster` and `gpuNodes` sections: where the training run's nodes come from.

`cluster` says whether the stack owns the whole platform (`create`: VPC, EKS, node groups) or
deploys onto a cluster that already exists (`existing`, by name). `gpuNodes` describes the GPU
node group; in `existing` mode it still describes the nodes the job lands on (the job's GPU and
EFA requests and the cost estimate are derived from it) but no node group is created.

Checks that only need one section live here (an EFA request on an instance without EFA, a
placement group together with a capacity reservation, an existing VPC without its subnets), so
the error names the key the user wrote; checks across sections live in `infra.config.stack`.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import ConfigSection
from infra.facts.eks_versions import (
    DEFAULT_KUBERNETES_VERSION,
    UPGRADE_SUPPORT_TYPE,
    check_kubernetes_version,
    in_standard_support,
)
from infra.facts.instances import (
    HYPERPOD_PREFIX,
    INSTANCE_FACTS,
    InstanceFacts,
    instance_facts,
    known_facts,
)

GPU_TAINT_KEY = "nvidia.com/gpu"
"""Taint on every GPU node: only pods that tolerate it (the job, GPU plugins) land there."""
NODE_POOL_LABEL = "fsdp-eks/node-pool"
"""The stack's own label: `gpu` on the GPU node group (`system` on the system one)."""

EKS_RESERVED_LABEL_DOMAINS = ("kubernetes.io/", "k8s.io/", "eks.amazonaws.com/")
"""Refused anywhere in a managed node group's label or taint key, subdomains included
("Label cannot contain reserved prefixes [kubernetes.io/, k8s.io/, eks.amazonaws.com/]", EKS
CreateNodegroup's InvalidParameterException, quoted in aws/containers-roadmap#1451)."""
EKS_LABEL_KEY_MAX = 63
"""EKS API `labelKey`/`taintKey`: 1 to 63 characters, prefix included (EKS API reference,
UpdateLabelsPayload and CreateNodegroup; botocore `eks/2017-11-01/service-2.json`), not the
316 a Kubernetes label key may have."""
AUTOSCALER_LABEL_TAG_PREFIX = "k8s.io/cluster-autoscaler/node-template/label/"
"""The ASG tag that carries a GPU label to Cluster Autoscaler while the group has no node
(kubernetes/autoscaler cluster-autoscaler-1.35.0 `cloudprovider/aws/README.md`, "Auto
discovery setup"; `aws_manager.go` `extractLabelsFromAsg`)."""
ASG_TAG_KEY_MAX = 128
"""An EC2 Auto Scaling tag key's limit (Auto Scaling API `Tag.Key`: 1 to 128 characters)."""

ControlPlaneLogType = Literal["api", "audit", "authenticator", "controllerManager", "scheduler"]
CapacityType = Literal["on-demand", "spot", "reservation", "block"]
TaintEffect = Literal["NoSchedule", "NoExecute", "PreferNoSchedule"]
DEFAULT_LOG_TYPES: tuple[ControlPlaneLogType, ...] = ("api", "audit", "authenticator")

_AZ_PATTERN = re.compile(r"^[a-z]{2}(-[a-z]+)+-\d[a-z]$")
_INSTANCE_TYPE = re.compile(
    r"^(?P<family>[a-z]+-?(?P<generation>\d+)(?P<options>[a-z]*)[a-z0-9-]*)"
    r"\.(nano|micro|small|medium|large|xlarge|\d+xlarge|metal(-\d+xl)?)$"
)
"""EC2's instance type names (EC2 user guide, "Amazon EC2 instance type naming conventions"):
family letters, generation digits, options (processor, storage, network), an optional `-flex`
or suffix, then the size: m6i.xlarge, c6gn.16xlarge, m7i-flex.large, p6-b200.48xlarge,
m7i.metal-24xl."""
_IAM_ROLE_ARN = re.compile(r"^arn:aws[a-z-]*:iam::\d{12}:role/[\w+=,.@/-]+$")
_KMS_KEY_ARN = re.compile(r"^arn:aws[a-z-]*:kms:[a-z0-9-]+:\d{12}:(key|alias)/[\w/-]+$")
_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8,17}$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class NetworkConfig(ConfigSection):
    """`cluster.network`: a new VPC (default) or an existing one given by its IDs."""

    vpc_cidr: str = Field(
        default="10.0.0.0/16",
        description=(
            "CIDR of the new VPC (create a VPC only). Split into one private subnet per system "
            "AZ, one GPU subnet in the GPU nodes' AZ and small public subnets for the NAT "
            "gateway; a prefix between /16 and /20."
        ),
    )
    availability_zones: list[str] | None = Field(
        default=None,
        description=(
            "AZs (names, e.g. us-west-2a) for the control plane and system node subnets of a new "
            "VPC; at least 2 (EKS requires 2). Default: the first `azCount` AZs of the region."
        ),
    )
    az_count: int = Field(
        default=2,
        ge=2,
        le=4,
        description="How many of the region's AZs to use when `availabilityZones` is not given.",
    )
    single_nat_gateway: bool = Field(
        default=True,
        description=(
            "One NAT gateway for the whole VPC (cheaper) instead of one per AZ (survives an AZ "
            "outage). GPU nodes sit in one AZ anyway, so one NAT is the default."
        ),
    )
    vpc_id: str | None = Field(
        default=None,
        description=(
            "ID of an existing VPC to use instead of creating one (with `privateSubnetIds` and "
            "`gpuSubnetId`). The stack then creates no VPC, subnet, NAT or endpoint."
        ),
    )
    private_subnet_ids: list[str] = Field(
        default_factory=list,
        description=(
            "Existing VPC only: private subnets in at least 2 AZs for the control plane and the "
            "system nodes (they need a route to the internet or VPC endpoints for ECR/EKS/S3)."
        ),
    )
    gpu_subnet_id: str | None = Field(
        default=None,
        description=(
            "Existing VPC only: the private subnet for the GPU nodes (and FSx), in the AZ of the "
            "GPU capacity. In existing-cluster mode: the subnet FSx is placed in."
        ),
    )

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr_is_splittable(cls, value: str) -> str:
        try:
            network = ipaddress.IPv4Network(value)
        except ValueError as exc:
            raise ValueError(f"cluster.network.vpcCidr {value!r} is not an IPv4 CIDR") from exc
        if not 16 <= network.prefixlen <= 20:
            raise ValueError(
                f"cluster.network.vpcCidr {value!r} has prefix /{network.prefixlen}; "
                "allowed: /16 to /20 (room for GPU pods' IPs)"
            )
        return value

    @field_validator("availability_zones")
    @classmethod
    def _azs_are_names(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        if len(value) < 2 or len(set(value)) != len(value):
            raise ValueError(
                f"cluster.network.availabilityZones {value} must name at least 2 distinct AZs"
            )
        bad = [az for az in value if not _AZ_PATTERN.match(az)]
        if bad:
            raise ValueError(
                f"cluster.network.availabilityZones: {bad} are not AZ names (e.g. us-west-2a)"
            )
        return value

    @model_validator(mode="after")
    def _existing_vpc_is_complete(self) -> NetworkConfig:
        if self.vpc_id is None:
            if self.private_subnet_ids:
                raise ValueError(
                    "cluster.network.privateSubnetIds given without cluster.network.vpcId: "
                    "subnet IDs belong to an existing VPC; set vpcId or remove them"
                )
            return self
        if len(set(self.private_subnet_ids)) < 2:
            raise ValueError(
                "cluster.network.privateSubnetIds must list at least 2 subnets (in 2 AZs) when "
                f"cluster.network.vpcId is set; got {self.private_subnet_ids}"
            )
        if self.gpu_subnet_id is None:
            raise ValueError(
                "cluster.network.gpuSubnetId is required when cluster.network.vpcId is set: the "
                "GPU nodes need one subnet in the AZ of their capacity"
            )
        return self

    @property
    def creates_vpc(self) -> bool:
        """Whether the stack creates (and owns) the VPC."""
        return self.vpc_id is None


class SystemNodesConfig(ConfigSection):
    """`cluster.systemNodes`: the CPU node group that runs add-ons and operators."""

    instance_type: str = Field(
        default="m6i.xlarge",
        description=(
            "EC2 instance type of the system (CPU) nodes: an x86_64 type (their AMI is "
            "AL2023_x86_64_STANDARD)."
        ),
    )
    desired_size: int = Field(default=2, ge=1, description="Nodes to start with.")
    min_size: int = Field(default=1, ge=1, description="Lower bound of the node group.")
    max_size: int = Field(default=4, ge=1, description="Upper bound of the node group.")
    disk_size_gib: int = Field(
        default=50,
        ge=20,
        le=1000,
        alias="diskSizeGiB",
        description="Root volume size (GiB) of each system node.",
    )

    @field_validator("instance_type")
    @classmethod
    def _x86_instance_type(cls, value: str) -> str:
        """Caught here, a typo costs nothing; left to EKS, CreateNodegroup refuses it after the
        control plane took its 10 minutes (`pulumi up` also asks EC2 before creating the
        cluster: infra/platform/cluster.py)."""
        match = _INSTANCE_TYPE.match(value)
        if match is None:
            raise ValueError(
                f"cluster.systemNodes.instanceType {value!r} is not an EC2 instance type name "
                "(<family><generation><options>.<size>); allowed: e.g. m6i.xlarge (the "
                "default), m7i.large, c6i.2xlarge"
            )
        # Graviton families carry a `g` among the options after the generation (m7g, c6gn,
        # t4g, x2gd, im4gn, is4gen), and a1 is the first Graviton.
        if "g" in match["options"] or match["family"] == "a1":
            raise ValueError(
                f"cluster.systemNodes.instanceType {value!r} is a Graviton (arm64) type, but "
                "the system nodes run the x86_64 AMI (AL2023_x86_64_STANDARD); allowed: an "
                "x86_64 type, e.g. m6i.xlarge (the default) or m7i.large"
            )
        return value

    @model_validator(mode="after")
    def _sizes_are_ordered(self) -> SystemNodesConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError(
                "cluster.systemNodes needs minSize <= desiredSize <= maxSize; got "
                f"{self.min_size} / {self.desired_size} / {self.max_size}"
            )
        return self


class ClusterConfig(ConfigSection):
    """`fsdp-eks:cluster`: create the EKS platform, or reuse an existing cluster by name."""

    mode: Literal["create", "existing"] = Field(
        default="create",
        description=(
            "`create`: the stack owns VPC, EKS and node groups and destroys them on `pulumi "
            "destroy`. `existing`: deploy onto the cluster named `name`; nothing of the "
            "cluster is created or changed."
        ),
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        pattern=r"^[0-9A-Za-z][A-Za-z0-9\-_]*$",
        description=(
            "EKS cluster name. Required in `existing` mode. In `create` mode default: "
            "`<project>-<stack>`."
        ),
    )
    kubernetes_version: str = Field(
        default=DEFAULT_KUBERNETES_VERSION,
        pattern=r"^1\.\d{2}$",
        description=(
            "Kubernetes minor version of a created cluster: one still in EKS standard support "
            f"({', '.join(in_standard_support())}; dates in infra/facts/eks_versions.py). The "
            f"cluster's upgrade policy is {UPGRADE_SUPPORT_TYPE}: at the end of standard "
            "support EKS upgrades the control plane instead of billing extended support."
        ),
    )
    endpoint_public_access: bool | None = Field(
        default=None,
        description=(
            "Expose the API server endpoint outside the VPC, to `publicAccessCidrs` only. "
            "Default: public exactly when `publicAccessCidrs` lists networks, otherwise "
            "private (as terraform-aws-eks defaults), and then `pulumi up` and kubectl must "
            "run from inside the VPC (docs/operations.md, 'The API endpoint')."
        ),
    )
    endpoint_private_access: bool = Field(
        default=True,
        description="Expose the API server endpoint inside the VPC (nodes use it).",
    )
    public_access_cidrs: list[str] | None = Field(
        default=None,
        min_length=1,
        description=(
            "Networks allowed to reach the public endpoint: the egress addresses of what runs "
            "`pulumi up` and kubectl (office or VPN, CI runners). Never implied: EKS's own "
            "default is 0.0.0.0/0, which a stack must write out to accept an endpoint open "
            "to the internet (still IAM-authenticated)."
        ),
    )
    admin_role_arn: str | None = Field(
        default=None,
        description=(
            "The IAM role everyone who runs this stack (people and CI) reaches Kubernetes as. "
            "`create`: granted cluster admin through an EKS access entry (the creator is "
            "admitted too, but only the creator: without this role a stack created by one "
            "principal is locked out for every other, and the plan warns). Both modes: the "
            "Kubernetes provider assumes it for its tokens (`aws eks get-token --role-arn`, "
            "with `aws:profile` if set) unless Pulumi already runs as it; in `existing` mode it "
            "must have an access entry on that cluster. Its trust policy must let those "
            "principals assume it."
        ),
    )
    secrets_kms_key_arn: str | None = Field(
        default=None,
        description=(
            "KMS key for envelope encryption of Kubernetes secrets. Default: the stack creates "
            "a key with rotation on."
        ),
    )
    log_types: list[ControlPlaneLogType] = Field(
        default_factory=lambda: list(DEFAULT_LOG_TYPES),
        description="Control-plane log types sent to CloudWatch (empty list: none).",
    )
    log_retention_days: int = Field(
        default=30,
        description="Days CloudWatch keeps control-plane logs (the stack owns the log group).",
    )
    pod_identity_agent: bool | None = Field(
        default=None,
        description=(
            "Install the `eks-pod-identity-agent` add-on (FSx CSI and S3 access use Pod "
            "Identity). Default: yes in `create` mode; no in `existing` mode, where the cluster "
            "usually has it; set true to install it on an existing cluster that lacks it."
        ),
    )
    platform_stack: str | None = Field(
        default=None,
        description=(
            "Existing mode only: fully qualified name (`org/project/stack`) of the stack that "
            "created the cluster; its outputs (e.g. `gpuSubnetId`) fill what the cluster "
            "look-up cannot tell."
        ),
    )
    trainer_v2: bool | None = Field(
        default=None,
        description=(
            "Existing mode with job.api trainjob: the cluster runs Kubeflow Trainer v2 (its "
            "TrainJob and TrainingRuntime CRDs, its controller and JobSet); check with `kubectl "
            "get crd trainjobs.trainer.kubeflow.org`. Nothing is installed on an existing "
            "cluster. In create mode the stack installs Trainer v2 itself: leave it unset."
        ),
    )
    network: NetworkConfig = Field(
        default_factory=NetworkConfig, description="VPC and subnets (create mode)."
    )
    system_nodes: SystemNodesConfig = Field(
        default_factory=SystemNodesConfig,
        description="The CPU node group for add-ons and operators (create mode).",
    )

    @field_validator("kubernetes_version")
    @classmethod
    def _version_in_standard_support(cls, value: str) -> str:
        return check_kubernetes_version(value)

    @field_validator("admin_role_arn")
    @classmethod
    def _admin_is_role(cls, value: str | None) -> str | None:
        if value is not None and not _IAM_ROLE_ARN.match(value):
            raise ValueError(
                f"cluster.adminRoleArn {value!r} is not an IAM role ARN "
                "(arn:aws:iam::<account>:role/<name>)"
            )
        return value

    @field_validator("secrets_kms_key_arn")
    @classmethod
    def _kms_is_arn(cls, value: str | None) -> str | None:
        if value is not None and not _KMS_KEY_ARN.match(value):
            raise ValueError(
                f"cluster.secretsKmsKeyArn {value!r} is not a KMS key ARN "
                "(arn:aws:kms:<region>:<account>:key/<id>)"
            )
        return value

    @field_validator("public_access_cidrs")
    @classmethod
    def _cidrs_parse(cls, value: list[str] | None) -> list[str] | None:
        for cidr in value or []:
            try:
                ipaddress.IPv4Network(cidr)
            except ValueError as exc:
                raise ValueError(
                    f"cluster.publicAccessCidrs entry {cidr!r} is not an IPv4 CIDR"
                ) from exc
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention_is_cloudwatch_value(cls, value: int) -> int:
        # CloudWatch accepts only these retention periods.
        allowed = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
        if value not in allowed:
            raise ValueError(f"cluster.logRetentionDays {value} is not one of {list(allowed)}")
        return value

    @model_validator(mode="after")
    def _mode_keys_are_consistent(self) -> ClusterConfig:
        if self.mode == "existing":
            if self.name is None:
                raise ValueError("cluster.name is required when cluster.mode is 'existing'")
            if self.network.vpc_id is not None:
                raise ValueError(
                    "cluster.network.vpcId is not used in cluster.mode 'existing' (the cluster's "
                    "own VPC is); remove it and give only network.gpuSubnetId if FSx needs one"
                )
            return self
        if self.network.vpc_id is None and self.network.gpu_subnet_id is not None:
            raise ValueError(
                "cluster.network.gpuSubnetId given without cluster.network.vpcId: a new VPC makes "
                "its own GPU subnet; set vpcId (existing VPC) or remove gpuSubnetId"
            )
        if self.platform_stack is not None:
            raise ValueError(
                "cluster.platformStack is only read in cluster.mode 'existing'; remove it or "
                "set mode: existing"
            )
        if not (self.public_endpoint or self.endpoint_private_access):
            raise ValueError(
                "cluster.endpointPublicAccess and cluster.endpointPrivateAccess are both false "
                "(without cluster.publicAccessCidrs the endpoint is not public): the API "
                "server would be unreachable"
            )
        if self.endpoint_public_access and self.public_access_cidrs is None:
            raise ValueError(
                "cluster.endpointPublicAccess is true but cluster.publicAccessCidrs is not set: "
                "list the networks that run `pulumi up` and kubectl (e.g. ['203.0.113.0/24'] "
                "for an office, your CI runners' egress); ['0.0.0.0/0'] opens the endpoint to "
                "the internet and must be written out"
            )
        if self.endpoint_public_access is False and self.public_access_cidrs is not None:
            raise ValueError(
                "cluster.publicAccessCidrs is set but cluster.endpointPublicAccess is false: "
                "remove one (the CIDRs only apply to a public endpoint)"
            )
        return self

    @property
    def public_endpoint(self) -> bool:
        """Whether the API server is reachable from outside the VPC (`publicAccessCidrs` only)."""
        if self.endpoint_public_access is None:
            return self.public_access_cidrs is not None
        return self.endpoint_public_access

    @property
    def installs_pod_identity_agent(self) -> bool:
        """Whether the stack installs (and owns) the pod identity agent add-on."""
        if self.pod_identity_agent is None:
            return self.mode == "create"
        return self.pod_identity_agent


class CapacityConfig(ConfigSection):
    """`gpuNodes.capacity`: how the GPU instances are bought."""

    type: CapacityType = Field(
        default="on-demand",
        description=(
            "`on-demand`, `spot`, `reservation` (an On-Demand Capacity Reservation, ODCR) or "
            "`block` (an EC2 Capacity Block for ML). The last two need `reservationId`."
        ),
    )
    reservation_id: str | None = Field(
        default=None,
        description="Capacity reservation ID (`cr-...`) for `reservation` and `block`.",
    )

    @model_validator(mode="after")
    def _reservation_matches_type(self) -> CapacityConfig:
        reserved = self.type in ("reservation", "block")
        if reserved and self.reservation_id is None:
            raise ValueError(
                f"gpuNodes.capacity.reservationId is required for capacity type {self.type!r}"
            )
        if not reserved and self.reservation_id is not None:
            raise ValueError(
                f"gpuNodes.capacity.reservationId is only used with type 'reservation' or "
                f"'block', not {self.type!r}"
            )
        if self.reservation_id is not None and not _RESERVATION_ID.match(self.reservation_id):
            raise ValueError(
                f"gpuNodes.capacity.reservationId {self.reservation_id!r} is not a capacity "
                "reservation ID (cr- followed by 8 or 17 hex digits)"
            )
        return self

    @property
    def is_reserved(self) -> bool:
        """Whether the nodes run in a reservation or capacity block (no placement group then)."""
        return self.type in ("reservation", "block")


def _is_label_value(value: str) -> bool:
    return len(value) <= 63 and _LABEL_VALUE.match(value) is not None


def _check_node_group_key(field: str, key: str) -> None:
    """A label or taint key EKS's CreateNodegroup takes, whose autoscaler node-template tag
    (`AUTOSCALER_LABEL_TAG_PREFIX` + key; the taint prefix has the same length) fits an ASG
    tag key. ValueError naming the key otherwise."""
    if not _LABEL_KEY.match(key):
        raise ValueError(
            f"{field} key {key!r} is not a Kubernetes key (an optional DNS prefix and '/', "
            "then letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        )
    reserved = [domain for domain in EKS_RESERVED_LABEL_DOMAINS if domain in key]
    if reserved:
        raise ValueError(
            f"{field} key {key!r} uses the domain {reserved[0]!r}, which EKS reserves for its "
            f"own labels and taints; allowed: a key outside {', '.join(EKS_RESERVED_LABEL_DOMAINS)}"
        )
    tag_room = ASG_TAG_KEY_MAX - len(AUTOSCALER_LABEL_TAG_PREFIX)
    limit = min(EKS_LABEL_KEY_MAX, tag_room)
    if len(key) > limit:
        raise ValueError(
            f"{field} key {key!r} has {len(key)} characters; allowed: at most {limit} (EKS "
            f"takes {EKS_LABEL_KEY_MAX}, and the autoscaler's tag "
            f"{AUTOSCALER_LABEL_TAG_PREFIX}<key> must fit an ASG tag key's {ASG_TAG_KEY_MAX})"
        )


class TaintConfig(ConfigSection):
    """One extra Kubernetes taint for the GPU nodes."""

    key: str = Field(description="Taint key.")
    value: str = Field(default="true", description="Taint value.")
    effect: TaintEffect = Field(default="NoSchedule", description="Taint effect.")

    # Taint keys and values follow the label rules; EKS rejects others only when it creates
    # the node group, long after the cluster.
    @field_validator("key")
    @classmethod
    def _key_is_valid(cls, key: str) -> str:
        _check_node_group_key("gpuNodes.taints", key)
        return key

    @field_validator("value")
    @classmethod
    def _value_is_valid(cls, value: str) -> str:
        if not _is_label_value(value):
            raise ValueError(
                f"gpuNodes.taints value {value!r} is not a Kubernetes taint value (at most 63 "
                "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
            )
        return value


class GpuNodesConfig(ConfigSection):
    """`fsdp-eks:gpuNodes`: the GPU (and EFA) node group the training job runs on."""

    instance_type: str = Field(
        description=(
            "GPU instance type (one of infra/facts/instances.py), e.g. p5.48xlarge. On a SageMaker "
            "HyperPod EKS cluster (cluster.mode existing) its SageMaker name, e.g. "
            "ml.p5.48xlarge: the job then selects nodes by that name and HyperPod's "
            "node-health-status Schedulable label, and cost.usdPerInstanceHour is required."
        )
    )
    count: int = Field(
        ge=1, description="Number of GPU nodes (the job runs one worker pod per node)."
    )
    availability_zone: str | None = Field(
        default=None,
        description=(
            "AZ of the GPU capacity (a reservation/block lives in one AZ; EFA needs all nodes "
            "in one); it must offer `instanceType` (checked against EC2's offerings at deploy "
            "time). Default: the first AZ of a new VPC that offers `instanceType` (pin it once "
            "deployed); with an existing VPC it must be the AZ of cluster.network.gpuSubnetId."
        ),
    )
    capacity: CapacityConfig = Field(
        default_factory=CapacityConfig, description="How the instances are bought."
    )
    keep_warm: bool = Field(
        default=False,
        description=(
            "Keep `count` GPU nodes running between jobs (min = desired = count) instead of "
            "starting from zero for each job and scaling back to zero after it: saves the "
            "node start-up (several minutes) per job, and bills every node-hour until "
            "`pulumi destroy`."
        ),
    )
    placement_group: Literal["auto"] | bool = Field(
        default="auto",
        description=(
            "Put the nodes in a cluster placement group. `auto`: yes with EFA and without a "
            "reservation/capacity block (those fix the placement themselves)."
        ),
    )
    efa: Literal["auto"] | bool = Field(
        default="auto",
        description=(
            "Attach EFA interfaces (one per network card). `auto`: yes when the instance "
            "type supports EFA."
        ),
    )
    root_volume_gib: int = Field(
        default=500,
        alias="rootVolumeGiB",
        ge=100,
        le=16384,
        description="gp3 root volume per node (GiB): container images, caches, local checkpoints.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Extra Kubernetes labels on the GPU nodes (added to the built-in ones). Keys of at "
            "most 63 characters (EKS's limit) outside kubernetes.io/, k8s.io/ and "
            "eks.amazonaws.com/, and not fsdp-eks/node-pool; values of 1 to 63 characters."
        ),
    )
    taints: list[TaintConfig] = Field(
        default_factory=list,
        description=f"Extra taints on the GPU nodes (the {GPU_TAINT_KEY} taint is always set).",
    )

    @field_validator("instance_type")
    @classmethod
    def _known_instance(cls, value: str) -> str:
        if known_facts(value) is None:
            close = difflib.get_close_matches(
                value.removeprefix(HYPERPOD_PREFIX), INSTANCE_FACTS, n=1, cutoff=0.9
            )
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"gpuNodes.instanceType {value!r} is not a known GPU instance type{hint}; "
                f"allowed: {', '.join(sorted(INSTANCE_FACTS))}, or on a SageMaker HyperPod "
                f"cluster the same with {HYPERPOD_PREFIX!r} in front (e.g. ml.p5.48xlarge)"
            )
        return value

    @field_validator("availability_zone")
    @classmethod
    def _az_is_name(cls, value: str | None) -> str | None:
        if value is not None and not _AZ_PATTERN.match(value):
            raise ValueError(
                f"gpuNodes.availabilityZone {value!r} is not an AZ name (e.g. us-west-2a)"
            )
        return value

    @field_validator("labels")
    @classmethod
    def _labels_are_valid(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label in value.items():
            _check_node_group_key("gpuNodes.labels", key)
            if key == NODE_POOL_LABEL:
                raise ValueError(
                    f"gpuNodes.labels key {key!r} is the stack's own node-pool label: the "
                    "autoscaler finds the GPU group by its value 'gpu' and would find none; "
                    "use another key"
                )
            if not label or not _is_label_value(label):
                raise ValueError(
                    f"gpuNodes.labels value {label!r} of {key!r} is not a label value EKS takes "
                    "(1 to 63 letters, digits, '-', '_' or '.', starting and ending with a "
                    "letter or digit)"
                )
        return value

    @model_validator(mode="after")
    def _efa_and_placement_fit(self) -> GpuNodesConfig:
        facts = instance_facts(self.instance_type)
        if self.efa is True and facts.efa_interfaces == 0:
            raise ValueError(
                f"gpuNodes.efa is true but gpuNodes.instanceType {self.instance_type!r} has no "
                "EFA support; use an EFA type (e.g. g5.8xlarge, p5.48xlarge) or efa: auto"
            )
        if self.placement_group is True and self.capacity.is_reserved:
            raise ValueError(
                "gpuNodes.placementGroup is true together with gpuNodes.capacity.type "
                f"{self.capacity.type!r}: a reservation/capacity block fixes placement itself "
                "and launches fail in a placement group; use placementGroup: auto or false"
            )
        if any(taint.key == GPU_TAINT_KEY for taint in self.taints):
            raise ValueError(
                f"gpuNodes.taints must not repeat {GPU_TAINT_KEY!r}: the stack always sets it"
            )
        return self

    @property
    def facts(self) -> InstanceFacts:
        """Published shape of the instance type."""
        return instance_facts(self.instance_type)

    @property
    def efa_enabled(self) -> bool:
        """Whether the nodes get EFA interfaces (and the job requests `vpc.amazonaws.com/efa`)."""
        if self.efa == "auto":
            return self.facts.efa_interfaces > 0
        return self.efa

    @property
    def efa_interface_count(self) -> int:
        """EFA interfaces per node: one per network card, 0 without EFA."""
        return self.facts.efa_interfaces if self.efa_enabled else 0

    @property
    def placement_group_enabled(self) -> bool:
        """Whether the nodes go into a cluster placement group."""
        if self.placement_group == "auto":
            return self.efa_enabled and not self.capacity.is_reserved
        return self.placement_group
