"""What a GPU node costs per hour: a list-price table kept in the repo, each price sourced.

**List prices for us-east-1, Linux, per instance-hour**, each naming its source and date;
`fsdp-eks:cost.usdPerInstanceHour` overrides. reservation and spot are priced at the On-Demand
rate (spot as an upper bound), block at On-Demand as a proxy. What the stack bills while it
exists is priced from `STANDING_PRICES`, `SYSTEM_NODE_USD_PER_HOUR` and
`FSX_PERSISTENT_2_USD_PER_GB_MONTH` (`infra.estimates.cost.standing_cost`).
Why each capacity type is priced so: docs/design/facts.md#prices
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from infra.facts.instances import INSTANCE_FACTS, is_hyperpod_type

CapacityType = Literal["on-demand", "spot", "reservation", "block"]
CAPACITY_TYPES: tuple[CapacityType, ...] = ("on-demand", "spot", "reservation", "block")

PRICE_REGION = "us-east-1"
"""Region the table's prices were read for."""

SAME_PRICE_REGIONS: dict[str, str] = {
    "us-east-1": "the region the tables were read for",
    "us-east-2": "lists the same On-Demand rates as us-east-1 for these types",
    "us-west-2": "lists the same On-Demand rates as us-east-1 for these types",
}
"""Regions whose list prices are the tables' (read 2026-11-09 to 2026-11-30 with them, from the
same Price List snapshots; US East (Ohio) and US West (Oregon) list the P4d, P5, P5en, G5 and
G6e rates, the EKS, NAT, EBS, KMS and FSx rates and the M/T rates of us-east-1). The shipped
stacks run in us-west-2 (the offline plan's default region too). Any other region's prices
differ and are not kept: a plan there says "unknown for <region>"."""


def region_is_priced(region: str | None) -> bool:
    """Whether the tables hold `region`'s list prices (None: not set, the tables' own region)."""
    return region is None or region in SAME_PRICE_REGIONS


@dataclass(frozen=True)
class PriceSource:
    """Where a group of prices was read, and how sure we are of them."""

    title: str
    url: str
    as_of: str
    """Date (ISO) the figures were read at the source."""
    confirmed: bool
    """True only when the figures were read from AWS itself; False: confirm before relying."""
    note: str


SOURCES: dict[str, PriceSource] = {
    "aws-on-demand-2026": PriceSource(
        title="Amazon EC2 On-Demand Pricing (Linux, US East (N. Virginia))",
        url="https://aws.amazon.com/ec2/pricing/on-demand/",
        as_of="2026-11-09",
        confirmed=False,
        note=(
            "AWS's page could not be reached from the build environment. Figures are the AWS "
            "list prices as mirrored by public snapshots of the AWS Price List (ec2instances.info "
            "/ Vantage data quoted in public repositories, retrieved 2026-08 to 2026-11); P4d, "
            "P4de, P5 and P5en reflect AWS's June 2025 price reduction. Confirm with "
            "`aws pricing get-products --service-code AmazonEC2` or the page above."
        ),
    ),
    "aws-on-demand-g-family": PriceSource(
        title="Amazon EC2 On-Demand Pricing (Linux, US East (N. Virginia)), G5 and G6e",
        url="https://aws.amazon.com/ec2/pricing/on-demand/",
        as_of="2026-06-17",
        confirmed=False,
        note=(
            "G5 prices have been stable since launch (g5.xlarge $1.006 is quoted for June 2026 "
            "by public price guides); G6e figures from public Price List snapshots. One "
            "snapshot lists g6e.12xlarge at $10.6032 instead of $10.49264: confirm that one."
        ),
    ),
    "aws-eks-pricing": PriceSource(
        title="Amazon EKS pricing (cluster in standard / extended Kubernetes version support)",
        url="https://aws.amazon.com/eks/pricing/",
        as_of="2026-11-30",
        confirmed=False,
        note=(
            "$0.10 per cluster-hour in standard support, $0.60 in extended support, as AWS's "
            "containers blog 'Amazon EKS extended support for Kubernetes versions pricing' "
            "states; read from secondary copies, not from the page itself."
        ),
    ),
    "aws-vpc-pricing": PriceSource(
        title="Amazon VPC pricing (NAT gateway, public IPv4 address), US East (N. Virginia)",
        url="https://aws.amazon.com/vpc/pricing/",
        as_of="2026-11-30",
        confirmed=False,
        note=(
            "NAT gateway $0.045 per hour plus $0.045 per GB processed (the GB are the run's "
            "downloads: not standing); every public IPv4 address, the NAT's Elastic IP "
            "included, $0.005 per hour since February 2024. As quoted by several pricing "
            "guides; the page itself could not be read from the build environment."
        ),
    ),
    "aws-fsx-lustre-pricing": PriceSource(
        title="Amazon FSx for Lustre pricing, Persistent-2 SSD, US East (N. Virginia)",
        url="https://aws.amazon.com/fsx/lustre/pricing/",
        as_of="2026-11-30",
        confirmed=False,
        note=(
            "Per GB-month of storage capacity by throughput tier (MB/s/TiB): 125 $0.145, 250 "
            "$0.210, 500 $0.340, 1000 $0.600. The 125 figure is confirmed by c3x.dev's "
            "estimator ('1.2 TB at 125 MB/s/TiB is ~$174/month'); the ratios match AWS's "
            "Tokyo table. Confirm with `aws pricing get-products --service-code AmazonFSx`."
        ),
    ),
    "aws-ebs-kms-pricing": PriceSource(
        title="Amazon EBS pricing (gp3) and AWS KMS pricing (customer managed key)",
        url="https://aws.amazon.com/ebs/pricing/",
        as_of="2026-11-30",
        confirmed=False,
        note=(
            "gp3 $0.08 per GB-month (3,000 IOPS and 125 MB/s included); a customer managed "
            "KMS key $1 per month (aws.amazon.com/kms/pricing). Secondary sources."
        ),
    ),
    "aws-on-demand-general-purpose": PriceSource(
        title="Amazon EC2 On-Demand Pricing (Linux, US East (N. Virginia)), M5/M6i/M7i/T3",
        url="https://aws.amazon.com/ec2/pricing/on-demand/",
        as_of="2026-11-30",
        confirmed=False,
        note=(
            "The general-purpose types a system node group uses, as public Price List "
            "snapshots list them; unchanged since their launch."
        ),
    ),
    "aws-amp-pricing": PriceSource(
        title="Amazon Managed Service for Prometheus pricing, US East (N. Virginia)",
        url="https://aws.amazon.com/prometheus/pricing/",
        as_of="2026-11-27",
        confirmed=False,
        note=(
            "Samples ingested $0.90 per 10M for the first 2B a month (the tier a run's few "
            "million samples fall in), storage $0.03 per GB-month, an AWS managed collector "
            "$0.04 per collector-hour. The page (read through stored copies) says a collector "
            "is also charged per sample collected; that figure could not be read and is not "
            "counted. Confirm with `aws pricing get-products --service-code AmazonPrometheus`."
        ),
    ),
}


@dataclass(frozen=True)
class ListPrice:
    usd_per_hour: float
    """Per instance-hour."""
    source: str
    """Key into SOURCES."""


ON_DEMAND_USD_PER_HOUR: dict[str, ListPrice] = {
    "p4d.24xlarge": ListPrice(21.957642, "aws-on-demand-2026"),
    "p4de.24xlarge": ListPrice(27.44705, "aws-on-demand-2026"),
    "p5.48xlarge": ListPrice(55.04, "aws-on-demand-2026"),
    "p5en.48xlarge": ListPrice(63.296, "aws-on-demand-2026"),
    "p6-b200.48xlarge": ListPrice(113.9328, "aws-on-demand-2026"),
    "g5.xlarge": ListPrice(1.006, "aws-on-demand-g-family"),
    "g5.2xlarge": ListPrice(1.212, "aws-on-demand-g-family"),
    "g5.4xlarge": ListPrice(1.624, "aws-on-demand-g-family"),
    "g5.8xlarge": ListPrice(2.448, "aws-on-demand-g-family"),
    "g5.12xlarge": ListPrice(5.672, "aws-on-demand-g-family"),
    "g5.16xlarge": ListPrice(4.096, "aws-on-demand-g-family"),
    "g5.24xlarge": ListPrice(8.144, "aws-on-demand-g-family"),
    "g5.48xlarge": ListPrice(16.288, "aws-on-demand-g-family"),
    "g6e.xlarge": ListPrice(1.861, "aws-on-demand-g-family"),
    "g6e.2xlarge": ListPrice(2.24208, "aws-on-demand-g-family"),
    "g6e.4xlarge": ListPrice(3.00424, "aws-on-demand-g-family"),
    "g6e.8xlarge": ListPrice(4.52856, "aws-on-demand-g-family"),
    "g6e.12xlarge": ListPrice(10.49264, "aws-on-demand-g-family"),
    "g6e.16xlarge": ListPrice(7.57719, "aws-on-demand-g-family"),
    "g6e.24xlarge": ListPrice(15.06559, "aws-on-demand-g-family"),
    "g6e.48xlarge": ListPrice(30.13118, "aws-on-demand-g-family"),
}
"""On-Demand list price per instance-hour. p5e.48xlarge is missing on purpose: AWS sells it
through Capacity Blocks, with no On-Demand list price we could source."""

_BASIS: dict[CapacityType, str] = {
    "on-demand": "On-Demand list price",
    "reservation": "On-Demand list price (capacity reservations bill at the On-Demand rate)",
    "spot": "On-Demand list price as the upper bound of spot",
    "block": (
        "On-Demand list price as a proxy for a Capacity Block "
        "(set cost.usdPerInstanceHour to the quoted rate)"
    ),
}


class PriceUnknownError(LookupError):
    """No price for an instance type: the message says how to supply one."""


@dataclass(frozen=True)
class HourlyPrice:
    """The price one GPU node is estimated at, and what that figure rests on."""

    usd_per_instance_hour: float
    basis: str
    """Human-readable: which price was used and why (shown in plans and stack outputs)."""
    source: PriceSource | None
    """None when the stack's own `cost.usdPerInstanceHour` was used."""


def instance_price(
    instance_type: str,
    capacity_type: CapacityType = "on-demand",
    *,
    usd_per_instance_hour: float | None = None,
) -> HourlyPrice:
    """Price of one `instance_type` node bought as `capacity_type`.

    `usd_per_instance_hour` (the stack's `cost.usdPerInstanceHour`) wins over the table.
    Raises ValueError for a capacity type that does not exist and PriceUnknownError for an
    instance type without a list price.
    """
    if capacity_type not in CAPACITY_TYPES:
        raise ValueError(
            f"capacity type {capacity_type!r} is not one of {', '.join(CAPACITY_TYPES)}"
        )
    if usd_per_instance_hour is not None:
        if usd_per_instance_hour <= 0:
            raise ValueError(f"cost.usdPerInstanceHour must be > 0, got {usd_per_instance_hour}")
        return HourlyPrice(usd_per_instance_hour, "cost.usdPerInstanceHour from the stack", None)
    listed = ON_DEMAND_USD_PER_HOUR.get(instance_type)
    if listed is None and is_hyperpod_type(instance_type):
        # SageMaker bills HyperPod capacity at its own rates (on-demand or a training plan),
        # for as long as the cluster holds it; no dated figure for those is kept here.
        raise PriceUnknownError(
            f"no list price for {instance_type!r}: SageMaker HyperPod instances are billed at "
            f"SageMaker's rates, not EC2's; set fsdp-eks:cost.usdPerInstanceHour to the "
            f"hourly rate your HyperPod cluster pays for one {instance_type}"
        )
    if listed is None:
        known = "known GPU type" if instance_type in INSTANCE_FACTS else "unknown type"
        raise PriceUnknownError(
            f"no list price for {instance_type!r} ({known}); set fsdp-eks:cost.usdPerInstanceHour "
            f"to the price you pay, or add it to infra/facts/prices.py with its source. Priced "
            f"types: {', '.join(sorted(ON_DEMAND_USD_PER_HOUR))}"
        )
    return HourlyPrice(listed.usd_per_hour, _BASIS[capacity_type], SOURCES[listed.source])


# --- what the stack bills while it exists, run or no run -------------------------------------

HOURS_PER_MONTH = 730
"""AWS's own month for converting monthly prices to hourly ones (365 x 24 / 12)."""


@dataclass(frozen=True)
class StandingPrice:
    """One price of something the stack keeps until `pulumi destroy`."""

    usd: float
    unit: Literal["hour", "GB-month", "month"]
    source: str
    """Key into SOURCES."""

    @property
    def usd_per_hour(self) -> float:
        """Per hour (per GB-hour for a GB-month price)."""
        return self.usd if self.unit == "hour" else self.usd / HOURS_PER_MONTH


STANDING_PRICES: dict[str, StandingPrice] = {
    "eks-control-plane": StandingPrice(0.10, "hour", "aws-eks-pricing"),
    "eks-control-plane-extended": StandingPrice(0.60, "hour", "aws-eks-pricing"),
    "nat-gateway": StandingPrice(0.045, "hour", "aws-vpc-pricing"),
    "public-ipv4": StandingPrice(0.005, "hour", "aws-vpc-pricing"),
    "ebs-gp3": StandingPrice(0.08, "GB-month", "aws-ebs-kms-pricing"),
    "kms-key": StandingPrice(1.0, "month", "aws-ebs-kms-pricing"),
}
"""us-east-1 list prices of the standing resources (PRICE_REGION, as for the GPU nodes)."""

FSX_PERSISTENT_2_USD_PER_GB_MONTH: dict[int, StandingPrice] = {
    125: StandingPrice(0.145, "GB-month", "aws-fsx-lustre-pricing"),
    250: StandingPrice(0.210, "GB-month", "aws-fsx-lustre-pricing"),
    500: StandingPrice(0.340, "GB-month", "aws-fsx-lustre-pricing"),
    1000: StandingPrice(0.600, "GB-month", "aws-fsx-lustre-pricing"),
}
"""FSx for Lustre PERSISTENT_2 SSD storage by `storage.fsx.perUnitStorageThroughput`; the
throughput is part of the storage price (no separate charge)."""

SYSTEM_NODE_USD_PER_HOUR: dict[str, StandingPrice] = {
    name: StandingPrice(usd, "hour", "aws-on-demand-general-purpose")
    for name, usd in {
        "m5.large": 0.096,
        "m5.xlarge": 0.192,
        "m5.2xlarge": 0.384,
        "m6i.large": 0.096,
        "m6i.xlarge": 0.192,
        "m6i.2xlarge": 0.384,
        "m7i.large": 0.1008,
        "m7i.xlarge": 0.2016,
        "m7i.2xlarge": 0.4032,
        "t3.large": 0.0832,
        "t3.xlarge": 0.1664,
    }.items()
}
"""On-Demand prices of the CPU types a system node group is usually given; another type is
reported as unpriced (the standing figure is then a lower bound), not refused."""


# --- what the run's metrics cost (Amazon Managed Service for Prometheus) ---------------------


@dataclass(frozen=True)
class UsagePrice:
    """A price per unit of use (samples, stored GB, collector hours)."""

    usd: float
    per: str
    """The unit, as AWS's page states it (`10M samples`, `GB-month`, `collector-hour`)."""
    source: str
    """Key into SOURCES."""


AMP_PRICES: dict[str, UsagePrice] = {
    "samples-ingested": UsagePrice(0.90, "10M samples", "aws-amp-pricing"),
    "storage": UsagePrice(0.03, "GB-month", "aws-amp-pricing"),
    "collector": UsagePrice(0.04, "collector-hour", "aws-amp-pricing"),
}
"""us-east-1 list prices of Amazon Managed Service for Prometheus (PRICE_REGION)."""

AMP_RETENTION_DAYS = 150
"""How long a workspace keeps samples by default: what a run's samples are stored for."""
AMP_BYTES_PER_SAMPLE = 2.0
"""AWS's page: a stored sample takes typically 1 or 2 bytes (the upper figure; metadata aside)."""
