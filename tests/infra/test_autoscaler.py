"""The GPU lease: the autoscaler's release and identity, the node group it scales, and the ASG
tags that must describe a GPU node exactly as the job's pods need it while none exists."""

from __future__ import annotations

import fnmatch
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from infra.config import parse_stack_config, read_stack_file
from infra.config.cluster import GpuNodesConfig
from infra.estimates.run_plan import plan_run
from infra.facts.instances import INSTANCE_FACTS
from infra.job.manifest import EFA_RESOURCE, GPU_RESOURCE, render_job
from infra.job.placement import TEMPLATE_TAG
from infra.offline import evaluate
from infra.platform.autoscaler import (
    CHART_VERSION,
    WRITE_ACTIONS,
    asg_arn,
    chart_values,
    node_template_tags,
    permissions,
)
from infra.program import main as program

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/t@sha256:" + "0" * 64
STACKS = Path(__file__).resolve().parents[2] / "stacks"


def config_for(instance_type: str) -> Any:
    return parse_stack_config(
        {
            "gpuNodes": {"instanceType": instance_type, "count": 2},
            "job": {"maxRunHours": 1},
            "training": {"maxSteps": 1},
            "model": {"preset": "llama3.2-1b", "numLayers": 2},
            "storage": {"fsx": {"storageCapacityGiB": 4800, "perUnitStorageThroughput": 1000}},
            "cost": {"maxUsdPerRun": None, "usdPerInstanceHour": 50},
        },
        stack_name="lease",
    )


@pytest.mark.parametrize("instance_type", sorted(INSTANCE_FACTS))
def test_the_node_template_is_what_the_job_asks_for(instance_type: str) -> None:
    """Requests, node selector and tolerations of the rendered job against the ASG tags: a
    mismatch means the autoscaler never scales up from zero, or scales up nodes that lack
    what the pods need (SkyPilot #10055: EFA dropped on scale-from-zero)."""
    config = config_for(instance_type)
    tags = node_template_tags(config.gpu_nodes)
    pod = render_job(plan_run(config), image=IMAGE, pvc_name="shared").as_dict()
    spec = pod["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    limits = spec["containers"][0]["resources"]["limits"]
    assert tags[f"{TEMPLATE_TAG}/resources/{GPU_RESOURCE}"] == str(limits[GPU_RESOURCE])
    efa_tag = tags.get(f"{TEMPLATE_TAG}/resources/{EFA_RESOURCE}")
    assert efa_tag == (str(limits[EFA_RESOURCE]) if EFA_RESOURCE in limits else None)
    for taint_key, value in tags.items():
        if "/taint/" not in taint_key:
            continue
        key = taint_key.split("/taint/", 1)[1]
        taint_value, effect = value.split(":")
        assert any(
            t["key"] == key
            and t.get("effect") in (None, effect)
            and (t.get("operator") == "Exists" or t.get("value") == taint_value)
            for t in spec["tolerations"]
        ), (key, spec["tolerations"])
    # Labels the pod selects on, other than those the autoscaler derives from the instance
    # type itself (node.kubernetes.io/instance-type), are template labels.
    for key, value in spec["nodeSelector"].items():
        if key != "node.kubernetes.io/instance-type":
            assert tags[f"{TEMPLATE_TAG}/label/{key}"] == value


def iam_allows(
    policy: dict[str, Any], action: str, resource: str, resource_tags: dict[str, str]
) -> bool:
    """An identity policy of Allow statements, as IAM evaluates one (IAM user guide, "Policy
    evaluation logic"): some statement whose Action and Resource patterns match (`*` any
    characters) and whose every StringEquals condition on `aws:ResourceTag/<key>` holds."""
    for statement in policy["Statement"]:
        actions = (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
        resources = (
            statement["Resource"]
            if isinstance(statement["Resource"], list)
            else [statement["Resource"]]
        )
        if statement["Effect"] != "Allow":
            continue
        if not any(fnmatch.fnmatchcase(action, a) for a in actions):
            continue
        if not any(fnmatch.fnmatchcase(resource, r) for r in resources):
            continue
        conditions = statement.get("Condition", {}).get("StringEquals", {})
        if all(
            resource_tags.get(key.removeprefix("aws:ResourceTag/")) == value
            for key, value in conditions.items()
        ):
            return True
    return False


def asg_tags(result: Any) -> dict[str, str]:
    return {
        t.inputs["tag"]["key"]: t.inputs["tag"]["value"]
        for t in result.of_type("aws:autoscaling/tag:Tag")
    }


def eks_asg_tags(cluster: str, node_group: str) -> dict[str, str]:
    """The tags EKS itself puts on a managed node group's ASG that the autoscaler's source
    relies on: `eks:cluster-name` and `eks:nodegroup-name` (cluster-autoscaler-1.35.0
    `cloudprovider/aws/aws_manager.go` `extractLabelsFromAsg` turns them into the labels
    `buildNodeFromTemplate` reads), and the two discovery tags the EKS user guide documents
    ("Managed node groups": tagged for auto-discovery) and the chart's defaults name."""
    return {
        "eks:cluster-name": cluster,
        "eks:nodegroup-name": node_group,
        "k8s.io/cluster-autoscaler/enabled": "true",
        f"k8s.io/cluster-autoscaler/{cluster}": "owned",
    }


def discovered(spec: str, tags: dict[str, str]) -> bool:
    """Whether an ASG with `tags` is one `--node-group-auto-discovery=<spec>` finds:
    `parseASGAutoDiscoverySpec` splits `asg:tag=k1,k2=v2,...` into keys (any value) and
    key=value pairs, and `getAutoscalingGroupsByTags` filters on all of them (`tag-key`, or
    `tag:<key>` = value)."""
    kind, _, param = spec.partition(":")
    key, _, wanted = param.partition("=")
    assert (kind, key) == ("asg", "tag")
    for item in wanted.split(","):
        name, has_value, value = item.partition("=")
        if name not in tags or (has_value and tags[name] != value):
            return False
    return True


def test_the_autoscaler_may_scale_the_gpu_group_and_nothing_else() -> None:
    """Write access by the GPU ASG's ARN (the CA README's minimal policy), not by an `owned`
    tag no source shows EKS setting: with only the tags EKS certainly sets, the GPU group
    scales and the system group does not."""
    result = run_dev()
    policy = json.loads(
        result.one("aws:iam/rolePolicy:RolePolicy", "autoscaler-policy").inputs["policy"]
    )
    [gpu_asg] = {
        t.inputs["autoscalingGroupName"] for t in result.of_type("aws:autoscaling/tag:Tag")
    }
    certain = {"eks:cluster-name": "fsdp-eks-dev", "eks:nodegroup-name": "platform-gpu-nodes"}
    arn = (
        "arn:aws:autoscaling:us-west-2:123456789012:autoScalingGroup:"
        f"{uuid.uuid4()}:autoScalingGroupName/"
    )
    for action in WRITE_ACTIONS:
        assert iam_allows(policy, action, arn + gpu_asg, certain)
        assert not iam_allows(policy, action, arn + "eks-platform-system-0a1b2c", certain)
    assert iam_allows(policy, "autoscaling:DescribeAutoScalingGroups", "*", {})
    assert all(a != "*" and not a.endswith(":*") for s in policy["Statement"] for a in s["Action"])
    assert permissions(asg_arn("aws", "r", "1", "g"))["Statement"][1]["Resource"] == (
        "arn:aws:autoscaling:r:1:autoScalingGroup:*:autoScalingGroupName/g"
    )


def test_the_autoscaler_discovers_the_gpu_group_and_not_the_system_group() -> None:
    """EKS tags every managed group's ASG for discovery: with the chart's default tags the
    autoscaler would resize the system nodes too, which the stack sizes itself."""
    result = run_dev()
    release = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    values = release.inputs["values"]
    cluster = values["autoDiscovery"]["clusterName"]
    # The chart's `--node-group-auto-discovery=asg:tag={{ join "," .Values.autoDiscovery.tags }}`
    # (chart 9.59.0 templates/deployment.yaml).
    spec = "asg:tag=" + ",".join(values["autoDiscovery"]["tags"])
    system = eks_asg_tags(cluster, "platform-system")
    gpu = {**eks_asg_tags(cluster, "platform-gpu-nodes"), **asg_tags(result)}
    assert discovered(spec, gpu)
    assert not discovered(spec, system)


def template_node(
    asg: dict[str, str], node_group: dict[str, str], gpus: int
) -> dict[str, dict[str, str]]:
    """The node Cluster Autoscaler imagines for a group without nodes (cluster-autoscaler-1.35.0
    `aws_manager.go` `buildNodeFromTemplate`): the instance type's GPUs, the ASG's resource
    tags over them, and, for an EKS managed group (the ASG's `eks:` tags give its name), the
    node group's own resource tags from DescribeNodegroup over those."""
    prefix = f"{TEMPLATE_TAG}/resources/"
    capacity = {GPU_RESOURCE: str(gpus)}
    for tags in (asg, node_group):
        capacity.update(
            {k.removeprefix(prefix): v for k, v in tags.items() if k.startswith(prefix)}
        )
    return {"capacity": capacity}


def test_the_first_look_at_the_gpu_group_already_sees_efa() -> None:
    """Before the ASG's template tags exist (they are added after the group), the autoscaler
    reads the group's resources from the node group's own tags, there from its creation."""
    stack = read_stack_file("llama31-8b-p5", STACKS)
    result = evaluate(
        program, config=stack.config, secret_keys=stack.secret_keys, stack=stack.stack_name
    )
    group = result.one("aws:eks/nodeGroup:NodeGroup", "platform-gpu-nodes")
    asg_without_template = eks_asg_tags("c", "platform-gpu-nodes")
    node = template_node(asg_without_template, group.inputs["tags"], gpus=8)
    assert node["capacity"] == {GPU_RESOURCE: "8", EFA_RESOURCE: "32"}


def test_the_release_and_the_job_wait_for_every_node_template_tag() -> None:
    result = run_dev()
    release = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    tags = result.of_type("aws:autoscaling/tag:Tag")
    assert tags
    for tag in tags:
        assert result.depends_on(release, tag), tag.name
        assert result.depends_on(job, tag), tag.name


def ready_for_the_autoscaler(node: dict[str, Any]) -> bool:
    """cluster-autoscaler-1.35.0 `processors/customresources/gpu_processor.go`
    `FilterOutNodesWithUnreadyResources`: a ready node carrying the GPU label
    (`aws_cloud_provider.go` `GPULabel`) but no GPU allocatable yet is counted unready."""
    has_label = "k8s.amazonaws.com/accelerator" in node["labels"]
    has_gpus = int(node["allocatable"].get(GPU_RESOURCE, "0")) > 0
    return not (has_label and not has_gpus)


@pytest.mark.parametrize("instance_type", ["g5.xlarge", "g6e.xlarge"])
def test_a_joining_gpu_node_is_not_taken_for_a_ready_node_without_gpus(instance_type: str) -> None:
    """Until the NVIDIA device plugin registers, a GPU node has no `nvidia.com/gpu`: with the
    autoscaler's GPU label it waits as unready instead of counting as capacity without GPUs
    (for which the autoscaler would add nodes, up to the group's maximum)."""
    result = run_dev(instanceType=instance_type)
    labels = result.one("aws:eks/nodeGroup:NodeGroup", "platform-gpu-nodes").inputs["labels"]
    joining = {"labels": labels, "allocatable": {"cpu": "4", "memory": "16Gi"}}
    assert not ready_for_the_autoscaler(joining)
    registered = {**joining, "allocatable": {**joining["allocatable"], GPU_RESOURCE: "1"}}
    assert ready_for_the_autoscaler(registered)
    # The template the autoscaler scales from zero with carries it too.
    assert (
        asg_tags(result)[f"{TEMPLATE_TAG}/label/k8s.amazonaws.com/accelerator"]
        == labels["k8s.amazonaws.com/accelerator"]
    )


NESTED_CHART_KEYS = frozenset(
    {
        "autoDiscovery.clusterName",
        "autoDiscovery.tags",
        "rbac.serviceAccount.create",
        "rbac.serviceAccount.name",
    }
)
"""Nested keys the release sets, as in the chart's values.yaml at the commit recorded in
tests/infra/test_manifest_scanners.py (which checks the top-level keys of every release)."""
AUTOSCALER_FLAGS = frozenset(
    {
        "scale-down-unneeded-time",
        "scale-down-delay-after-add",
        "skip-nodes-with-local-storage",
        "balance-similar-node-groups",
        "expander",
    }
)
"""Flags of Cluster Autoscaler 1.35.0 (tag cluster-autoscaler-1.35.0,
`cluster-autoscaler/config/flags/flags.go`); `least-waste` is its `LeastWasteExpanderName`."""


def test_the_values_are_keys_of_the_pinned_chart_and_flags_of_its_autoscaler() -> None:
    assert CHART_VERSION == "9.59.0"
    values = chart_values("c", "us-west-2", {"fsdp-eks/node-pool": "system"}, 10)
    nested = {
        f"{key}.{sub}" if not isinstance(inner, dict) else f"{key}.{sub}.{leaf}"
        for key, value in values.items()
        if isinstance(value, dict) and key not in ("extraArgs", "nodeSelector")
        for sub, inner in value.items()
        for leaf in (inner if isinstance(inner, dict) else [None])
    }
    assert {k.removesuffix(".None") for k in nested} <= NESTED_CHART_KEYS
    assert set(values["extraArgs"]) <= AUTOSCALER_FLAGS


def run_dev(**gpu_nodes: Any) -> Any:
    stack = read_stack_file("dev", STACKS)
    config = dict(stack.config)
    config["fsdp-eks:gpuNodes"] = {**config["fsdp-eks:gpuNodes"], **gpu_nodes}
    return evaluate(program, config=config, stack=stack.stack_name)


def test_the_gpu_group_starts_at_zero_and_the_autoscaler_owns_its_size() -> None:
    result = run_dev()
    group = result.one("aws:eks/nodeGroup:NodeGroup", "platform-gpu-nodes")
    assert group.inputs["scalingConfig"] == {"desiredSize": 0, "minSize": 0, "maxSize": 1}
    assert group.ignore_changes == ["scalingConfig.desiredSize"]
    release = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    assert release.inputs["values"]["nodeSelector"] == {"fsdp-eks/node-pool": "system"}
    assert release.inputs["values"]["extraArgs"]["scale-down-unneeded-time"] == "10m"
    tags = {
        t.inputs["tag"]["key"]: t.inputs["tag"]["value"]
        for t in result.of_type("aws:autoscaling/tag:Tag")
    }
    assert tags[f"{TEMPLATE_TAG}/resources/{GPU_RESOURCE}"] == "1"
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert release.urn in job.dependencies


def test_a_warm_group_keeps_its_nodes_and_pulumi_owns_its_size() -> None:
    result = run_dev(keepWarm=True)
    group = result.one("aws:eks/nodeGroup:NodeGroup", "platform-gpu-nodes")
    assert group.inputs["scalingConfig"] == {"desiredSize": 1, "minSize": 1, "maxSize": 1}
    assert group.ignore_changes == []


@pytest.mark.parametrize("name", ["dev", "llama31-8b-p5"])
def test_nothing_the_stack_runs_keeps_a_gpu_node_from_scaling_down(name: str) -> None:
    """Cluster Autoscaler's scale-down blockers (its FAQ, "What types of pods can prevent CA
    from removing a node?"): pods under a PodDisruptionBudget that allows no eviction, pods
    not backed by a controller, pods with local storage, kube-system pods without a PDB. The
    stack creates no PDB; its only controller that tolerates the GPU taint is a DaemonSet
    (the device plugins, which do not block); the job's pods are removed when it ends
    (`cleanPodPolicy: Running`) and their emptyDir scratch is allowed
    (`skip-nodes-with-local-storage=false`)."""
    stack = read_stack_file(name, STACKS)
    result = evaluate(
        program, config=stack.config, secret_keys=stack.secret_keys, stack=stack.stack_name
    )
    assert result.of_type("kubernetes:policy/v1:PodDisruptionBudget") == []
    for deployment in result.of_type("kubernetes:apps/v1:Deployment"):
        pod = deployment.inputs["spec"]["template"]["spec"]
        tolerated = {t.get("key") for t in pod.get("tolerations") or []}
        assert "nvidia.com/gpu" not in tolerated, deployment.name
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert job.inputs["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    release = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    assert release.inputs["values"]["extraArgs"]["skip-nodes-with-local-storage"] == "false"
    assert release.inputs["values"]["nodeSelector"] == {"fsdp-eks/node-pool": "system"}


def test_the_cost_line_says_who_owns_the_idle_tail() -> None:
    from infra.config import load_stack_file

    existing = plan_run(load_stack_file("team-cluster")).cost
    assert existing is not None
    assert existing.lease_tail_hours is None and not existing.nodes_owned
    assert "the existing cluster's GPU nodes: their idle time is its operators'" in (
        existing.summary()
    )
    created = plan_run(load_stack_file("dev")).cost
    assert created is not None
    assert created.nodes_owned and created.lease_tail_hours == pytest.approx(10 / 60)


def test_the_longest_key_allowed_fits_every_limit() -> None:
    """63 characters (EKS's labelKey) is the binding limit: its autoscaler node-template tags
    (label and taint, 46-character prefixes) still fit an ASG tag key's 128."""
    key = "research.example.com/" + "a" * 42
    assert len(key) == 63
    nodes = GpuNodesConfig.model_validate(
        {
            "instanceType": "p5.48xlarge",
            "count": 2,
            "labels": {key: "yes"},
            "taints": [{"key": key}],
        }
    )
    tags = node_template_tags(nodes, efa_interfaces=32)
    mine = [tag for tag in tags if tag.endswith(key)]
    assert len(mine) == 2
    assert all(len(tag) <= 128 for tag in tags)


def test_the_reason_given_for_cluster_autoscaler_is_not_a_refuted_one() -> None:
    """Karpenter 1.11+ expresses EFA interfaces per card, placement groups and reservation
    targets, so that cannot be the reason; the stated ones are cited where they can be checked."""
    import infra.platform.autoscaler as autoscaler

    text = " ".join((autoscaler.__doc__ or "").split())
    assert "cannot express" not in text
    for source in (
        "capacity-blocks-mng",
        "ml-node-groups",
        "provisioning-request.md",
        "karpenter#742",
    ):
        assert source in text, source
