"""The one cluster client (`infra.job.kube_client`, over the Kubernetes Python client):
credentials from the kubeconfig, refusals named as RBAC names them, one error type, and the
only module of the code base that speaks to Kubernetes (the stop/start, watch and CLI tests
drive it against the loopback fake)."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from infra.job.job_api import PYTORCHJOB, TRAINJOB
from infra.job.kube_client import KubeClient, KubernetesApiError, KubernetesCredentialError
from tests.infra.kube_fake import ClusterApiServer, config_with_user, kubeconfig, serving

ROOT = Path(__file__).resolve().parents[2]


REQUESTS: list[tuple[str, str, Callable[[KubeClient], object], str]] = [
    ("get", "pytorchjobs", lambda c: c.get_job(PYTORCHJOB, "training", "exp"),
     "`get` on pytorchjobs.kubeflow.org in namespace training"),
    ("list", "pods", lambda c: c.list_pods("training", "a=b"),
     "`list` on pods in namespace training"),
    ("patch", "pytorchjobs",
     lambda c: c.apply_job(PYTORCHJOB, "training", "exp", {}, field_manager="m", force=True),
     "`patch` on pytorchjobs.kubeflow.org in namespace training"),
    ("list", "nodes", lambda c: c.list_nodes("a=b"), "`list` on nodes"),
]  # fmt: skip


@pytest.mark.parametrize(("verb", "resource", "call", "needed"), REQUESTS)
def test_a_refusal_names_the_permission_as_rbac_names_it(
    verb: str, resource: str, call: Callable[[KubeClient], object], needed: str
) -> None:
    with serving(ClusterApiServer()) as server:
        server.put_job({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
                        "metadata": {"name": "exp", "namespace": "training"},
                        "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}})  # fmt: skip
        server.forbidden.add((verb, resource))
        with pytest.raises(KubernetesApiError) as error:
            call(KubeClient.from_kubeconfig(kubeconfig(server.url)))
    assert error.value.status == 403 and error.value.reason == "Forbidden"
    text = str(error.value)
    assert len(text.splitlines()) == 1 and "HTTP 403 Forbidden" in text
    assert text.endswith(f"needs {needed} (an RBAC Role bound to it, or an EKS access policy)")


def test_a_static_token_and_a_document_are_read_as_well_as_text() -> None:
    with serving(ClusterApiServer()) as server:
        client = KubeClient.from_kubeconfig(config_with_user(server.url, {"token": "secret"}))
        assert client.server == server.url
        assert client.api_client.configuration.api_key["BearerToken"] == "Bearer secret"


def test_a_kubeconfig_without_credentials_is_refused_in_one_line() -> None:
    with pytest.raises(KubernetesCredentialError, match=r"neither a token nor an exec"):
        KubeClient.from_kubeconfig(config_with_user("http://127.0.0.1:1", {}))


def test_a_credential_plugin_that_prints_no_token_is_one_clear_error() -> None:
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                       "command": sys.executable, "args": ["-c", "print('{}')"]}}  # fmt: skip
    with pytest.raises(KubernetesCredentialError, match=r"failed \(exec: malformed response"):
        KubeClient.from_kubeconfig(config_with_user("http://127.0.0.1:1", plugin))


def test_a_missing_credential_command_names_it() -> None:
    plugin = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                       "command": "/nonexistent/aws", "args": ["eks", "get-token"]}}  # fmt: skip
    with pytest.raises(KubernetesCredentialError) as error:
        KubeClient.from_kubeconfig(config_with_user("http://127.0.0.1:1", plugin))
    assert "`/nonexistent/aws eks get-token` failed" in str(error.value)
    assert "No such file or directory" in str(error.value)


JOBS = {
    "pytorchjob": (PYTORCHJOB, {"pytorchReplicaSpecs": {"Worker": {"replicas": 1}}}),
    "trainjob": (TRAINJOB, {"runtimeRef": {"name": "exp-runtime"}, "trainer": {"numNodes": 1}}),
}


@pytest.mark.parametrize("which", list(JOBS))
def test_the_apply_is_server_side_apply_as_the_manager(which: str) -> None:
    """`_content_type` picks apply: the generated method would otherwise send a JSON patch
    that rest.py turns into a strategic merge patch, which CRDs refuse."""
    api, spec = JOBS[which]
    with serving(ClusterApiServer(namespace="training", name="exp", api=api)) as server:
        meta = {"name": "exp", "namespace": "training"}
        server.put_job({"apiVersion": api.api_version, "kind": api.kind, "metadata": meta,
                        "spec": spec})  # fmt: skip
        client = KubeClient.from_kubeconfig(kubeconfig(server.url))
        body = api.suspend_patch("training", "exp", True)
        stored = client.apply_job(api, "training", "exp", body, field_manager="fsdp-eks",
                                  force=True)  # fmt: skip
        assert client.get_job(api, "training", "exp")["kind"] == api.kind
    (sent,) = server.patches
    assert sent.path == f"/apis/{api.api_version}/namespaces/training/{api.plural}/exp"
    assert sent.content_type == "application/apply-patch+yaml"
    assert sent.query == {"fieldManager": "fsdp-eks", "force": "true"}
    assert sent.body == body and api.suspend_requested(stored) is True


def _sources() -> list[Path]:
    return [p for d in ("infra", "scripts") for p in (ROOT / d).rglob("*.py")]


def test_one_module_speaks_to_kubernetes() -> None:
    """The Kubernetes client is imported by `infra/job/kube_client.py` alone; no module of
    ours sends HTTP with urllib to Kubernetes or runs kubectl (kubectl stays in printed hints;
    `doctor` reports its version, an optional tool), but for the port-forward a person would
    type to look at Grafana (`fsdp-eks dashboard --open`). The one module that uses urllib
    asks a Prometheus HTTP API, not a cluster (`fsdp-eks status`'s live figures)."""
    imports = re.compile(r"^\s*(from|import)\s+kubernetes\b", re.M)
    urllib = re.compile(r"^\s*(from|import)\s+urllib\b(?!3)", re.M)
    kubectl_argv = re.compile(
        r"""require_tool\(\s*["']kubectl|(run|Popen|check_output|call)\(\s*\[\s*["']kubectl"""
    )
    clients, http, runs = [], [], []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        name = str(path.relative_to(ROOT))
        clients += [name] if imports.search(text) else []
        http += [name] if urllib.search(text) else []
        runs += [name] if kubectl_argv.search(text) else []
    assert clients == ["infra/job/kube_client.py"]
    assert http == ["scripts/cli/support/live_metrics.py"], http
    assert runs == ["scripts/cli/support/port_forward.py"], runs
    assert "port-forward" in (ROOT / runs[0]).read_text(encoding="utf-8")
    assert "/api/v1/query" in (ROOT / http[0]).read_text(encoding="utf-8")
