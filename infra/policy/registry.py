"""The guardrails: one list, registered by the policy pack and run by the offline plan.

A guardrail has either a resource check (one resource at a time; the engine calls it for
every resource it registers) or a stack check (all resources at once, for rules that relate
resources, e.g. a job to the node group it runs on). Adding one here adds it to both
`pulumi preview --policy-pack infra/policy` and `scripts/cli/plan.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infra.policy.aws_checks import (
    check_ecr_scan_on_push,
    check_eks_secrets_encryption,
    check_iam_no_star_star,
    check_no_public_s3,
)
from infra.policy.cost_checks import check_cost_ceiling
from infra.policy.kube_checks import (
    Finding,
    check_efa,
    check_forbidden_env,
    check_run_is_bounded,
)
from infra.policy.settings import COST_POLICY
from infra.policy.view import Resource

ResourceCheck = Callable[[Resource], list[str]]
StackCheck = Callable[[Sequence[Resource], Mapping[str, Any]], list[Finding]]
Enforcement = Literal["mandatory", "advisory"]

PACK_NAME = "fsdp-eks-guardrails"


@dataclass(frozen=True)
class Guardrail:
    name: str
    description: str
    resource_check: ResourceCheck | None = None
    stack_check: StackCheck | None = None
    enforcement: Enforcement = "mandatory"
    config_schema: dict[str, dict[str, Any]] = field(default_factory=dict)
    """JSON-schema properties of this guardrail's settings (policy-pack config)."""


def _ignore_config(check: Callable[[Sequence[Resource]], list[Finding]]) -> StackCheck:
    def stack_check(resources: Sequence[Resource], config: Mapping[str, Any]) -> list[Finding]:
        return check(resources)

    return stack_check


_NUMBER_OR_NULL = {"type": ["number", "null"]}
_STRING_OR_NULL = {"type": ["string", "null"]}

GUARDRAILS: tuple[Guardrail, ...] = (
    Guardrail(
        "efa-on-efa-instances",
        "Multi-node GPU jobs on EFA instances request every EFA interface (else NCCL falls "
        "back to TCP); no EFA request on instances without EFA.",
        stack_check=_ignore_config(check_efa),
    ),
    Guardrail(
        "no-forbidden-nccl-env",
        "Containers do not set NCCL_SOCKET_IFNAME=eth0, NCCL_PROTO, NCCL_ALGO, "
        "NCCL_P2P_DISABLE=1 or CUDA_LAUNCH_BLOCKING=1.",
        resource_check=check_forbidden_env,
    ),
    Guardrail(
        "no-public-s3",
        "No public bucket ACLs, no weakened public access blocks, no bucket policy that "
        "allows everyone.",
        resource_check=check_no_public_s3,
    ),
    Guardrail(
        "iam-no-star-star",
        "No IAM statement allows every action on every resource; no AdministratorAccess.",
        resource_check=check_iam_no_star_star,
    ),
    Guardrail(
        "ecr-scan-on-push",
        "ECR repositories scan every pushed image.",
        resource_check=check_ecr_scan_on_push,
    ),
    Guardrail(
        "eks-secrets-encryption",
        "EKS clusters envelope-encrypt Kubernetes secrets with a KMS key.",
        resource_check=check_eks_secrets_encryption,
    ),
    Guardrail(
        COST_POLICY,
        "Estimated $/hour of the GPU nodes x run hours stays under fsdp-eks:cost.maxUsdPerRun.",
        stack_check=check_cost_ceiling,
        config_schema={
            "maxUsdPerRun": _NUMBER_OR_NULL,
            "maxRunHours": _NUMBER_OR_NULL,
            "usdPerInstanceHour": _NUMBER_OR_NULL,
            "instanceType": _STRING_OR_NULL,
            "nodeCount": {"type": ["integer", "null"]},
            "capacityType": _STRING_OR_NULL,
        },
    ),
    Guardrail(
        "job-run-bound",
        "Training jobs end by themselves: a deadline (job.maxRunHours) or --max_steps.",
        resource_check=check_run_is_bounded,
    ),
)
