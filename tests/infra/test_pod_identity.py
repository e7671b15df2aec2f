"""Every role a pod assumes through EKS Pod Identity trusts exactly the service account its
association binds, on this cluster: the one helper (`infra.platform.iam.pod_identity_role`)
builds role, policy and association together, so the three cannot disagree."""

from __future__ import annotations

import json

import pytest

from infra.config import read_stack_file
from infra.offline import evaluate
from infra.program import main as program

ASSOCIATION = "aws:eks/podIdentityAssociation:PodIdentityAssociation"
ROLE = "aws:iam/role:Role"


@pytest.mark.parametrize(
    ("stack", "expected"),
    [
        # dev: no FSx, so the job's own role for its run's prefix in S3; and the autoscaler.
        ("dev", {("kube-system", "cluster-autoscaler"), ("training", "dev-trainer")}),
        # A stack with FSx: the CSI controller's role instead of the job's; metrics in AMP,
        # so the in-cluster Grafana's query role.
        (
            "llama32-1b-g5",
            {
                ("kube-system", "cluster-autoscaler"),
                ("kube-system", "fsx-csi-controller-sa"),
                ("llama32-1b-g5-metrics", "grafana"),
            },
        ),
    ],
)
def test_each_association_binds_a_role_that_trusts_only_its_account(
    stack: str, expected: set[tuple[str, str]]
) -> None:
    stack_file = read_stack_file(stack)
    result = evaluate(
        program,
        config=stack_file.config,
        secret_keys=stack_file.secret_keys,
        stack=stack_file.stack_name,
    )
    roles = {r.outputs.get("arn"): r for r in result.of_type(ROLE)}
    bound = set()
    for association in result.of_type(ASSOCIATION):
        inputs = association.inputs
        role = roles[inputs["roleArn"]]
        [statement] = json.loads(role.inputs["assumeRolePolicy"])["Statement"]
        assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
        assert statement["Condition"]["StringEquals"] == {
            "aws:RequestTag/eks-cluster-name": inputs["clusterName"],
            "aws:RequestTag/kubernetes-namespace": inputs["namespace"],
            "aws:RequestTag/kubernetes-service-account": inputs["serviceAccount"],
        }
        # The role's one policy is its own, inline, beside it.
        assert role.name.removesuffix("-role") == association.name.removesuffix("-identity")
        bound.add((inputs["namespace"], inputs["serviceAccount"]))
    assert bound == expected
