"""The alerts component under the mock runtime: AMP rules and alert manager routed to the
stack's topic, e-mail subscribers, the publish policy AWS documents; an existing topic left
alone; a PrometheusRule for an existing cluster's operator."""

from __future__ import annotations

import json
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra.config import load_stack_file
from infra.config.alerts import AlertsConfig
from infra.estimates.run_plan import plan_run
from infra.job.alert_rules import alert_thresholds, rule_groups
from infra.offline import evaluate
from infra.platform.run_alerts import RunAlerts, RunAlertsArgs, email_resource_name

WORKSPACE_ID = "ws-0123abcd"
WORKSPACE_ARN = f"arn:aws:aps:us-west-2:123456789012:workspace/{WORKSPACE_ID}"
THRESHOLDS = alert_thresholds(plan_run(load_stack_file("dev")))


def evaluated(config: dict[str, Any], **args: Any) -> Any:
    def program() -> None:
        RunAlerts(
            "alerts",
            RunAlertsArgs(
                config=AlertsConfig.model_validate(config), thresholds=THRESHOLDS, **args
            ),
        )

    return evaluate(program, config={"aws:region": "us-west-2"})


def test_create_mode_routes_the_rules_to_the_stacks_topic() -> None:
    result = evaluated(
        {"email": ["ops@example.com", "ml@example.com"]},
        workspace_id=WORKSPACE_ID,
        workspace_arn=WORKSPACE_ARN,
    )
    (topic,) = result.of_type("aws:sns/topic:Topic")
    subscriptions = result.of_type("aws:sns/topicSubscription:TopicSubscription")
    assert sorted(s.inputs["endpoint"] for s in subscriptions) == [
        "ml@example.com",
        "ops@example.com",
    ]
    assert {s.inputs["protocol"] for s in subscriptions} == {"email"}
    assert {s.name for s in subscriptions} == {
        email_resource_name("alerts", "ops@example.com"),
        email_resource_name("alerts", "ml@example.com"),
    }
    (namespace,) = result.of_type("aws:amp/ruleGroupNamespace:RuleGroupNamespace")
    assert namespace.inputs["workspaceId"] == WORKSPACE_ID
    assert yaml.safe_load(namespace.inputs["data"]) == rule_groups(THRESHOLDS)
    (manager,) = result.of_type("aws:amp/alertManagerDefinition:AlertManagerDefinition")
    config = yaml.safe_load(yaml.safe_load(manager.inputs["definition"])["alertmanager_config"])
    topic_arn = topic.outputs.get("arn")
    assert {c["topic_arn"] for r in config["receivers"] for c in r["sns_configs"]} == {topic_arn}
    (policy,) = result.of_type("aws:sns/topicPolicy:TopicPolicy")
    (statement,) = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Principal"] == {"Service": "aps.amazonaws.com"}
    assert statement["Condition"]["ArnEquals"] == {"aws:SourceArn": WORKSPACE_ARN}
    assert set(statement["Action"]) == {"sns:Publish", "sns:GetTopicAttributes"}
    # The alert manager may publish only once the policy lets it.
    assert policy.urn in manager.dependencies


def test_an_existing_topic_keeps_its_policy_and_gets_the_statement_as_output() -> None:
    arn = "arn:aws:sns:us-west-2:123456789012:ml-alerts"
    result = evaluated({"snsTopicArn": arn}, workspace_id=WORKSPACE_ID, workspace_arn=WORKSPACE_ARN)
    assert not result.of_type("aws:sns/topic:Topic")
    assert not result.of_type("aws:sns/topicPolicy:TopicPolicy")
    (manager,) = result.of_type("aws:amp/alertManagerDefinition:AlertManagerDefinition")
    assert arn in manager.inputs["definition"]


def test_alerts_off_renders_nothing() -> None:
    result = evaluated({"enabled": False}, workspace_id=WORKSPACE_ID, workspace_arn=WORKSPACE_ARN)
    assert [r.type for r in result.resources] == ["fsdp-eks:observability:RunAlerts"]


def test_an_existing_clusters_operator_gets_a_prometheus_rule() -> None:
    def program() -> None:
        provider = k8s.Provider("k8s", kubeconfig="{}")
        RunAlerts(
            "alerts",
            RunAlertsArgs(
                config=AlertsConfig(),
                thresholds=THRESHOLDS,
                prometheus_rule_namespace="monitoring",
                k8s_provider=provider,
            ),
            opts=pulumi.ResourceOptions(),
        )

    result = evaluate(program, config={"aws:region": "us-west-2"})
    (rule,) = result.of_type("kubernetes:monitoring.coreos.com/v1:PrometheusRule")
    assert rule.inputs["metadata"]["namespace"] == "monitoring"
    assert rule.inputs["spec"] == rule_groups(THRESHOLDS)
    assert not result.of_type("aws:sns/topic:Topic")
