"""The GPU node group: EFA wiring per instance type, one AZ, placement vs reservation, IMDSv2."""

import base64
import email
from decimal import Decimal
from typing import Any

import pulumi
import pytest
import yaml
from pulumi.runtime import settings

from infra.config.cluster import GpuNodesConfig
from infra.job.placement import gpu_tolerations
from infra.offline import Evaluation, FakeCloud, evaluate
from infra.offline.outputs import INVOKE_RESULTS
from infra.platform.gpu_nodes import (
    GPU_AMI_TYPE,
    MEMLOCK_BYTES,
    GpuNodeGroup,
    GpuNodeGroupArgs,
    efa_network_interfaces,
    gpu_node_user_data,
)

LT = "aws:ec2/launchTemplate:LaunchTemplate"
NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
PLACEMENT = "aws:ec2/placementGroup:PlacementGroup"
CLUSTER_SG = "sg-cluster0000000000"
RESERVATION = "cr-0123456789abcdef0"


def build(fake_cloud: FakeCloud | None = None, **gpu: Any) -> Evaluation:
    config = GpuNodesConfig.model_validate({"instanceType": "p5.48xlarge", "count": 2, **gpu})

    def program() -> None:
        nodes = GpuNodeGroup(
            "gpu",
            GpuNodeGroupArgs(
                config=config,
                cluster_name="train",
                cluster_security_group_id=CLUSTER_SG,
                vpc_id="vpc-1",
                subnet_id="subnet-gpu",
                node_role_arn="arn:aws:iam::123456789012:role/gpu-nodes",
                kubernetes_version="1.33",
            ),
        )
        pulumi.export("efa", nodes.efa_interface_count)

    return evaluate(program, config={}, fake_cloud=fake_cloud)


def interfaces(result: Evaluation) -> list[dict[str, Any]]:
    return list(result.one(LT).inputs.get("networkInterfaces", []))


@pytest.mark.parametrize(
    ("instance_type", "count"),
    [
        ("p4d.24xlarge", 4),
        ("p5.48xlarge", 32),
        ("p5en.48xlarge", 16),
        ("p6-b200.48xlarge", 8),
        ("g5.8xlarge", 1),
    ],
)
def test_one_efa_interface_per_network_card(instance_type: str, count: int) -> None:
    result = build(instanceType=instance_type)
    nics = interfaces(result)
    assert len(nics) == count
    assert result.stack_outputs["efa"] == count
    assert [n["networkCardIndex"] for n in nics] == list(range(count))
    assert nics[0]["interfaceType"] == "efa" and nics[0]["deviceIndex"] == 0
    assert all(n["interfaceType"] == "efa-only" and n["deviceIndex"] == 1 for n in nics[1:])
    efa_sg = result.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa")
    for nic in nics:  # EFA SG and the cluster SG on every interface
        assert sorted(nic["securityGroups"]) == sorted(
            [efa_sg.outputs["arn"].split("/")[-1], CLUSTER_SG]
        )
    node_group = result.one(NODE_GROUP)
    assert node_group.inputs["tags"]["fsdp-eks/efa-interfaces"] == str(count)
    assert node_group.inputs["labels"]["vpc.amazonaws.com/efa.present"] == "true"


def test_efa_security_group_allows_all_traffic_to_and_from_itself() -> None:
    result = build()
    group = result.one("aws:ec2/securityGroup:SecurityGroup", "gpu-efa")
    assert group.inputs["vpcId"] == "vpc-1"
    ingress = result.one("aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule")
    egress = result.one("aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule")
    for rule in (ingress, egress):
        assert rule.inputs["ipProtocol"] == "-1"
        assert rule.inputs["securityGroupId"] == rule.inputs["referencedSecurityGroupId"]
        assert "cidrIpv4" not in rule.inputs


def test_nodes_live_in_the_one_gpu_subnet() -> None:
    node_group = build().one(NODE_GROUP)
    assert node_group.inputs["subnetIds"] == ["subnet-gpu"]


def test_on_demand_efa_gets_a_cluster_placement_group() -> None:
    result = build()
    group = result.one(PLACEMENT)
    assert group.inputs["strategy"] == "cluster"
    assert result.one(LT).inputs["placement"]["groupName"] == group.inputs.get(
        "name", group.outputs["name"]
    )
    assert result.one(NODE_GROUP).inputs["capacityType"] == "ON_DEMAND"
    assert "capacityReservationSpecification" not in result.one(LT).inputs


def test_odcr_targets_the_reservation_without_a_placement_group() -> None:
    result = build(capacity={"type": "reservation", "reservationId": RESERVATION})
    assert result.of_type(PLACEMENT) == []
    template = result.one(LT).inputs
    assert "placement" not in template
    target = template["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == RESERVATION
    assert "instanceMarketOptions" not in template
    assert result.one(NODE_GROUP).inputs["capacityType"] == "ON_DEMAND"
    assert len(interfaces(result)) == 32


def test_capacity_block_uses_its_own_launch_template() -> None:
    result = build(capacity={"type": "block", "reservationId": RESERVATION})
    assert result.of_type(PLACEMENT) == []
    template = result.one(LT)
    assert template.inputs["instanceMarketOptions"]["marketType"] == "capacity-block"
    target = template.inputs["capacityReservationSpecification"]["capacityReservationTarget"]
    assert target["capacityReservationId"] == RESERVATION
    node_group = result.one(NODE_GROUP)
    assert node_group.inputs["capacityType"] == "CAPACITY_BLOCK"
    assert (
        node_group.inputs["launchTemplate"]["id"] == f"lt-{template.outputs['arn'].split('lt-')[1]}"
    )
    assert node_group.delete_before_replace  # the block cannot hold two groups at once
    assert result.of_type("eks:index:ManagedNodeGroup") == []


def test_spot_capacity_type() -> None:
    assert build(capacity={"type": "spot"}).one(NODE_GROUP).inputs["capacityType"] == "SPOT"


@pytest.mark.parametrize(
    "capacity",
    [{"type": "on-demand"}, {"type": "block", "reservationId": "cr-0123456789abcdef0"}],
)
def test_gpu_nodes_are_repaired_by_eks(capacity: dict[str, Any]) -> None:
    """Managed node group auto-repair (EKS API CreateNodegroup `nodeRepairConfig`, off by
    default) acts on the node monitoring agent's conditions, GPU XID errors among them."""
    node_group = build(capacity=capacity).one(NODE_GROUP).inputs
    assert node_group["nodeRepairConfig"] == {"enabled": True}


def test_imdsv2_required_for_the_node_only_and_a_large_gp3_root_volume() -> None:
    template = build(rootVolumeGiB=1200).one(LT).inputs
    metadata = template["metadataOptions"]
    assert metadata["httpTokens"] == "required"
    assert metadata["httpEndpoint"] == "enabled"
    # Hop limit 1: a pod (one network hop from the node) cannot fetch the node role's
    # credentials; 2 let every pod read them.
    assert metadata["httpPutResponseHopLimit"] == 1
    (root,) = template["blockDeviceMappings"]
    assert root["deviceName"] == "/dev/xvda"
    assert root["ebs"]["volumeType"] == "gp3"
    assert root["ebs"]["volumeSize"] == 1200
    assert root["ebs"]["encrypted"] == "true"
    assert "vpcSecurityGroupIds" not in template  # the interfaces carry the groups


def test_gpu_taint_labels_and_ami() -> None:
    node_group = build(labels={"team": "nlp"}, taints=[{"key": "dedicated", "value": "fsdp"}]).one(
        NODE_GROUP
    )
    assert node_group.inputs["amiType"] == GPU_AMI_TYPE == "AL2023_x86_64_NVIDIA"
    assert node_group.inputs["instanceTypes"] == ["p5.48xlarge"]
    assert node_group.inputs["taints"] == [
        {"key": "nvidia.com/gpu", "value": "true", "effect": "NO_SCHEDULE"},
        {"key": "dedicated", "value": "fsdp", "effect": "NO_SCHEDULE"},
    ]
    labels = node_group.inputs["labels"]
    assert labels["team"] == "nlp"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["fsdp-eks/node-pool"] == "gpu"
    assert node_group.inputs["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 2}
    assert node_group.inputs["version"] == "1.33"


def test_tolerations_match_the_taints() -> None:
    config = GpuNodesConfig.model_validate(
        {"instanceType": "g5.xlarge", "count": 1, "taints": [{"key": "dedicated", "value": "x"}]}
    )
    assert gpu_tolerations(config) == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "x", "effect": "NoSchedule"},
    ]


def test_instance_without_efa_gets_a_plain_node_group() -> None:
    result = build(instanceType="g5.xlarge", count=1)
    assert interfaces(result) == []
    assert result.of_type("aws:ec2/securityGroup:SecurityGroup") == []
    assert result.of_type(PLACEMENT) == []
    assert result.stack_outputs["efa"] == 0
    assert "vpc.amazonaws.com/efa.present" not in result.one(NODE_GROUP).inputs["labels"]
    assert not any(token.endswith("getInstanceType") for token, _ in result.invokes)


def test_efa_switched_off_on_an_efa_type() -> None:
    result = build(efa=False)
    assert interfaces(result) == []
    assert result.of_type(PLACEMENT) == []


def test_deploy_time_check_fails_when_aws_disagrees_with_the_facts_table(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = INVOKE_RESULTS["aws:ec2/getInstanceType:getInstanceType"]

    def fewer_cards(args: dict[str, Any]) -> dict[str, Any]:
        return {**real(args), "efaMaximumInterfaces": 16}

    monkeypatch.setitem(INVOKE_RESULTS, "aws:ec2/getInstanceType:getInstanceType", fewer_cards)
    try:
        with pytest.raises(ValueError, match=r"'p5\.48xlarge': AWS reports 16 EFA.*says 32"):
            build()
    finally:
        # The failed run leaves its pending outputs in the SDK's process-wide set, which the
        # next evaluation would await on a closed loop (reported to the runtime's owner).
        settings.SETTINGS.outputs.clear()


def test_the_check_asks_aws_about_the_configured_type() -> None:
    result = build(instanceType="p5en.48xlarge")
    asked = [a["instanceType"] for t, a in result.invokes if t.endswith("getInstanceType")]
    assert asked == ["p5en.48xlarge"]


def test_interface_builder_rejects_zero() -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        efa_network_interfaces(0, ["sg-1"])


# --- locked memory: what nodeadm makes of the launch template's user data ----------------

AMI_DEFAULT_RLIMITS = [{"type": "RLIMIT_NOFILE", "soft": 65536, "hard": 1048576}]
"""`process.rlimits` of the AL2023 AMI's default base runtime spec (awslabs/amazon-eks-ami
v20260724 `nodeadm/internal/containerd/base-runtime-spec.json`): the only list the model below
merges into."""
UINT64_MAX = 2**64 - 1
NODEADM_PART = "application/node.eks.aws"


def node_config_parts(user_data_b64: str) -> list[dict[str, Any]]:
    """The NodeConfig documents nodeadm finds in the user data: every MIME part of content type
    application/node.eks.aws (`nodeadm/internal/configprovider/mime.go` `ParseMultipart`),
    decoded as JSON or YAML (`internal/api/bridge/decode.go`)."""
    message = email.message_from_bytes(base64.b64decode(user_data_b64))
    assert message.is_multipart(), "nodeadm reads a NodeConfig part only from MIME multi-part"
    return [
        yaml.safe_load(str(part.get_payload()))
        for part in message.walk()
        if part.get_content_type() == NODEADM_PART
    ]


def _go_float(value: Any) -> Any:
    """A JSON number after json.Unmarshal into interface{}: a float64."""
    if isinstance(value, dict):
        return {key: _go_float(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_go_float(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _mergo(dst: dict[str, Any], src: dict[str, Any]) -> dict[str, Any]:
    """mergo.Merge(&dst, src, WithOverride) on two map[string]interface{}: maps merge key by
    key, anything else (lists included) is replaced by src's (`internal/util/merge.go`)."""
    merged = dict(dst)
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _mergo(merged[key], value)
        else:
            merged[key] = value
    return merged


def _go_json_number(value: float) -> int:
    """What Go's encoding/json writes for a float64 below 1e21 (the shortest digits that
    round-trip, in 'f' format), read back as the OCI spec's uint64 by containerd, which
    refuses a number that overflows it (and with it the whole base spec)."""
    text = format(Decimal(repr(value)).normalize(), "f")
    number = int(text)
    assert 0 <= number <= UINT64_MAX, f"{text} overflows uint64: containerd fails to load the spec"
    return number


def effective_rlimits(user_data_b64: str | None) -> dict[str, tuple[int, int]]:
    """{type: (soft, hard)} of every container on a node with this user data, as nodeadm
    writes /etc/containerd/base-runtime-spec.json (`internal/containerd/base_runtime_spec.go`
    `writeBaseRuntimeSpec`: the NodeConfigs merged, then their baseRuntimeSpec merged into the
    default, both with util.Merge). EKS's own part (cluster endpoint, CA) carries no spec."""
    eks_part: dict[str, Any] = {"spec": {"cluster": {"name": "train"}}}
    parts = [eks_part, *(node_config_parts(user_data_b64) if user_data_b64 else [])]
    node_config: dict[str, Any] = {}
    for part in parts:
        node_config = _mergo(node_config, _go_float(part))
    base = node_config["spec"].get("containerd", {}).get("baseRuntimeSpec")
    spec: dict[str, Any] = {"process": {"rlimits": AMI_DEFAULT_RLIMITS}}
    if base:
        spec = _mergo(_go_float(spec), _go_float(base))
    return {
        limit["type"]: (_go_json_number(limit["soft"]), _go_json_number(limit["hard"]))
        for limit in spec["process"]["rlimits"]
    }


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p4d.24xlarge", "g5.xlarge"])
def test_gpu_nodes_lift_the_locked_memory_limit_and_keep_the_amis_file_limit(
    instance_type: str,
) -> None:
    """Without the user data a container inherits containerd's 8 MiB memlock and EFA cannot
    register NCCL's buffers; with it, the limit is above the node's memory."""
    config = GpuNodesConfig.model_validate({"instanceType": instance_type, "count": 1})
    limits = effective_rlimits(
        build(instanceType=instance_type, count=1).one(LT).inputs.get("userData")
    )
    soft, hard = limits["RLIMIT_MEMLOCK"]
    assert soft == hard >= config.facts.memory_gib * 2**30
    assert limits["RLIMIT_NOFILE"] == (65536, 1048576)


def test_rlim_infinity_would_not_survive_nodeadms_merge() -> None:
    """Why MEMLOCK_BYTES is not 2**64-1: through a float64 it comes out above uint64."""
    with pytest.raises(AssertionError, match="overflows uint64"):
        _go_json_number(float(UINT64_MAX))
    assert _go_json_number(float(MEMLOCK_BYTES)) == MEMLOCK_BYTES
    assert gpu_node_user_data() == build().one(LT).inputs["userData"]
