"""The run's metrics as the program registers them: the exporters, hardened and on the GPU
nodes only; AMP's workspace and managed scraper in create mode; PodMonitors (valid for the
pinned prometheus-operator CRD) or nothing on an existing cluster, per the stack."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from infra.config.files import read_stack_file
from infra.facts.exporter_metrics import (
    DCGM_EXPORTER_CHART_VERSION,
    DCGM_EXPORTER_IMAGE,
    NODE_EXPORTER_IMAGE,
)
from infra.job.placement import GPU_TAINT_KEY
from infra.offline import Evaluation, evaluate
from infra.program import main as program
from tests.crd_schemas import openapi_schema
from tests.crd_schemas import validate as validate_against_schema
from tests.infra.test_stacks import stack

REPO_ROOT = Path(__file__).resolve().parents[2]
HELM = "kubernetes:helm.sh/v3:Release"
DAEMONSET = "kubernetes:apps/v1:DaemonSet"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
PODMONITOR = "kubernetes:monitoring.coreos.com/v1:PodMonitor"
WORKSPACE = "aws:amp/workspace:Workspace"
SCRAPER = "aws:amp/scraper:Scraper"
ARN = "arn:aws:aps:us-west-2:123456789012:workspace/ws-0a1b2c3d"
PODMONITOR_CRD = "monitoring.coreos.com_podmonitors.v0.93.0.yaml"
"""prometheus-operator v0.93.0 (commit f8fafd475f3d132e239432ae6172de60a6cb6516)
`example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml`, found by
tests/crd_schemas.py (tests/schemas/ holds it without its prose)."""


def of_type(result: Evaluation, typ: str) -> list[Any]:
    return [r for r in result.resources if r.type == typ]


@cache
def existing(observability: str) -> Evaluation:
    """team-cluster (an existing cluster) with an `observability` section (JSON text)."""
    stack_file = read_stack_file("team-cluster")
    config = {**stack_file.config, "fsdp-eks:observability": observability}
    return evaluate(
        program, config=config, secret_keys=stack_file.secret_keys, stack="team-cluster"
    )


def test_create_mode_renders_workspace_scraper_and_both_exporters() -> None:
    config, result = stack("llama31-8b-p5")
    [workspace] = of_type(result, WORKSPACE)
    [scraper] = of_type(result, SCRAPER)
    assert scraper.inputs["destination"]["amp"]["workspaceArn"] == workspace.outputs["arn"]
    eks = scraper.inputs["source"]["eks"]
    assert len(eks["subnetIds"]) >= 2  # the scraper needs two AZs
    scrape = yaml.safe_load(scraper.inputs["scrapeConfiguration"])
    jobs = {job["job_name"]: job for job in scrape["scrape_configs"]}
    assert set(jobs) == {"fsdp-trainer", "dcgm-exporter", "efa-exporter"}
    # The trainer's own stack/run/node/rank labels survive; exporters get node and stack.
    assert jobs["fsdp-trainer"]["honor_labels"] is True
    for job in jobs.values():
        targets = {r.get("target_label") for r in job["relabel_configs"]}
        assert {"node", "stack"} <= targets
        assert {"regex": "metrics", "action": "keep"}.items() <= job["relabel_configs"][1].items()
    trainer_keep = jobs["fsdp-trainer"]["relabel_configs"][0]
    assert trainer_keep["regex"] == str(config.job.name)
    assert trainer_keep["source_labels"] == [
        "__meta_kubernetes_pod_label_training_kubeflow_org_job_name"
    ]
    outputs = result.stack_outputs
    assert outputs["metricsWorkspaceArn"] == workspace.outputs["arn"]
    assert outputs["metricsWorkspaceId"] == workspace.outputs["arn"].rsplit("/", 1)[-1]
    assert outputs["metricsWorkspaceEndpoint"] == workspace.outputs["prometheusEndpoint"]


def test_dcgm_exporter_is_pinned_non_root_and_on_gpu_nodes_only() -> None:
    _, result = stack("llama31-8b-p5")
    [release] = [r for r in of_type(result, HELM) if r.inputs["chart"] == "dcgm-exporter"]
    assert release.inputs["version"] == DCGM_EXPORTER_CHART_VERSION
    values = release.inputs["values"]
    assert f"{values['image']['repository']}:{values['image']['tag']}" == DCGM_EXPORTER_IMAGE
    context = values["securityContext"]
    assert context["runAsNonRoot"] and context["runAsUser"] != 0
    assert context["capabilities"] == {"drop": ["ALL"]}  # no SYS_ADMIN: no DCGM_FI_PROF_*
    assert context["allowPrivilegeEscalation"] is False
    assert values["podSecurityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert values["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert any(t["key"] == GPU_TAINT_KEY for t in values["tolerations"])
    assert values["resources"]["limits"] and values["resources"]["requests"]
    assert "DCGM_FI_PROF" not in values["customMetrics"]


def test_efa_exporter_reads_sys_read_only_as_nobody() -> None:
    _, result = stack("llama31-8b-p5")
    [daemonset] = of_type(result, DAEMONSET)
    spec = daemonset.inputs["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert spec["automountServiceAccountToken"] is False
    [sys] = [v for v in spec["volumes"] if "hostPath" in v]
    assert sys["hostPath"]["path"] == "/sys"
    for container in spec["containers"]:
        assert container["image"] == NODE_EXPORTER_IMAGE
        context = container["securityContext"]
        assert context["runAsNonRoot"] and context["readOnlyRootFilesystem"]
        assert context["capabilities"] == {"drop": ["ALL"]}
        for mount in container["volumeMounts"]:
            if mount["name"] == "sys":
                assert mount["readOnly"] is True


def test_a_stack_without_efa_gets_no_efa_exporter() -> None:
    config, result = stack("llama2-7b-p4d")
    assert config.gpu_nodes.efa_enabled == bool(of_type(result, DAEMONSET))


def test_disabled_or_unresolved_observability_registers_nothing() -> None:
    for name in ("dev", "team-cluster"):  # auto off: too dear for one g5; no destination
        _, result = stack(name)
        assert not of_type(result, WORKSPACE) and not of_type(result, SCRAPER)
        assert not [r for r in of_type(result, HELM) if r.inputs["chart"] == "dcgm-exporter"]
        assert result.stack_outputs["metricsWorkspaceId"] is None
    off = existing(f'{{"enabled": false, "workspaceArn": "{ARN}"}}')
    assert not [r for r in off.resources if "observability" in r.name and r.custom]


def test_existing_cluster_with_a_workspace_arn_scrapes_into_it_and_creates_none() -> None:
    result = existing(f'{{"workspaceArn": "{ARN}"}}')
    assert not of_type(result, WORKSPACE)
    [scraper] = of_type(result, SCRAPER)
    assert scraper.inputs["destination"]["amp"]["workspaceArn"] == ARN
    assert result.stack_outputs["metricsWorkspaceArn"] == ARN
    assert result.stack_outputs["metricsWorkspaceId"] == "ws-0a1b2c3d"
    assert result.stack_outputs["metricsWorkspaceEndpoint"].endswith("/workspaces/ws-0a1b2c3d/")
    assert not of_type(result, PODMONITOR)


def _podmonitor_schema() -> dict[str, Any]:
    return openapi_schema(PODMONITOR_CRD, "v1")


def test_existing_cluster_prometheus_gets_valid_pod_monitors_and_nothing_else() -> None:
    result = existing('{"clusterPrometheus": {"monitorLabels": {"release": "kps"}}}')
    assert not of_type(result, WORKSPACE) and not of_type(result, SCRAPER)
    monitors = of_type(result, PODMONITOR)
    assert {m.inputs["metadata"]["name"].rsplit("-", 1)[-1] for m in monitors} == {
        "trainer",
        "dcgm",
        "efa",
    }
    schema = _podmonitor_schema()
    for monitor in monitors:
        body = {
            k: v
            for k, v in monitor.inputs.items()
            if k in ("apiVersion", "kind", "metadata", "spec")
        }
        validate_against_schema(body, schema)
        assert monitor.inputs["metadata"]["labels"]["release"] == "kps"
        [endpoint] = monitor.inputs["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] == "metrics"


def test_the_crd_schema_catches_a_misspelt_endpoint() -> None:
    schema = _podmonitor_schema()
    broken = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "podMetricsEndpoints": [{"port": 9400}]},
    }
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(broken, schema)
