"""The VPC the platform runs in: new (private subnets in >= 2 AZs, one GPU subnet, NAT, S3
endpoint) or an existing one passed through by ID.

The GPU subnet sits alone in the capacity's AZ (EFA and reservations are zonal), checked
against EC2's offerings before anything is registered.
Why, and construction: docs/design/platform.md#network
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from infra.config import StackConfigError
from infra.config.cluster import NetworkConfig

INTERNAL_ELB_TAG = {"kubernetes.io/role/internal-elb": "1"}
PUBLIC_ELB_TAG = {"kubernetes.io/role/elb": "1"}


@dataclass(frozen=True)
class SubnetPlan:
    """CIDR blocks of a new VPC, decided before anything is registered (and testable alone)."""

    system: dict[str, str]
    """AZ → CIDR of the private subnet for the control plane and system nodes."""
    gpu: str
    """CIDR of the GPU subnet (in the GPU AZ)."""
    public: dict[str, str]
    """AZ → CIDR of the small public subnet that holds a NAT gateway."""


def plan_subnets(vpc_cidr: str, system_azs: Sequence[str]) -> SubnetPlan:
    """Split `vpc_cidr` into eighths: one per system AZ (up to 4), a quarter for the GPU subnet,
    one eighth spare for growth, and the last eighth cut into /prefix+8 public subnets.

    For the default /16 that is /19 system subnets (8k IPs), an /18 GPU subnet (16k IPs: pods on
    GPU nodes take VPC IPs) and /24 public subnets.
    """
    network = ipaddress.IPv4Network(vpc_cidr)
    if not 2 <= len(system_azs) <= 4:
        raise ValueError(f"need 2 to 4 system AZs, got {list(system_azs)}")
    eighths = list(network.subnets(new_prefix=network.prefixlen + 3))
    quarters = list(network.subnets(new_prefix=network.prefixlen + 2))
    publics = list(eighths[7].subnets(new_prefix=network.prefixlen + 8))
    return SubnetPlan(
        system={az: str(eighths[i]) for i, az in enumerate(system_azs)},
        gpu=str(quarters[2]),  # eighths 4 and 5
        public={az: str(publics[i]) for i, az in enumerate(system_azs)},
    )


@dataclass
class NetworkArgs:
    """Inputs of `Network`."""

    config: NetworkConfig
    gpu_availability_zone: str | None = None
    """AZ of the GPU capacity; default: the first system AZ that offers `gpu_instance_type`
    (new VPC) or the GPU subnet's AZ (existing VPC, which must then agree with it)."""
    gpu_instance_type: str | None = None
    """The GPU nodes' instance type: the GPU AZ must offer it. None: no offerings check."""
    gpu_capacity_reserved: bool = False
    """The GPU nodes run in a capacity reservation or block: its AZ is the one to use, and is
    not checked against the type's offerings (a Capacity Block's AZ need not be one where
    the type is offered On-Demand; EC2 decided the placement when it sold the block)."""
    tags: Mapping[str, str] = field(default_factory=dict)


class Network(pulumi.ComponentResource):
    """A VPC for EKS with a zonal GPU subnet, or an existing VPC's IDs."""

    vpc_id: pulumi.Output[str]
    private_subnet_ids: pulumi.Output[list[str]]
    """Subnets (>= 2 AZs) for the control plane and the system nodes."""
    gpu_subnet_id: pulumi.Output[str]
    gpu_availability_zone: pulumi.Output[str]
    public_subnet_ids: pulumi.Output[list[str]]
    """Empty with an existing VPC."""

    def __init__(
        self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:network:Network", name, None, opts)
        if args.config.creates_vpc:
            self._create(name, args)
        else:
            self._reuse(args.config, args.gpu_availability_zone, _offered_type(args))
        self.register_outputs(
            {
                "vpcId": self.vpc_id,
                "privateSubnetIds": self.private_subnet_ids,
                "gpuSubnetId": self.gpu_subnet_id,
                "gpuAvailabilityZone": self.gpu_availability_zone,
            }
        )

    def _reuse(
        self, config: NetworkConfig, requested_az: str | None, instance_type: str | None
    ) -> None:
        # Nothing is registered: the stack must never own (or destroy) someone else's VPC.
        assert config.vpc_id is not None and config.gpu_subnet_id is not None
        gpu_subnet_id = config.gpu_subnet_id
        # Plain (blocking) invokes, not Outputs: a problem found here must be raised by the
        # program itself, where the entry point prints it as the one-line config error. From
        # inside an apply it would reach the engine wrapped as "While processing input ..."
        # with a traceback (pulumi/runtime/rpc.py serialize_property).
        invoke = pulumi.InvokeOptions(parent=self)
        actual = aws.ec2.get_subnet(id=gpu_subnet_id, opts=invoke).availability_zone
        offered = _offerings(instance_type, invoke) if instance_type is not None else None
        # Reserved capacity lives in one AZ: nodes in another AZ's subnet never launch.
        if requested_az is not None and actual != requested_az:
            raise StackConfigError(
                [
                    f"gpuNodes.availabilityZone is {requested_az!r} but "
                    f"cluster.network.gpuSubnetId {gpu_subnet_id!r} is in {actual!r}; "
                    "make them agree (or drop gpuNodes.availabilityZone)"
                ]
            )
        if offered is not None and actual not in offered:
            raise StackConfigError(
                [
                    f"cluster.network.gpuSubnetId {gpu_subnet_id!r} is in {actual!r}, "
                    f"which does not offer gpuNodes.instanceType {instance_type!r}; "
                    f"AZs that do: {sorted(offered)} (give a subnet in one of them)"
                ]
            )

        self.vpc_id = pulumi.Output.from_input(config.vpc_id)
        self.private_subnet_ids = pulumi.Output.from_input(list(config.private_subnet_ids))
        self.gpu_subnet_id = pulumi.Output.from_input(gpu_subnet_id)
        self.gpu_availability_zone = pulumi.Output.from_input(actual)
        self.public_subnet_ids = pulumi.Output.from_input([])

    def _create(self, name: str, args: NetworkArgs) -> None:
        config = args.config
        available = aws.get_availability_zones(
            state="available",
            # Only the region's own AZs: an opted-in Local Zone (us-west-2-lax-1a) sorts before
            # us-west-2a and would take a system subnet, but EKS cannot use it.
            filters=[
                aws.GetAvailabilityZonesFilterArgs(
                    name="opt-in-status", values=["opt-in-not-required"]
                )
            ],
            opts=pulumi.InvokeOptions(parent=self),
        ).names
        system_azs = _system_azs(config, available)
        # Decided before registration: the GPU subnet's AZ is a plain input, and its name too.
        instance_type = _offered_type(args)
        offering = (
            _offerings(instance_type, pulumi.InvokeOptions(parent=self))
            if instance_type is not None
            else None
        )
        gpu_az = _gpu_az(
            args.gpu_availability_zone,
            system_azs,
            available,
            offering,
            args.gpu_instance_type,
            parent=self,
        )
        plan = plan_subnets(config.vpc_cidr, system_azs)
        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)

        def tagged(role: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
            return {**tags, **(extra or {}), "Name": f"{name}-{role}"}

        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=config.vpc_cidr,
            enable_dns_support=True,
            enable_dns_hostnames=True,  # EKS private endpoint and FSx DNS names need both
            tags=tagged("vpc"),
            opts=child,
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tagged("igw"), opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public-rt", vpc_id=vpc.id, tags=tagged("public-rt"), opts=child
        )
        aws.ec2.Route(
            f"{name}-public-default",
            route_table_id=public_rt.id,
            destination_cidr_block="0.0.0.0/0",
            gateway_id=igw.id,
            opts=child,
        )
        public_subnets: dict[str, aws.ec2.Subnet] = {}
        for az, cidr in plan.public.items():
            subnet = aws.ec2.Subnet(
                f"{name}-public-{az}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=az,
                map_public_ip_on_launch=False,  # only NAT gateways live here
                tags=tagged(f"public-{az}", PUBLIC_ELB_TAG),
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{az}", subnet_id=subnet.id, route_table_id=public_rt.id, opts=child
            )
            public_subnets[az] = subnet

        nat_azs = system_azs[:1] if config.single_nat_gateway else system_azs
        private_rts: dict[str, aws.ec2.RouteTable] = {}
        for az in nat_azs:
            eip = aws.ec2.Eip(
                f"{name}-nat-{az}", domain="vpc", tags=tagged(f"nat-{az}"), opts=child
            )
            nat = aws.ec2.NatGateway(
                f"{name}-nat-{az}",
                allocation_id=eip.id,
                subnet_id=public_subnets[az].id,
                tags=tagged(f"nat-{az}"),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[igw]),
            )
            route_table = aws.ec2.RouteTable(
                f"{name}-private-rt-{az}",
                vpc_id=vpc.id,
                tags=tagged(f"private-rt-{az}"),
                opts=child,
            )
            aws.ec2.Route(
                f"{name}-private-default-{az}",
                route_table_id=route_table.id,
                destination_cidr_block="0.0.0.0/0",
                nat_gateway_id=nat.id,
                opts=child,
            )
            private_rts[az] = route_table

        def route_table_for(az: str) -> aws.ec2.RouteTable:
            # Same-AZ NAT where there is one (no cross-AZ data charge), else the first.
            return private_rts.get(az, private_rts[nat_azs[0]])

        system_subnets = []
        for az, cidr in plan.system.items():
            subnet = aws.ec2.Subnet(
                f"{name}-private-{az}",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=az,
                tags=tagged(f"private-{az}", INTERNAL_ELB_TAG),
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{az}",
                subnet_id=subnet.id,
                route_table_id=route_table_for(az).id,
                opts=child,
            )
            system_subnets.append(subnet)
        gpu_subnet = aws.ec2.Subnet(
            f"{name}-gpu",
            vpc_id=vpc.id,
            cidr_block=plan.gpu,
            availability_zone=gpu_az,
            tags=tagged(f"gpu-{gpu_az}"),
            opts=child,
        )
        aws.ec2.RouteTableAssociation(
            f"{name}-gpu",
            subnet_id=gpu_subnet.id,
            route_table_id=route_table_for(gpu_az).id,
            opts=child,
        )

        region = aws.get_region(opts=pulumi.InvokeOptions(parent=self)).region
        # Image layers (ECR stores them in S3), checkpoints and the FSx data repository all
        # go to S3: a gateway endpoint keeps that traffic off the NAT gateway's per-GB bill.
        aws.ec2.VpcEndpoint(
            f"{name}-s3",
            vpc_id=vpc.id,
            service_name=f"com.amazonaws.{region}.s3",
            vpc_endpoint_type="Gateway",
            route_table_ids=[rt.id for rt in private_rts.values()],
            tags=tagged("s3"),
            opts=child,
        )

        self.vpc_id = vpc.id
        self.private_subnet_ids = pulumi.Output.all(*[s.id for s in system_subnets])
        self.gpu_subnet_id = gpu_subnet.id
        self.gpu_availability_zone = pulumi.Output.from_input(gpu_az)
        self.public_subnet_ids = pulumi.Output.all(*[s.id for s in public_subnets.values()])


def _system_azs(config: NetworkConfig, available: Sequence[str]) -> list[str]:
    if config.availability_zones is None:
        if len(available) < config.az_count:
            raise ValueError(
                f"cluster.network.azCount {config.az_count} exceeds the region's available AZs "
                f"{list(available)}"
            )
        return list(available[: config.az_count])
    unknown = [az for az in config.availability_zones if az not in available]
    if unknown:
        raise ValueError(
            f"cluster.network.availabilityZones {unknown} are not available in this region; "
            f"available: {list(available)}"
        )
    return list(config.availability_zones)


def _offered_type(args: NetworkArgs) -> str | None:
    """The instance type whose offerings decide the GPU AZ; None where a reservation does."""
    return None if args.gpu_capacity_reserved else args.gpu_instance_type


def _offerings(instance_type: str, opts: pulumi.InvokeOptions) -> list[str]:
    """Names of the region's AZs where EC2 offers `instance_type`.

    `location_type="availability-zone"` makes `locations` AZ names (the same names as the
    subnets'); the default, `region`, would only say whether the region has the type at all.
    """
    return list(
        aws.ec2.get_instance_type_offerings(
            filters=[_instance_type_filter(instance_type)],
            location_type="availability-zone",
            opts=opts,
        ).locations
    )


def _instance_type_filter(instance_type: str) -> aws.ec2.GetInstanceTypeOfferingsFilterArgs:
    return aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[instance_type])


def _gpu_az(
    requested: str | None,
    system_azs: Sequence[str],
    available: Sequence[str],
    offering: Sequence[str] | None = None,
    instance_type: str | None = None,
    parent: pulumi.Resource | None = None,
) -> str:
    """The GPU subnet's AZ: the requested one if it offers the type, else the first AZ that does.

    System AZs come first (the GPU subnet shares their NAT route table), then the region's
    other AZs in the order EC2 lists them, so the choice is stable from one run to the next
    as long as the offerings are.
    """
    if requested is not None:
        if requested not in available:
            raise StackConfigError(
                [
                    f"gpuNodes.availabilityZone {requested!r} is not available in this region; "
                    f"available: {list(available)}"
                ]
            )
        if offering is not None and requested not in offering:
            raise StackConfigError(
                [
                    f"gpuNodes.availabilityZone {requested!r} does not offer "
                    f"gpuNodes.instanceType {instance_type!r}; AZs that do: "
                    f"{[az for az in available if az in offering]}"
                ]
            )
        return requested
    if offering is None:
        return system_azs[0]
    candidates = [az for az in system_azs if az in offering]
    candidates += [az for az in available if az in offering and az not in system_azs]
    if not candidates:
        raise StackConfigError(
            [
                f"gpuNodes.instanceType {instance_type!r} is not offered in any AZ of this "
                f"region ({list(available)}); choose another aws:region or instance type"
            ]
        )
    if candidates[0] != system_azs[0]:
        # EC2 adds offerings over time; an unpinned choice could then move the GPU subnet
        # (a replacement of the subnet, FSx and node group) on a later `pulumi up`.
        pulumi.log.warn(
            f"gpuNodes.availabilityZone is not set and {system_azs[0]!r} does not offer "
            f"{instance_type!r}: the GPU subnet goes to {candidates[0]!r}; pin "
            f"gpuNodes.availabilityZone: {candidates[0]} in the stack file",
            resource=parent,
        )
    return candidates[0]
