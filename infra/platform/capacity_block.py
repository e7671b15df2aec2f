"""A Capacity Block must hold the run: its type, AZ and size, and its window the whole run.

A block ends at a fixed time and EC2 then terminates its instances ("When a Capacity Block
expires, all instances in the Capacity Block are terminated": EC2 API reference,
`CapacityBlock.endDate`). A run that is still training then dies without its last
checkpoint's worth of work, after the block was paid for in full. So the program looks the
block up (`aws.ec2.get_capacity_block_reservation`, blocking, before any resource exists) and
compares it with the stack: one line per mismatch, in the "stack is invalid" form.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_aws as aws

from infra.config import StackConfigError
from infra.facts.instances import HYPERPOD_PREFIX

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.estimates.run_plan import RunPlan


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def block_problems(
    config: StackConfig, block: Mapping[str, Any], now: datetime, *, run_hours: float
) -> list[str]:
    """What is wrong with running `config` in `block` (the data source's fields) from `now`,
    for a run expected to take `run_hours`."""
    nodes = config.gpu_nodes
    block_id = nodes.capacity.reservation_id
    problems = []
    wanted = nodes.instance_type.removeprefix(HYPERPOD_PREFIX)
    if block.get("instance_type") and block["instance_type"] != wanted:
        problems.append(
            f"gpuNodes.instanceType {nodes.instance_type!r} but Capacity Block {block_id} is "
            f"for {block['instance_type']!r}; allowed: {block['instance_type']!r}"
        )
    zone = block.get("availability_zone")
    if zone and nodes.availability_zone and zone != nodes.availability_zone:
        problems.append(
            f"gpuNodes.availabilityZone {nodes.availability_zone!r} but Capacity Block "
            f"{block_id} is in {zone!r}; allowed: {zone!r}"
        )
    size = block.get("instance_count")
    if size is not None and nodes.count > int(size):
        problems.append(
            f"gpuNodes.count {nodes.count} but Capacity Block {block_id} holds {size} "
            f"instance(s); allowed: at most {size}"
        )
    if block.get("end_date"):
        start = max(now, _time(block["start_date"])) if block.get("start_date") else now
        hours_left = (_time(block["end_date"]) - start).total_seconds() / 3600
        needed = run_hours
        if hours_left < needed:
            left = max(hours_left, 0)
            problems.append(
                f"Capacity Block {block_id} ends at {block['end_date']}, {left:.1f} h after "
                f"the run could start, but the run takes ~{needed:.1f} h "
                "(infra/estimates/duration.py); EC2 terminates the block's instances at its end: "
                "lower training.maxSteps, or use a longer block"
            )
    return problems


def check_capacity_block(plan: RunPlan, *, source: str) -> None:
    """For a stack on a Capacity Block: look it up and raise StackConfigError on a mismatch.
    A plain (blocking) invoke: the error must come from the program itself, as one line."""
    config = plan.config
    capacity = config.gpu_nodes.capacity
    if capacity.type != "block" or capacity.reservation_id is None:
        return
    found = aws.ec2.get_capacity_block_reservation(id=capacity.reservation_id)
    block = {
        "instance_type": found.instance_type,
        "availability_zone": found.availability_zone,
        "instance_count": found.instance_count,
        "start_date": found.start_date,
        "end_date": found.end_date,
    }
    assert plan.duration is not None  # a checked plan has one
    problems = block_problems(config, block, datetime.now(UTC), run_hours=plan.duration.hours)
    if problems:
        raise StackConfigError(problems, source=source)
    pulumi.log.info(
        f"Capacity Block {capacity.reservation_id}: {found.instance_count} x "
        f"{found.instance_type} in {found.availability_zone}, {found.start_date} to "
        f"{found.end_date}"
    )
