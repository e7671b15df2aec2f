"""Who the Kubernetes provider is to EKS: the kubeconfig it uses and the IAM identity behind it.

EKS admits an IAM principal to the Kubernetes API through an access entry; the one principal
admitted without an entry is the cluster's creator. The Kubernetes provider authenticates by
running `aws eks get-token` (an exec credential plugin), so the identity it presents is
whatever credentials that command finds, which need not be the ones Pulumi's AWS provider
uses:

* `aws:profile` configures the AWS provider only. pulumi-eks's `kubeconfigJson` is built
  without the profile (pulumi/pulumi-eks `nodejs/eks/cluster/cluster.ts`: `genKubeconfig(false)`
  is the one exported as `kubeconfig`; only its own internal provider gets `--profile`), so
  with `aws:profile` set and other credentials in the environment (`AWS_ACCESS_KEY_ID`, an
  SSO session, an instance role) every Kubernetes call is signed by someone else and answered
  Unauthorized. The kubeconfig built here passes `--profile` as an argument: pulumi-eks's
  `generateKubeconfig` does the same, because the `AWS_PROFILE` variable loses to ambient
  credentials while a command-line option wins over them.
* A stack created by one person and later run by CI (or a colleague) is locked out, since
  only the creator is admin. `cluster.adminRoleArn` is the shared path: the cluster gives that
  role an admin access entry, and the Kubernetes provider assumes it (`get-token --role-arn`,
  aws/aws-cli `awscli/customizations/eks/get_token.py`) whenever the principal running Pulumi
  is not that role already, so people and CI all reach the cluster as the same identity.

Changing only the `users` part of the kubeconfig updates the provider in place: pulumi-kubernetes
plans a replacement only when the active cluster (server, CA) changes
(`provider/pkg/provider/provider.go` `DiffConfig`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws


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


def cluster_kubeconfig(
    found: pulumi.Output[aws.eks.GetClusterResult],
    access: KubernetesAccess,
    parent: pulumi.Resource,
) -> pulumi.Output[str]:
    """The kubeconfig (JSON, secret) of a cluster read with `aws.eks.get_cluster_output`.

    In create mode look the cluster up by a name that resolves only once it exists, so the
    look-up waits for it (and stays unknown in the first preview).
    """
    region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=parent)).region
    return pulumi.Output.secret(
        pulumi.Output.all(found.name, found.endpoint, found.certificate_authorities, region).apply(
            lambda v: json.dumps(exec_kubeconfig(v[0], v[1], v[2][0]["data"], v[3], access))
        )
    )


def deployer_principal_arn(parent: pulumi.Resource | None = None) -> str:
    """IAM ARN of the principal running `pulumi up` (a role's ARN, not its session's).

    Access entries take IAM user or role ARNs; `get_caller_identity` returns an STS session ARN
    for assumed roles, and `get_session_context` maps it back to the role (path included).
    """
    opts = pulumi.InvokeOptions(parent=parent)
    caller = aws.get_caller_identity(opts=opts)
    return aws.iam.get_session_context(arn=caller.arn, opts=opts).issuer_arn


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


def kubernetes_access(
    admin_role_arn: str | None, profile: str | None, deployer: str
) -> KubernetesAccess:
    """Sign as `admin_role_arn` unless the deployer is that role (a role may not assume itself
    unless its own trust policy names it), with the stack's profile either way."""
    role = admin_role_arn
    if role is not None and same_iam_principal(role, deployer):
        role = None
    return KubernetesAccess(profile=profile, role_arn=role)
