"""The cost section, the price table and the estimates derived from them."""

from __future__ import annotations

from datetime import date
from typing import Any

import pytest
from pydantic import ValidationError

from infra.config import load_stack_file, parse_stack_config
from infra.config.cost import DEFAULT_MAX_USD_PER_RUN, CostConfig
from infra.estimates.cost import (
    StandingCost,
    estimate_cost,
    estimate_hourly_usd,
    estimate_run_usd,
)
from infra.estimates.run_plan import plan_run
from infra.facts.instances import INSTANCE_FACTS
from infra.facts.prices import (
    FSX_PERSISTENT_2_USD_PER_GB_MONTH,
    ON_DEMAND_USD_PER_HOUR,
    SOURCES,
    STANDING_PRICES,
    SYSTEM_NODE_USD_PER_HOUR,
    CapacityType,
    PriceUnknownError,
    instance_price,
)
from tests.infra.test_stacks import stack


def test_cost_config_defaults_to_a_low_ceiling_and_table_prices() -> None:
    cost = CostConfig.model_validate({})
    assert cost.max_usd_per_run == DEFAULT_MAX_USD_PER_RUN
    assert cost.priced_run_hours is None
    assert cost.usd_per_instance_hour is None


def test_cost_config_reads_camel_case_keys() -> None:
    cost = CostConfig.model_validate(
        {"maxUsdPerRun": 2500, "pricedRunHours": 12, "usdPerInstanceHour": 31.5}
    )
    assert (cost.max_usd_per_run, cost.priced_run_hours, cost.usd_per_instance_hour) == (
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
    cost = CostConfig.model_validate({"pricedRunHours": 3})
    assert cost.run_hours(10) == 10
    assert cost.run_hours(None) == 3
    assert CostConfig.model_validate({}).run_hours(None) is None


def test_the_old_spelling_of_priced_run_hours_still_prices_with_a_warning() -> None:
    """`cost.maxRunHours` read like `job.maxRunHours` (the deadline) but only priced a run."""
    values = {"gpuNodes": {"instanceType": "g5.8xlarge", "count": 1}, "cost": {"maxRunHours": 3}}
    plan = plan_run(parse_stack_config(values, stack_name="exp"))
    assert plan.config.cost.run_hours(None) == 3
    [warning] = [w for w in plan.warnings if "cost.maxRunHours" in w]
    assert warning.endswith("write cost.pricedRunHours")
    renamed = {**values, "cost": {"pricedRunHours": 3}}
    assert not any("deprecated" in w for w in plan_run(
        parse_stack_config(renamed, stack_name="exp")).warnings)  # fmt: skip
    with pytest.raises(ValidationError, match=r"old spelling of cost\.pricedRunHours"):
        CostConfig.model_validate({"maxRunHours": 3, "pricedRunHours": 4})


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


# --- what the stack bills until `pulumi destroy` -----------------------------------------


def standing_of(**sections: Any) -> StandingCost:
    values = {"gpuNodes": {"instanceType": "p5.48xlarge", "count": 4}, **sections}
    values.setdefault("cost", {"maxUsdPerRun": None})
    return plan_run(parse_stack_config(values, stack_name="standing")).standing


def test_the_p5_stack_shows_its_standing_cost_and_worst_partial_start_in_its_outputs() -> None:
    """The p5 stack keeps, until `pulumi destroy`: the control plane ($0.10/h), 2 x
    m6i.xlarge system nodes ($0.192/h) with 50 GB gp3 each, one NAT gateway and its public
    address, the secrets key, 2,400 GiB of FSx PERSISTENT_2 at 250 MB/s/TiB ($0.21/GB-month)
    and the metrics' managed collector ($0.04/h); and a start that gets 3 of its 4 p5 nodes
    holds them through the 1 h start budget and the 10 minutes before the autoscaler removes
    them."""
    _, result = stack("llama31-8b-p5")
    outputs = result.stack_outputs
    hourly = 0.10 + 2 * 0.192 + 100 * 0.08 / 730 + 0.045 + 0.005 + 1 / 730 + 2400 * 0.21 / 730
    hourly += 0.04  # the AMP managed scraper
    assert outputs["standingUsdPerDay"] == pytest.approx(24 * hourly, abs=0.01) == 30.64
    standing = outputs["cost"]["standing"]
    assert standing["usdPerDay"] == 30.64 and standing["unpriced"] == []
    assert standing["items"]["FSx for Lustre (2400 GiB at 250 MB/s/TiB)"] == pytest.approx(
        2400 * 0.21 / 730
    )
    assert outputs["cost"]["partialStartWorstUsd"] == pytest.approx(3 * 55.04 * (1 + 10 / 60))
    assert outputs["cost"]["partialStartWorstUsd"] == 192.64
    assert (
        "until `pulumi destroy`" in standing["summary"] and "(unconfirmed)" in standing["summary"]
    )


def test_standing_cost_counts_only_what_the_stack_creates() -> None:
    base = standing_of()
    names = [item.name for item in base.items]
    assert names[:3] == [
        "EKS control plane",
        "system nodes (2 x m6i.xlarge)",
        "system root volumes",
    ]
    assert "NAT gateway" in names and "secrets KMS key" in names
    # One NAT per system AZ when asked, none in a VPC the stack does not create.
    per_az = standing_of(cluster={"network": {"singleNatGateway": False, "azCount": 3}})
    nat = {i.name: i.usd_per_hour for i in per_az.items}["NAT gateway"]
    assert nat == pytest.approx(3 * 0.045)
    existing_vpc = standing_of(
        cluster={"network": {"vpcId": "vpc-1", "privateSubnetIds": ["subnet-a", "subnet-b"],
                             "gpuSubnetId": "subnet-g"}},
    )  # fmt: skip
    assert not any(i.name.startswith("NAT") for i in existing_vpc.items)
    # A key the stack is given is not the stack's to pay for.
    key = "arn:aws:kms:us-west-2:123456789012:key/0a1b2c3d-0a1b-0a1b-0a1b-0a1b2c3d4e5f"
    own_key = standing_of(cluster={"secretsKmsKeyArn": key})
    assert "secrets KMS key" not in [i.name for i in own_key.items]
    # No FSx, no FSx line; a bigger, faster one costs more.
    assert not any(
        i.name.startswith("FSx") for i in standing_of(storage={"fsx": {"enabled": False}}).items
    )
    fast = standing_of(
        storage={"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}}
    )
    [fsx] = [i for i in fast.items if i.name.startswith("FSx")]
    assert fsx.usd_per_hour == pytest.approx(4800 * 0.60 / 730)


def test_gpu_nodes_kept_warm_are_standing_and_no_partial_start_adds_to_them() -> None:
    values = {"gpuNodes": {"instanceType": "g5.xlarge", "count": 2, "keepWarm": True},
              "cost": {"maxUsdPerRun": None}}  # fmt: skip
    plan = plan_run(parse_stack_config(values, stack_name="warm"))
    warm = {i.name: i.usd_per_hour for i in plan.standing.items}
    assert warm["GPU nodes kept warm (2 x g5.xlarge)"] == pytest.approx(2 * 1.006)
    assert plan.cost is not None and plan.cost.partial_start_worst_usd is None
    leased_values = {**values, "gpuNodes": {"instanceType": "g5.xlarge", "count": 2}}
    leased = plan_run(parse_stack_config(leased_values, stack_name="leased"))
    assert not any(name.startswith("GPU nodes") for name in (i.name for i in leased.standing.items))
    assert leased.cost is not None and leased.cost.partial_start_worst_usd == pytest.approx(
        1.006 * (1 + 10 / 60), abs=0.01
    )


def test_an_existing_cluster_stands_only_for_the_file_system_it_creates() -> None:
    plan = plan_run(load_stack_file("team-cluster"))
    assert plan.standing.items == () and plan.standing.usd_per_day == 0
    assert plan.cost is not None and plan.cost.partial_start_worst_usd is None


def test_an_unpriced_system_type_is_reported_not_refused() -> None:
    standing = standing_of(cluster={"systemNodes": {"instanceType": "c7i.large"}})
    assert standing.unpriced == ["system nodes (2 x c7i.large)"]
    assert standing.summary().startswith("at least $")


def test_every_standing_price_names_its_source() -> None:
    prices = [
        *STANDING_PRICES.values(),
        *FSX_PERSISTENT_2_USD_PER_GB_MONTH.values(),
        *SYSTEM_NODE_USD_PER_HOUR.values(),
    ]
    for price in prices:
        source = SOURCES[price.source]
        assert source.url.startswith("https://aws.amazon.com/") and date.fromisoformat(source.as_of)
        assert source.confirmed is False  # none was read from AWS itself
    assert set(FSX_PERSISTENT_2_USD_PER_GB_MONTH) == {125, 250, 500, 1000}
