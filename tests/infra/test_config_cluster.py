"""The cluster and gpuNodes sections: defaults that are safe, and errors that name the key."""

from datetime import date
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from infra.config.cluster import (
    CapacityConfig,
    ClusterConfig,
    GpuNodesConfig,
    NetworkConfig,
    SystemNodesConfig,
    TaintConfig,
)
from infra.facts.eks_versions import EKS_VERSIONS, in_standard_support
from infra.facts.prices import SOURCES

SECTIONS: list[type[BaseModel]] = [
    ClusterConfig,
    NetworkConfig,
    SystemNodesConfig,
    GpuNodesConfig,
    CapacityConfig,
    TaintConfig,
]


def gpu(**overrides: Any) -> GpuNodesConfig:
    return GpuNodesConfig.model_validate({"instanceType": "p5.48xlarge", "count": 2, **overrides})


@pytest.mark.parametrize("model", SECTIONS)
def test_every_field_has_a_description(model: type[BaseModel]) -> None:
    missing = [name for name, info in model.model_fields.items() if not info.description]
    assert missing == []


def test_defaults_create_a_private_logged_encrypted_cluster() -> None:
    config = ClusterConfig.model_validate({})
    assert config.mode == "create"
    assert config.network.creates_vpc
    assert config.endpoint_private_access
    assert set(config.log_types) >= {"api", "audit", "authenticator"}
    assert config.secrets_kms_key_arn is None  # the stack creates a key
    assert config.installs_pod_identity_agent


def test_camel_case_keys_from_a_stack_file() -> None:
    config = ClusterConfig.model_validate(
        {
            "kubernetesVersion": "1.34",
            "adminRoleArn": "arn:aws:iam::123456789012:role/platform-admins",
            "network": {
                "vpcCidr": "10.8.0.0/16",
                "availabilityZones": ["us-east-1a", "us-east-1b"],
            },
            "systemNodes": {"instanceType": "m6i.2xlarge", "desiredSize": 3},
        }
    )
    assert config.kubernetes_version == "1.34"
    assert config.network.availability_zones == ["us-east-1a", "us-east-1b"]
    assert config.system_nodes.desired_size == 3
    assert gpu(rootVolumeGiB=1000).root_volume_gib == 1000
    assert SystemNodesConfig.model_validate({"diskSizeGiB": 80}).disk_size_gib == 80


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"mode": "existing"}, r"cluster\.name is required"),
        ({"platformStack": "org/p/s"}, r"cluster\.platformStack is only read"),
        ({"adminRoleArn": "arn:aws:iam::123456789012:user/bob"}, r"cluster\.adminRoleArn"),
        ({"secretsKmsKeyArn": "my-key"}, r"cluster\.secretsKmsKeyArn"),
        ({"logRetentionDays": 10}, r"cluster\.logRetentionDays 10"),
        ({"logTypes": ["api", "kubelet"]}, r"logTypes"),
        ({"kubernetesVersion": "latest"}, r"kubernetesVersion"),
        ({"publicAccessCidrs": ["my office"]}, r"publicAccessCidrs entry 'my office'"),
        (
            {"endpointPublicAccess": False, "endpointPrivateAccess": False},
            r"both false",
        ),
        ({"nodes": 3}, r"nodes"),
        ({"network": {"vpcCidr": "10.0.0.0/24"}}, r"vpcCidr '10\.0\.0\.0/24' has prefix /24"),
        ({"network": {"availabilityZones": ["us-west-2a"]}}, r"at least 2 distinct AZs"),
        ({"network": {"vpcId": "vpc-1", "gpuSubnetId": "subnet-g"}}, r"privateSubnetIds"),
        (
            {"network": {"vpcId": "vpc-1", "privateSubnetIds": ["subnet-a", "subnet-b"]}},
            r"gpuSubnetId is required",
        ),
        ({"network": {"gpuSubnetId": "subnet-g"}}, r"gpuSubnetId given without"),
        ({"network": {"privateSubnetIds": ["subnet-a"]}}, r"privateSubnetIds given without"),
        (
            {
                "mode": "existing",
                "name": "team",
                "network": {
                    "vpcId": "vpc-1",
                    "privateSubnetIds": ["subnet-a", "subnet-b"],
                    "gpuSubnetId": "subnet-g",
                },
            },
            r"vpcId is not used in cluster\.mode 'existing'",
        ),
        ({"systemNodes": {"minSize": 3, "desiredSize": 2}}, r"minSize <= desiredSize"),
    ],
)
def test_cluster_errors_name_the_key(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        ClusterConfig.model_validate(data)


def test_default_version_is_in_standard_support_on_the_price_tables_date() -> None:
    # A cluster priced as of the price table's date must not be billed for extended support
    # then: EKS calendar, 1.33 left standard support on 2026-07-29 (before 2026-11-09).
    priced_on = max(date.fromisoformat(source.as_of) for source in SOURCES.values())
    version = ClusterConfig.model_validate({}).kubernetes_version
    assert EKS_VERSIONS[version].end_of_standard_support > priced_on
    assert version == max(in_standard_support(priced_on), key=lambda v: int(v.split(".")[1]))


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("1.33", r"'1\.33' left EKS standard support on 2026-07-29 .*allowed: 1\.34, 1\.35"),
        ("1.29", r"'1\.29' is not in the project's table .*allowed: 1\.34, 1\.35"),
        ("1.36", r"'1\.36' is not in the project's table"),
    ],
)
def test_versions_outside_standard_support_are_rejected(version: str, message: str) -> None:
    with pytest.raises(ValidationError, match=rf"cluster\.kubernetesVersion {message}"):
        ClusterConfig.model_validate({"kubernetesVersion": version})


def test_existing_mode_needs_only_a_name_and_skips_the_agent_by_default() -> None:
    config = ClusterConfig.model_validate({"mode": "existing", "name": "team-gpu"})
    assert not config.installs_pod_identity_agent
    asked = ClusterConfig.model_validate(
        {"mode": "existing", "name": "team-gpu", "podIdentityAgent": True}
    )
    assert asked.installs_pod_identity_agent


def test_existing_mode_may_name_the_fsx_subnet() -> None:
    config = ClusterConfig.model_validate(
        {"mode": "existing", "name": "team", "network": {"gpuSubnetId": "subnet-g"}}
    )
    assert config.network.gpu_subnet_id == "subnet-g"


def test_existing_vpc_with_subnets() -> None:
    network = NetworkConfig.model_validate(
        {"vpcId": "vpc-1", "privateSubnetIds": ["subnet-a", "subnet-b"], "gpuSubnetId": "subnet-g"}
    )
    assert not network.creates_vpc


@pytest.mark.parametrize(
    ("instance_type", "efa_count", "placement"),
    [
        ("p4d.24xlarge", 4, True),
        ("p5.48xlarge", 32, True),
        ("p5en.48xlarge", 16, True),
        ("p6-b200.48xlarge", 8, True),
        ("g5.8xlarge", 1, True),
        ("g5.xlarge", 0, False),
    ],
)
def test_efa_and_placement_follow_the_instance(
    instance_type: str, efa_count: int, placement: bool
) -> None:
    nodes = gpu(instanceType=instance_type)
    assert nodes.efa_interface_count == efa_count
    assert nodes.efa_enabled == (efa_count > 0)
    assert nodes.placement_group_enabled == placement


@pytest.mark.parametrize("capacity_type", ["reservation", "block"])
def test_reserved_capacity_has_no_placement_group(capacity_type: str) -> None:
    nodes = gpu(capacity={"type": capacity_type, "reservationId": "cr-0123456789abcdef0"})
    assert nodes.capacity.is_reserved
    assert nodes.efa_enabled
    assert not nodes.placement_group_enabled


def test_efa_and_placement_can_be_switched_off() -> None:
    nodes = gpu(efa=False)
    assert nodes.efa_interface_count == 0
    assert not nodes.placement_group_enabled
    assert not gpu(placementGroup=False).placement_group_enabled


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"instanceType": "m5.large"}, r"gpuNodes\.instanceType 'm5\.large'.*p5\.48xlarge"),
        ({"count": 0}, r"count"),
        ({"instanceType": "g5.xlarge", "efa": True}, r"gpuNodes\.efa is true.*'g5\.xlarge'"),
        (
            {
                "placementGroup": True,
                "capacity": {"type": "block", "reservationId": "cr-0123456789abcdef0"},
            },
            r"gpuNodes\.placementGroup is true together with.*'block'",
        ),
        ({"capacity": {"type": "reservation"}}, r"reservationId is required"),
        (
            {"capacity": {"type": "spot", "reservationId": "cr-0123456789abcdef0"}},
            r"only used with type",
        ),
        (
            {"capacity": {"type": "block", "reservationId": "res-1"}},
            r"'res-1' is not a capacity reservation ID",
        ),
        ({"capacity": {"type": "dedicated"}}, r"capacity\.type"),
        ({"availabilityZone": "west"}, r"gpuNodes\.availabilityZone 'west'"),
        ({"labels": {"node.kubernetes.io/pool": "x"}}, r"'kubernetes\.io/', which EKS reserves"),
        ({"labels": {"bad key": "x"}}, r"gpuNodes\.labels key 'bad key' is not a Kubernetes key"),
        ({"taints": [{"key": "nvidia.com/gpu"}]}, r"must not repeat"),
        ({"labels": {"team": "ml research"}}, r"gpuNodes\.labels value 'ml research'"),
        ({"labels": {"team": "x" * 64}}, r"gpuNodes\.labels value"),
        ({"taints": [{"key": "dedicated to"}]}, r"gpuNodes\.taints key 'dedicated to'"),
        ({"taints": [{"key": "dedicated", "value": "-ml"}]}, r"gpuNodes\.taints value '-ml'"),
        ({"rootVolumeGiB": 20}, r"rootVolumeGiB"),
    ],
)
def test_gpu_nodes_errors_name_the_key(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        gpu(**overrides)


LONG_KEY = "research.example.com/" + "a" * 60


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # EKS refuses these domains in a node group's labels and taints (CreateNodegroup:
        # "Label cannot contain reserved prefixes [kubernetes.io/, k8s.io/, eks.amazonaws.com/]").
        (
            {"labels": {"eks.amazonaws.com/capacityType": "SPOT"}},
            r"gpuNodes\.labels key 'eks\.amazonaws\.com/capacityType' uses the domain "
            r"'eks\.amazonaws\.com/'",
        ),
        (
            {"taints": [{"key": "eks.amazonaws.com/compute-type"}]},
            r"gpuNodes\.taints key 'eks\.amazonaws\.com/compute-type' uses the domain",
        ),
        # A valid Kubernetes key (<= 316) that EKS (63) and the ASG tag (128 - 46) refuse.
        ({"labels": {LONG_KEY: "x"}}, rf"gpuNodes\.labels key '{LONG_KEY}' has 81 characters"),
        ({"taints": [{"key": LONG_KEY}]}, r"gpuNodes\.taints key .* has 81 characters"),
        # Overriding the pool label would hide the GPU group from the autoscaler's discovery.
        (
            {"labels": {"fsdp-eks/node-pool": "training"}},
            r"gpuNodes\.labels key 'fsdp-eks/node-pool' is the stack's own node-pool label",
        ),
        ({"labels": {"team": ""}}, r"gpuNodes\.labels value '' of 'team'"),
    ],
)
def test_gpu_node_keys_eks_and_the_autoscaler_refuse_are_refused(
    overrides: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message) as raised:
        gpu(**overrides)
    [error] = raised.value.errors()
    assert "\n" not in str(error["msg"])


def test_sections_are_frozen() -> None:
    nodes = gpu()
    with pytest.raises(ValidationError):
        nodes.count = 3  # type: ignore[misc]
