"""The job's own access to its run's prefix of the bucket: checkpoints in S3 when there is no FSx.

A Pod Identity role limited to `s3://<bucket>/checkpoints/<run id>/`, plus `s3:ListBucket`
without a prefix condition, which DCP's HeadObject of `.metadata` needs to get a 404
(Amazon S3 API Reference, HeadObject, "Permissions").
Why, with sources: docs/design/platform.md#run_access
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.platform.iam import pod_identity_role

OBJECT_ACTIONS = (
    "s3:GetObject",  # loads, and HeadObject of objects that exist
    "s3:PutObject",  # shards, markers, metrics (multipart uploads included)
    "s3:DeleteObject",  # pruning, and clearing a crashed save before it is retried
    "s3:AbortMultipartUpload",  # a failed large upload leaves no billed parts behind
)
"""What the trainer does to objects under its run's prefix."""


def service_account_name(job_name: str) -> str:
    """The job's service account (one per job: each is bound to its own run's prefix)."""
    return f"{job_name}-trainer"


def permissions(bucket_arn: str, prefix: str) -> dict[str, Any]:
    """Objects under `prefix/` only; key listing of the bucket (see the module docstring)."""
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "ThisRunsObjects",
                "Effect": "Allow",
                "Action": list(OBJECT_ACTIONS),
                "Resource": f"{bucket_arn}/{prefix.strip('/')}/*",
            },
            {
                "Sid": "KeyListingSoHeadObjectOfAMissingKeyIs404",
                "Effect": "Allow",
                "Action": "s3:ListBucket",
                "Resource": bucket_arn,
            },
        ],
    }


@dataclass
class CheckpointAccessArgs:
    cluster_name: pulumi.Input[str]
    namespace: pulumi.Input[str]
    """The job's namespace (an output of its Namespace resource, so the account waits)."""
    job_name: str
    bucket_arn: pulumi.Input[str]
    prefix: str
    """The run's key prefix in the bucket (`checkpoints/<run id>`)."""
    k8s_provider: pulumi.ProviderResource
    cluster_ready: Sequence[pulumi.Resource] = ()
    """The cluster and its pod identity agent: associations need the cluster."""
    tags: Mapping[str, str] = field(default_factory=dict)


class CheckpointAccess(pulumi.ComponentResource):
    """Service account, role, policy and Pod Identity association for one run's prefix."""

    service_account_name: str
    ready: list[pulumi.Resource]
    """What the job must wait for: Pod Identity injects credentials only into pods created
    after the association exists (EKS User Guide, "Assign an IAM role to a service
    account")."""

    def __init__(
        self, name: str, args: CheckpointAccessArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:storage:CheckpointAccess", name, None, opts)
        self.service_account_name = service_account_name(args.job_name)
        account = k8s.core.v1.ServiceAccount(
            f"{name}-service-account",
            metadata={"name": self.service_account_name, "namespace": args.namespace},
            # The account grants nothing inside Kubernetes and its pods mount no API token: EKS
            # Pod Identity gives them a projected token of its own audience (infra/job/manifest.py).
            opts=pulumi.ResourceOptions(parent=self, provider=args.k8s_provider),
        )
        identity = pod_identity_role(
            name,
            cluster_name=args.cluster_name,
            namespace=args.namespace,
            service_account=self.service_account_name,
            policy=pulumi.Output.from_input(args.bucket_arn).apply(
                lambda arn: json.dumps(permissions(arn, args.prefix))
            ),
            description=f"Trainer of {args.job_name} (Pod Identity): its run's prefix in S3",
            parent=self,
            cluster_ready=args.cluster_ready,
            tags=args.tags,
            sid="EksPodIdentityForThisJob",
        )
        self.ready = [account, identity.policy, identity.association]
        self.register_outputs({"serviceAccountName": self.service_account_name})
