"""SageMaker HyperPod EKS: its `ml.*` instance names are accepted on an existing cluster only,
carry their EC2 family's facts, select nodes by the labels HyperPod sets, and need the rate
SageMaker bills (no EC2 list price stands in for it).

Facts, from AWS's own sources: HyperPod nodes' `node.kubernetes.io/instance-type` is the `ml.`
name (aws/sagemaker-hyperpod-cli `helm_chart/HyperPodHelmChart/values.yaml`: the NVIDIA and EFA
device plugins are placed on `ml.p5.48xlarge`, ... nodes); jobs select
`sagemaker.amazonaws.com/node-health-status: Schedulable` (SageMaker developer guide,
"Resilience-related Kubernetes labels by SageMaker HyperPod"; the HyperPod CLI's
`NODE_AFFINITY_DICT` requires it).
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.config import StackConfigError, parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.facts.instances import (
    HYPERPOD_HEALTH_LABEL,
    instance_facts,
    known_facts,
    scheduling_labels,
)
from infra.facts.prices import PriceUnknownError, instance_price
from infra.job.manifest import render_job
from infra.job.placement import INSTANCE_TYPE_LABEL
from infra.job.stack_checks import checked_run_plan
from infra.offline import evaluate
from infra.policy.offline import run_policies
from infra.policy.settings import policy_config_for
from infra.program import main as program
from tests.infra.test_stacks import REPO_ROOT

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@sha256:" + "0" * 64


def hyperpod_variant(**cost: Any) -> dict[str, Any]:
    """stacks/Pulumi.team-cluster.yaml with the HyperPod lines its comment shows."""
    path = REPO_ROOT / "stacks/Pulumi.team-cluster.yaml"
    raw: dict[str, Any] = yaml.safe_load(path.read_text())["config"]
    raw["fsdp-eks:gpuNodes"] = {"instanceType": "ml.p5.48xlarge", "count": 2}
    raw["fsdp-eks:cost"] = {"maxUsdPerRun": 1000, **cost}
    return raw


def test_ml_types_have_their_ec2_familys_facts() -> None:
    assert instance_facts("ml.p5.48xlarge") == instance_facts("p5.48xlarge")
    assert instance_facts("ml.g5.8xlarge").efa_interfaces == 1
    assert known_facts("ml.p9.48xlarge") is None
    with pytest.raises(KeyError, match=r"'ml\.' in front"):
        instance_facts("ml.p9.48xlarge")


def test_only_hyperpod_nodes_get_the_health_label() -> None:
    assert scheduling_labels("ml.p5.48xlarge") == {HYPERPOD_HEALTH_LABEL: "Schedulable"}
    assert scheduling_labels("p5.48xlarge") == {}


def test_an_ml_type_has_no_ec2_list_price_and_says_what_to_set() -> None:
    with pytest.raises(PriceUnknownError, match=r"cost\.usdPerInstanceHour") as caught:
        instance_price("ml.p5.48xlarge")
    assert "SageMaker" in str(caught.value)
    assert instance_price("ml.p5.48xlarge", usd_per_instance_hour=60.0).usd_per_instance_hour == 60


def test_create_mode_refuses_an_ml_type_naming_key_value_and_allowed() -> None:
    raw = {
        "fsdp-eks:gpuNodes": {"instanceType": "ml.p5.48xlarge", "count": 2},
        "fsdp-eks:cost": {"maxUsdPerRun": 5000, "usdPerInstanceHour": 60},
        "fsdp-eks:job": {"maxRunHours": 4},
    }
    with pytest.raises(StackConfigError) as caught:
        parse_stack_config(raw, stack_name="hp")
    (problem,) = caught.value.problems
    assert problem.startswith("gpuNodes.instanceType 'ml.p5.48xlarge' is a SageMaker HyperPod")
    assert "'p5.48xlarge'" in problem and "cluster.mode: existing" in problem


def test_an_unknown_ml_type_lists_what_is_allowed() -> None:
    raw = hyperpod_variant(usdPerInstanceHour=60)
    raw["fsdp-eks:gpuNodes"]["instanceType"] = "ml.p9.48xlarge"
    with pytest.raises(StackConfigError, match=r"e\.g\. ml\.p5\.48xlarge"):
        parse_stack_config(raw, stack_name="hp")


def test_without_the_sagemaker_rate_the_stack_is_refused_before_anything_is_created() -> None:
    with pytest.raises(StackConfigError, match="usdPerInstanceHour"):
        checked_run_plan(hyperpod_variant(), stack_name="hp")


def test_the_job_selects_hyperpod_nodes_by_their_labels() -> None:
    config = parse_stack_config(hyperpod_variant(usdPerInstanceHour=60), stack_name="hp")
    manifest = render_job(plan_run(config), image=IMAGE, pvc_name="fsx-claim").as_dict()
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    pod = worker["template"]["spec"]
    assert pod["nodeSelector"] == {
        INSTANCE_TYPE_LABEL: "ml.p5.48xlarge",
        HYPERPOD_HEALTH_LABEL: "Schedulable",
    }
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8


def test_the_hyperpod_variant_of_team_cluster_plans_and_passes_its_guardrails() -> None:
    raw = hyperpod_variant(usdPerInstanceHour=60)
    config = parse_stack_config(raw, stack_name="team-cluster")
    evaluation = evaluate(program, config=raw, stack="team-cluster")
    (job,) = evaluation.of_type("kubernetes:kubeflow.org/v1:PyTorchJob")
    pod = job.inputs["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    assert pod["nodeSelector"][INSTANCE_TYPE_LABEL] == "ml.p5.48xlarge"
    assert pod["nodeSelector"][HYPERPOD_HEALTH_LABEL] == "Schedulable"
    assert run_policies(evaluation, policy_config_for(config)) == []
    assert evaluation.stack_outputs["estimatedUsdPerHour"] == 120  # 2 x the stack's rate
    cheap = policy_config_for(config)
    cheap["cost-ceiling"]["maxUsdPerRun"] = 100  # 2 x $60 x 4 h = $480
    (violation,) = run_policies(evaluation, cheap)
    assert "2 x ml.p5.48xlarge" in violation.message and "$480.00" in violation.message
