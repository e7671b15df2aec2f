"""The `alerts` section: who hears about the run, and how far from the plan is too far.

The rules themselves (`infra.job.alert_rules`) are derived from the run plan; this section
only names the people (an SNS topic the stack creates with e-mail subscribers, or a topic
that exists) and the two fractions a team may want to tune: how slow is slow, and at which
share of the cost ceiling someone should hear about the spend.
"""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from infra.config.base import ConfigSection

# An address SNS's email protocol can deliver to: one @, a dotted domain, no spaces.
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_SNS_TOPIC_ARN = re.compile(r"^arn:aws[a-z-]*:sns:[a-z0-9-]+:\d{12}:[A-Za-z0-9_-]{1,256}$")


class AlertsConfig(ConfigSection):
    """`fsdp-eks:alerts`: where the run's alerts go and the thresholds a stack may tune."""

    enabled: bool = Field(
        default=True,
        description=(
            "Render the run's alert rules (failed, finished, hung, diverged, slow, GPU and "
            "EFA errors, idle GPU nodes, spend) where the stack's metrics go. false: no rules "
            "and no topic; the dashboard is still written."
        ),
    )
    email: list[str] = Field(
        default_factory=list,
        description=(
            "Addresses the stack subscribes to a new SNS topic (each must confirm the e-mail "
            "SNS sends). Empty and no snsTopicArn: the rules still evaluate, nobody is told."
        ),
    )
    sns_topic_arn: str | None = Field(
        default=None,
        description=(
            "An existing SNS topic (same account and region) instead of a new one. The stack "
            "does not change its policy: add the statement in the `alerts.topicPolicy` output "
            "so that Amazon Managed Service for Prometheus may publish to it."
        ),
    )
    throughput_floor: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description=(
            "The slow-run alert fires when tokens/s stays below this share of the plan's "
            "expected tokens/s for 15 minutes."
        ),
    )
    spend_warning: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description=(
            "The spend alert fires once when the run's GPU-node spend (run time x the plan's "
            "$/hour) passes this share of cost.maxUsdPerRun."
        ),
    )

    @field_validator("email")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        bad = [address for address in value if not _EMAIL.match(address)]
        if bad:
            raise ValueError(
                f"alerts.email {bad[0]!r} is not an e-mail address; allowed: a list of "
                "addresses like ops@example.com"
            )
        if len(set(value)) != len(value):
            twice = next(a for a in value if value.count(a) > 1)
            raise ValueError(f"alerts.email lists {twice!r} twice; list each address once")
        return value

    @field_validator("sns_topic_arn")
    @classmethod
    def _topic_is_arn(cls, value: str | None) -> str | None:
        if value is not None and not _SNS_TOPIC_ARN.match(value):
            raise ValueError(
                f"alerts.snsTopicArn {value!r} is not an SNS topic ARN "
                "(arn:aws:sns:<region>:<account>:<topic>)"
            )
        return value

    @model_validator(mode="after")
    def _one_destination(self) -> AlertsConfig:
        if self.email and self.sns_topic_arn is not None:
            # Subscribing people to a topic the stack does not own would outlive the stack.
            raise ValueError(
                "alerts.email and alerts.snsTopicArn are both set; allowed: email (the stack "
                "creates a topic and subscribes them) or snsTopicArn (subscribe people to "
                "that topic yourself)"
            )
        return self

    @property
    def creates_topic(self) -> bool:
        """Whether the stack owns a topic: alerts on and no existing topic named."""
        return self.enabled and self.sns_topic_arn is None
