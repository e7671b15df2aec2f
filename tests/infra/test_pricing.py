"""The cost section, the price table and the estimates derived from them."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from infra.config.cost import DEFAULT_MAX_USD_PER_RUN, CostConfig


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
