"""The guardrails see a TrainJob stack's job: its nodes in the TrainingRuntime's replicated
job, its deadline in the TrainJob (tests/infra/test_policy.py holds the PyTorchJob stacks)."""

from __future__ import annotations

import json
from pathlib import Path

from infra.config.cost import CostConfig
from infra.policy.offline import check_resources, run_policies
from infra.policy.settings import policy_config, policy_config_from_stack_file
from infra.policy.view import Resource, job_deadline, pod_templates
from tests.infra.test_trainjob_stack import RUNTIME, TRAINJOB, evaluation

STACK_FILE = Path(__file__).resolve().parents[2] / "stacks/Pulumi.llama32-1b-g5-trainjob.yaml"
GENEROUS = policy_config(CostConfig.model_validate({"maxUsdPerRun": 10_000}))


def resources() -> list[Resource]:
    return [Resource.from_recorded(r) for r in evaluation().resources]


def test_the_runtime_holds_four_g5_nodes_and_the_trainjob_its_deadline() -> None:
    everything = resources()
    [runtime] = [r for r in everything if r.type == RUNTIME]
    [job] = [r for r in everything if r.type == TRAINJOB]
    [template] = pod_templates(runtime)
    assert template.replicas == 4
    assert template.spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.8xlarge"}
    assert job_deadline(job) == 6 * 3600
    assert pod_templates(job) == []


def test_the_stack_passes_and_a_cent_ceiling_catches_it() -> None:
    config = policy_config_from_stack_file(STACK_FILE)
    assert run_policies(evaluation(), config) == []
    config["cost-ceiling"]["maxUsdPerRun"] = 0.01
    violations = run_policies(evaluation(), config)
    assert [v.policy for v in violations] == ["cost-ceiling"]
    assert "exceeds fsdp-eks:cost.maxUsdPerRun" in violations[0].message


def test_a_runtime_without_max_steps_or_deadline_is_unbounded() -> None:
    everything = resources()
    tampered = []
    for resource in everything:
        if resource.type not in (RUNTIME, TRAINJOB):
            tampered.append(resource)
            continue
        props = json.loads(json.dumps(resource.props))
        if resource.type == TRAINJOB:
            props["spec"].pop("activeDeadlineSeconds")
        if resource.type == RUNTIME:
            for job in props["spec"]["template"]["spec"]["replicatedJobs"]:
                for container in job["template"]["spec"]["template"]["spec"]["containers"]:
                    container["args"] = [a for a in container["args"] if "max_steps" not in a]
        tampered.append(Resource(resource.urn, resource.type, resource.name, props))
    found = {v.policy for v in check_resources(tampered, GENEROUS)}
    assert "job-run-bound" in found
