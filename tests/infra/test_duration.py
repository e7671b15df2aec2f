"""The run-length estimate: the trainer's own MFU arithmetic (trainer.flops), checkpoint writes
and start-up, with a range from the per-GPU MFU assumption; and what the plan does with it."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import StackConfigError, load_stack_file, parse_stack_config
from infra.config.job import DEFAULT_START_TIMEOUT_MINUTES
from infra.estimates.duration import (
    MFU_BY_GPU,
    STARTUP_HOURS,
    checkpoint_saves,
    checkpoint_seconds,
    estimate_duration,
    shape_flops_config,
    steps_within,
)
from infra.estimates.run_plan import plan_run
from infra.facts.instances import INSTANCE_FACTS
from infra.job.stack_checks import checked_run_plan
from trainer.flops import flops_per_token
from trainer.presets import PRESETS


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_shape_adapter_gives_the_trainers_flops_for_every_preset(preset: str) -> None:
    """What the trainer logs MFU with (flops_per_token of the transformers config that
    trainer.models.hf_config_from builds) is what the estimate uses, for every preset."""
    from trainer.models import hf_config_from

    shape = PRESETS[preset]
    for seq_len in (2048, 8192):
        assert flops_per_token(shape_flops_config(shape), seq_len) == flops_per_token(
            hf_config_from(shape), seq_len
        )


def test_llama31_8b_on_32_h100_by_hand() -> None:
    """10,000 steps x 256 x 8192 tokens of Llama 3.1 8B on 32 H100s at 40% MFU is about 26.6 h
    (the figure the review quoted): the formula, not a re-derivation, gives it."""
    shipped = load_stack_file("llama31-8b-p5")
    training = shipped.training.model_copy(update={"max_steps": 10_000})
    config = shipped.model_copy(update={"training": training})
    estimate = estimate_duration(config, mfu=0.40, startup_hours=0)
    assert estimate.tokens == 10_000 * 256 * 8192
    assert estimate.gpus == 32 and estimate.peak_flops_per_gpu == 989.4e12
    assert estimate.training_hours == pytest.approx(26.64, abs=0.01)


def test_the_worked_example_of_the_docs() -> None:
    """docs/design/estimates.md#duration and docs/operations.md: llama31-8b-p5 as shipped."""
    estimate = estimate_duration(load_stack_file("llama31-8b-p5"))
    assert estimate.tokens == 3_500 * 256 * 8192
    assert estimate.flops_per_token == pytest.approx(57.9e9, rel=1e-3)
    assert estimate.training_hours == pytest.approx(10.66, abs=0.01)
    # 7 saves of 8.03B parameters x 12 bytes at 250 MB/s/TiB x 2400 GiB of FSx, 164 s each: in
    # the background of 500 steps (1.5 h) but the last, written whole.
    assert estimate.checkpoint_hours == pytest.approx(8.03e9 * 12 / 585.9e6 / 3600, rel=0.01)
    assert estimate.hours == pytest.approx(11.2, abs=0.05)
    assert estimate.low_hours < estimate.hours < estimate.high_hours
    assert estimate.high_hours == pytest.approx(
        estimate.training_hours_at(0.25) + estimate.checkpoint_hours + 1.0  # the 60 min budget
    )
    assert "range 9.4-16.0 h" in estimate.summary() and "assumed" in estimate.summary()


@pytest.mark.parametrize(
    ("extra", "every", "saves_stalled"),
    [
        ({"async_checkpoint": 0}, 500, 7.0),  # every write stalls the steps
        ({}, 500, 1.0),  # the writes hide behind 1.5 h of steps; the last is written whole
    ],
)
def test_checkpoint_stalls_follow_the_save_mode(
    extra: dict[str, Any], every: int, saves_stalled: float
) -> None:
    shipped = load_stack_file("llama31-8b-p5")
    training = shipped.training.model_copy(update={"extra_args": extra, "checkpoint_every": every})
    config = shipped.model_copy(update={"training": training})
    write_h = checkpoint_seconds(config) / 3600
    assert estimate_duration(config).checkpoint_hours == pytest.approx(saves_stalled * write_h)


def test_a_background_write_longer_than_its_interval_holds_the_next_save() -> None:
    """Saves every 10 steps (~110 s of steps) of a 164 s write: each periodic save costs the
    54 s its write outlasts the interval; the last, its whole write."""
    shipped = load_stack_file("llama31-8b-p5")
    training = shipped.training.model_copy(update={"checkpoint_every": 10})
    config = shipped.model_copy(update={"training": training})
    estimate = estimate_duration(config)
    write_s = checkpoint_seconds(config)
    interval_s = estimate.training_hours * 3600 / 3500 * 10
    assert 0 < interval_s < write_s
    expected = write_s + (checkpoint_saves(config) - 1) * (write_s - interval_s)
    assert estimate.checkpoint_hours == pytest.approx(expected / 3600)


def test_every_gpu_the_instance_table_knows_has_an_mfu_assumption() -> None:
    for instance_type, facts in INSTANCE_FACTS.items():
        mfu = MFU_BY_GPU.get(facts.gpu_model)
        assert mfu is not None, instance_type
        assert 0 < mfu.low <= mfu.expected <= mfu.high < 1 and mfu.source


@pytest.mark.parametrize(
    ("max_steps", "every", "saves"), [(1000, 500, 2), (1001, 500, 3), (200, 0, 1), (10, 500, 1)]
)
def test_checkpoint_saves_count_the_periodic_ones_and_the_last(
    max_steps: int, every: int, saves: int
) -> None:
    config = load_stack_file("dev")
    training = config.training.model_copy(
        update={"max_steps": max_steps, "checkpoint_every": every}
    )
    assert checkpoint_saves(config.model_copy(update={"training": training})) == saves


def test_a_bad_mfu_is_refused() -> None:
    config = load_stack_file("dev")
    with pytest.raises(ValueError, match="mfu"):
        estimate_duration(config, mfu=0)


P4D: dict[str, Any] = {
    "fsdp-eks:gpuNodes": {"instanceType": "p4d.24xlarge", "count": 2},
    "fsdp-eks:model": {"preset": "llama2-7b"},
    "fsdp-eks:cost": {"maxUsdPerRun": None},
}


def parse(job: dict[str, Any], training: dict[str, Any]) -> Any:
    values = {**P4D, "fsdp-eks:job": job, "fsdp-eks:training": training}
    return checked_run_plan(values, stack_name="duration").config


def test_a_run_longer_than_its_deadline_is_refused_with_what_to_change() -> None:
    with pytest.raises(StackConfigError) as error:
        parse({"maxRunHours": 4}, {"maxSteps": 5000, "globalBatchSize": 64})
    [message] = [p for p in error.value.problems if "job.maxRunHours 4 " in p]
    assert "training.maxSteps 5000 takes ~" in message
    assert "raise job.maxRunHours to at least" in message and "gpuNodes.count" in message
    steps = int(message.split("lower training.maxSteps to at most ")[1].split(",")[0])
    fitting = parse({"maxRunHours": 4}, {"maxSteps": steps, "globalBatchSize": 64})
    assert estimate_duration(fitting).hours <= 4
    assert steps_within(fitting, 4) == steps


def test_a_run_that_fits_only_at_the_expected_mfu_is_a_warning() -> None:
    config = parse({"maxRunHours": 4}, {"maxSteps": 3000, "globalBatchSize": 64})
    estimate = estimate_duration(config)
    assert estimate.hours <= 4 < estimate.high_hours
    [warning] = [w for w in plan_run(config).warnings if w.startswith("duration:")]
    assert "beyond job.maxRunHours 4" in warning


def test_the_cost_shows_the_expected_run_beside_the_deadline_worst_case() -> None:
    config = load_stack_file("llama31-8b-p5")
    cost = plan_run(config).cost
    assert cost is not None
    hours = estimate_duration(config).hours
    assert cost.expected_hours == pytest.approx(hours)
    # The estimate plus the leased nodes' idle tail before the autoscaler removes them.
    assert cost.lease_tail_hours == pytest.approx(10 / 60)
    assert cost.expected_usd == pytest.approx(cost.usd_per_hour * (hours + 10 / 60), abs=0.01)
    assert "GPU nodes 0 -> 4 for the job, 0 again ~10 min after it" in cost.summary()
    assert cost.usd_per_run == pytest.approx(cost.usd_per_hour * 12, abs=0.01)
    # The tail is said apart from the run, and the sum is the expected figure.
    run_usd = cost.usd_per_hour * hours
    assert (
        f"expected ~${run_usd:,.2f} for the run (~{hours:.1f} h) + ~${cost.tail_usd:,.2f} for the "
        f"~10 min the nodes idle before scale-down = ~${cost.expected_usd:,.2f}"
    ) in cost.summary()
    assert cost.as_outputs()["expectedUsd"] == cost.expected_usd


def test_start_up_allowance_is_within_the_default_start_budget() -> None:
    assert 0 < STARTUP_HOURS <= DEFAULT_START_TIMEOUT_MINUTES / 60


def test_the_top_of_the_range_spends_the_stack_s_start_budget() -> None:
    stack = load_stack_file("llama31-8b-p5")
    longer = stack.model_copy(
        update={"job": stack.job.model_copy(update={"start_timeout_minutes": 180})}
    )
    shipped, patient = estimate_duration(stack), estimate_duration(longer)
    assert patient.hours == pytest.approx(shipped.hours)
    assert patient.high_hours == pytest.approx(shipped.high_hours + 2.0)


def test_a_run_without_a_deadline_is_warned_that_a_frozen_worker_0_holds_it() -> None:
    """No rendezvous timeout ends a call to a frozen store host (tests/infra/test_rendezvous.py
    `test_a_hung_worker_0_holds_the_others_past_any_read_timeout`): only the deadline does."""
    values = {
        "gpuNodes": {"instanceType": "g5.xlarge", "count": 1},
        "training": {"maxSteps": 1},
        "cost": {"maxUsdPerRun": None},
    }
    unbounded = plan_run(parse_stack_config(values, stack_name="x"))
    [warning] = [w for w in unbounded.warnings if w.startswith("job.maxRunHours is not set")]
    assert "worker 0 freezes" in warning
    bounded = plan_run(parse_stack_config({**values, "job": {"maxRunHours": 1}}, stack_name="x"))
    assert not [w for w in bounded.warnings if w.startswith("job.maxRunHours")]
