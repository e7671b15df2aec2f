"""Who holds the GPU nodes: the plan's lease line and the existing cluster's report.

The existing-cluster report reads what EKS says of its managed node groups (`ListNodegroups`,
`DescribeNodegroup` `scalingConfig`); the stack must only look, never change them.
"""

from __future__ import annotations

from typing import Any

import pytest
from pulumi.runtime import mocks as pulumi_mocks

from infra.config import load_stack_file, parse_stack_config, read_stack_file
from infra.offline import FakeCloud, evaluate
from infra.platform.gpu_lease import NodeGroupScaling, existing_lease_report, lease_line
from infra.program import main as program

P5 = "p5.48xlarge"


def group(name: str, minimum: int, maximum: int, *types: str) -> NodeGroupScaling:
    return NodeGroupScaling(name, types or (P5,), minimum, minimum, maximum)


def test_a_group_that_can_reach_zero_is_reported_without_a_warning() -> None:
    report, warnings = existing_lease_report(P5, 2, [group("gpu", 0, 4)], auto_mode=False)
    assert report.startswith("node group gpu (min 0, now 0, max 4) can scale to zero")
    assert "not checked" in report  # the autoscaler is the cluster's, and unread
    assert warnings == []


def test_idle_nodes_that_bill_are_a_warning_naming_the_group_and_the_payer() -> None:
    report, warnings = existing_lease_report(P5, 2, [group("gpu", 2, 4)], auto_mode=False)
    assert "keeps 2 node(s) billing while no job runs" in report
    (warning,) = warnings
    assert "existing node group gpu has minSize 2" in warning
    assert "cluster's operators pay" in warning


def test_too_few_nodes_to_start_the_job_is_a_warning() -> None:
    groups = [group("gpu-a", 0, 1), group("gpu-b", 0, 1), group("other", 0, 9, "g5.48xlarge")]
    report, warnings = existing_lease_report(P5, 4, groups, auto_mode=False)
    assert "other" not in report  # only groups that offer the job's instance type count
    (warning,) = warnings
    assert "allow 2 node(s) at most (maxSize), the job needs 4" in warning


def test_a_group_whose_launch_template_sets_the_type_is_a_candidate_not_absent() -> None:
    """EKS reports no instanceTypes for such a group (EFA groups usually are one)."""
    efa = NodeGroupScaling("gpu-efa", (), 2, 2, 4, launch_template="p5-efa")
    report, warnings = existing_lease_report(P5, 2, [efa], auto_mode=False)
    assert report.startswith("node group gpu-efa (min 2, now 2, max 4) sets its instance type")
    assert "launch template p5-efa" in report and "no EKS managed node group" not in report
    (warning,) = warnings
    assert "has minSize 2: if it is the p5.48xlarge group" in warning


@pytest.mark.parametrize(("auto_mode", "source"), [(True, "EKS Auto Mode"), (False, "Karpenter")])
def test_no_managed_group_of_the_type_says_the_stack_cannot_see(
    auto_mode: bool, source: str
) -> None:
    report, warnings = existing_lease_report(
        P5, 2, [group("cpu", 1, 3, "m7i.2xlarge")], auto_mode=auto_mode
    )
    assert report.startswith(f"no EKS managed node group offers {P5}")
    assert source in report
    assert warnings == []


def test_the_plan_line_says_when_billing_starts_and_stops() -> None:
    shipped = load_stack_file("llama31-8b-p5")
    assert lease_line(shipped) == (
        "0 now, 32 GPUs (4 x p5.48xlarge, 8 each) while the job runs (all 4 nodes placed within "
        "60 min or none), 0 about 10 min "
        "after it ends (cluster autoscaler)"
    )
    warm = shipped.model_copy(
        update={"gpu_nodes": shipped.gpu_nodes.model_copy(update={"keep_warm": True})}
    )
    assert lease_line(warm).startswith(
        "32 GPUs (4 x p5.48xlarge, 8 each) from `pulumi up` until `pulumi destroy`"
    )
    assert "(gpuNodes.keepWarm)" in lease_line(warm)
    existing = load_stack_file("team-cluster")
    assert "the stack does not scale them" in lease_line(existing)


def test_a_shorter_start_budget_shows_in_the_line() -> None:
    config = parse_stack_config(
        {
            "gpuNodes": {"instanceType": "g5.8xlarge", "count": 2},
            "job": {"maxRunHours": 1, "startTimeoutMinutes": 20},
            "training": {"maxSteps": 50},
            "model": {"preset": "llama3.2-1b", "numLayers": 2},
        },
        stack_name="exp",
    )
    assert "(all 2 nodes placed within 20 min or none)" in lease_line(config)


class TeamCloud(FakeCloud):
    """An existing cluster with a warm p5 group, a p5 group that can reach zero and a CPU one."""

    GROUPS = {
        "system": (["m7i.2xlarge"], 2, 2, 3),
        "p5-reserved": ([P5], 1, 1, 1),
        "p5-burst": ([P5], 0, 0, 4),
        "efa-templated": ([], 0, 0, 2),  # EKS: instanceTypes null with a launch template
    }

    def call(self, args: pulumi_mocks.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        if args.token == "aws:eks/getNodeGroups:getNodeGroups":
            self.invokes.append((args.token, dict(args.args)))
            return {"clusterName": args.args["clusterName"], "names": list(self.GROUPS)}, []
        if args.token == "aws:eks/getNodeGroup:getNodeGroup":
            self.invokes.append((args.token, dict(args.args)))
            types, low, now, high = self.GROUPS[args.args["nodeGroupName"]]
            return {
                "clusterName": args.args["clusterName"],
                "nodeGroupName": args.args["nodeGroupName"],
                "instanceTypes": types or None,
                "scalingConfigs": [{"minSize": low, "desiredSize": now, "maxSize": high}],
                "launchTemplates": [] if types else [{"id": "lt-1", "name": "efa", "version": "3"}],
            }, []
        return super().call(args)


def test_an_existing_cluster_s_groups_are_read_and_reported_not_changed() -> None:
    stack_file = read_stack_file("team-cluster")
    cloud = TeamCloud()
    result = evaluate(
        program,
        config=stack_file.config,
        secret_keys=stack_file.secret_keys,
        stack="team-cluster",
        fake_cloud=cloud,
    )
    described = sorted(
        args["nodeGroupName"]
        for token, args in result.invokes
        if token == "aws:eks/getNodeGroup:getNodeGroup"
    )
    assert described == sorted(TeamCloud.GROUPS)
    assert {args["clusterName"] for token, args in result.invokes if "NodeGroup" in token} == {
        "ml-team-cluster"
    }
    lease = result.stack_outputs["gpuLease"]
    assert "node group p5-burst (min 0, now 0, max 4) can scale to zero" in lease
    assert "node group p5-reserved (min 1, now 1, max 1) keeps 1 node(s) billing" in lease
    assert "system" not in lease
    # Looked at, never touched: no node group, autoscaler or ASG tag is registered.
    types = {r.type for r in result.resources}
    assert not types & {
        "aws:eks/nodeGroup:NodeGroup",
        "aws:autoscaling/tag:Tag",
        "kubernetes:helm.sh/v3:Release",
    }


def test_a_created_cluster_s_output_is_the_plan_line() -> None:
    stack_file = read_stack_file("llama32-1b-g5")
    result = evaluate(
        program, config=stack_file.config, secret_keys=stack_file.secret_keys, stack="llama32-1b-g5"
    )
    assert result.stack_outputs["gpuLease"] == lease_line(load_stack_file("llama32-1b-g5"))
    assert not [token for token, _ in result.invokes if "NodeGroup" in token]
