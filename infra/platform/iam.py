"""IAM building blocks shared by the platform components: trust policies, node roles and the
roles pods assume through EKS Pod Identity.

Policies are rendered with `aws.iam.get_policy_document` rather than hand-written JSON so the
text is what IAM stores (and what the tests read). Roles carry only AWS-managed policies scoped
to their job; nothing here grants `"Action": "*"`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_aws as aws

POD_IDENTITY_PRINCIPAL = "pods.eks.amazonaws.com"
"""Service principal EKS Pod Identity assumes roles as (needs sts:TagSession too)."""

NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",  # join the cluster, describe itself
    "AmazonEKS_CNI_Policy",  # the VPC CNI (aws-node) assigns pod IPs with the node's role
    "AmazonEC2ContainerRegistryPullOnly",  # pull images (the trainer image, add-ons) from ECR
)
"""AWS-managed policies an EKS managed node needs, and no more."""


def service_trust_policy(
    service: str,
    *,
    actions: Sequence[str] = ("sts:AssumeRole",),
    opts: pulumi.InvokeOutputOptions | None = None,
) -> pulumi.Output[str]:
    """Trust policy letting the AWS service principal `service` assume a role."""
    return aws.iam.get_policy_document_output(
        statements=[
            aws.iam.GetPolicyDocumentStatementArgs(
                effect="Allow",
                actions=list(actions),
                principals=[
                    aws.iam.GetPolicyDocumentStatementPrincipalArgs(
                        type="Service", identifiers=[service]
                    )
                ],
            )
        ],
        opts=opts,
    ).json


def aws_managed_policy_arn(policy_name: str, partition: pulumi.Input[str]) -> pulumi.Output[str]:
    """ARN of an AWS-managed policy in `partition` (aws, aws-cn, aws-us-gov)."""
    return pulumi.Output.concat("arn:", partition, ":iam::aws:policy/", policy_name)


@dataclass(frozen=True)
class NodeRole:
    """A node role and its policy attachments (node groups must wait for both)."""

    role: aws.iam.Role
    attachments: list[aws.iam.RolePolicyAttachment]

    @property
    def ready(self) -> list[pulumi.Resource]:
        """Resources a node group must depend on: nodes without the policies cannot join."""
        return [self.role, *self.attachments]


def node_role(
    name: str,
    *,
    parent: pulumi.Resource,
    tags: Mapping[str, str] | None = None,
) -> NodeRole:
    """An EC2 role for EKS managed nodes, with exactly the `NODE_POLICIES` attached.

    Attachments are separate resources (not `managed_policy_arns`, deprecated in pulumi-aws 7)
    and children of `parent`, so `pulumi destroy` detaches them before deleting the role.
    """
    invoke_opts = pulumi.InvokeOutputOptions(parent=parent)
    role = aws.iam.Role(
        name,
        assume_role_policy=service_trust_policy("ec2.amazonaws.com", opts=invoke_opts),
        description="EKS managed node group instances",
        tags=dict(tags or {}),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    partition = aws.get_partition_output(opts=invoke_opts).partition
    attachments = [
        aws.iam.RolePolicyAttachment(
            f"{name}-{policy}",
            role=role.name,
            policy_arn=aws_managed_policy_arn(policy, partition),
            opts=pulumi.ResourceOptions(parent=parent),
        )
        for policy in NODE_POLICIES
    ]
    return NodeRole(role=role, attachments=attachments)


def pod_identity_trust(
    cluster_name: str, namespace: str, service_account: str, *, sid: str | None = None
) -> dict[str, Any]:
    """Trust policy for EKS Pod Identity: the role goes to one service account of one cluster.

    The conditions are on the session tags the Pod Identity agent sets when it assumes the
    role (EKS User Guide, "Define the trust policy for EKS Pod Identity": `eks-cluster-name`,
    `kubernetes-namespace`, `kubernetes-service-account`), so another cluster or account
    associated with the same role by mistake gets nothing.
    """
    statement: dict[str, Any] = {"Sid": sid} if sid else {}
    statement.update(
        {
            "Effect": "Allow",
            "Principal": {"Service": POD_IDENTITY_PRINCIPAL},
            "Action": ["sts:AssumeRole", "sts:TagSession"],
            "Condition": {
                "StringEquals": {
                    "aws:RequestTag/eks-cluster-name": cluster_name,
                    "aws:RequestTag/kubernetes-namespace": namespace,
                    "aws:RequestTag/kubernetes-service-account": service_account,
                }
            },
        }
    )
    return {"Version": "2012-10-17", "Statement": [statement]}


@dataclass(frozen=True)
class PodIdentityRole:
    """A role one service account assumes through Pod Identity, its one inline policy, and the
    association that binds the two."""

    role: aws.iam.Role
    policy: aws.iam.RolePolicy
    association: aws.eks.PodIdentityAssociation


def pod_identity_role(
    name: str,
    *,
    cluster_name: pulumi.Input[str],
    namespace: pulumi.Input[str],
    service_account: str,
    policy: pulumi.Input[str],
    description: str,
    parent: pulumi.Resource,
    cluster_ready: Sequence[pulumi.Resource] = (),
    tags: Mapping[str, str] | None = None,
    sid: str | None = None,
) -> PodIdentityRole:
    """`<name>-role` (trusted by `service_account` in `namespace` of `cluster_name` only),
    `<name>-policy` (the JSON `policy`, inline: it is this role's alone) and `<name>-identity`.

    The association waits for `cluster_ready` (the Pod Identity agent add-on among it): Pod
    Identity injects credentials only into pods created after their association exists.
    """
    child = pulumi.ResourceOptions(parent=parent)
    trust = pulumi.Output.all(cluster_name, namespace).apply(
        lambda names: json.dumps(pod_identity_trust(names[0], names[1], service_account, sid=sid))
    )
    role = aws.iam.Role(
        f"{name}-role",
        assume_role_policy=trust,
        description=description,
        tags=dict(tags or {}),
        opts=child,
    )
    inline = aws.iam.RolePolicy(f"{name}-policy", role=role.id, policy=policy, opts=child)
    association = aws.eks.PodIdentityAssociation(
        f"{name}-identity",
        cluster_name=cluster_name,
        namespace=namespace,
        service_account=service_account,
        role_arn=role.arn,
        tags=dict(tags or {}),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(cluster_ready)),
    )
    return PodIdentityRole(role=role, policy=inline, association=association)
