"""What the run's metrics cost, and how `observability.enabled: auto` resolves from it."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.parse import parse_stack_config
from infra.estimates.metrics_cost import (
    SCRAPE_SERIES_PER_TARGET,
    series_per_node,
    trainer_series_per_rank,
)
from infra.estimates.run_plan import plan_run
from infra.facts.exporter_metrics import EFA_COUNTERS, metric_names
from infra.facts.prices import AMP_PRICES

ARN = "arn:aws:aps:us-east-1:123456789012:workspace/ws-0a1b2c3d"


def _plan(instance: str = "p5.48xlarge", count: int = 2, **observability: Any) -> Any:
    config = parse_stack_config(
        {
            "gpuNodes": {"instanceType": instance, "count": count},
            "cost": {"maxRunHours": 4, "maxUsdPerRun": None},
            "observability": observability,
        },
        stack_name="dev",
    )
    return plan_run(config)


def test_series_count_each_exporter_on_each_device() -> None:
    plan = _plan()
    # p5.48xlarge: 8 GPUs, 32 EFA devices; three targets per node.
    expected = (
        trainer_series_per_rank() * 8
        + len(metric_names("dcgm")) * 8
        + len(EFA_COUNTERS) * 32
        + 3 * SCRAPE_SERIES_PER_TARGET
    )
    assert series_per_node(plan.config) == expected
    assert plan.metrics.series == 2 * expected
    assert plan.metrics.samples_per_hour == 2 * expected * 3600 / 30


def test_price_is_ingestion_storage_and_collector_hours() -> None:
    metrics = _plan().metrics
    ingest = metrics.samples_per_hour / 1e7 * AMP_PRICES["samples-ingested"].usd
    assert metrics.usd_per_run_hour > ingest + AMP_PRICES["collector"].usd  # plus storage
    assert metrics.usd_per_run_hour < 1.05 * (ingest + AMP_PRICES["collector"].usd)
    # Halving the interval doubles the samples (and the ingestion) but not the collector.
    fast = _plan(scrapeIntervalSeconds=15).metrics
    assert fast.samples_per_hour == 2 * metrics.samples_per_hour


def test_auto_is_on_under_one_percent_of_the_gpu_cost_and_off_above() -> None:
    big = _plan()
    assert big.metrics.enabled and big.metrics.gpu_share is not None
    assert big.metrics.gpu_share < 0.01
    # One g5.xlarge costs about $1/h: the collector's $0.04/h alone is 4%.
    small = _plan("g5.xlarge", 1)
    assert small.metrics.gpu_share is not None and small.metrics.gpu_share > 0.01
    assert not small.metrics.enabled
    assert "would cost" in small.metrics.summary()
    assert _plan("g5.xlarge", 1, enabled=True).metrics.enabled


@pytest.mark.parametrize("enabled", [True, False])
def test_the_standing_cost_carries_the_collector_only_when_collecting(enabled: bool) -> None:
    plan = _plan(enabled=enabled)
    names = [item.name for item in plan.standing.items]
    assert any("metrics collector" in name for name in names) is enabled
    assert plan.metrics.usd_per_run_hour > 0  # shown either way


def test_existing_cluster_without_destination_is_off_and_costs_nothing() -> None:
    config = parse_stack_config(
        {
            "cluster": {"mode": "existing", "name": "team"},
            "gpuNodes": {"instanceType": "p5.48xlarge", "count": 2},
            "storage": {"fsx": {"enabled": False}},
            "cost": {"maxRunHours": 4, "maxUsdPerRun": None},
        },
        stack_name="dev",
    )
    metrics = plan_run(config).metrics
    assert not metrics.enabled and metrics.destination == "none"
    monitored = parse_stack_config(
        {**config.model_dump(by_alias=True, exclude={"observability", "hf_token"}),
         "observability": {"clusterPrometheus": {}}},
        stack_name="dev",
    )  # fmt: skip
    watched = plan_run(monitored).metrics
    assert watched.enabled and watched.usd_per_run_hour == 0  # the cluster's own Prometheus
