"""The `cost` section: the spending ceiling a stack promises to stay under, and how to price it.

A reviewer approves an experiment partly on what it may cost, so the ceiling is written in
the stack file next to the experiment instead of living in someone's head. The estimate it
is checked against is "GPU nodes' $/hour x run hours" (see `infra.facts.prices`); the price table
is a published list price, so teams with negotiated rates, savings plans, a quoted capacity
block price or another region's prices can put the price they really pay here.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from infra.config.base import ConfigSection

DEFAULT_MAX_USD_PER_RUN = 100.0
"""Low on purpose: a stack that may spend more has to say so in a file a reviewer reads."""


class CostConfig(ConfigSection):
    """`fsdp-eks:cost`: the per-run cost ceiling and the inputs of the cost estimate."""

    max_usd_per_run: float | None = Field(
        default=DEFAULT_MAX_USD_PER_RUN,
        gt=0,
        description=(
            "Ceiling in USD for one run: the estimated $/hour of the GPU nodes times the run "
            "hours must not exceed it (the policy pack and the offline plan reject the stack "
            "otherwise). null switches the ceiling off."
        ),
    )
    priced_run_hours: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Hours to price one run at when the job has no deadline (job.maxRunHours); a run "
            "bounded only by training.maxSteps has no known length, so the stack states one. "
            "When the job has a deadline, the deadline is the worst case and is used instead."
        ),
    )
    max_run_hours: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Deprecated spelling of cost.pricedRunHours (it read like job.maxRunHours, the "
            "deadline); still read, with a warning in the plan."
        ),
    )
    usd_per_instance_hour: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Price actually paid per GPU node per hour (negotiated rate, savings plan, quoted "
            "capacity block price, another region). Default: the list price in "
            "infra/facts/prices.py for gpuNodes.instanceType and gpuNodes.capacity.type."
        ),
    )

    def run_hours(self, job_max_run_hours: float | None) -> float | None:
        """Hours one run is priced at: the job's deadline, else this section's `max_run_hours`.

        The deadline wins because the operator kills the job there, so it is the real worst
        case. None when neither is set: the ceiling cannot be checked without a length, and the
        stack model / the policy pack reject that combination.
        """
        if job_max_run_hours is not None:
            return job_max_run_hours
        return self.priced_run_hours if self.priced_run_hours is not None else self.max_run_hours

    @model_validator(mode="after")
    def _one_spelling(self) -> CostConfig:
        if self.priced_run_hours is not None and self.max_run_hours is not None:
            raise ValueError(
                f"cost.maxRunHours {self.max_run_hours:g} is the old spelling of "
                f"cost.pricedRunHours {self.priced_run_hours:g}; allowed: cost.pricedRunHours only"
            )
        return self

    def deprecations(self) -> list[str]:
        """One line per deprecated key the stack still uses."""
        if self.max_run_hours is None:
            return []
        return [
            "cost.maxRunHours is deprecated: it is the hours a run without a deadline is priced "
            "at, not a deadline (job.maxRunHours); write cost.pricedRunHours"
        ]
