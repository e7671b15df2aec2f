"""The command-line tool reaches a stack's cluster exactly as the Pulumi program does.

The program's Kubernetes provider gets its kubeconfig from `infra.platform.kube_access`
(an EKS look-up, the stack's `aws:profile`, `cluster.adminRoleArn` unless the deployer is
that role). The tool builds one from EKS `DescribeCluster`, the stack file and its caller's
STS identity (`infra.job.kubeconfig`). Both are compared here on the real program, evaluated
offline, for each way the identity can come out.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra.config import parse_stack_config, read_stack_file
from infra.job.kubeconfig import (
    KubernetesAccess,
    described_cluster_kubeconfig,
    principal_of_caller,
    same_iam_principal,
    stack_kubernetes_access,
)
from infra.offline.outputs import ACCOUNT_ID, INVOKE_RESULTS
from infra.offline.outputs import DEFAULT_REGION as REGION
from tests.infra.test_cluster import ADMIN_ROLE, K8S_PROVIDER, STACKS, run_stack, unsecret

CALLER = "aws:index/getCallerIdentity:getCallerIdentity"
DEPLOYER = f"arn:aws:iam::{ACCOUNT_ID}:user/deployer"
ADMIN_SESSION = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/platform-admins/ci-run-7"


@pytest.mark.parametrize(
    ("name", "cluster", "config", "caller"),
    [
        ("dev", {"adminRoleArn": ADMIN_ROLE}, {"aws:profile": "ml-lab"}, DEPLOYER),
        ("dev", {"adminRoleArn": ADMIN_ROLE}, {}, ADMIN_SESSION),
        (
            "team-cluster",
            {"adminRoleArn": f"arn:aws:iam::{ACCOUNT_ID}:role/ml-team-admins"},
            {"aws:profile": "ml"},
            DEPLOYER,
        ),
    ],
)
def test_the_tool_builds_the_programs_kubeconfig(
    name: str,
    cluster: dict[str, Any],
    config: dict[str, Any],
    caller: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = INVOKE_RESULTS[CALLER]
    monkeypatch.setitem(INVOKE_RESULTS, CALLER, lambda args: {**real(args), "arn": caller})
    result = run_stack(name, cluster=cluster, **config)
    programs = json.loads(unsecret(result.one(K8S_PROVIDER).inputs["kubeconfig"]))

    # What the tool has: the stack file, DescribeCluster of the cluster the stack names, and
    # its caller's identity (boto3 `sts.get_caller_identity()["Arn"]`).
    stack_file = read_stack_file(name, STACKS)
    values = {**stack_file.config, **config}
    values["fsdp-eks:cluster"] = {**values.get("fsdp-eks:cluster", {}), **cluster}
    stack = parse_stack_config(values, stack_name=name)
    described = INVOKE_RESULTS["aws:eks/getCluster:getCluster"](
        {"name": programs["clusters"][0]["name"]}
    )
    access = stack_kubernetes_access(stack, values.get("aws:profile"), caller)
    assert described_cluster_kubeconfig(described, REGION, access) == programs


@pytest.mark.parametrize(
    ("caller", "principal"),
    [
        (ADMIN_SESSION, f"arn:aws:iam::{ACCOUNT_ID}:role/platform-admins"),
        (DEPLOYER, DEPLOYER),
        (f"arn:aws:iam::{ACCOUNT_ID}:root", f"arn:aws:iam::{ACCOUNT_ID}:root"),
        (
            "arn:aws-cn:sts::123456789012:assumed-role/AWSReservedSSO_Admin_0123/jane@example.com",
            "arn:aws-cn:iam::123456789012:role/AWSReservedSSO_Admin_0123",
        ),
    ],
)
def test_the_callers_principal_is_the_role_behind_its_session(caller: str, principal: str) -> None:
    assert principal_of_caller(caller) == principal


def test_an_sso_session_is_the_same_principal_as_its_role_with_its_path() -> None:
    """`GetSessionContext` (the program) gives the role with its path; the session ARN (the
    tool) has none; both must decide alike whether to assume the admin role."""
    role = f"arn:aws:iam::{ACCOUNT_ID}:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_A_1"
    session = f"arn:aws:sts::{ACCOUNT_ID}:assumed-role/AWSReservedSSO_A_1/jane"
    assert same_iam_principal(role, principal_of_caller(session))


def test_without_a_known_caller_the_admin_role_is_assumed() -> None:
    stack = parse_stack_config(
        {**read_stack_file("dev", STACKS).config, "fsdp-eks:cluster": {"adminRoleArn": ADMIN_ROLE}},
        stack_name="dev",
    )
    assert stack_kubernetes_access(stack, None, None) == KubernetesAccess(role_arn=ADMIN_ROLE)
