"""The run's dashboard: built by grafana-foundation-sdk, every panel query parses (promtool's
PromQL parser, through `promtool check rules` on a rule file of the queries) and names only
series the trainer (trainer/telemetry_names.py) or the exporters
(infra/facts/exporter_metrics.py) emit."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from infra.config import load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.alert_rules import alert_thresholds
from infra.job.dashboard import dashboard_json, panel_queries, plan_figures
from infra.job.watch_series import exported_names
from tests.prometheus_tools import require_binary

KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "offset", "bool", "Inf", "NaN", "inf", "nan", "atan2",
}  # fmt: skip


def series_names(expr: str) -> set[str]:
    """The metric names an expression selects: identifiers outside strings, label braces,
    grouping clauses and ranges that are not functions, keywords or numbers."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'", '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", text):
        if match.group(2) is None and match.group(1) not in KEYWORDS:
            names.add(match.group(1))
    return names


@pytest.fixture(scope="module", params=["dev", "llama31-8b-p5", "team-cluster"])
def document(request: pytest.FixtureRequest) -> str:
    plan = plan_run(load_stack_file(request.param))
    thresholds = alert_thresholds(plan)
    return dashboard_json(thresholds, plan_figures(plan, thresholds))


def test_the_name_reader_sees_selectors_and_skips_the_rest() -> None:
    expr = 'max by (Hostname, gpu) (rate(a_total{x="y b"}[5m])) or on (run) b > bool 3 or vector(1)'
    assert series_names(expr) == {"a_total", "b"}


def test_every_panel_query_parses(document: str, tmp_path: Path) -> None:
    queries = panel_queries(document)
    rules = {
        "groups": [
            {
                "name": "dashboard-queries",
                "rules": [{"record": f"dashboard:q{i}", "expr": q} for i, q in enumerate(queries)],
            }
        ]
    }
    path = tmp_path / "queries.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [require_binary("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout


def test_every_panel_names_only_emitted_series(document: str) -> None:
    emitted = exported_names()
    named = {name for query in panel_queries(document) for name in series_names(query)}
    assert named and named <= emitted, named - emitted


def test_the_panels_the_issue_asks_for_are_there(document: str) -> None:
    titles = [p["title"] for p in json.loads(document)["panels"]]
    for wanted in (
        "Loss", "Tokens/s against the plan", "MFU against the plan's range",
        "Step time and data wait", "Checkpoints", "GPU utilisation", "GPU memory used",
        "GPU power", "GPU temperature", "Last XID per GPU", "EFA throughput per node",
        "EFA errors and retransmits per node", "Restarts, rollbacks and goodput",
        "Spent against the ceiling",
    ):  # fmt: skip
        assert wanted in titles


def test_the_plan_is_drawn_beside_the_run() -> None:
    plan = plan_run(load_stack_file("dev"))
    thresholds = alert_thresholds(plan)
    queries = panel_queries(dashboard_json(thresholds, plan_figures(plan, thresholds)))
    assert plan.duration is not None
    assert f"vector({plan.duration.mfu.expected:g})" in queries
    assert f"vector({thresholds.expected_tokens_per_second:g})" in queries
    assert "vector(5)" in queries  # the dev stack's $5 ceiling


def test_queries_have_distinct_ref_ids(document: str) -> None:
    for panel in json.loads(document)["panels"]:
        refs = [t["refId"] for t in panel.get("targets") or []]
        assert len(set(refs)) == len(refs) and all(refs), panel["title"]
