"""The cost section, the price table and the estimates derived from them."""

from __future__ import annotations

from datetime import date

import pytest
from pydantic import ValidationError

from infra.config.cost import DEFAULT_MAX_USD_PER_RUN, CostConfig
from infra.estimates.cost import estimate_cost, estimate_hourly_usd, estimate_run_usd
from infra.facts.instances import INSTANCE_FACTS
from infra.facts.prices import (
    ON_DEMAND_USD_PER_HOUR,
    SOURCES,
    CapacityType,
    PriceUnknownError,
    instance_price,
)


def test_cost_config_defaults_to_a_low_ceiling_and_table_prices() -> None:
    cost = CostConfig.model_validate({})
    assert cost.max_usd_per_run == DEFAULT_MAX_USD_PER_RUN
    assert cost.max_run_hours is None
    assert cost.usd_per_instance_hour is None


def test_cost_config_reads_camel_case_keys() -> None:
    cost = CostConfig.model_validate(
        {"maxUsdPerRun": 2500, "maxRunHours": 12, "usdPerInstanceHour": 31.5}
    )
    assert (cost.max_usd_per_run, cost.max_run_hours, cost.usd_per_instance_hour) == (
        2500,
        12,
        31.5,
    )


@pytest.mark.parametrize(
    ("raw", "bad_key"),
    [
        ({"maxUsd": 10}, "maxUsd"),
        ({"maxUsdPerRun": 0}, "maxUsdPerRun"),
        ({"maxRunHours": -1}, "maxRunHours"),
        ({"usdPerInstanceHour": 0}, "usdPerInstanceHour"),
    ],
)
def test_cost_config_rejects_bad_values_naming_the_key(raw: dict, bad_key: str) -> None:
    with pytest.raises(ValidationError, match=bad_key):
        CostConfig.model_validate(raw)


def test_null_ceiling_switches_it_off() -> None:
    assert CostConfig.model_validate({"maxUsdPerRun": None}).max_usd_per_run is None


def test_run_hours_prefers_the_job_deadline() -> None:
    cost = CostConfig.model_validate({"maxRunHours": 3})
    assert cost.run_hours(10) == 10
    assert cost.run_hours(None) == 3
    assert CostConfig.model_validate({}).run_hours(None) is None


def test_every_cost_field_has_a_description() -> None:
    for name, field in CostConfig.model_fields.items():
        assert field.description, name


# --- the price table -------------------------------------------------------------------------


def test_every_gpu_instance_type_but_p5e_has_a_sourced_list_price() -> None:
    unpriced = set(INSTANCE_FACTS) - set(ON_DEMAND_USD_PER_HOUR)
    assert unpriced == {"p5e.48xlarge"}
    assert set(ON_DEMAND_USD_PER_HOUR) <= set(INSTANCE_FACTS)
    for instance_type, price in ON_DEMAND_USD_PER_HOUR.items():
        assert price.usd_per_hour > 0, instance_type
        source = SOURCES[price.source]
        assert source.url.startswith("https://"), instance_type
        assert date.fromisoformat(source.as_of) <= date(2026, 12, 31)
        assert source.note


def test_prices_grow_with_the_hardware_within_a_family() -> None:
    """A transposed digit in the table would break these orderings."""
    table = {k: v.usd_per_hour for k, v in ON_DEMAND_USD_PER_HOUR.items()}
    assert table["p4d.24xlarge"] < table["p4de.24xlarge"] < table["p5.48xlarge"]
    assert table["p5.48xlarge"] < table["p5en.48xlarge"] < table["p6-b200.48xlarge"]
    g5 = ["g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.16xlarge"]
    assert [table[t] for t in g5] == sorted(table[t] for t in g5)
    assert table["g5.12xlarge"] < table["g5.24xlarge"] < table["g5.48xlarge"]
    assert table["g6e.12xlarge"] < table["g6e.24xlarge"] < table["g6e.48xlarge"]


# --- estimates ------------------------------------------------------------------------------


def test_hourly_estimate_is_price_times_nodes() -> None:
    assert estimate_hourly_usd("p5.48xlarge", 4) == pytest.approx(4 * 55.04)
    assert estimate_hourly_usd("g5.8xlarge", 4, "on-demand") == pytest.approx(4 * 2.448)
    assert estimate_hourly_usd("g5.8xlarge", 0) == 0


@pytest.mark.parametrize("capacity", ["on-demand", "reservation", "spot", "block"])
def test_every_capacity_type_is_priced_at_the_on_demand_bound(capacity: CapacityType) -> None:
    assert estimate_hourly_usd("p4d.24xlarge", 2, capacity) == pytest.approx(2 * 21.957642)
    assert instance_price("p4d.24xlarge", capacity).basis  # says why


def test_the_stack_price_override_wins_over_the_table() -> None:
    assert estimate_hourly_usd("p5.48xlarge", 4, "block", usd_per_instance_hour=31.5) == 126.0
    price = instance_price("p5e.48xlarge", "block", usd_per_instance_hour=40.0)
    assert price.source is None and "cost.usdPerInstanceHour" in price.basis


def test_run_estimate_is_hourly_times_hours() -> None:
    assert estimate_run_usd("p5.48xlarge", 4, "on-demand", 24) == pytest.approx(
        4 * 55.04 * 24, abs=0.01
    )
    with pytest.raises(ValueError, match="run hours"):
        estimate_run_usd("p5.48xlarge", 4, "on-demand", 0)


def test_unpriced_and_bad_inputs_fail_with_what_to_do() -> None:
    with pytest.raises(PriceUnknownError, match=r"p5e\.48xlarge.*cost\.usdPerInstanceHour"):
        estimate_hourly_usd("p5e.48xlarge", 2)
    with pytest.raises(PriceUnknownError, match="unknown type"):
        estimate_hourly_usd("m5.large", 1)
    with pytest.raises(ValueError, match="capacity type 'dedicated'"):
        estimate_hourly_usd("p5.48xlarge", 1, "dedicated")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="node count"):
        estimate_hourly_usd("p5.48xlarge", -1)


def test_cost_estimate_checks_the_ceiling_and_explains_itself() -> None:
    within = estimate_cost("g5.8xlarge", 4, "on-demand", run_hours=2, max_usd_per_run=100)
    assert within.usd_per_hour == pytest.approx(9.792)
    assert within.usd_per_run == pytest.approx(19.58)
    assert not within.exceeds_ceiling
    assert "unconfirmed" in within.basis and "us-east-1" in within.basis
    over = estimate_cost("p5.48xlarge", 4, "spot", run_hours=24, max_usd_per_run=1000)
    assert over.exceeds_ceiling and "EXCEEDED" in over.summary()
    unknown_length = estimate_cost(
        "p5.48xlarge", 4, "on-demand", run_hours=None, max_usd_per_run=1000
    )
    assert unknown_length.usd_per_run is None and unknown_length.exceeds_ceiling
    no_ceiling = estimate_cost("p5.48xlarge", 4, "on-demand", run_hours=None, max_usd_per_run=None)
    assert not no_ceiling.exceeds_ceiling and "no ceiling" in no_ceiling.summary()
    outputs = over.as_outputs()
    assert outputs["usdPerHour"] == over.usd_per_hour and outputs["usdPerRun"] == over.usd_per_run
