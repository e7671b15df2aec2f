"""What a stack's GPU nodes are estimated to cost: per hour, per run, and what is expected.

Prices come from the facts table (`infra.facts.prices`) or the stack's own
`cost.usdPerInstanceHour`; hours from the deadline (the worst case) and the duration estimate
(the expected case). Only the GPU nodes are priced; the summary says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.facts.prices import PRICE_REGION, CapacityType, instance_price

if TYPE_CHECKING:
    from infra.config import StackConfig


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
    """None: the run has no known length (no deadline and no cost.maxRunHours)."""
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

    def summary(self) -> str:
        """One line for plans, PR comments and stack outputs."""
        run = (
            f"${self.usd_per_run:,.2f} per run at most ({self.run_hours:g} h)"
            if self.usd_per_run is not None and self.run_hours is not None
            else "per run: unknown (no deadline and no cost.maxRunHours)"
        )
        if self.expected_usd is not None and self.expected_hours is not None:
            run = f"~${self.expected_usd:,.2f} expected (~{self.expected_hours:.1f} h), {run}"
        if not self.nodes_owned:
            run += " (the existing cluster's GPU nodes: their idle time is its operators' choice)"
        elif self.lease_tail_hours is None:
            run += " (nodes bill on after the job until `pulumi destroy`)"
        else:
            tail = self.lease_tail_hours * 60
            run += f" (GPU nodes 0 -> {self.count} for the job, 0 again ~{tail:.0f} min after it)"
        ceiling = (
            "no ceiling"
            if self.max_usd_per_run is None
            else f"ceiling ${self.max_usd_per_run:,.2f}"
            + (" EXCEEDED" if self.exceeds_ceiling else "")
        )
        return (
            f"{self.count} x {self.instance_type} ({self.capacity_type}): "
            f"${self.usd_per_hour:,.2f}/hour, {run}, {ceiling}; {self.basis}; GPU nodes only"
        )

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
        basis += f", {PRICE_REGION}, as of {price.source.as_of}"
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
        usd_per_run=per_run,
        max_usd_per_run=max_usd_per_run,
        basis=basis,
    )


def lease_tail_hours(config: StackConfig) -> float | None:
    """How long leased GPU nodes outlive the job (infra.platform.autoscaler); None when not leased:
    kept warm, or on an existing cluster whose autoscaling the stack does not own."""
    autoscaler = config.addons.cluster_autoscaler
    if config.cluster.mode != "create" or not autoscaler.install or config.gpu_nodes.keep_warm:
        return None
    return autoscaler.scale_down_unneeded_minutes / 60


def cost_estimate(config: StackConfig, *, expected_hours: float | None) -> CostEstimate:
    """The GPU nodes' estimated cost, as plans and stack outputs show it; `expected_hours` is
    the duration estimate's (None when the run cannot be estimated)."""
    nodes, cost = config.gpu_nodes, config.cost
    return estimate_cost(
        nodes.instance_type,
        nodes.count,
        nodes.capacity.type,
        run_hours=cost.run_hours(config.job.max_run_hours),
        expected_hours=expected_hours,
        lease_tail_hours=lease_tail_hours(config),
        nodes_owned=config.cluster.mode == "create",
        max_usd_per_run=cost.max_usd_per_run,
        usd_per_instance_hour=cost.usd_per_instance_hour,
    )
