"""The `observability` section: one destination per stack, errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config.errors import StackConfigError
from infra.config.observability import ClusterPrometheusConfig, ObservabilityConfig
from infra.config.parse import parse_stack_config

ARN = "arn:aws:aps:us-east-1:123456789012:workspace/ws-0a1b2c3d-4e5f-6789-abcd-ef0123456789"
BASE: dict[str, Any] = {
    "gpuNodes": {"instanceType": "g5.12xlarge", "count": 1},
    "cost": {"maxRunHours": 1},
    "storage": {"fsx": {"enabled": False}},
}
EXISTING = {"mode": "existing", "name": "team"}


def _parse(**sections: Any) -> Any:
    return parse_stack_config({**BASE, **sections}, stack_name="dev")


def _error(**sections: Any) -> str:
    with pytest.raises(StackConfigError) as raised:
        _parse(**sections)
    return str(raised.value)


def test_every_field_has_a_description() -> None:
    for model in (ObservabilityConfig, ClusterPrometheusConfig):
        assert [n for n, f in model.model_fields.items() if not f.description] == []


def test_defaults_to_auto_and_managed_prometheus() -> None:
    config = _parse().observability
    assert config.enabled == "auto"
    assert config.destination == "managed-prometheus"
    assert config.workspace_arn is None
    assert config.scrape_interval_seconds == 30


def test_an_existing_cluster_chooses_monitors_or_a_workspace() -> None:
    monitors = _parse(
        cluster=EXISTING, observability={"clusterPrometheus": {"monitorLabels": {"release": "kps"}}}
    ).observability
    assert monitors.destination == "cluster-prometheus"
    assert monitors.cluster_prometheus is not None
    assert monitors.cluster_prometheus.monitor_labels == {"release": "kps"}
    workspace = _parse(cluster=EXISTING, observability={"workspaceArn": ARN}).observability
    assert workspace.destination == "managed-prometheus"
    assert workspace.workspace_arn == ARN


@pytest.mark.parametrize(
    ("sections", "names"),
    [
        ({"observability": {"enabeld": True}}, "enabeld"),
        ({"observability": {"enabled": "maybe"}}, "observability.enabled"),
        ({"observability": {"workspaceArn": "ws-123"}}, "observability.workspaceArn"),
        ({"observability": {"scrapeIntervalSeconds": 1}}, "observability.scrapeIntervalSeconds"),
        (
            {"cluster": EXISTING, "observability": {"clusterPrometheus": {"namespace": "Mon"}}},
            "observability.clusterPrometheus.namespace",
        ),
        (
            {
                "cluster": EXISTING,
                "observability": {"clusterPrometheus": {"monitorLabels": {"a b": "x"}}},
            },
            "observability.clusterPrometheus.monitorLabels",
        ),
        ({"observability": {"clusterPrometheus": {}}}, "observability.clusterPrometheus"),
        (
            {"cluster": EXISTING, "observability": {"clusterPrometheus": {}, "workspaceArn": ARN}},
            "observability.workspaceArn",
        ),
        ({"cluster": EXISTING, "observability": {"enabled": True}}, "observability.workspaceArn"),
    ],
)
def test_bad_values_are_one_line_naming_the_key(sections: dict[str, Any], names: str) -> None:
    message = _error(**sections)
    assert names in message
    assert "Traceback" not in message


def test_enabled_false_and_auto_on_an_existing_cluster_need_no_destination() -> None:
    assert _parse(cluster=EXISTING, observability={"enabled": False}).observability.enabled is False
    assert _parse(cluster=EXISTING).observability.enabled == "auto"
