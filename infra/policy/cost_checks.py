"""The cost ceiling: estimated $/hour of the GPU nodes x run hours must stay under the stack's
`fsdp-eks:cost.maxUsdPerRun`.

The node count and instance type are read from the resources the plan would create (the GPU
node groups, or on an existing cluster the training job's replicas and instance-type node
selector), not from the config, so the check holds the program to what the config promised.
The ceiling, the price override and the fallback facts come from the policy config, which
`infra.policy.settings` derives from the stack file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from infra.config.cost import DEFAULT_MAX_USD_PER_RUN
from infra.facts.prices import CAPACITY_TYPES, CapacityType, PriceUnknownError, instance_price
from infra.policy.kube_checks import Finding
from infra.policy.view import (
    UNKNOWN,
    Resource,
    gpu_node_groups,
    is_training_job,
    job_deadline,
    pod_templates,
    selected_instance_type,
)


@dataclass(frozen=True)
class PricedNodes:
    instance_type: str
    count: int
    capacity_type: CapacityType
    usd_per_instance_hour: float

    def describe(self) -> str:
        return (
            f"{self.count} x {self.instance_type} ({self.capacity_type}) at "
            f"${self.usd_per_instance_hour:,.2f}/h"
        )


def _capacity(value: Any) -> CapacityType:
    for capacity in CAPACITY_TYPES:
        if value == capacity:
            return capacity
    return "on-demand"


def _node_sets(
    resources: Sequence[Resource], config: Mapping[str, Any]
) -> tuple[list[tuple[str, Any, CapacityType, str]], list[Finding]]:
    """(instance type, count, capacity, urn) of every set of GPU nodes the stack pays for."""
    groups = gpu_node_groups(resources)
    if groups:
        return [
            (
                g.instance_type,
                g.count if isinstance(g.count, int) else config.get("nodeCount"),
                _capacity(g.capacity_type),
                g.resource.urn,
            )
            for g in groups
        ], []
    configured_capacity = _capacity(config.get("capacityType"))
    node_sets: list[tuple[str, Any, CapacityType, str]] = []
    findings: list[Finding] = []
    for resource in resources:
        templates = pod_templates(resource)
        if not is_training_job(resource) or not templates:
            continue
        selected = {selected_instance_type(t) for t in templates} - {None}
        instance_type = next(iter(selected), None) or config.get("instanceType")
        if not isinstance(instance_type, str):
            findings.append(
                Finding(
                    f"{resource.name}: cannot price the job's nodes: no GPU node group in the "
                    f"stack, no node.kubernetes.io/instance-type node selector and no "
                    f"instanceType in the cost-ceiling policy config",
                    resource.urn,
                )
            )
            continue
        nodes = sum(t.replicas for t in templates)
        node_sets.append((instance_type, nodes, configured_capacity, resource.urn))
    return node_sets, findings


def run_hours(resources: Sequence[Resource], config: Mapping[str, Any]) -> float | None:
    """The longest job deadline in the stack, else the configured maxRunHours, else None."""
    deadlines = [job_deadline(r) for r in resources if is_training_job(r)]
    seconds = [d for d in deadlines if isinstance(d, int | float) and d is not UNKNOWN and d > 0]
    if seconds:
        return max(seconds) / 3600
    hours = config.get("maxRunHours")
    return float(hours) if isinstance(hours, int | float) and hours > 0 else None


def check_cost_ceiling(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Finding]:
    """The estimated cost of one run does not exceed the stack's ceiling."""
    ceiling = config.get("maxUsdPerRun", DEFAULT_MAX_USD_PER_RUN)
    if ceiling is None:
        return []
    node_sets, findings = _node_sets(resources, config)
    if not node_sets:
        return findings
    override = config.get("usdPerInstanceHour")
    priced: list[PricedNodes] = []
    for instance_type, count, capacity, urn in node_sets:
        if not isinstance(count, int):
            findings.append(
                Finding(
                    f"cannot price {instance_type} nodes: their count is not known; set "
                    f"nodeCount in the cost-ceiling policy config",
                    urn,
                )
            )
            continue
        try:
            price = instance_price(instance_type, capacity, usd_per_instance_hour=override)
        except PriceUnknownError as error:
            findings.append(Finding(str(error), urn))
            continue
        priced.append(PricedNodes(instance_type, count, capacity, price.usd_per_instance_hour))
    if not priced:
        return findings
    hourly = sum(p.count * p.usd_per_instance_hour for p in priced)
    hours = run_hours(resources, config)
    nodes = " + ".join(p.describe() for p in priced)
    if hours is None:
        findings.append(
            Finding(
                f"the run has no known length (no job deadline, no cost.pricedRunHours), so the "
                f"${hourly:,.2f}/h of {nodes} cannot be held to the ${float(ceiling):,.2f} "
                f"ceiling; set fsdp-eks:job.maxRunHours or fsdp-eks:cost.maxRunHours"
            )
        )
        return findings
    per_run = hourly * hours
    if per_run > float(ceiling):
        findings.append(
            Finding(
                f"estimated ${per_run:,.2f} per run ({nodes} = ${hourly:,.2f}/h x {hours:g} h) "
                f"exceeds fsdp-eks:cost.maxUsdPerRun ${float(ceiling):,.2f}; shorten "
                f"job.maxRunHours, use fewer or cheaper nodes, or raise the ceiling in the "
                f"stack file for the reviewers to approve"
            )
        )
    return findings
