"""The run's plan: every figure derived from a valid stack, computed once and handed down.

The renderer (`infra.job`), the platform components, the plan printout and the stack outputs
all need the same derived figures: how the run shards and checkpoints (`auto` resolved), its
peak memory, how long it takes, what it costs, and the timeouts that follow from those (a
checkpoint's write time, the shutdown grace, the watchdog's floor, the start budget). They
read them here instead of each asking the estimators for one figure at a time, so the job and
the plan can never disagree on a timeout.

`plan_run` never raises on a run that cannot go ahead: its `problems` say why (over memory,
over the deadline, over the cost ceiling, unpriced), and the checks above decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.estimates.cost import CostEstimate, StandingCost, cost_estimate, standing_cost
from infra.estimates.duration import (
    DurationEstimate,
    UnknownPeakError,
    checkpoint_seconds,
    estimate_duration,
    shutdown_grace_seconds,
    steps_within,
    watchdog_floor_seconds,
)
from infra.estimates.memory_fit import (
    MemoryFit,
    Parallelism,
    memory_fit,
    memory_problems,
    memory_warnings,
    parallelism,
)
from infra.estimates.metrics_cost import MetricsPlan, plan_metrics
from infra.estimates.stop_save import stop_save_warnings
from infra.facts.hub_models import HUB_MODELS
from infra.facts.prices import PriceUnknownError

if TYPE_CHECKING:
    from infra.config import StackConfig


@dataclass(frozen=True)
class RunTimeouts:
    """The timeouts the job renders, each sized from the run's own figures."""

    checkpoint_seconds: float
    """One checkpoint's write time at the storage's throughput."""
    shutdown_grace_seconds: int
    """SIGTERM to exit: the step in flight and two saves (infra.estimates.duration)."""
    watchdog_floor_seconds: int
    """The trainer's `--watchdog_floor_s`: a save between two steps is no hang."""
    start_budget_seconds: int
    """All workers placed and joined within this, or none (`job.startTimeoutMinutes`)."""


@dataclass(frozen=True)
class RunPlan:
    """One stack's run as planned: the config and every figure derived from it."""

    config: StackConfig
    parallelism: Parallelism
    """Sharding and activation checkpointing, `auto` resolved by the memory estimate."""
    memory: MemoryFit
    duration: DurationEstimate | None
    """None when the GPU has no peak FLOP/s or MFU figures (a problem says so)."""
    cost: CostEstimate | None
    """None when the GPU node has no price (a problem says so)."""
    standing: StandingCost
    """What the stack bills until `pulumi destroy`, run or no run (control plane, system
    nodes, NAT, FSx, ...): shown beside the run's cost, never part of its ceiling."""
    metrics: MetricsPlan
    """Whether the run's metrics are collected (`observability.enabled: auto` resolved), where,
    and what they cost; the standing cost includes its collector."""
    problems: tuple[str, ...]
    """Why the run must not start, one line each; empty for a run that may."""
    warnings: tuple[str, ...]
    """What a valid run should still hear before it costs anything."""
    _timeouts: RunTimeouts | None

    @property
    def has_timeouts(self) -> bool:
        return self._timeouts is not None

    @property
    def timeouts(self) -> RunTimeouts:
        """The job's timeouts; a run without a duration estimate has none to render."""
        if self._timeouts is None:
            raise ValueError(
                "the run has no duration estimate, so no timeouts to render: "
                + "; ".join(self.problems)
            )
        return self._timeouts


def plan_run(config: StackConfig, *, region: str | None = None) -> RunPlan:
    """Estimate `config`'s run once: its parallelism, memory, duration, cost and timeouts;
    `region` is the stack's `aws:region` (None: not set), which its prices are for."""
    chosen = parallelism(config)
    fit = memory_fit(config)
    problems = memory_problems(config)
    warnings = memory_warnings(config)
    duration: DurationEstimate | None = None
    timeouts: RunTimeouts | None = None
    try:
        duration = estimate_duration(config)
    except UnknownPeakError as err:
        problems.append(f"gpuNodes.instanceType {config.gpu_nodes.instance_type!r}: {err}")
    if duration is not None:
        save_s = checkpoint_seconds(config)
        grace_s = shutdown_grace_seconds(
            duration, max_steps=config.training.max_steps, checkpoint_s=save_s
        )
        timeouts = RunTimeouts(
            checkpoint_seconds=save_s,
            shutdown_grace_seconds=grace_s,
            watchdog_floor_seconds=watchdog_floor_seconds(grace_s),
            start_budget_seconds=config.job.start_timeout_seconds,
        )
        # Beside a memory problem too: the duration is the plan's as it stands, and a fix for
        # both at once (more nodes) is one a person can only choose knowing both.
        problems.extend(_deadline_problems(config, duration))
        warnings.extend(_deadline_warnings(config, duration))
        warnings.extend(stop_save_warnings(config, grace_s=grace_s, checkpoint_s=save_s))
    if config.job.max_run_hours is None:
        warnings.append(_NO_DEADLINE)
    warnings.extend(_init_from_warnings(config))
    warnings.extend(config.cost.deprecations())
    warnings.extend(_checkpoint_cadence_warnings(config))
    cost: CostEstimate | None = None
    try:
        cost = cost_estimate(
            config, expected_hours=duration.hours if duration else None, region=region
        )
    except PriceUnknownError as err:
        problems.append(f"gpuNodes.instanceType: {err}")
    else:
        problems.extend(_ceiling_problems(config, cost))
    metrics = plan_metrics(
        config,
        gpu_usd_per_hour=cost.usd_per_hour if cost is not None else None,
        expected_hours=duration.hours if duration is not None else None,
    )
    warnings.extend(_idle_gpu_warnings(config, cost))
    return RunPlan(
        config=config,
        parallelism=chosen,
        memory=fit,
        duration=duration,
        cost=cost,
        standing=standing_cost(config, metrics, region=region),
        metrics=metrics,
        problems=tuple(problems),
        warnings=tuple(warnings),
        _timeouts=timeouts,
    )


def _deadline_problems(config: StackConfig, estimate: DurationEstimate) -> list[str]:
    """A run expected to outlast its own deadline is killed half way, after it was paid for."""
    deadline = config.job.max_run_hours
    if deadline is None or estimate.hours <= deadline:
        return []
    steps = steps_within(config, deadline)
    fewer = f"lower training.maxSteps to at most {steps}, " if steps else ""
    return [
        f"job.maxRunHours {deadline:g} is shorter than the run: training.maxSteps "
        f"{config.training.max_steps} takes {estimate.summary()}; raise job.maxRunHours to at "
        f"least {math.ceil(estimate.hours)} (and cost.maxUsdPerRun with it), {fewer}or add "
        "GPU nodes (gpuNodes.count)"
    ]


_NO_DEADLINE = (
    "job.maxRunHours is not set: a run whose worker 0 freezes mid-run (its node hung, not "
    "gone) holds every GPU node until someone deletes its pods, because no rendezvous timeout "
    "ends a call to a frozen store host (docs/operations.md, 'A worker 0 that hangs mid-run'); "
    "set a deadline a little beyond the expected duration"
)


def _init_from_warnings(config: StackConfig) -> list[str]:
    """Weights the plan cannot read (a path on the volume, an id `infra.facts.hub_models` does
    not know) decide the model the trainer builds, which the estimates cannot see."""
    init_from, preset = config.model.init_from, config.model.preset
    known = HUB_MODELS.get(init_from) if init_from is not None else None
    if init_from is None or (known is not None and known.preset is not None):
        return []  # none, or a known architecture (another preset's is refused)
    return [
        f"model.initFrom {init_from!r} is read only when the pods start: the trainer builds "
        "the architecture of its config.json, and every estimate (memory, time, cost) assumes "
        f"model.preset {preset!r}'s; check that the weights are a {preset}"
    ]


def _idle_gpu_warnings(config: StackConfig, cost: CostEstimate | None) -> list[str]:
    """`job.gpusPerNode` below the instance's GPUs: EC2 bills the whole node, GPUs idle or not."""
    used, facts = config.job.gpus_per_node, config.instance
    if used is None or used >= facts.gpus:
        return []
    instance_type = config.gpu_nodes.instance_type
    bill = (
        f" (${cost.usd_per_instance_hour:,.2f}/hour a node, ${cost.usd_per_hour:,.2f}/hour for "
        f"{cost.count} node{'s' if cost.count != 1 else ''}, as the cost line shows)"
        if cost is not None
        else ""
    )
    return [
        f"job.gpusPerNode {used} runs {used} trainer processes on each {instance_type}, which "
        f"has {facts.gpus} GPUs: every node bills all {facts.gpus}{bill} while "
        f"{facts.gpus - used} per node sit idle; leave job.gpusPerNode out to use them all, or "
        f"choose a gpuNodes.instanceType with {used} GPUs"
    ]


def _checkpoint_cadence_warnings(config: StackConfig) -> list[str]:
    """A cadence at or beyond the last step saves only at the end: a failure before it loses
    the whole run."""
    training = config.training
    every, steps = training.checkpoint_every, training.max_steps
    if not every or every < steps:
        return []
    return [
        f"training.checkpointEvery {every} is not below training.maxSteps {steps}: the run "
        f"saves only at its end (step {steps}), so a stop or a failure before then starts it "
        f"again from step 0; set training.checkpointEvery below {steps} (0 says 'only at the "
        "end' on purpose, without this warning)"
    ]


def _deadline_warnings(config: StackConfig, estimate: DurationEstimate) -> list[str]:
    deadline = config.job.max_run_hours
    if deadline is None or estimate.high_hours <= deadline:
        return []
    return [
        f"duration: at the low end of the assumed MFU the run takes ~{estimate.high_hours:.1f} h, "
        f"beyond job.maxRunHours {deadline:g}: it may stop before training.maxSteps "
        f"{config.training.max_steps} (its last checkpoint is kept; resume from it)"
    ]


def _ceiling_problems(config: StackConfig, estimate: CostEstimate) -> list[str]:
    """A run must be priced under its ceiling before anything is created."""
    cost = config.cost
    if not estimate.exceeds_ceiling:
        return []
    if estimate.usd_per_run is None:
        return [
            f"cost.maxUsdPerRun {cost.max_usd_per_run:g} needs a run length to check against: "
            "set job.maxRunHours (a deadline, recommended) or cost.maxRunHours, or "
            "cost.maxUsdPerRun: null to switch the ceiling off"
        ]
    return [
        f"cost.maxUsdPerRun {cost.max_usd_per_run:g} is below the estimate "
        f"${estimate.usd_per_run:,.2f} ({estimate.summary()}); raise the ceiling, shorten "
        "job.maxRunHours or use fewer/cheaper gpuNodes"
    ]
