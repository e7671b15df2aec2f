"""A node's staged checkpoint must fit the pod's /dev/shm, or the plan refuses the stack."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfigError, load_stack_file
from infra.config.parse import validate_stack_config
from infra.job.manifest import pod_size
from infra.job.stack_checks import checked_run_plan
from infra.job.staging_fit import GIB, staged_bytes_per_node

LLAMA_70B_ON_TWO_P5: dict[str, Any] = {
    "fsdp-eks:gpuNodes": {"instanceType": "p5.48xlarge", "count": 2},
    "fsdp-eks:model": {"preset": "llama3.1-70b"},
    "fsdp-eks:training": {"shardingStrategy": "full", "activationCheckpointing": "full"},
    "fsdp-eks:cost": {"maxUsdPerRun": None},
}


def problems(values: dict[str, Any]) -> list[str]:
    try:
        checked_run_plan(values, stack_name="staging")
    except StackConfigError as error:
        return [p for p in error.problems if "/dev/shm" in p]
    return []


def with_section(section: str, **keys: Any) -> dict[str, Any]:
    name = f"fsdp-eks:{section}"
    return {**LLAMA_70B_ON_TWO_P5, name: {**LLAMA_70B_ON_TWO_P5.get(name, {}), **keys}}


def test_70b_fully_sharded_over_two_p5_gets_a_shm_that_holds_its_420_gb_by_default() -> None:
    config = validate_stack_config(LLAMA_70B_ON_TWO_P5, stack_name="staging").config
    # 70.6B parameters x 12 bytes, each node's 8 of 16 shards: 394 GiB, with 10% to spare.
    assert staged_bytes_per_node(config) / GIB == pytest.approx(394.5, abs=0.5)
    assert pod_size(config).shm_gib == 439


def test_a_shm_set_too_small_is_refused_naming_the_key_that_fixes_it() -> None:
    [problem] = problems(with_section("job", shmSizeGiB=256))
    assert problem.startswith(
        "job.shmSizeGiB 256: an asynchronous save stages 394 GiB of model and optimizer "
        "shards per p5.48xlarge node in /dev/shm, more than 90% of it"
    )
    assert "raise job.shmSizeGiB to at least 439, or set training.extraArgs." in problem
    assert problems(with_section("job", shmSizeGiB=439)) == []
    synchronous = with_section("job", shmSizeGiB=256)
    synchronous["fsdp-eks:training"] = {
        **synchronous["fsdp-eks:training"],
        "extraArgs": {"async_checkpoint": 0},
    }
    assert problems(synchronous) == []


def test_beyond_what_shm_may_take_it_asks_for_more_nodes() -> None:
    """One p4d (1152 GiB) would stage all of a 70B model's 789 GiB: more than half the node,
    the most /dev/shm may take."""
    values = {
        **LLAMA_70B_ON_TWO_P5,
        "fsdp-eks:gpuNodes": {"instanceType": "p4d.24xlarge", "count": 1},
    }
    [problem] = problems(values)
    assert "add GPU nodes (gpuNodes.count) to shard the state further" in problem


@pytest.mark.parametrize(
    "stack", ["dev", "llama2-7b-p4d", "llama31-8b-p5", "llama32-1b-g5", "mixtral-8x7b-p5"]
)
def test_every_shipped_stack_stages_within_its_shm(stack: str) -> None:
    config = load_stack_file(stack)
    assert staged_bytes_per_node(config) <= 0.9 * pod_size(config).shm_gib * GIB
