"""The Pulumi half of the stack's Kubernetes access: the kubeconfig of a cluster the program
looked up, and the IAM principal running `pulumi up`.

What the kubeconfig holds and why (`aws:profile` as `--profile`, `cluster.adminRoleArn` as
`--role-arn`) is in `infra.job.kubeconfig`, which the command-line tool shares so that it
signs as `pulumi up` does.

Changing only the `users` part of the kubeconfig updates the provider in place: pulumi-kubernetes
plans a replacement only when the active cluster (server, CA) changes
(`provider/pkg/provider/provider.go` `DiffConfig`).
"""

from __future__ import annotations

import json

import pulumi
import pulumi_aws as aws

from infra.job.kubeconfig import KubernetesAccess, exec_kubeconfig


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
