"""Who reaches a stack's cluster, and how: the kubeconfig the Kubernetes provider uses.

`aws eks get-token` with `--profile` as an argument (pulumi-eks's exported kubeconfig omits it,
and ambient credentials would win), and `--role-arn cluster.adminRoleArn` so people and CI reach
the cluster as one identity. Pure: the program and the CLI build the same kubeconfig here.
Why and sources: docs/design/job.md#kubeconfig
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the offline runtime imports the builder without the schema
    from infra.config.stack import StackConfig


@dataclass(frozen=True)
class KubernetesAccess:
    """The credentials `aws eks get-token` signs with for the Kubernetes provider."""

    profile: str | None = None
    """The stack's `aws:profile` (None: the default credential chain)."""
    role_arn: str | None = None
    """A role assumed with those credentials before signing (None: sign with them directly)."""


def exec_kubeconfig(
    cluster_name: str,
    endpoint: str,
    ca_data: str,
    region: str,
    access: KubernetesAccess | None = None,
) -> dict[str, Any]:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credentials)."""
    access = access or KubernetesAccess()
    args = ["eks", "get-token", "--cluster-name", cluster_name, "--region", region]
    if access.role_arn is not None:
        args += ["--role-arn", access.role_arn]
    if access.profile is not None:
        args += ["--profile", access.profile]
    args += ["--output", "json"]
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster_name,
                "cluster": {"server": endpoint, "certificate-authority-data": ca_data},
            }
        ],
        "contexts": [{"name": cluster_name, "context": {"cluster": cluster_name, "user": "aws"}}],
        "current-context": cluster_name,
        "users": [
            {
                "name": "aws",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": "aws",
                        "args": args,
                    }
                },
            }
        ],
    }


def described_cluster_kubeconfig(
    cluster: Mapping[str, Any], region: str, access: KubernetesAccess | None = None
) -> dict[str, Any]:
    """The kubeconfig of a cluster as EKS `DescribeCluster` returns it (boto3
    `eks.describe_cluster(name=...)["cluster"]`: `name`, `endpoint`,
    `certificateAuthority.data`), the same document the program builds from
    `aws.eks.get_cluster` (`infra.platform.kube_access.cluster_kubeconfig`)."""
    return exec_kubeconfig(
        str(cluster["name"]),
        str(cluster["endpoint"]),
        str(cluster["certificateAuthority"]["data"]),
        region,
        access,
    )


def same_iam_principal(first: str, second: str) -> bool:
    """Whether two IAM user/role ARNs name the same principal.

    Names are unique per account whatever the path, and the session issuer reports a role's
    path (SSO roles live under `aws-reserved/sso.amazonaws.com/`) that a user writing the ARN
    by hand usually leaves out.
    """

    def identity(arn: str) -> tuple[str, str, str, str]:
        prefix, _, rest = arn.partition(":iam::")
        account, _, resource = rest.partition(":")
        kind, _, path_and_name = resource.partition("/")
        return prefix, account, kind, path_and_name.rsplit("/", 1)[-1]

    return identity(first) == identity(second)


def principal_of_caller(caller_arn: str) -> str:
    """The IAM user or role ARN behind an STS `GetCallerIdentity` ARN.

    An assumed role's caller ARN is its session, `arn:aws:sts::ACCOUNT:assumed-role/NAME/
    SESSION`; access entries and `same_iam_principal` want the role, `arn:aws:iam::ACCOUNT:
    role/NAME` (its path is not in the session ARN, and `same_iam_principal` ignores paths).
    The program gets the same answer with IAM's `GetSessionContext`; the command-line tool
    needs no IAM permission for it. Users' and roots' ARNs are IAM ARNs already.
    """
    prefix, _, rest = caller_arn.partition(":sts::")
    account, _, resource = rest.partition(":")
    kind, _, path = resource.partition("/")
    if not rest or kind != "assumed-role":
        return caller_arn
    role = path.split("/")[0]
    return f"{prefix}:iam::{account}:role/{role}"


def kubernetes_access(
    admin_role_arn: str | None, profile: str | None, deployer: str | None
) -> KubernetesAccess:
    """Sign as `admin_role_arn` unless the deployer is that role (a role may not assume itself
    unless its own trust policy names it), with the stack's profile either way. `deployer`
    is the IAM principal running the command (None: not known, so the role is assumed)."""
    role = admin_role_arn
    if role is not None and deployer is not None and same_iam_principal(role, deployer):
        role = None
    return KubernetesAccess(profile=profile, role_arn=role)


def stack_kubernetes_access(
    config: StackConfig, profile: str | None, caller_arn: str | None
) -> KubernetesAccess:
    """What the program's Kubernetes provider signs as, for the stack `config` with its
    `aws:profile` (`profile`), seen from the principal whose STS caller ARN is `caller_arn`
    (None: unknown). The program does the same with the deployer it reads from AWS
    (`infra.platform.cluster`, both modes)."""
    deployer = principal_of_caller(caller_arn) if caller_arn is not None else None
    return kubernetes_access(config.cluster.admin_role_arn, profile, deployer)
