"""Alerts that reach a person: the run's rules where its metrics are, routed to SNS.

AMP's rules and alert manager in create mode, a PrometheusRule on an existing cluster; the
rules from `infra.job.alert_rules`. The topic policy carries AWS's confused-deputy conditions.
Why, with sources: docs/design/platform.md#run_alerts
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra.config.alerts import AlertsConfig
from infra.job.alert_rules import (
    AlertThresholds,
    alertmanager_definition,
    prometheus_rule,
    rules_yaml,
)


def publish_statement(topic_arn: str, workspace_arn: str, account_id: str) -> dict[str, Any]:
    """The one statement that lets this workspace's alert manager publish to the topic."""
    return {
        "Sid": "AmpAlertManagerPublishes",
        "Effect": "Allow",
        "Principal": {"Service": "aps.amazonaws.com"},
        "Action": ["sns:Publish", "sns:GetTopicAttributes"],
        "Resource": topic_arn,
        "Condition": {
            "ArnEquals": {"aws:SourceArn": workspace_arn},
            "StringEquals": {"aws:SourceAccount": account_id},
        },
    }


def email_resource_name(prefix: str, address: str) -> str:
    """A subscription's name from its address: reordering the list replaces nothing."""
    return f"{prefix}-email-{hashlib.sha256(address.encode()).hexdigest()[:10]}"


@dataclass
class RunAlertsArgs:
    config: AlertsConfig
    thresholds: AlertThresholds
    workspace_id: pulumi.Input[str] | None = None
    """The AMP workspace that scrapes the run (create mode); None: no AMP rules."""
    workspace_arn: pulumi.Input[str] | None = None
    prometheus_rule_namespace: str | None = None
    """Where an existing cluster's prometheus-operator reads PrometheusRules; None: none."""
    k8s_provider: pulumi.ProviderResource | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


class RunAlerts(pulumi.ComponentResource):
    """The run's alert rules and the SNS topic they reach people through."""

    topic_arn: pulumi.Output[str] | None
    topic_policy: pulumi.Output[Any] | None
    """The statement to add to an existing topic's policy (None for the stack's own topic)."""

    def __init__(
        self, name: str, args: RunAlertsArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:observability:RunAlerts", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        config, t = args.config, args.thresholds
        self.topic_arn = None
        self.topic_policy = None
        amp = args.workspace_id is not None and args.workspace_arn is not None
        if config.enabled and amp:
            self._amp_alerts(name, args, child)
        if config.enabled and args.prometheus_rule_namespace is not None:
            rule = prometheus_rule(
                t, name=f"fsdp-eks-{t.stack}", namespace=args.prometheus_rule_namespace
            )
            k8s.apiextensions.CustomResource(
                f"{name}-prometheus-rule",
                api_version=rule["apiVersion"],
                kind=rule["kind"],
                metadata=rule["metadata"],
                spec=rule["spec"],
                opts=pulumi.ResourceOptions(parent=self, provider=args.k8s_provider),
            )
        self.register_outputs({"topicArn": self.topic_arn, "topicPolicy": self.topic_policy})

    def _amp_alerts(self, name: str, args: RunAlertsArgs, child: pulumi.ResourceOptions) -> None:
        config, t = args.config, args.thresholds
        assert args.workspace_id is not None and args.workspace_arn is not None
        account = aws.get_caller_identity_output().account_id
        if config.sns_topic_arn is None:
            topic = aws.sns.Topic(f"{name}-topic", tags=dict(args.tags), opts=child)
            for address in config.email:
                aws.sns.TopicSubscription(
                    email_resource_name(name, address),
                    topic=topic.arn,
                    protocol="email",
                    endpoint=address,
                    opts=child,
                )
            policy = aws.sns.TopicPolicy(
                f"{name}-topic-policy",
                arn=topic.arn,
                policy=pulumi.Output.all(topic.arn, args.workspace_arn, account).apply(
                    lambda v: json.dumps(
                        {"Version": "2012-10-17", "Statement": [publish_statement(*v)]}
                    )
                ),
                opts=child,
            )
            topic_arn: pulumi.Output[str] = topic.arn
            publishable: list[pulumi.Resource] = [policy]
        else:
            topic_arn = pulumi.Output.from_input(config.sns_topic_arn)
            self.topic_policy = pulumi.Output.all(topic_arn, args.workspace_arn, account).apply(
                lambda v: publish_statement(*v)
            )
            publishable = []
        self.topic_arn = topic_arn
        aws.amp.RuleGroupNamespace(
            f"{name}-rules",
            name=f"fsdp-eks-{t.stack}",
            workspace_id=args.workspace_id,
            data=rules_yaml(t),
            tags=dict(args.tags),
            opts=child,
        )
        region = aws.get_region_output().region
        aws.amp.AlertManagerDefinition(
            f"{name}-alertmanager",
            workspace_id=args.workspace_id,
            definition=pulumi.Output.all(topic_arn, region).apply(
                lambda v: alertmanager_definition(v[0], v[1])
            ),
            # Alerts sent before AMP may publish would be lost: the policy first.
            opts=pulumi.ResourceOptions(parent=self, depends_on=publishable),
        )
