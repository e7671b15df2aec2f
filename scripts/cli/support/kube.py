"""The stack's own cluster, reached as `pulumi up` reaches it, through the one cluster client.

The cluster's name comes from the stack's `clusterName` output and its region from the stack
file (`aws:region`); EKS tells the endpoint and certificate authority (`DescribeCluster`), and
credentials come from `aws eks get-token`, in a kubeconfig built by the program's own builder
(`infra.job.kubeconfig`) and kept in memory: the user's `~/.kube/config` and its current context
are neither read nor changed. Only `--context` (an explicit choice) uses a context of the
user's kubeconfig (`infra.job.kube_client.KubeClient.from_user_context`). (An EKS cluster on
Outposts, addressed by `--cluster-id`, is not handled.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import yaml

from scripts.cli.support.errors import CliError

if TYPE_CHECKING:
    from infra.job.kube_client import KubeClient


class ClusterNotReadyError(CliError):
    """EKS has no endpoint or certificate for the cluster yet (it is still being created)."""


class _PlainDumper(yaml.SafeDumper):
    """Writes shared sub-objects (labels) out in full: no YAML anchors in manifests."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifests: Iterable[dict[str, Any]]) -> str:
    return yaml.dump_all(list(manifests), Dumper=_PlainDumper, sort_keys=False)


def cluster_client(stack_file: str | None, cluster: Any, context: str | None) -> KubeClient:
    """The client of the run's cluster: `--context` of the user's kubeconfig, else the
    stack's own (`stack_cluster_access`)."""
    from infra.job.kube_client import KubeClient

    if context is not None:
        return KubeClient.from_user_context(context)
    if stack_file is None or not isinstance(cluster, str):
        raise CliError(
            "no cluster to reach: name a deployed stack (its clusterName output), or pass "
            "--context CONTEXT to use one of your kubeconfig"
        )
    document, _ = stack_cluster_access(stack_file, cluster)
    return KubeClient.from_kubeconfig(document)


def stack_cluster_access(stack: str, cluster: str) -> tuple[dict[str, Any], Any]:
    """(the kubeconfig `pulumi up` signs with, a boto3 session) for the stack's cluster: EKS
    `DescribeCluster` in the stack file's region, signed through `aws eks get-token` with the
    stack's `aws:profile` and `cluster.adminRoleArn` (`infra.job.kubeconfig`, the module the
    program builds its own Kubernetes provider's kubeconfig with), so the tool reaches the
    cluster as the same identity as the deploy."""
    import boto3

    from infra.config import load_stack_file, read_stack_file
    from infra.job.kubeconfig import described_cluster_kubeconfig, stack_kubernetes_access

    values = read_stack_file(stack).config
    profile = values.get("aws:profile") if isinstance(values.get("aws:profile"), str) else None
    region = values.get("aws:region") if isinstance(values.get("aws:region"), str) else None
    session = boto3.session.Session(profile_name=profile, region_name=region)
    described = session.client("eks").describe_cluster(name=cluster)["cluster"]
    if not described.get("endpoint") or not (described.get("certificateAuthority") or {}).get(
        "data"
    ):
        raise ClusterNotReadyError(
            f"EKS cluster {cluster!r} has no endpoint yet (status {described.get('status')})"
        )
    config = load_stack_file(stack)
    caller = None
    if config.cluster.admin_role_arn is not None:  # only then does who we are matter
        caller = session.client("sts").get_caller_identity().get("Arn")
    access = stack_kubernetes_access(config, profile, caller)
    document = described_cluster_kubeconfig(described, region or session.region_name, access)
    return document, session
