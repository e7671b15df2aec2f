"""A Capacity Block must hold the run: type, AZ, size, and a window longer than the run."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from infra.config import StackConfigError, parse_stack_config
from infra.estimates.duration import estimate_duration
from infra.offline import evaluate
from infra.platform.capacity_block import block_problems
from infra.program import main as program

BLOCK_ID = "cr-0123456789abcdef0"
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
STACK: dict[str, Any] = {
    "gpuNodes": {
        "instanceType": "p5.48xlarge",
        "count": 2,
        "availabilityZone": "us-west-2a",
        "capacity": {"type": "block", "reservationId": BLOCK_ID},
    },
    "job": {"maxRunHours": 4},
    "training": {"maxSteps": 200},
    "storage": {"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}},
    "cost": {"maxUsdPerRun": None},
}


def block(**fields: Any) -> dict[str, Any]:
    return {
        "instance_type": "p5.48xlarge",
        "availability_zone": "us-west-2a",
        "instance_count": 2,
        "start_date": "2026-11-24T11:30:00Z",
        "end_date": "2026-11-25T11:30:00Z",
        **fields,
    }


def config() -> Any:
    return parse_stack_config(STACK, stack_name="blocked")


RUN_HOURS = estimate_duration(config()).hours
"""What the run plan hands the block check (`RunPlan.duration`)."""


def test_a_block_that_holds_the_run_passes() -> None:
    assert block_problems(config(), block(), NOW, run_hours=RUN_HOURS) == []


def test_a_block_of_another_type_az_or_size_is_named() -> None:
    problems = block_problems(
        config(),
        block(instance_type="p4d.24xlarge", availability_zone="us-west-2b", instance_count=1),
        NOW,
        run_hours=RUN_HOURS,
    )
    assert [p.split(" but ")[0] for p in problems] == [
        "gpuNodes.instanceType 'p5.48xlarge'",
        "gpuNodes.availabilityZone 'us-west-2a'",
        "gpuNodes.count 2",
    ]


def test_a_block_that_ends_before_the_run_would_is_refused() -> None:
    needed = RUN_HOURS
    ends = "2026-11-24T12:06:00Z"  # six minutes from now: less than the start-up
    [problem] = block_problems(config(), block(end_date=ends), NOW, run_hours=RUN_HOURS)
    assert problem.startswith(f"Capacity Block {BLOCK_ID} ends at {ends}, 0.1 h after")
    assert f"the run takes ~{needed:.1f} h" in problem
    # A block that starts later: its window counts from its start, not from now.
    later = block(start_date="2026-11-30T11:30:00Z", end_date="2026-11-30T23:30:00Z")
    assert block_problems(config(), later, NOW, run_hours=RUN_HOURS) == []


def test_the_program_looks_the_block_up_before_registering_anything(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    values = {f"fsdp-eks:{k}": v for k, v in STACK.items()}
    result = evaluate(program, config=values, stack="blocked")
    [(_, asked)] = [
        (token, args)
        for token, args in result.invokes
        if token == "aws:ec2/getCapacityBlockReservation:getCapacityBlockReservation"
    ]
    assert asked["id"] == BLOCK_ID
    values["fsdp-eks:gpuNodes"] = {**STACK["gpuNodes"], "count": 8}  # the offline block has 4
    with pytest.raises(StackConfigError, match=r"gpuNodes\.count 8 but Capacity Block"):
        evaluate(program, config=values, stack="blocked")
