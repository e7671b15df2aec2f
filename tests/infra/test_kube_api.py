"""The Kubernetes API client: credentials from the kubeconfig, requests named as RBAC names
them, and one error type (the stop/start tests drive it against a loopback cluster)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from infra.job.kube_api import KubernetesApi, KubernetesCredentialError, ResourceRef
from tests.infra.kube_fake import ClusterApiServer, kubeconfig, serving


def config_with_user(server: str, user: dict[str, Any]) -> dict[str, Any]:
    document = json.loads(kubeconfig(server))
    document["users"][0]["user"] = user
    return document


@pytest.mark.parametrize(
    ("method", "path", "expected"),
    [
        ("GET", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/exp",
         ResourceRef("get", "pytorchjobs.kubeflow.org", "training", "exp")),
        ("GET", "/api/v1/namespaces/training/pods",
         ResourceRef("list", "pods", "training", None)),
        ("PATCH", "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/exp",
         ResourceRef("patch", "pytorchjobs.kubeflow.org", "training", "exp")),
        ("GET", "/api/v1/nodes", ResourceRef("list", "nodes", None, None)),
        ("PUT", "/apis/kubeflow.org/v1/namespaces/t/pytorchjobs/exp/status",
         ResourceRef("update", "pytorchjobs.kubeflow.org (subresource status)", "t", "exp")),
    ],
)  # fmt: skip
def test_a_request_is_named_as_rbac_names_it(method: str, path: str, expected: ResourceRef) -> None:
    assert ResourceRef.from_request(method, path) == expected


def test_a_static_token_and_a_document_are_read_as_well_as_text() -> None:
    with serving(ClusterApiServer()) as server:
        api = KubernetesApi.from_kubeconfig(config_with_user(server.url, {"token": "secret"}))
        assert api.server == server.url
        assert api._token() == "secret"


def test_a_kubeconfig_without_credentials_is_refused_in_one_line() -> None:
    with pytest.raises(KubernetesCredentialError, match=r"neither a token nor an exec"):
        KubernetesApi.from_kubeconfig(config_with_user("http://127.0.0.1:1", {}))


def test_a_credential_plugin_that_prints_no_token_is_one_clear_error() -> None:
    plugin = {"exec": {"command": sys.executable, "args": ["-c", "print('{}')"]}}
    api = KubernetesApi.from_kubeconfig(config_with_user("http://127.0.0.1:1", plugin))
    with pytest.raises(KubernetesCredentialError, match=r"printed no ExecCredential"):
        api.get("/api/v1/namespaces/training/pods")


def test_a_missing_credential_command_names_it() -> None:
    plugin = {"exec": {"command": "/nonexistent/aws", "args": ["eks", "get-token"]}}
    api = KubernetesApi.from_kubeconfig(config_with_user("http://127.0.0.1:1", plugin))
    with pytest.raises(KubernetesCredentialError, match=r"cannot run .*'/nonexistent/aws'"):
        api.get("/api/v1/namespaces/training/pods")
