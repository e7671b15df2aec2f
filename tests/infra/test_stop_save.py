"""The plan warns when a stop's saves cannot land in the time a Spot reclaim leaves."""

from __future__ import annotations

import pytest

from infra.config import StackConfig, load_stack_file
from infra.estimates.run_plan import plan_run
from infra.estimates.stop_save import SPOT_NOTICE_S


def on_capacity(stack: str, capacity: str) -> StackConfig:
    config = load_stack_file(stack)
    nodes = config.gpu_nodes.model_copy(
        update={"capacity": config.gpu_nodes.capacity.model_copy(update={"type": capacity})}
    )
    return config.model_copy(update={"gpu_nodes": nodes})


def spot_warnings(config: StackConfig) -> list[str]:
    return [w for w in plan_run(config).warnings if w.startswith("gpuNodes.capacity.type spot")]


def test_mixtral_on_spot_is_told_its_stop_saves_outlast_the_reclaim_notice() -> None:
    """~560 GB at FSx's ~2.3 GB/s is ~4 minutes a save: twice the two minutes of notice."""
    config = on_capacity("mixtral-8x7b-p5", "spot")
    plan = plan_run(config)
    [warning] = spot_warnings(config)
    assert plan.timeouts.checkpoint_seconds == pytest.approx(239, abs=2)
    assert f"a stop needs ~{plan.timeouts.shutdown_grace_seconds} s" in warning
    assert (
        "560 GB each at 2.34 GB/s to FSx for Lustre (500 MB/s/TiB x 4800 GiB), ~239 s each"
        in warning
    )
    assert "training.checkpointEvery 500 steps" in warning
    assert "raise storage.fsx.perUnitStorageThroughput" in warning
    assert "gpuNodes.capacity.type on-demand" in warning


def test_on_demand_capacity_waits_the_grace_period_the_plan_sized() -> None:
    assert spot_warnings(on_capacity("mixtral-8x7b-p5", "on-demand")) == []


def test_a_small_model_on_spot_saves_within_the_notice() -> None:
    config = on_capacity("dev", "spot")
    assert plan_run(config).timeouts.shutdown_grace_seconds <= SPOT_NOTICE_S
    assert spot_warnings(config) == []
