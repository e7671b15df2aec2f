"""Guardrails on the AWS side: no public S3, no `*:*` IAM, ECR scan on push, EKS secrets
encryption.

Each check takes one `Resource` and returns messages (empty: compliant). Values that are
unknown during a preview are given the benefit of the doubt; `pulumi up` runs the pack again
with them known.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from infra.policy.view import UNKNOWN, Resource, dig

# --- S3 --------------------------------------------------------------------------------------

PUBLIC_ACLS = frozenset({"public-read", "public-read-write", "authenticated-read"})
_PUBLIC_GRANTEE_URIS = (
    "http://acs.amazonaws.com/groups/global/AllUsers",
    "http://acs.amazonaws.com/groups/global/AuthenticatedUsers",
)
_BLOCK_FLAGS = ("blockPublicAcls", "blockPublicPolicy", "ignorePublicAcls", "restrictPublicBuckets")
_BUCKETS = ("aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2")
_BUCKET_ACLS = ("aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2")
_ACCESS_BLOCKS = (
    "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
    "aws:s3/accountPublicAccessBlock:AccountPublicAccessBlock",
)
BUCKET_POLICY = "aws:s3/bucketPolicy:BucketPolicy"


def check_no_public_s3(resource: Resource) -> list[str]:
    """No public ACL, no weakened public access block, no bucket policy open to everyone."""
    props = resource.props
    if resource.type in _BUCKETS + _BUCKET_ACLS:
        acl = props.get("acl")
        if isinstance(acl, str) and acl in PUBLIC_ACLS:
            return [f"{resource.name}: ACL {acl!r} makes the bucket public; use 'private'"]
        grants = dig(props, "accessControlPolicy", "grants")
        for grant in grants if isinstance(grants, list) else []:
            uri = dig(grant, "grantee", "uri")
            if uri in _PUBLIC_GRANTEE_URIS:
                return [f"{resource.name}: an ACL grant to {uri} makes the bucket public"]
        return []
    if resource.type in _ACCESS_BLOCKS:
        weak = [f for f in _BLOCK_FLAGS if props.get(f) is not UNKNOWN and props.get(f) is not True]
        if weak:
            return [
                f"{resource.name}: public access block leaves {', '.join(weak)} off; all four "
                f"of {', '.join(_BLOCK_FLAGS)} must be true"
            ]
        return []
    if resource.type == BUCKET_POLICY:
        return [
            f"{resource.name}: bucket policy statement {sid} allows {actions} to every principal "
            f"without a condition; name the principals that need access"
            for sid, actions in _public_statements(props.get("policy"))
        ]
    return []


def _public_statements(document: Any) -> Iterator[tuple[str, str]]:
    for index, statement in enumerate(policy_statements(document)):
        if statement.get("Effect") != "Allow" or statement.get("Condition"):
            continue
        principal = statement.get("Principal")
        aws_principal = principal.get("AWS") if isinstance(principal, Mapping) else None
        if principal == "*" or "*" in _as_list(aws_principal):
            sid = statement.get("Sid") or f"#{index}"
            yield str(sid), ", ".join(_as_list(statement.get("Action"))) or "actions"


# --- IAM -------------------------------------------------------------------------------------

ADMIN_POLICY_SUFFIX = ":iam::aws:policy/AdministratorAccess"
_POLICY_DOCUMENTS: dict[str, str] = {
    "aws:iam/policy:Policy": "policy",
    "aws:iam/rolePolicy:RolePolicy": "policy",
    "aws:iam/userPolicy:UserPolicy": "policy",
    "aws:iam/groupPolicy:GroupPolicy": "policy",
}
_ATTACHMENTS = (
    "aws:iam/rolePolicyAttachment:RolePolicyAttachment",
    "aws:iam/userPolicyAttachment:UserPolicyAttachment",
    "aws:iam/groupPolicyAttachment:GroupPolicyAttachment",
    "aws:iam/policyAttachment:PolicyAttachment",
)
ROLE = "aws:iam/role:Role"


def check_iam_no_star_star(resource: Resource) -> list[str]:
    """No IAM statement allows every action on every resource, and no AdministratorAccess."""
    documents: list[Any] = []
    if resource.type in _POLICY_DOCUMENTS:
        documents.append(resource.props.get(_POLICY_DOCUMENTS[resource.type]))
    elif resource.type == ROLE:
        inline = resource.props.get("inlinePolicies")
        documents.extend(p.get("policy") for p in inline or [] if isinstance(p, Mapping))
        if _is_admin(resource.props.get("managedPolicyArns")):
            return [f"{resource.name}: AdministratorAccess is `*:*`; attach what the role needs"]
    elif resource.type in _ATTACHMENTS:
        if _is_admin(resource.props.get("policyArn")):
            return [f"{resource.name}: AdministratorAccess is `*:*`; attach what the role needs"]
        return []
    else:
        return []
    messages = []
    for document in documents:
        for index, statement in enumerate(policy_statements(document)):
            if statement.get("Effect") != "Allow":
                continue
            actions = _as_list(statement.get("Action"))
            targets = _as_list(statement.get("Resource"))
            if any(a in ("*", "*:*") for a in actions) and "*" in targets:
                sid = statement.get("Sid") or f"#{index}"
                messages.append(
                    f"{resource.name}: statement {sid} allows every action (`*:*`) on every "
                    f"resource; list the actions and resources the principal needs"
                )
    return messages


def _is_admin(arns: Any) -> bool:
    return any(isinstance(a, str) and a.endswith(ADMIN_POLICY_SUFFIX) for a in _as_list(arns))


def policy_statements(document: Any) -> list[Mapping[str, Any]]:
    """Statements of an IAM policy document given as JSON text or a dict; [] when unknown."""
    if document is None or document is UNKNOWN:
        return []
    if isinstance(document, str):
        try:
            document = json.loads(document)
        except json.JSONDecodeError:
            return []
    statements = document.get("Statement") if isinstance(document, Mapping) else None
    if isinstance(statements, Mapping):
        statements = [statements]
    return [s for s in statements or [] if isinstance(s, Mapping)]


def _as_list(value: Any) -> list[Any]:
    if value is None or value is UNKNOWN:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]


# --- ECR -------------------------------------------------------------------------------------

ECR_REPOSITORY = "aws:ecr/repository:Repository"


def check_ecr_scan_on_push(resource: Resource) -> list[str]:
    """Every image pushed to our repositories is scanned for known vulnerabilities."""
    if resource.type != ECR_REPOSITORY:
        return []
    scan = dig(resource.props, "imageScanningConfiguration", "scanOnPush")
    if scan is True or scan is UNKNOWN:
        return []
    return [
        f"{resource.name}: ECR repository without scan on push; set "
        f"imageScanningConfiguration.scanOnPush=true"
    ]


# --- EKS -------------------------------------------------------------------------------------

PULUMI_EKS_CLUSTER = "eks:index:Cluster"
AWS_EKS_CLUSTER = "aws:eks/cluster:Cluster"


def check_eks_secrets_encryption(resource: Resource) -> list[str]:
    """Kubernetes secrets (the HF token among them) are envelope-encrypted with a KMS key."""
    props = resource.props
    if resource.type == PULUMI_EKS_CLUSTER:
        key = props.get("encryptionConfigKeyArn")
        ok = key is UNKNOWN or (isinstance(key, str) and key != "")
    elif resource.type == AWS_EKS_CLUSTER:
        config = props.get("encryptionConfig")
        if config is UNKNOWN:
            return []
        key = dig(config, "provider", "keyArn")
        kinds = _as_list(dig(config, "resources"))
        ok = (key is UNKNOWN or bool(key)) and "secrets" in kinds
    else:
        return []
    if ok:
        return []
    return [
        f"{resource.name}: EKS cluster without KMS envelope encryption of secrets; leave "
        f"fsdp-eks:cluster.secretsKmsKeyArn unset (the stack makes a key) or name a key"
    ]
