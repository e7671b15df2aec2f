"""The run's alert rules under the real `promtool`: each alert fires on the series it is for,
and no other alert fires on them; a healthy run fires none.

The thresholds are the `dev` stack's plan (a step every ~0.46 s, ~8,900 tokens/s expected,
so slow below ~4,456; a hang after 300 s; $1.006/h against a $5 ceiling, warned at $4).
Series are written in promtool's expanding notation (`a+bxN`: N more values, each b more;
`_` no sample; `stale` a staleness marker) at one sample a minute.
"""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.alert_rules import (
    AlertThresholds,
    alert_thresholds,
    alertmanager_definition,
    prometheus_rule,
    rule_groups,
    rules_yaml,
)
from tests.crd_schemas import openapi_schema
from tests.prometheus_tools import require_binary

STACK = "dev"
RUN = "r1"


@pytest.fixture(scope="module")
def thresholds() -> AlertThresholds:
    return alert_thresholds(plan_run(load_stack_file(STACK)))


@pytest.fixture(scope="module")
def promtool() -> str:
    return require_binary("promtool")


def alert_names(t: AlertThresholds) -> list[str]:
    return [r["alert"] for g in rule_groups(t)["groups"] for r in g["rules"]]


def annotations_of(t: AlertThresholds, alert: str) -> dict[str, str]:
    rule = next(r for g in rule_groups(t)["groups"] for r in g["rules"] if r["alert"] == alert)
    return dict(rule["annotations"])


def rendered(template: str, labels: dict[str, str], value: str | None) -> str:
    """The annotation as Prometheus's template engine renders it for these labels/value."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], template)
    return re.sub(r"\{\{ \$value[^}]*\}\}", lambda m: value or "", text)


def trainer(metric: str, values: str, **labels: str) -> dict[str, str]:
    base = {"stack": STACK, "run": RUN, "node": "n1", "rank": "0", **labels}
    inner = ",".join(f'{k}="{v}"' for k, v in base.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def node(metric: str, values: str, **labels: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def states(current: dict[str, str]) -> list[dict[str, str]]:
    """`fsdp_run_state`'s enum series: the given states' values, 0 for the others as long as
    the first given state has samples."""
    names = ("starting", "training", "checkpointing", "rolling_back", "stopping", "finished",
             "failed")  # fmt: skip
    shape = next(iter(current.values()))
    zeros = " ".join("0" if v not in ("_", "stale") else v for v in shape.split())
    return [trainer("fsdp_run_state", current.get(n, zeros), state=n) for n in names]


def healthy(minutes: int) -> list[dict[str, str]]:
    """A run training at the plan's pace with healthy GPUs and EFA, for `minutes`."""
    n = minutes
    return [
        *states({"training": f"1x{n}"}),
        trainer("fsdp_train_last_step_timestamp_seconds", f"0+60x{n}"),
        trainer("fsdp_train_tokens_per_second", f"8900x{n}"),
        trainer("fsdp_train_loss", f"2.5x{n}"),
        trainer("fsdp_train_skipped_steps_total", f"0x{n}"),
        trainer("fsdp_train_rollbacks_total", f"0x{n}"),
        trainer("fsdp_checkpoint_failures_total", f"0x{n}"),
        node("DCGM_FI_DEV_GPU_UTIL", f"97x{n}", node="n1", gpu="0"),
        node("DCGM_EXP_XID_ERRORS_COUNT", f"0x{n}", node="n1", gpu="0", xid="13"),
        node("DCGM_EXP_GPU_HEALTH_STATUS", f"0x{n}", node="n1", gpu="0"),
        node("DCGM_FI_DEV_ROW_REMAP_FAILURE", f"0x{n}", node="n1", gpu="0"),
        *(
            node(f"efa_{counter}_total", f"0x{n}", node="n1", device="efa_0", port="1")
            for counter in (
                "rdma_read_wr_err",
                "rdma_write_wr_err",
                "retrans_timeout_events",
                "unresponsive_remote_events",
                "impaired_remote_conn_events",
            )
        ),
        node("efa_rx_bytes_total", f"0+1e9x{n}", node="n1", device="efa_0", port="1"),
        node("efa_retrans_bytes_total", f"0+1e3x{n}", node="n1", device="efa_0", port="1"),
    ]


def replaced(series: list[dict[str, str]], *changes: dict[str, str]) -> list[dict[str, str]]:
    """`series` with the entries of the same series name replaced by `changes`."""
    by_name = {c["series"]: c for c in changes}
    kept = [s for s in series if s["series"] not in by_name]
    return [*kept, *changes]


RUN_LABELS = {"stack": STACK, "run": RUN}
SCENARIOS: list[tuple[str, Any, str, str | None, dict[str, str], str | None]] = [
    # (case, series(thresholds), eval time, alert expected or None, its labels, its $value)
    ("healthy run", lambda t: healthy(60), "45m", None, {}, None),
    (
        "the trainer reports failed, then exits",
        lambda t: states({"training": "1x9 0 stale", "failed": "0x9 1 stale"}),
        "20m",
        "FsdpRunFailed",
        {**RUN_LABELS, "severity": "critical", "notify": "once"},
        None,
    ),
    (
        "a failed run's alert has resolved by itself 15 minutes later (said once)",
        lambda t: states({"training": "1x9 0 stale", "failed": "0x9 1 stale"}),
        "30m",
        None,
        {},
        None,
    ),
    (
        "the trainer reports finished, then exits",
        lambda t: states({"training": "1x9 0 stale", "finished": "0x9 1 stale"}),
        "20m",
        "FsdpRunFinished",
        {**RUN_LABELS, "severity": "info", "notify": "once"},
        None,
    ),
    (
        "the trainer stops on SIGTERM and exits",
        lambda t: states({"training": "1x9 0 stale", "stopping": "0x9 1 stale"}),
        "20m",
        "FsdpRunStopped",
        {**RUN_LABELS, "severity": "info", "notify": "once"},
        None,
    ),
    (
        "the trainer vanishes mid-run",
        lambda t: states({"training": "1x9 stale"}),
        "20m",
        "FsdpRunLost",
        {**RUN_LABELS, "severity": "critical", "notify": "once"},
        None,
    ),
    (
        "the trainer serves metrics but completes no step",
        lambda t: replaced(
            healthy(20), trainer("fsdp_train_last_step_timestamp_seconds", "0+60x5 300x15")
        ),
        "13m",
        "FsdpRunHung",
        {**RUN_LABELS, "severity": "critical"},
        "8m 0s",
    ),
    (
        "the loss turns infinite",
        lambda t: replaced(
            healthy(20), trainer("fsdp_train_loss", "2.5x10 " + " ".join(["Inf"] * 10))
        ),
        "15m",
        "FsdpRunNonFinite",
        {**RUN_LABELS, "severity": "critical"},
        None,
    ),
    (
        "the loss turns NaN",
        lambda t: replaced(
            healthy(20), trainer("fsdp_train_loss", "2.5x10 " + " ".join(["NaN"] * 10))
        ),
        "15m",
        "FsdpRunNonFinite",
        {**RUN_LABELS, "severity": "critical"},
        None,
    ),
    (
        "updates are skipped for a non-finite gradient",
        lambda t: replaced(healthy(20), trainer("fsdp_train_skipped_steps_total", "0x10 3x10")),
        "15m",
        "FsdpRunNonFinite",
        {**RUN_LABELS, "severity": "critical"},
        None,
    ),
    (
        "the run rolls back",
        lambda t: replaced(healthy(20), trainer("fsdp_train_rollbacks_total", "0x10 1x10")),
        "15m",
        "FsdpRunRolledBack",
        {**RUN_LABELS, "severity": "warning"},
        None,
    ),
    (
        "a checkpoint save fails",
        lambda t: replaced(healthy(20), trainer("fsdp_checkpoint_failures_total", "0x10 1x10")),
        "15m",
        "FsdpCheckpointFailed",
        {**RUN_LABELS, "severity": "warning"},
        None,
    ),
    (
        "tokens/s below the floor for 15 minutes",
        lambda t: replaced(healthy(25), trainer("fsdp_train_tokens_per_second", "3000x25")),
        "20m",
        "FsdpRunSlow",
        {**RUN_LABELS, "severity": "warning"},
        "3k",
    ),
    (
        "tokens/s below the floor for less than 15 minutes",
        lambda t: replaced(healthy(25), trainer("fsdp_train_tokens_per_second", "8900x10 3000x15")),
        "20m",
        None,
        {},
        None,
    ),
    (
        "four hours at $1.006/h pass 80% of the $5 ceiling",
        lambda t: healthy(245),
        "240m",
        "FsdpSpendNearCeiling",
        {**RUN_LABELS, "severity": "warning", "notify": "once"},
        "4",
    ),
    ("three hours do not", lambda t: healthy(245), "180m", None, {}, None),
    (
        "a GPU reports XID 79",
        lambda t: replaced(
            healthy(20),
            node("DCGM_EXP_XID_ERRORS_COUNT", "0x10 1x10", node="n1", gpu="0", xid="79"),
        ),
        "15m",
        "FsdpGpuXidError",
        {"node": "n1", "gpu": "0", "xid": "79", "severity": "critical"},
        None,
    ),
    (
        "DCGM's health watches report a failure",
        lambda t: replaced(
            healthy(20), node("DCGM_EXP_GPU_HEALTH_STATUS", "0x10 2x10", node="n1", gpu="0")
        ),
        "15m",
        "FsdpGpuUnhealthy",
        {"node": "n1", "gpu": "0", "severity": "critical"},
        None,
    ),
    (
        "a GPU fails to remap a row",
        lambda t: replaced(
            healthy(20),
            node("DCGM_FI_DEV_ROW_REMAP_FAILURE", "0x10 1x10", node="n1", gpu="0"),
        ),
        "15m",
        "FsdpGpuUnhealthy",
        {"node": "n1", "gpu": "0", "severity": "critical"},
        None,
    ),
    (
        "EFA retransmit timeouts keep rising",
        lambda t: replaced(
            healthy(30),
            node(
                "efa_retrans_timeout_events_total",
                "0+5x30",
                node="n1",
                device="efa_0",
                port="1",
            ),
        ),
        "25m",
        "FsdpEfaErrorsRising",
        {"node": "n1", "severity": "warning"},
        None,
    ),
    (
        "a GPU node is up with no trainer for 15 minutes",
        lambda t: [node("DCGM_FI_DEV_GPU_UTIL", "0x20", node="n1", gpu="0")],
        "16m",
        "FsdpGpuNodesIdle",
        {"node": "n1", "severity": "warning"},
        None,
    ),
    (
        "a GPU node up for 10 minutes before the trainer starts is not idle yet",
        lambda t: [node("DCGM_FI_DEV_GPU_UTIL", "0x20", node="n1", gpu="0")],
        "10m",
        None,
        {},
        None,
    ),
]


def unit_test_file(t: AlertThresholds, rules: Path) -> dict[str, Any]:
    tests = []
    for _, series, at, alert, labels, value in SCENARIOS:
        checks = []
        for name in alert_names(t):
            expected = []
            if name == alert:
                notes = {k: rendered(v, labels, value) for k, v in annotations_of(t, name).items()}
                expected = [{"exp_labels": labels, "exp_annotations": notes}]
            checks.append({"eval_time": at, "alertname": name, "exp_alerts": expected})
        tests.append({"interval": "1m", "input_series": series(t), "alert_rule_test": checks})
    return {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests}


def test_the_rendered_rules_pass_promtool_check(
    thresholds: AlertThresholds, promtool: str, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(thresholds))
    result = subprocess.run(
        [promtool, "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_names(thresholds))} rules found" in result.stdout


def test_each_alert_fires_on_its_series_and_only_there(
    thresholds: AlertThresholds, promtool: str, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(rules_yaml(thresholds))
    spec = tmp_path / "tests.yaml"
    spec.write_text(yaml.safe_dump(unit_test_file(thresholds, rules), sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(spec)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_scenario_that_fires_it(thresholds: AlertThresholds) -> None:
    fired = {scenario[3] for scenario in SCENARIOS}
    assert set(alert_names(thresholds)) <= fired


def test_thresholds_follow_the_plan(thresholds: AlertThresholds) -> None:
    plan = plan_run(load_stack_file(STACK))
    assert plan.duration is not None and plan.cost is not None
    usd_per_hour = plan.cost.usd_per_hour
    step_s = plan.duration.training_hours * 3600 / plan.config.training.max_steps
    assert thresholds.expected_step_seconds == pytest.approx(step_s)
    assert thresholds.expected_tokens_per_second == pytest.approx(
        plan.config.tokens_per_step / step_s
    )
    assert thresholds.slow_tokens_per_second == pytest.approx(
        0.5 * plan.config.tokens_per_step / step_s
    )
    assert thresholds.usd_per_hour == plan.cost.usd_per_hour
    ceiling = plan.config.cost.max_usd_per_run
    assert ceiling is not None
    assert thresholds.spend_warning_usd == pytest.approx(0.8 * ceiling)
    # The window reaches back far enough to see the whole ceiling spent at the plan's rate.
    assert thresholds.spend_window_hours * usd_per_hour >= 5


def test_a_big_run_waits_longer_before_calling_a_hang() -> None:
    big = alert_thresholds(plan_run(load_stack_file("llama31-8b-p5")))
    small = alert_thresholds(plan_run(load_stack_file(STACK)))
    assert small.hang_after_seconds == 300  # the floor
    assert big.hang_after_seconds is not None and big.hang_after_seconds > 300


def test_an_existing_cluster_gets_no_idle_gpu_rule() -> None:
    t = alert_thresholds(plan_run(load_stack_file("team-cluster")))
    assert not t.owns_gpu_nodes and "FsdpGpuNodesIdle" not in alert_names(t)


def test_the_prometheus_rule_carries_the_same_groups(thresholds: AlertThresholds) -> None:
    rule = prometheus_rule(thresholds, name="fsdp-dev", namespace="monitoring")
    assert rule["kind"] == "PrometheusRule" and rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == rule_groups(thresholds)


def test_end_alerts_are_sent_once_and_the_rest_repeat() -> None:
    document = yaml.safe_load(alertmanager_definition("arn:aws:sns:us-west-2:1:t", "us-west-2"))
    config = yaml.safe_load(document["alertmanager_config"])
    (once,) = config["route"]["routes"]
    assert once["matchers"] == ['notify="once"']
    # AMP caps repeat_interval at five days (AMP user guide, AMP-alertmanager-config).
    assert once["repeat_interval"] == "120h"
    receivers = {r["name"]: r["sns_configs"][0] for r in config["receivers"]}
    assert receivers[once["receiver"]]["send_resolved"] is False
    assert receivers[config["route"]["receiver"]]["send_resolved"] is True
    assert all(r["sigv4"] == {"region": "us-west-2"} for r in receivers.values())


PROMETHEUS_RULE_CRD = "monitoring.coreos.com_prometheusrules.v0.82.2.yaml"
"""prometheus-operator v0.82.2's published CRD
(example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml), found by
tests/crd_schemas.py (tests/schemas/ holds it without its prose)."""


@pytest.mark.parametrize("stack", ["dev", "team-cluster"])
def test_the_prometheus_rule_is_valid_against_the_operators_crd(stack: str) -> None:
    import jsonschema

    # The CRD's patterns are Go RE2 (`^(?i)(abort|warn)?$` on partial_response_strategy), which
    # Python's `re` refuses in jsonschema's metaschema check: validate without that check.
    validator = jsonschema.Draft202012Validator(openapi_schema(PROMETHEUS_RULE_CRD, "v1"))
    t = alert_thresholds(plan_run(load_stack_file(stack)))
    rule = prometheus_rule(t, name=f"fsdp-eks-{stack}", namespace="monitoring")
    validator.validate(rule)
    # The schema is not vacuous: a duration that is not Prometheus's syntax is refused.
    broken = copy.deepcopy(rule)
    broken["spec"]["groups"][0]["rules"][0]["for"] = "five minutes"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)
