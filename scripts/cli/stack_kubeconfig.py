"""Kubernetes access to the stack's own cluster, never to whatever context is current.

The ops commands learn the cluster's name from the stack's `clusterName` output and its region
from the stack file (`aws:region`); EKS tells the endpoint and certificate authority
(`DescribeCluster`), and the credentials come from `aws eks get-token` at each kubectl call,
as `aws eks update-kubeconfig` would set it up (AWS CLI v2 `customizations/eks/
update_kubeconfig.py`), but in a file of the stack's own: the user's `~/.kube/config` and its
current context are neither read nor changed. (An EKS cluster on Outposts, which the CLI
addresses by `--cluster-id`, is not handled.)
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

EXEC_API_VERSION = "client.authentication.k8s.io/v1beta1"
"""The exec credential version `aws eks get-token` prints (AWS CLI v2)."""


def kubeconfig_document(
    cluster: str, region: str | None, endpoint: str, certificate_authority: str
) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user (`aws eks get-token`) and one context."""
    token_args = ["eks", "get-token", "--cluster-name", cluster, "--output", "json"]
    if region:
        token_args += ["--region", region]
    user: dict[str, Any] = {
        "exec": {
            "apiVersion": EXEC_API_VERSION,
            "command": "aws",
            "args": token_args,
            "interactiveMode": "Never",
        }
    }
    if os.environ.get("AWS_PROFILE"):
        user["exec"]["env"] = [{"name": "AWS_PROFILE", "value": os.environ["AWS_PROFILE"]}]
    name = f"fsdp-eks-{cluster}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": endpoint,
                    "certificate-authority-data": certificate_authority,
                },
            }
        ],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }


class ClusterNotReadyError(RuntimeError):
    """EKS has no endpoint or certificate for the cluster yet (it is still being created)."""


def kubeconfig_dir() -> Path:
    """A directory only this user can enter (`$XDG_CACHE_HOME/fsdp-eks`, else
    `~/.cache/fsdp-eks`): credentials config never sits at a guessable path in a shared /tmp."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "fsdp-eks"
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def write_stack_kubeconfig(stack: str, cluster: str, region: str | None) -> Path:
    """Describe `cluster` and write its kubeconfig (mode 0600) for the stack; the path."""
    import boto3

    client = boto3.session.Session(region_name=region).client("eks")
    described = client.describe_cluster(name=cluster)["cluster"]
    endpoint = described.get("endpoint")
    authority = (described.get("certificateAuthority") or {}).get("data")
    if not endpoint or not authority:
        raise ClusterNotReadyError(
            f"EKS cluster {cluster!r} has no endpoint yet (status {described.get('status')})"
        )
    document = kubeconfig_document(cluster, region or client.meta.region_name, endpoint, authority)
    directory = kubeconfig_dir()
    path = directory / f"{stack.replace('/', '_')}.kubeconfig"
    # Written beside, then renamed over: never through a link someone else placed there.
    descriptor, staged = tempfile.mkstemp(dir=directory, suffix=".tmp")
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        yaml.safe_dump(document, out, sort_keys=False)
    Path(staged).replace(path)
    return path
