"""What a stack is estimated to cost: the run (its GPU nodes per hour, per run, what is
expected, the worst partial start) and the standing cost of what it keeps until `pulumi
destroy`.

Prices come from the facts tables (`infra.facts.prices`) or the stack's own
`cost.usdPerInstanceHour`; hours from the deadline (the worst case) and the duration estimate
(the expected case). The run's figures are the GPU nodes'; the standing figures
(`standing_cost`) are everything else the stack bills by the hour or the month whether a job
runs or not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.estimates.duration import hours_text
from infra.facts.eks_versions import UPGRADE_SUPPORT_TYPE
from infra.facts.prices import (
    AMP_PRICES,
    FSX_PERSISTENT_2_USD_PER_GB_MONTH,
    PRICE_REGION,
    SAME_PRICE_REGIONS,
    SOURCES,
    STANDING_PRICES,
    SYSTEM_NODE_USD_PER_HOUR,
    CapacityType,
    PriceUnknownError,
    StandingPrice,
    instance_price,
    region_is_priced,
)

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.estimates.metrics_cost import MetricsPlan


def estimate_hourly_usd(
    instance_type: str,
    count: int,
    capacity_type: CapacityType = "on-demand",
    *,
    usd_per_instance_hour: float | None = None,
) -> float:
    """Estimated $/hour of `count` GPU nodes (GPU nodes only; see the module docstring)."""
    if count < 0:
        raise ValueError(f"node count must be >= 0, got {count}")
    price = instance_price(
        instance_type, capacity_type, usd_per_instance_hour=usd_per_instance_hour
    )
    return round(price.usd_per_instance_hour * count, 4)


def estimate_run_usd(
    instance_type: str,
    count: int,
    capacity_type: CapacityType = "on-demand",
    hours: float = 1.0,
    *,
    usd_per_instance_hour: float | None = None,
) -> float:
    """Estimated $ of one run: `count` nodes for `hours` hours."""
    if hours <= 0:
        raise ValueError(f"run hours must be > 0, got {hours}")
    hourly = estimate_hourly_usd(
        instance_type, count, capacity_type, usd_per_instance_hour=usd_per_instance_hour
    )
    return round(hourly * hours, 2)


@dataclass(frozen=True)
class CostEstimate:
    """Everything the plan, the stack outputs and the cost policy show about one stack's cost."""

    instance_type: str
    count: int
    capacity_type: CapacityType
    usd_per_instance_hour: float
    usd_per_hour: float
    run_hours: float | None
    """None: the run has no known length (no deadline and no cost.pricedRunHours)."""
    expected_hours: float | None
    """The run's expected wall time (`infra.estimates.duration`); None when it cannot be
    estimated."""
    usd_per_run: float | None
    max_usd_per_run: float | None
    """The stack's ceiling; None: switched off."""
    basis: str
    nodes_owned: bool = True
    """False on an existing cluster: the stack neither creates nor scales its GPU nodes."""
    lease_tail_hours: float | None = None
    """How long the nodes stay after the job when the autoscaler leases them (its idle time
    before scale-down); None: they run until `pulumi destroy`."""
    start_budget_hours: float = 1.0
    """`job.startTimeoutMinutes`: how long the workers that did start wait for the others."""
    region: str | None = None
    """The stack's `aws:region`; None: not set (the AWS provider's default applies)."""
    atomic_request: bool = False
    """Kueue's ProvisioningRequest check asks the autoscaler for every node in one scale-up
    before the job is admitted (`scheduling.kueue`)."""

    @property
    def region_priced(self) -> bool:
        """Whether the price is the region's own (the stack's rate, or a region the tables
        hold); else the figures are us-east-1's, shown as such."""
        return self.basis.startswith("cost.usdPerInstanceHour") or region_is_priced(self.region)

    @property
    def partial_start_worst_usd(self) -> float | None:
        """What a start that never completes costs at worst: EC2 grants all nodes but one,
        they wait the whole start budget for the last, the job is then suspended and they
        leave after the lease tail. None when the stack does not lease its nodes. Kueue's
        atomic ProvisioningRequest does not lower it on AWS (cluster-autoscaler 1.35.2
        `cloudprovider/aws/aws_cloud_provider.go` `AtomicIncreaseSize`: not implemented).
        Why and sources: docs/design/estimates.md#partial-start-and-kueue"""
        if not self.nodes_owned or self.lease_tail_hours is None:
            return None
        held = max(self.count - 1, 0) * self.usd_per_instance_hour
        return round(held * (self.start_budget_hours + self.lease_tail_hours), 2)

    @property
    def exceeds_ceiling(self) -> bool:
        """True when a ceiling is set and the run estimate is above it (or cannot be computed)."""
        if self.max_usd_per_run is None:
            return False
        return self.usd_per_run is None or self.usd_per_run > self.max_usd_per_run

    @property
    def expected_usd(self) -> float | None:
        """What the run is expected to cost: its estimated hours and, when the nodes are
        leased, their idle tail after the job, at the nodes' hourly price. Unleased nodes bill
        on after the job until `pulumi destroy`, which no estimate can bound."""
        if self.expected_hours is None:
            return None
        return round(self.usd_per_hour * (self.expected_hours + (self.lease_tail_hours or 0)), 2)

    @property
    def tail_usd(self) -> float:
        """What the leased nodes cost while they idle after the job, before scale-down."""
        return round(self.usd_per_hour * (self.lease_tail_hours or 0), 2)

    def summary_lines(self) -> list[str]:
        """The estimate in short lines: the price and its basis, what the run is expected to
        cost (the scale-down tail apart), the most it may cost, and how the nodes come and go."""
        what = f"{self.count} x {self.instance_type} ({self.capacity_type})"
        if self.region_priced:
            lines = [f"{what}: ${self.usd_per_hour:,.2f}/hour; {self.basis}; GPU nodes only"]
            at = ""
        else:
            lines = [
                f"{what}: price unknown for {self.region} (list prices are kept for "
                f"{', '.join(SAME_PRICE_REGIONS)}); set cost.usdPerInstanceHour to its rate",
                f"at {PRICE_REGION}'s ${self.usd_per_hour:,.2f}/hour ({self.basis}), which "
                "the ceiling is checked against:",
            ]
            at = "  "
        if self.expected_usd is not None and self.expected_hours is not None:
            run_usd = round(self.usd_per_hour * self.expected_hours, 2)
            expected = f"expected ~${run_usd:,.2f} for the run (~{hours_text(self.expected_hours)})"
            if self.nodes_owned and self.lease_tail_hours:
                expected += (
                    f" + ~${self.tail_usd:,.2f} for the ~{self.lease_tail_hours * 60:.0f} min "
                    f"the nodes idle before scale-down = ~${self.expected_usd:,.2f}"
                )
            lines.append(at + expected)
        ceiling = (
            "no ceiling"
            if self.max_usd_per_run is None
            else f"ceiling ${self.max_usd_per_run:,.2f}"
            + (" EXCEEDED" if self.exceeds_ceiling else "")
        )
        lines.append(
            at
            + (
                f"at most ${self.usd_per_run:,.2f} per run ({self.run_hours:g} h), {ceiling}"
                if self.usd_per_run is not None and self.run_hours is not None
                else f"per run: unknown (no deadline and no cost.pricedRunHours), {ceiling}"
            )
        )
        if not self.nodes_owned:
            lines.append(
                at + "the existing cluster's GPU nodes: their idle time is its operators' choice"
            )
        elif self.lease_tail_hours is None:
            lines.append(at + "nodes bill on after the job until `pulumi destroy`")
        else:
            tail = self.lease_tail_hours * 60
            lines.append(
                at + f"GPU nodes 0 -> {self.count} for the job, 0 again ~{tail:.0f} min after it"
            )
        worst = self.partial_start_worst_usd
        if worst is not None and self.lease_tail_hours is not None and self.count > 1:
            hours = self.start_budget_hours + self.lease_tail_hours
            granted = self.count - 1
            lines.append(
                at + f"a start that never completes ${worst:,.2f} at most ({granted} "
                f"node{'s' if granted > 1 else ''} granted of {self.count}, held {hours:.2f} h: "
                "the start budget and the tail)"
            )
            if self.atomic_request:
                lines.append(
                    at + f"Kueue asks for all {self.count} nodes in one scale-up before "
                    "admitting the job, but AWS node groups scale up non-atomically (the "
                    "autoscaler's AWS provider has no atomic increase): EC2 may still grant "
                    "fewer, so the figure above stands"
                )
        return lines

    def summary(self) -> str:
        """One line for PR comments, problems and stack outputs."""
        return "; ".join(line.strip().rstrip(":") for line in self.summary_lines())

    def as_outputs(self) -> dict[str, object]:
        """Stack-output shaped dict (camelCase), for `pulumi.export("cost", ...)`."""
        return {
            "instanceType": self.instance_type,
            "count": self.count,
            "capacityType": self.capacity_type,
            "usdPerInstanceHour": self.usd_per_instance_hour,
            "usdPerHour": self.usd_per_hour,
            "runHours": self.run_hours,
            "usdPerRun": self.usd_per_run,
            "expectedHours": self.expected_hours,
            "expectedUsd": self.expected_usd,
            "leased": self.lease_tail_hours is not None,
            "partialStartWorstUsd": self.partial_start_worst_usd,
            "maxUsdPerRun": self.max_usd_per_run,
            "basis": self.basis,
            "summary": self.summary(),
        }


def estimate_cost(
    instance_type: str,
    count: int,
    capacity_type: CapacityType,
    *,
    run_hours: float | None,
    max_usd_per_run: float | None,
    usd_per_instance_hour: float | None = None,
    expected_hours: float | None = None,
    lease_tail_hours: float | None = None,
    nodes_owned: bool = True,
    start_budget_hours: float = 1.0,
    region: str | None = None,
    atomic_request: bool = False,
) -> CostEstimate:
    """The full estimate for one stack's GPU nodes.

    From the stack config: `estimate_cost(gpu.instance_type, gpu.count, gpu.capacity.type,
    run_hours=cost.run_hours(job.max_run_hours), max_usd_per_run=cost.max_usd_per_run,
    usd_per_instance_hour=cost.usd_per_instance_hour)`.
    """
    price = instance_price(
        instance_type, capacity_type, usd_per_instance_hour=usd_per_instance_hour
    )
    hourly = round(price.usd_per_instance_hour * count, 4)
    per_run = round(hourly * run_hours, 2) if run_hours is not None else None
    basis = price.basis
    if price.source is not None:
        basis += f", {price_region(region)}, as of {price.source.as_of}"
        if not price.source.confirmed:
            basis += " (unconfirmed)"
    return CostEstimate(
        instance_type=instance_type,
        count=count,
        capacity_type=capacity_type,
        usd_per_instance_hour=price.usd_per_instance_hour,
        usd_per_hour=hourly,
        run_hours=run_hours,
        expected_hours=expected_hours,
        lease_tail_hours=lease_tail_hours,
        nodes_owned=nodes_owned,
        start_budget_hours=start_budget_hours,
        region=region,
        usd_per_run=per_run,
        max_usd_per_run=max_usd_per_run,
        basis=basis,
        atomic_request=atomic_request,
    )


def price_region(region: str | None) -> str:
    """Which region's list prices a figure is, as the plan says it."""
    if region is None:
        return f"{PRICE_REGION} (aws:region not set)"
    return region if region_is_priced(region) else PRICE_REGION


def lease_tail_hours(config: StackConfig) -> float | None:
    """How long leased GPU nodes outlive the job (infra.platform.autoscaler); None when not leased:
    kept warm, or on an existing cluster whose autoscaling the stack does not own."""
    autoscaler = config.addons.cluster_autoscaler
    if config.cluster.mode != "create" or not autoscaler.install or config.gpu_nodes.keep_warm:
        return None
    return autoscaler.scale_down_unneeded_minutes / 60


def cost_estimate(
    config: StackConfig, *, expected_hours: float | None, region: str | None = None
) -> CostEstimate:
    """The GPU nodes' estimated cost, as plans and stack outputs show it; `expected_hours` is
    the duration estimate's (None when the run cannot be estimated), `region` the stack's
    `aws:region` (None: not set)."""
    nodes, cost = config.gpu_nodes, config.cost
    return estimate_cost(
        nodes.instance_type,
        nodes.count,
        nodes.capacity.type,
        run_hours=cost.run_hours(config.job.max_run_hours),
        expected_hours=expected_hours,
        lease_tail_hours=lease_tail_hours(config),
        nodes_owned=config.cluster.mode == "create",
        start_budget_hours=config.job.start_timeout_seconds / 3600,
        max_usd_per_run=cost.max_usd_per_run,
        usd_per_instance_hour=cost.usd_per_instance_hour,
        region=region,
        atomic_request=config.scheduling.kueue,
    )


# --- the standing cost ---------------------------------------------------------------------


@dataclass(frozen=True)
class StandingItem:
    """One thing the stack bills until `pulumi destroy`."""

    name: str
    usd_per_hour: float | None
    """None: no price for it in the tables (the total is then a lower bound)."""
    basis: str
    """What the figure is made of, e.g. `2 x m6i.xlarge at $0.192/h`."""


@dataclass(frozen=True)
class StandingCost:
    """What the stack costs per hour while it exists, run or no run."""

    items: tuple[StandingItem, ...]
    confirmed: bool
    """Whether every price used was read from AWS itself (see `infra.facts.prices`)."""
    region: str | None = None
    """The stack's `aws:region`; None: not set."""

    @property
    def usd_per_hour(self) -> float:
        return round(sum(i.usd_per_hour or 0.0 for i in self.items), 4)

    @property
    def usd_per_day(self) -> float:
        return round(24 * self.usd_per_hour, 2)

    @property
    def usd_per_month(self) -> float:
        return round(24 * 365 / 12 * self.usd_per_hour, 2)

    @property
    def unpriced(self) -> list[str]:
        return [i.name for i in self.items if i.usd_per_hour is None]

    def summary_lines(self) -> list[str]:
        """The daily figure and whose prices, what it is made of, and what it leaves out."""
        if not self.items:
            return ["$0.00/day: the stack creates nothing that bills while no job runs"]
        parts = ", ".join(
            f"{i.name} ${24 * i.usd_per_hour:,.2f}" if i.usd_per_hour is not None
            else f"{i.name} unpriced"
            for i in self.items
        )  # fmt: skip
        bound = "at least " if self.unpriced else ""
        unconfirmed = "" if self.confirmed else " (unconfirmed)"
        figure = (
            f"{bound}${self.usd_per_day:,.2f}/day (~${self.usd_per_month:,.0f}/month) until "
            "`pulumi destroy`"
        )
        if region_is_priced(self.region):
            head = f"{figure}; list prices, {price_region(self.region)}{unconfirmed}"
        else:
            head = (
                f"unknown for {self.region}; at {PRICE_REGION}'s list prices{unconfirmed}, {figure}"
            )
        return [
            head,
            parts,
            "not counted: data through the NAT, CloudWatch logs, S3 and ECR storage",
        ]

    def summary(self) -> str:
        """One line: the daily figure and what it is made of."""
        return "; ".join(self.summary_lines())

    def as_outputs(self) -> dict[str, object]:
        return {
            "usdPerHour": self.usd_per_hour,
            "usdPerDay": self.usd_per_day,
            "usdPerMonth": self.usd_per_month,
            "items": {i.name: i.usd_per_hour for i in self.items},
            "unpriced": self.unpriced,
            "summary": self.summary(),
        }


def _item(name: str, count: float, price: StandingPrice, what: str) -> StandingItem:
    unit = {"hour": "/h", "GB-month": "/GB-month", "month": "/month"}[price.unit]
    return StandingItem(
        name, round(count * price.usd_per_hour, 6), f"{what} at ${price.usd:g}{unit}"
    )


def standing_cost(
    config: StackConfig, metrics: MetricsPlan | None = None, *, region: str | None = None
) -> StandingCost:
    """Everything the stack keeps, priced per hour: on a cluster it creates, the control
    plane (in standard support: `infra.facts.eks_versions`), the system nodes and their root
    volumes, the NAT gateways of a VPC it creates (one, or one per system AZ) and their public
    addresses, the secrets key it creates, GPU nodes kept warm; in both modes the FSx file
    system it creates (capacity x its throughput tier), the metrics' managed collector when
    `metrics` collects through one. GPU nodes leased for a run are the run's cost, not
    standing."""
    items: list[StandingItem] = []
    used: list[str] = []

    def add(name: str, count: float, price: StandingPrice, what: str) -> None:
        items.append(_item(name, count, price, what))
        used.append(price.source)

    cluster, nodes = config.cluster, config.gpu_nodes
    if cluster.mode == "create":
        plane = "eks-control-plane" if UPGRADE_SUPPORT_TYPE == "STANDARD" else (
            "eks-control-plane-extended"
        )  # fmt: skip
        add("EKS control plane", 1, STANDING_PRICES[plane], "1 cluster")
        system = cluster.system_nodes
        name = f"system nodes ({system.desired_size} x {system.instance_type})"
        price = SYSTEM_NODE_USD_PER_HOUR.get(system.instance_type)
        if price is None:
            items.append(StandingItem(name, None, f"{system.instance_type}: no list price"))
        else:
            add(name, system.desired_size, price, f"{system.desired_size} x")
        volume_gb = system.desired_size * system.disk_size_gib
        add("system root volumes", volume_gb, STANDING_PRICES["ebs-gp3"], f"{volume_gb} GB gp3")
        network = cluster.network
        if network.creates_vpc:
            azs = len(network.availability_zones or []) or network.az_count
            nats = 1 if network.single_nat_gateway else azs
            add("NAT gateway", nats, STANDING_PRICES["nat-gateway"], f"{nats} x")
            add("NAT public IPv4", nats, STANDING_PRICES["public-ipv4"], f"{nats} x")
        if cluster.secrets_kms_key_arn is None:
            add("secrets KMS key", 1, STANDING_PRICES["kms-key"], "1 key")
        if nodes.keep_warm:
            name = f"GPU nodes kept warm ({nodes.count} x {nodes.instance_type})"
            try:
                gpu = instance_price(
                    nodes.instance_type, nodes.capacity.type,
                    usd_per_instance_hour=config.cost.usd_per_instance_hour,
                )  # fmt: skip
            except PriceUnknownError:
                items.append(StandingItem(name, None, f"{nodes.instance_type}: no price"))
            else:
                items.append(
                    StandingItem(
                        name,
                        round(nodes.count * gpu.usd_per_instance_hour, 4),
                        f"{nodes.count} x ${gpu.usd_per_instance_hour:g}/h ({gpu.basis})",
                    )
                )
                if gpu.source is not None:
                    used.append(next(k for k, v in SOURCES.items() if v is gpu.source))
    fsx = config.storage.fsx
    if fsx.creates_file_system:
        tier = FSX_PERSISTENT_2_USD_PER_GB_MONTH[fsx.per_unit_storage_throughput]
        add(
            f"FSx for Lustre ({fsx.storage_capacity_gib} GiB at "
            f"{fsx.per_unit_storage_throughput} MB/s/TiB)",
            fsx.storage_capacity_gib,
            tier,
            f"{fsx.storage_capacity_gib} GB",
        )
    if metrics is not None and metrics.enabled and metrics.collector_usd_per_hour:
        collector = AMP_PRICES["collector"]
        items.append(
            StandingItem(
                "metrics collector (AMP managed scraper)",
                metrics.collector_usd_per_hour,
                f"1 collector at ${collector.usd:g}/{collector.per}",
            )
        )
        used.append(collector.source)
    return StandingCost(
        items=tuple(items), confirmed=all(SOURCES[key].confirmed for key in used), region=region
    )
