"""The GPU lease: the autoscaler's release and identity, the node group it scales, and the ASG
tags that must describe a GPU node exactly as the job's pods need it while none exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.config import parse_stack_config, read_stack_file
from infra.estimates.run_plan import plan_run
from infra.facts.instances import INSTANCE_FACTS
from infra.job.manifest import EFA_RESOURCE, GPU_RESOURCE, render_job
from infra.offline import evaluate
from infra.platform.autoscaler import (
    CHART_VERSION,
    TEMPLATE_TAG,
    WRITE_ACTIONS,
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
            "storage": {"fsx": {"existingClaimName": "shared"}},
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


def test_the_autoscaler_may_scale_only_this_clusters_groups() -> None:
    policy = permissions("lease-cluster")
    [write] = [s for s in policy["Statement"] if set(s["Action"]) & set(WRITE_ACTIONS)]
    assert sorted(write["Action"]) == sorted(WRITE_ACTIONS)
    assert write["Condition"] == {
        "StringEquals": {"aws:ResourceTag/k8s.io/cluster-autoscaler/lease-cluster": "owned"}
    }
    assert all(a != "*" and not a.endswith(":*") for s in policy["Statement"] for a in s["Action"])


NESTED_CHART_KEYS = frozenset(
    {"autoDiscovery.clusterName", "rbac.serviceAccount.create", "rbac.serviceAccount.name"}
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
