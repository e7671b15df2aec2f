"""The in-cluster Grafana: when it is installed, how it is hardened, what it may read, and what
reaches it (`infra.job.grafana`, `infra.platform.grafana`)."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest

from infra.config import load_stack_file
from infra.config.errors import StackConfigError
from infra.config.files import read_stack_file
from infra.config.parse import parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.job.dashboard import dashboard_uid, stack_dashboard
from infra.job.grafana import (
    GRAFANA_CHART_REPOSITORY,
    GRAFANA_CHART_VERSION,
    GRAFANA_IMAGE_TAG,
    QUERY_ACTIONS,
    SERVICE_ACCOUNT,
    grafana_plan,
)
from infra.job.stack_checks import check_run
from infra.offline import Evaluation, evaluate
from infra.program import main as program
from tests.infra.network_policy_model import Cluster, Endpoint, allowed
from tests.infra.test_observability import ARN, existing
from tests.infra.test_stacks import stack

HELM = "kubernetes:helm.sh/v3:Release"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"
POLICY = "kubernetes:networking.k8s.io/v1:NetworkPolicy"
ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
WORKSPACE = "aws:amp/workspace:Workspace"
AMG_URL = "https://g-abc123def4.grafana-workspace.us-west-2.amazonaws.com"


def _grafana(result: Evaluation) -> Any:
    [release] = [r for r in result.of_type(HELM) if r.inputs["chart"] == "grafana"]
    return release


@cache
def _p5() -> Evaluation:
    return stack("llama31-8b-p5")[1]


@pytest.mark.parametrize(
    ("name", "mode"),
    [
        ("llama31-8b-p5", "in-cluster"),  # created cluster, metrics on (auto) into AMP
        ("dev", "none"),  # metrics off (auto: dear for one g5)
        ("team-cluster", "none"),  # an existing cluster: its operators' Grafana
    ],
)
def test_auto_installs_grafana_only_in_a_created_cluster_with_metrics_in_amp(
    name: str, mode: str
) -> None:
    plan = plan_run(load_stack_file(name))
    assert grafana_plan(plan).mode == mode
    _, result = stack(name)
    assert bool([r for r in result.of_type(HELM) if r.inputs["chart"] == "grafana"]) == (
        mode == "in-cluster"
    )
    assert result.stack_outputs["grafana"]["mode"] == mode


def test_the_release_is_pinned_cluster_ip_only_and_hardened() -> None:
    values = _grafana(_p5()).inputs["values"]
    release = _grafana(_p5()).inputs
    assert release["version"] == GRAFANA_CHART_VERSION
    assert release["repositoryOpts"]["repo"] == GRAFANA_CHART_REPOSITORY
    assert values["image"]["tag"] == GRAFANA_IMAGE_TAG
    assert values["service"]["type"] == "ClusterIP"
    assert values["ingress"] == {"enabled": False}
    pod, container = values["securityContext"], values["containerSecurityContext"]
    assert pod["runAsNonRoot"] and pod["runAsUser"] != 0
    assert container["readOnlyRootFilesystem"] is True
    assert container["allowPrivilegeEscalation"] is False
    assert container["capabilities"] == {"drop": ["ALL"]}
    # No sidecar reads the API: no RBAC, no API token mounted.
    assert values["rbac"] == {"create": False}
    assert values["automountServiceAccountToken"] is False
    assert values["serviceAccount"]["name"] == SERVICE_ACCOUNT


def test_no_admin_password_is_in_what_pulumi_holds() -> None:
    """The chart generates the password into its Secret (`randAlphaNum 40`, kept by `lookup`);
    Pulumi's inputs, and so the plan and the state, carry none."""
    values = _grafana(_p5()).inputs["values"]
    assert "adminPassword" not in values and values.get("admin", {}).get("existingSecret") is None
    text = json.dumps([r.inputs for r in _p5().resources if "grafana" in r.name]).lower()
    assert "password" not in text
    assert "GF_SECURITY_ADMIN_PASSWORD" not in values["env"]


def test_the_data_source_is_the_workspace_signed_with_sigv4() -> None:
    result = _p5()
    [workspace] = result.of_type(WORKSPACE)
    values = _grafana(result).inputs["values"]
    [source] = values["datasources"]["datasources.yaml"]["datasources"]
    assert source["type"] == "prometheus" and source["isDefault"] is True
    assert source["url"] == workspace.outputs["prometheusEndpoint"].rstrip("/")
    assert source["jsonData"]["sigV4Auth"] is True
    assert source["jsonData"]["sigV4AuthType"] == "default"  # the SDK chain: Pod Identity
    assert source["jsonData"]["sigV4Region"] == "us-west-2"
    assert values["env"]["GF_AUTH_SIGV4_AUTH_ENABLED"] == "true"
    assert values["grafana.ini"]["auth"]["sigv4_auth_enabled"] is True


def test_the_role_may_only_query_the_runs_workspace_and_only_grafana_gets_it() -> None:
    result = _p5()
    [workspace] = result.of_type(WORKSPACE)
    [policy] = [r for r in result.of_type(ROLE_POLICY) if r.name == "grafana-policy"]
    [statement] = json.loads(policy.inputs["policy"])["Statement"]
    assert statement["Effect"] == "Allow"
    assert sorted(statement["Action"]) == sorted(QUERY_ACTIONS)
    assert statement["Resource"] == workspace.outputs["arn"]
    [association] = [r for r in result.of_type(ASSOCIATION) if r.name == "grafana-identity"]
    [namespace] = [
        r.inputs["metadata"]["name"]
        for r in result.of_type("kubernetes:core/v1:Namespace")
        if r.name == "observability-namespace"
    ]
    assert association.inputs["namespace"] == namespace
    assert association.inputs["serviceAccount"] == SERVICE_ACCOUNT
    assert _grafana(result).inputs["namespace"] == namespace


def test_the_runs_dashboard_is_provisioned_from_a_config_map() -> None:
    result = _p5()
    config = load_stack_file("llama31-8b-p5")
    values = _grafana(result).inputs["values"]
    [config_map] = [r for r in result.of_type(CONFIG_MAP) if r.name == "grafana-dashboard"]
    name = config_map.inputs["metadata"]["name"]
    ((provider, mounted),) = values["dashboardsConfigMaps"].items()
    assert mounted == name
    [entry] = values["dashboardProviders"]["dashboardproviders.yaml"]["providers"]
    assert entry["name"] == provider
    assert entry["options"]["path"] == f"/var/lib/grafana/dashboards/{provider}"  # the mount
    (document,) = config_map.inputs["data"].values()
    assert document == stack_dashboard(plan_run(config))
    assert json.loads(document)["uid"] == dashboard_uid(str(config.job.name))
    assert result.stack_outputs["grafana"]["dashboardPath"] == (
        f"/d/{dashboard_uid(str(config.job.name))}"
    )


def test_nothing_reaches_grafana_over_the_pod_network_and_it_reaches_only_dns_agent_and_https() -> (
    None
):
    result = _p5()
    policies = [r.inputs for r in result.of_type(POLICY)]
    [namespace] = {
        p["metadata"]["namespace"] for p in policies if "grafana" in p["metadata"]["name"]
    }
    cluster = Cluster(
        policies,
        namespace_labels={
            namespace: {"kubernetes.io/metadata.name": namespace},
            "kube-system": {"kubernetes.io/metadata.name": "kube-system"},
            "default": {"kubernetes.io/metadata.name": "default"},
        },
    )
    values = _grafana(result).inputs["values"]
    grafana = Endpoint(
        "grafana",
        "10.0.7.11",
        namespace,
        {"app.kubernetes.io/name": "grafana", "app.kubernetes.io/instance": "grafana"},
        node_ip="10.0.7.200",
    )
    port = values["service"]["targetPort"]
    neighbour = Endpoint("dcgm", "10.0.1.40", namespace, {"app.kubernetes.io/name": "dcgm"})
    # Grafana's own policy shuts it, whatever else the namespace holds (the exporters' policy
    # happens to isolate every pod there too).
    own = Cluster(
        [p for p in policies if "grafana" in p["metadata"]["name"]], cluster.namespace_labels
    )
    for source in (
        neighbour,
        Endpoint("curious", "10.0.3.10", "default", {"app": "curious"}),
        Endpoint("AMP managed scraper ENI", "10.0.64.7"),
        Endpoint("another node", "10.0.8.200"),
    ):
        assert not allowed(cluster, source, grafana, port), source.name
        assert not allowed(own, source, grafana, port), source.name
    # Its own node's kubelet (probes) is admitted by the VPC CNI's policy agent.
    assert allowed(cluster, Endpoint("kubelet", "10.0.7.200"), grafana, port)
    coredns = Endpoint("coredns", "10.0.9.2", "kube-system", {"k8s-app": "kube-dns"})
    assert allowed(cluster, grafana, coredns, 53, "UDP")
    assert allowed(cluster, grafana, Endpoint("eks-pod-identity-agent", "169.254.170.23"), 80)
    amp = Endpoint("aps-workspaces.us-west-2.amazonaws.com", "52.94.1.1")
    assert allowed(cluster, grafana, amp, 443)
    assert not allowed(cluster, grafana, amp, 80)
    assert not allowed(cluster, grafana, neighbour, 9400)


def test_an_existing_cluster_gets_grafana_only_when_the_stack_asks() -> None:
    assert not [
        r
        for r in existing(f'{{"workspaceArn": "{ARN}"}}').of_type(HELM)
        if r.inputs["chart"] == "grafana"
    ]
    asked = existing(f'{{"workspaceArn": "{ARN}", "grafana": "in-cluster"}}')
    [policy] = [r for r in asked.of_type(ROLE_POLICY) if r.name == "grafana-policy"]
    assert json.loads(policy.inputs["policy"])["Statement"][0]["Resource"] == ARN
    assert _grafana(asked).inputs["values"]["service"]["type"] == "ClusterIP"


def test_a_managed_workspace_installs_nothing_and_is_the_output() -> None:
    stack_file = read_stack_file("llama31-8b-p5")
    config = {
        **stack_file.config,
        "fsdp-eks:observability": f'{{"grafanaWorkspaceUrl": "{AMG_URL}/"}}',
    }
    result = evaluate(
        program, config=config, secret_keys=stack_file.secret_keys, stack="llama31-8b-p5"
    )
    assert not [r for r in result.of_type(HELM) if r.inputs["chart"] == "grafana"]
    assert result.stack_outputs["grafana"]["mode"] == "managed"
    assert result.stack_outputs["grafana"]["workspaceUrl"] == AMG_URL


BASE: dict[str, Any] = {
    "gpuNodes": {"instanceType": "g5.12xlarge", "count": 1},
    "cost": {"maxRunHours": 1},
    "storage": {"fsx": {"enabled": False}},
}


@pytest.mark.parametrize(
    ("observability", "fragments"),
    [
        ({"grafana": "managed"}, ("observability.grafana 'managed'", "grafanaWorkspaceUrl")),
        (
            {"grafana": "in-cluster", "grafanaWorkspaceUrl": AMG_URL},
            ("grafanaWorkspaceUrl", "'in-cluster'"),
        ),
        (
            {"grafanaWorkspaceUrl": "https://grafana.example.com"},
            ("observability.grafanaWorkspaceUrl", "grafana.example.com"),
        ),
        (
            {"grafana": "in-cluster", "enabled": False},
            ("observability.grafana 'in-cluster'", "enabled"),
        ),
        ({"grafana": "cloud"}, ("observability.grafana", "cloud")),
    ],
)
def test_grafana_mistakes_are_one_line_naming_the_key(
    observability: dict[str, Any], fragments: tuple[str, ...]
) -> None:
    with pytest.raises(StackConfigError) as raised:
        parse_stack_config({**BASE, "observability": observability}, stack_name="dev")
    text = str(raised.value)
    for fragment in fragments:
        assert fragment in text, text


def test_in_cluster_with_metrics_that_auto_turns_off_is_refused_at_plan_time() -> None:
    stack_file = read_stack_file("dev")
    values = {
        key.split(":", 1)[1]: value
        for key, value in stack_file.config.items()
        if key.startswith("fsdp-eks:")
    }
    assert plan_run(load_stack_file("dev")).metrics.enabled is False  # auto: off for dev
    config = parse_stack_config(
        {**values, "observability": {**values.get("observability", {}), "grafana": "in-cluster"}},
        stack_name="dev",
    )
    with pytest.raises(StackConfigError) as raised:
        check_run(config, source="stack 'dev'")
    assert "observability.grafana 'in-cluster' needs the run's metrics" in str(raised.value)
