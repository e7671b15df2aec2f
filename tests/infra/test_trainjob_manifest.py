"""The run as a TrainJob: the same pod as the PyTorchJob's, valid for Trainer v2.3.0's CRDs,
with the operator's restart rules carried by the batch Job JobSet creates."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

from infra.config import StackConfig, load_stack_file, parse_stack_config
from infra.estimates.run_plan import RunPlan, plan_run
from infra.job.job_api import TRAINJOB
from infra.job.manifest import (
    CONTAINER_NAME,
    RENDEZVOUS_PORT,
    RENDEZVOUS_PORT_NAME,
    S3Bucket,
    elastic_policy,
    render_job,
)
from infra.job.trainjob_manifest import (
    POD_DIFFERENCES,
    TRAINER_CONTAINER,
    render_trainjob,
    restart_rules,
)
from tests.crd_schemas import validate as validate_against_schema

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp@sha256:" + "a" * 64
TORCH_PLUGIN_ENV = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR",
                    "PET_MASTER_PORT"}  # fmt: skip
"""kubeflow/trainer v2.3.0 `pkg/constants` `TorchRunReservedEnvNames`: the plugin's own."""


def g5_config(**job: Any) -> StackConfig:
    """stacks/Pulumi.llama32-1b-g5.yaml with `job` keys added."""
    shipped = load_stack_file("llama32-1b-g5")
    values = shipped.model_dump(by_alias=True, exclude_unset=True)
    values["job"] = {**values.get("job", {}), **job}
    values.pop("hfToken", None)
    return parse_stack_config(values, stack_name="llama32-1b-g5")


def plan(**job: Any) -> RunPlan:
    return plan_run(g5_config(**job))


RENDERINGS: dict[str, dict[str, Any]] = {
    "fsx": {"pvc_name": "fsx-claim"},
    "s3": {
        "pvc_name": None,
        "service_account_name": "exp-run",
        "bucket": S3Bucket(name="runs-bucket", region="us-west-2"),
        "hf_secret_name": "exp-hf-token",
    },
}


def undo_listed_differences(template: dict[str, Any]) -> dict[str, Any]:
    """The TrainJob's pod template with each of `POD_DIFFERENCES` undone."""
    template = copy.deepcopy(template)
    spec = template["spec"]
    spec.pop("restartPolicy")
    [container] = spec["containers"]
    container["name"] = CONTAINER_NAME
    container["env"] = [e for e in container["env"] if not e["name"].startswith("PET_RDZV_")
                        and e["name"] != "PET_MAX_RESTARTS"]  # fmt: skip
    container["ports"].insert(0, {"name": RENDEZVOUS_PORT_NAME, "containerPort": RENDEZVOUS_PORT})
    return template


@pytest.mark.parametrize("rendering", list(RENDERINGS))
def test_both_apis_run_the_same_pod_but_for_the_listed_differences(rendering: str) -> None:
    run = plan(api="trainjob")
    kwargs = RENDERINGS[rendering]
    pytorchjob = render_job(run, image=IMAGE, **kwargs).spec["pytorchReplicaSpecs"]["Worker"]
    trainjob = render_trainjob(run, image=IMAGE, **kwargs)
    assert trainjob.pod_template != pytorchjob["template"]
    assert undo_listed_differences(trainjob.pod_template) == pytorchjob["template"]
    assert trainjob.pod_template["spec"]["restartPolicy"] == pytorchjob["restartPolicy"]
    assert len(POD_DIFFERENCES) == 4


def test_the_objects_validate_against_trainer_v2_3_crds(
    trainjob_schema: dict[str, Any], trainingruntime_schema: dict[str, Any]
) -> None:
    for policy in ("OnFailure", "ExitCode", "Never"):
        rendered = render_trainjob(plan(api="trainjob", restartPolicy=policy), image=IMAGE,
                                   pvc_name="fsx-claim")  # fmt: skip
        validate_against_schema(rendered.runtime, trainingruntime_schema)
        validate_against_schema(rendered.trainjob, trainjob_schema)


def test_a_wrong_field_fails_the_schema(trainingruntime_schema: dict[str, Any]) -> None:
    rendered = render_trainjob(plan(api="trainjob"), image=IMAGE, pvc_name="fsx-claim")
    bad = copy.deepcopy(rendered.runtime)
    bad["spec"]["template"]["spec"]["failurePolicy"]["restartStrategy"] = "Sometimes"
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(bad, trainingruntime_schema)


def test_the_trainjob_names_its_runtime_and_leaves_suspend_alone() -> None:
    run = plan(api="trainjob", maxRunHours=6)
    rendered = render_trainjob(run, image=IMAGE, pvc_name="fsx-claim")
    spec = rendered.trainjob["spec"]
    assert spec["runtimeRef"]["name"] == rendered.runtime["metadata"]["name"]
    assert spec["runtimeRef"]["kind"] == "TrainingRuntime"
    assert spec["trainer"] == {"numNodes": 4, "numProcPerNode": 1}
    assert spec["activeDeadlineSeconds"] == 6 * 3600
    assert "suspend" not in spec
    assert TRAINJOB.runtime_name(rendered.trainjob) == rendered.runtime["metadata"]["name"]
    assert TRAINJOB.workers(rendered.trainjob) == 4
    assert TRAINJOB.backoff_limit(rendered.trainjob, rendered.runtime) == 3
    grace = rendered.job.spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ]
    pod = TRAINJOB.pod_template(rendered.trainjob, rendered.runtime)
    assert pod["spec"]["terminationGracePeriodSeconds"] == grace


def test_the_rendezvous_is_the_pytorchjobs_on_node_0s_jobset_hostname() -> None:
    run = plan(api="trainjob")
    rendered = render_trainjob(run, image=IMAGE, pvc_name="fsx-claim")
    [container] = rendered.pod_template["spec"]["containers"]
    assert container["name"] == TRAINER_CONTAINER
    env = {e["name"]: e.get("value") for e in container["env"]}
    policy = elastic_policy(workers=4, max_restarts=3, run_name="llama32-1b-g5",
                            start_timeout_s=run.timeouts.start_budget_seconds)  # fmt: skip
    # `<jobset>-<replicatedJob>-<job index>-<pod index>.<subdomain>` (jobset v0.12.0).
    assert env["PET_RDZV_ENDPOINT"] == "llama32-1b-g5-node-0-0.llama32-1b-g5:29500"
    assert env["PET_RDZV_BACKEND"] == "c10d"
    assert env["PET_RDZV_ID"] == "llama32-1b-g5"
    assert env["PET_MAX_RESTARTS"] == "3"
    assert env["PET_RDZV_CONF"] == ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    # The plugin's variables are its own: the TrainJob webhook refuses them in spec.trainer.env.
    assert not TORCH_PLUGIN_ENV & set(env)
    jobset = rendered.runtime["spec"]["template"]["spec"]
    assert jobset["network"] == {"enableDNSHostnames": True}
    [node] = jobset["replicatedJobs"]
    assert node["name"] == "node" and node["replicas"] == 1
    assert node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"
    }


def test_restarts_by_exit_code_fail_at_once_on_a_permanent_code() -> None:
    pod_policy, job = restart_rules("ExitCode", 5)
    assert pod_policy == "Never"  # a pod failure policy needs it (batch/v1 validation)
    assert job["backoffLimit"] == 5
    [rule] = job["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob"
    codes = rule["onExitCodes"]
    assert codes["containerName"] == "node" and codes["operator"] == "In"
    # training-operator v1.9.0 `IsRetryableExitCode`: >= 128 restarts, the rest fail.
    assert codes["values"] == list(range(1, 128))
    assert 140 not in codes["values"] and 143 not in codes["values"]
    assert restart_rules("OnFailure", 5) == ("OnFailure", {"backoffLimit": 5})
    assert restart_rules("Never", 5) == ("Never", {"backoffLimit": 0})


def test_a_finished_jobset_stays_and_never_restarts_itself() -> None:
    """No TTL: on Trainer v2.3.0 a failed TrainJob whose JobSet is deleted gets a new one
    (`trainjob_controller.go` `removeFailedCondition`, kubeflow/trainer#3779): the run would
    start again on GPUs after the TTL."""
    rendered = render_trainjob(plan(api="trainjob"), image=IMAGE, pvc_name="fsx-claim")
    jobset = rendered.runtime["spec"]["template"]["spec"]
    assert "ttlSecondsAfterFinished" not in jobset
    assert jobset["failurePolicy"] == {"maxRestarts": 0}


def runtime_webhook_problems(runtime: dict[str, Any]) -> list[str]:
    """Trainer v2.3.0's TrainingRuntime webhook (`pkg/webhooks/trainingruntime_webhook.go`
    `validateReplicatedJobs`): a replicated job labelled as the trainer ancestor must have
    `replicas: 1` and a container named `node`."""
    problems = []
    for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
        labels = job["template"].get("metadata", {}).get("labels", {})
        if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
            continue
        if job.get("replicas", 1) != 1:
            problems.append(f"{job['name']}: replicas always must be 1")
        names = [c["name"] for c in job["template"]["spec"]["template"]["spec"]["containers"]]
        if "node" not in names:
            problems.append(f"{job['name']}: no container named node")
    return problems


def test_the_runtime_passes_trainer_v2_3s_runtime_webhook() -> None:
    rendered = render_trainjob(plan(api="trainjob"), image=IMAGE, pvc_name="fsx-claim")
    assert runtime_webhook_problems(rendered.runtime) == []
    # The model can fail: the PyTorchJob's container name is refused.
    renamed = copy.deepcopy(rendered.runtime)
    [node] = renamed["spec"]["template"]["spec"]["replicatedJobs"]
    node["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = CONTAINER_NAME
    assert runtime_webhook_problems(renamed) == ["node: no container named node"]
