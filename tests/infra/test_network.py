"""The network: private subnets in >= 2 AZs, a zonal GPU subnet, NAT, S3 endpoint; or nothing."""

import ipaddress
from pathlib import Path
from typing import Any

import pulumi
import pytest
from pulumi.runtime import settings

from infra.config import StackConfigError, read_stack_file
from infra.config.cluster import NetworkConfig
from infra.offline import Evaluation, evaluate
from infra.offline.outputs import INVOKE_RESULTS
from infra.platform.network import Network, NetworkArgs, _gpu_az, plan_subnets
from infra.program import main as program

SUBNET = "aws:ec2/subnet:Subnet"
OFFERINGS = "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings"
STACKS = Path(__file__).resolve().parents[2] / "stacks"


def build(network: dict[str, Any], gpu_az: str | None = None) -> Evaluation:
    def program() -> None:
        net = Network(
            "net",
            NetworkArgs(config=NetworkConfig.model_validate(network), gpu_availability_zone=gpu_az),
        )
        pulumi.export("vpcId", net.vpc_id)
        pulumi.export("private", net.private_subnet_ids)
        pulumi.export("gpuSubnet", net.gpu_subnet_id)
        pulumi.export("gpuAz", net.gpu_availability_zone)

    return evaluate(program, config={})


def test_plan_splits_the_vpc_without_overlap() -> None:
    plan = plan_subnets("10.0.0.0/16", ["us-west-2a", "us-west-2b", "us-west-2c"])
    blocks = [*plan.system.values(), plan.gpu, *plan.public.values()]
    networks = [ipaddress.IPv4Network(b) for b in blocks]
    vpc = ipaddress.IPv4Network("10.0.0.0/16")
    assert all(n.subnet_of(vpc) for n in networks)
    assert not any(a.overlaps(b) for i, a in enumerate(networks) for b in networks[i + 1 :])
    assert ipaddress.IPv4Network(plan.gpu).prefixlen == 18
    assert {ipaddress.IPv4Network(c).prefixlen for c in plan.system.values()} == {19}
    assert {ipaddress.IPv4Network(c).prefixlen for c in plan.public.values()} == {24}


def test_smallest_vpc_still_has_valid_public_subnets() -> None:
    plan = plan_subnets("10.0.0.0/20", ["a", "b", "c", "d"])
    assert {ipaddress.IPv4Network(c).prefixlen for c in plan.public.values()} == {28}


def test_new_vpc_has_two_private_azs_a_zonal_gpu_subnet_nat_and_s3_endpoint() -> None:
    result = build({}, gpu_az="us-west-2c")
    subnets = result.of_type(SUBNET)
    private = [s for s in subnets if s.inputs["tags"].get("kubernetes.io/role/internal-elb")]
    assert sorted(s.inputs["availabilityZone"] for s in private) == ["us-west-2a", "us-west-2b"]
    gpu = result.one(SUBNET, "net-gpu")
    assert gpu.inputs["availabilityZone"] == "us-west-2c"
    assert result.stack_outputs["gpuAz"] == "us-west-2c"
    assert result.stack_outputs["gpuSubnet"].startswith("subnet-")
    assert len(result.stack_outputs["private"]) == 2
    assert all(not s.inputs.get("mapPublicIpOnLaunch", False) for s in subnets)
    nats = result.of_type("aws:ec2/natGateway:NatGateway")
    assert len(nats) == 1  # single NAT by default
    endpoint = result.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert endpoint.inputs["serviceName"] == "com.amazonaws.us-west-2.s3"
    assert endpoint.inputs["vpcEndpointType"] == "Gateway"
    private_rts = [
        r for r in result.of_type("aws:ec2/routeTable:RouteTable") if "private" in r.name
    ]
    assert len(endpoint.inputs["routeTableIds"]) == len(private_rts) == 1
    # every private and GPU subnet routes through the NAT's route table
    associations = {
        a.name: a.inputs["routeTableId"]
        for a in result.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    assert associations["net-gpu"] == associations["net-private-us-west-2a"]
    default_routes = result.of_type("aws:ec2/route:Route")
    assert any("natGatewayId" in r.inputs for r in default_routes)


def test_gpu_subnet_defaults_to_the_first_az() -> None:
    result = build({})
    assert result.one(SUBNET, "net-gpu").inputs["availabilityZone"] == "us-west-2a"


def test_nat_per_az_gives_each_az_its_own_route() -> None:
    result = build({"singleNatGateway": False, "azCount": 3}, gpu_az="us-west-2b")
    assert len(result.of_type("aws:ec2/natGateway:NatGateway")) == 3
    endpoint = result.one("aws:ec2/vpcEndpoint:VpcEndpoint")
    assert len(endpoint.inputs["routeTableIds"]) == 3
    associations = {
        a.name: a.inputs["routeTableId"]
        for a in result.of_type("aws:ec2/routeTableAssociation:RouteTableAssociation")
    }
    assert associations["net-gpu"] == associations["net-private-us-west-2b"]
    assert associations["net-gpu"] != associations["net-private-us-west-2a"]


def test_explicit_azs_are_used() -> None:
    result = build({"availabilityZones": ["us-west-2b", "us-west-2d"]})
    azs = sorted(
        s.inputs["availabilityZone"] for s in result.of_type(SUBNET) if "private" in s.name
    )
    assert azs == ["us-west-2b", "us-west-2d"]


@pytest.mark.parametrize(
    ("network", "gpu_az", "message"),
    [
        ({}, "eu-west-1a", r"gpuNodes\.availabilityZone 'eu-west-1a' is not available"),
        ({"availabilityZones": ["us-west-2a", "us-east-1a"]}, None, r"\['us-east-1a'\]"),
    ],
)
def test_unavailable_azs_fail_before_anything_is_created(
    network: dict[str, Any], gpu_az: str | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build(network, gpu_az)


def test_existing_vpc_creates_nothing() -> None:
    result = build(
        {
            "vpcId": "vpc-0abc",
            "privateSubnetIds": ["subnet-a", "subnet-b"],
            "gpuSubnetId": "subnet-g",
        }
    )
    assert [r.type for r in result.resources] == ["fsdp-eks:network:Network"]
    assert result.stack_outputs["vpcId"] == "vpc-0abc"
    assert result.stack_outputs["private"] == ["subnet-a", "subnet-b"]
    assert result.stack_outputs["gpuSubnet"] == "subnet-g"
    assert result.stack_outputs["gpuAz"] == "us-west-2a"  # looked up from the subnet


def test_existing_gpu_subnet_must_be_in_the_capacity_az() -> None:
    existing = {
        "vpcId": "vpc-0abc",
        "privateSubnetIds": ["subnet-a", "subnet-b"],
        "gpuSubnetId": "subnet-g",
    }
    assert build(existing, gpu_az="us-west-2a").stack_outputs["gpuSubnet"] == "subnet-g"
    try:
        with pytest.raises(ValueError, match=r"'us-west-2c' but .*'subnet-g' is in 'us-west-2a'"):
            build(existing, gpu_az="us-west-2c")
    finally:
        # A failed run leaves pending outputs in the SDK's process-wide set (see test_gpu_nodes).
        settings.SETTINGS.outputs.clear()


def test_only_the_regions_own_azs_are_candidates() -> None:
    # An opted-in Local Zone (us-west-2-lax-1a) sorts before us-west-2a; EKS cannot use it.
    result = build({})
    (asked,) = [args for token, args in result.invokes if token.endswith("getAvailabilityZones")]
    assert asked["state"] == "available"
    assert {"name": "opt-in-status", "values": ["opt-in-not-required"]} in asked["filters"]


# -- the GPU AZ against the instance type's offerings ----------------------------------------


def offered_only_in(monkeypatch: pytest.MonkeyPatch, *azs: str) -> None:
    """Make the mock's EC2 offer every GPU type only in `azs` (by AZ name)."""
    real = INVOKE_RESULTS[OFFERINGS]

    def answer(args: dict[str, Any]) -> dict[str, Any]:
        result = real(args)
        rows = [
            (t, loc)
            for t, loc in zip(result["instanceTypes"], result["locations"], strict=True)
            if loc in azs
        ]
        return {
            **result,
            "instanceTypes": [t for t, _ in rows],
            "locations": [loc for _, loc in rows],
            "locationTypes": result["locationTypes"][: len(rows)],
        }

    monkeypatch.setitem(INVOKE_RESULTS, OFFERINGS, answer)


def run_dev_stack(**sections: Any) -> Evaluation:
    """The real program on the dev stack file on g5.xlarge, sections extended."""
    stack = read_stack_file("dev", STACKS)
    config = dict(stack.config)
    sections = {
        **sections,
        "gpuNodes": {"instanceType": "g5.xlarge", **sections.get("gpuNodes", {})},
    }
    for key, value in sections.items():
        config[f"fsdp-eks:{key}"] = {**config.get(f"fsdp-eks:{key}", {}), **value}
    try:
        return evaluate(program, config=config, stack=stack.stack_name)
    finally:
        # A failed run leaves pending outputs in the SDK's process-wide set (see test_gpu_nodes).
        settings.SETTINGS.outputs.clear()


def test_without_an_az_the_gpu_subnet_goes_where_the_type_is_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first system AZ does not offer g5.xlarge: the subnet (and FSx, and the node group)
    # would sit where EKS can never launch the nodes.
    offered_only_in(monkeypatch, "us-west-2b", "us-west-2c")
    result = run_dev_stack()
    gpu_subnet = result.one(SUBNET, "network-gpu")
    assert gpu_subnet.inputs["availabilityZone"] == "us-west-2b"
    system = [s for s in result.of_type(SUBNET) if "-private-" in s.name]
    assert sorted(s.inputs["availabilityZone"] for s in system) == ["us-west-2a", "us-west-2b"]
    assert any("pin gpuNodes.availabilityZone: us-west-2b" in w for w in result.warnings)
    (asked,) = [args for token, args in result.invokes if token == OFFERINGS]
    assert asked["locationType"] == "availability-zone"
    assert asked["filters"] == [{"name": "instance-type", "values": ["g5.xlarge"]}]


def test_an_offering_az_outside_the_system_azs_is_used() -> None:
    # Not a system AZ, but the region's only one that offers the type.
    azs = ["us-west-2a", "us-west-2b", "us-west-2c", "us-west-2d"]
    assert _gpu_az(None, azs[:2], azs, ["us-west-2d"], "p5.48xlarge") == "us-west-2d"
    assert _gpu_az(None, azs[:2], azs, azs, "p5.48xlarge") == "us-west-2a"


def test_an_explicit_az_that_does_not_offer_the_type_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    offered_only_in(monkeypatch, "us-west-2b", "us-west-2c")
    with pytest.raises(ValueError) as raised:
        run_dev_stack(gpuNodes={"availabilityZone": "us-west-2a"})
    assert (
        "gpuNodes.availabilityZone 'us-west-2a' does not offer gpuNodes.instanceType "
        "'g5.xlarge'; AZs that do: ['us-west-2b', 'us-west-2c']"
    ) in str(raised.value)


def test_a_reservations_az_is_used_without_an_offerings_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A capacity block's AZ is where EC2 sold it, whether or not the type is offered there
    On-Demand: the offerings must not overrule it, nor be asked."""
    offered_only_in(monkeypatch, "us-west-2b", "us-west-2c")
    result = run_dev_stack(
        gpuNodes={
            "instanceType": "p5.48xlarge",
            "availabilityZone": "us-west-2a",
            "capacity": {"type": "block", "reservationId": "cr-0123456789abcdef0"},
        },
        cost={"maxUsdPerRun": None},
    )
    assert result.one(SUBNET, "network-gpu").inputs["availabilityZone"] == "us-west-2a"
    assert [args for token, args in result.invokes if token == OFFERINGS] == []


def test_no_offering_az_in_the_region_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    offered_only_in(monkeypatch)
    with pytest.raises(ValueError, match=r"'g5\.xlarge' is not offered in any AZ of this region"):
        run_dev_stack()


def test_the_offline_plans_region_has_an_az_without_gpu_types() -> None:
    # The mock's own table: usw2-az4 (us-west-2d here) offers none of the GPU types.
    with pytest.raises(ValueError, match=r"'us-west-2d' does not offer .*'g5\.xlarge'"):
        run_dev_stack(gpuNodes={"availabilityZone": "us-west-2d"})


def test_an_existing_gpu_subnet_in_an_az_without_the_type_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The mock puts every looked-up subnet in us-west-2a.
    offered_only_in(monkeypatch, "us-west-2b")
    existing = {
        "network": {
            "vpcId": "vpc-0abc",
            "privateSubnetIds": ["subnet-a", "subnet-b"],
            "gpuSubnetId": "subnet-g",
        }
    }
    with pytest.raises(
        ValueError,
        match=r"cluster\.network\.gpuSubnetId 'subnet-g' is in 'us-west-2a', which does not "
        r"offer gpuNodes\.instanceType 'g5\.xlarge'; AZs that do: \['us-west-2b'\]",
    ) as raised:
        run_dev_stack(cluster=existing)
    # Raised by the program itself, so the entry point prints it as the one-line config error;
    # from an apply it came wrapped as "While processing input ..." with a traceback.
    assert isinstance(raised.value, StackConfigError)
