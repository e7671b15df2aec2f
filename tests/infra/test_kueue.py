"""Kueue on a created cluster (`scheduling.kueue: true`): its objects against the pinned CRD
schemas, the rules Kueue applies to them that the mock runtime cannot show, the autoscaler's
ProvisioningRequest switch, and the program's wiring."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
import yaml

from infra.config import parse_stack_config, read_stack_file
from infra.config.scheduling import SchedulingConfig
from infra.estimates.run_plan import plan_run
from infra.job.manifest import render_job
from infra.job.placement import INSTANCE_TYPE_LABEL, gpu_labels
from infra.job.queueing import QUEUE_LABEL, kueue_integrations, plan_lines
from infra.offline import evaluate
from infra.platform.autoscaler import PROVISIONING_REQUEST_ARGS, chart_values
from infra.platform.kueue import chart_values as kueue_chart_values
from infra.platform.kueue_manifests import (
    ADMISSION_CHECK,
    ATOMIC_SCALE_UP,
    PROVISIONING_CONFIG,
    kueue_objects,
    manager_config_yaml,
)
from infra.program import main as program
from tests.crd_schemas import openapi_schema
from tests.crd_schemas import validate as validate_against_schema
from tests.infra.test_autoscaler import STACKS

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/t@sha256:" + "0" * 64
SCHEMAS = {
    "ResourceFlavor": "kueue.x-k8s.io_resourceflavors.v0.19.2.yaml",
    "ClusterQueue": "kueue.x-k8s.io_clusterqueues.v0.19.2.yaml",
    "LocalQueue": "kueue.x-k8s.io_localqueues.v0.19.2.yaml",
    "AdmissionCheck": "kueue.x-k8s.io_admissionchecks.v0.19.2.yaml",
    "ProvisioningRequestConfig": "kueue.x-k8s.io_provisioningrequestconfigs.v0.19.2.yaml",
}


def go_patterns(node: Any) -> Any:
    """The schema with Go's `^(?i)...` patterns as Python's `(?i)^...` (the same language: Python
    takes an inline flag only at the start; AdmissionCheck's `parameters.kind`)."""
    if isinstance(node, dict):
        return {
            key: (
                "(?i)^" + value.removeprefix("^(?i)")
                if key == "pattern" and isinstance(value, str) and value.startswith("^(?i)")
                else go_patterns(value)
            )
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [go_patterns(item) for item in node]
    return node


def kueue_schema(kind: str) -> dict[str, Any]:
    return dict(go_patterns(openapi_schema(SCHEMAS[kind], "v1beta2")))


def queued_config(instance_type: str = "p5.48xlarge", count: int = 2, **scheduling: Any) -> Any:
    return parse_stack_config(
        {
            "gpuNodes": {"instanceType": instance_type, "count": count},
            "job": {"maxRunHours": 1, "namespace": "training"},
            "training": {"maxSteps": 1},
            "model": {"preset": "llama3.2-1b", "numLayers": 2},
            "storage": {"fsx": {"enabled": False}},
            "cost": {"maxUsdPerRun": None, "usdPerInstanceHour": 50},
            "scheduling": {"kueue": True, **scheduling},
        },
        stack_name="queued",
    )


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["kind"]: o for o in objects}


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p4d.24xlarge", "g5.12xlarge"])
def test_every_object_validates_against_the_pinned_crd(instance_type: str) -> None:
    objects = kueue_objects(queued_config(instance_type))
    assert sorted(o["kind"] for o in objects) == sorted(SCHEMAS)
    for manifest in objects:
        assert manifest["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        validate_against_schema(manifest, kueue_schema(manifest["kind"]))


def test_the_schema_check_can_fail() -> None:
    """The same check refuses what Kueue's CRD refuses: an unknown provisioning class name
    pattern, a missing controller name."""
    objects = by_kind(kueue_objects(queued_config()))
    config = objects["ProvisioningRequestConfig"]
    broken = {**config, "spec": {**config["spec"], "provisioningClassName": "Atomic_ScaleUp"}}
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(broken, kueue_schema("ProvisioningRequestConfig"))
    check = objects["AdmissionCheck"]
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema({**check, "spec": {}}, kueue_schema("AdmissionCheck"))
    parameters = {**check["spec"]["parameters"], "kind": "Provisioning_Request"}
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(
            {**check, "spec": {**check["spec"], "parameters": parameters}},
            kueue_schema("AdmissionCheck"),
        )


def _quantity(value: Any) -> float:
    text = str(value)
    for suffix, factor in (("Gi", 2**30), ("Mi", 2**20), ("m", 1e-3)):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


def pod_requests(job: dict[str, Any]) -> dict[str, float]:
    """The pod's effective requests as Kueue counts them: per resource the larger of the init
    containers' largest and the containers' sum (kueue v0.19.2 `pkg/util/resource` as
    `limitrange.TotalRequests` computes them for a pod set)."""
    spec = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    total: dict[str, float] = {}
    for container in spec["containers"]:
        for name, value in container["resources"]["requests"].items():
            total[name] = total.get(name, 0.0) + _quantity(value)
    for container in spec.get("initContainers", []):
        for name, value in container["resources"]["requests"].items():
            total[name] = max(total.get(name, 0.0), _quantity(value))
    return total


@pytest.mark.parametrize("instance_type", ["p5.48xlarge", "p4d.24xlarge", "g5.12xlarge"])
def test_the_cluster_queue_admits_the_whole_job(instance_type: str) -> None:
    """Kueue's default quota check (BlockUndeclared) refuses a workload requesting a resource
    its ClusterQueue does not cover (`flavorassigner.go` "resource %s unavailable in
    ClusterQueue"), and admits it only within nominal quota: every pod of the job must fit."""
    config = queued_config(instance_type)
    job = render_job(plan_run(config), image=IMAGE, pvc_name=None).as_dict()
    queue = by_kind(kueue_objects(config))["ClusterQueue"]
    (group,) = queue["spec"]["resourceGroups"]
    (flavor,) = group["flavors"]
    quota = {r["name"]: _quantity(r["nominalQuota"]) for r in flavor["resources"]}
    requests = pod_requests(job)
    assert set(requests) <= set(group["coveredResources"]), requests
    workers = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
    for name, per_pod in requests.items():
        assert per_pod * workers <= quota[name], name
    # Not more GPUs than the group has at its maximum: the queue is the group.
    assert quota["nvidia.com/gpu"] == config.gpu_nodes.count * config.instance.gpus


def test_the_flavor_selects_the_gpu_nodes_the_pods_already_select() -> None:
    """Kueue merges a flavor's nodeLabels into the admitted job's pod template: each must be a
    label the GPU nodes carry (else no node matches) and one the pods already select with the
    same value (else the live template drifts from what Pulumi rendered)."""
    config = queued_config()
    flavor = by_kind(kueue_objects(config))["ResourceFlavor"]
    labels = flavor["spec"]["nodeLabels"]
    job = render_job(plan_run(config), image=IMAGE, pvc_name=None).as_dict()
    selector = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["nodeSelector"]
    assert labels and labels.items() <= selector.items()
    gpu_node = {**gpu_labels(config.gpu_nodes), INSTANCE_TYPE_LABEL: config.gpu_nodes.instance_type}
    assert labels.items() <= gpu_node.items()


def test_the_admission_check_asks_for_atomic_scale_up_on_every_workload() -> None:
    objects = by_kind(kueue_objects(queued_config()))
    check = objects["AdmissionCheck"]["spec"]
    assert check["controllerName"] == "kueue.x-k8s.io/provisioning-request"
    assert check["parameters"]["name"] == PROVISIONING_CONFIG
    assert objects["ProvisioningRequestConfig"]["spec"]["provisioningClassName"] == ATOMIC_SCALE_UP
    strategy = objects["ClusterQueue"]["spec"]["admissionChecksStrategy"]
    assert strategy == {"admissionChecks": [{"name": ADMISSION_CHECK}]}
    local = objects["LocalQueue"]
    assert local["metadata"] == {"name": "fsdp-eks", "namespace": "training"}
    assert local["spec"]["clusterQueue"] == objects["ClusterQueue"]["metadata"]["name"]


def test_one_function_decides_the_integration() -> None:
    assert kueue_integrations("pytorchjob") == ("kubeflow.org/pytorchjob",)
    assert kueue_integrations("trainjob") == ("trainer.kubeflow.org/trainjob",)
    with pytest.raises(ValueError, match="mpijob"):
        kueue_integrations("mpijob")
    config = yaml.safe_load(manager_config_yaml(kueue_integrations("pytorchjob")))
    assert config["kind"] == "Configuration"
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["integrations"] == {"frameworks": ["kubeflow.org/pytorchjob"]}
    values = kueue_chart_values(kueue_integrations("trainjob"), {"pool": "system"})
    loaded = yaml.safe_load(values["managerConfig"]["controllerManagerConfigYaml"])
    assert loaded["integrations"]["frameworks"] == ["trainer.kubeflow.org/trainjob"]
    assert values["controllerManager"]["nodeSelector"] == {"pool": "system"}


def test_the_autoscaler_serves_provisioning_requests_only_with_kueue() -> None:
    plain = chart_values("c", "us-west-2", {"pool": "system"}, 10)
    assert not set(PROVISIONING_REQUEST_ARGS) & set(plain["extraArgs"])
    queued = chart_values("c", "us-west-2", {"pool": "system"}, 10, provisioning_requests=True)
    assert queued["extraArgs"] == {**plain["extraArgs"], **PROVISIONING_REQUEST_ARGS}
    assert queued["extraArgs"]["enable-provisioning-requests"] == "true"


def test_the_queued_job_is_labelled_and_renders_no_suspend() -> None:
    """Kueue's webhook creates a queued job suspended (kueue v0.19.2 `jobframework/defaults.go`
    `ApplyDefaultForSuspend`); the program renders no `suspend`, so Pulumi never owns it."""
    job = render_job(plan_run(queued_config(queue="runs")), image=IMAGE, pvc_name=None).as_dict()
    assert job["metadata"]["labels"][QUEUE_LABEL] == "runs"
    assert "suspend" not in job["spec"]["runPolicy"]


def run_queued_dev(**scheduling: Any) -> Any:
    stack = read_stack_file("dev", STACKS)
    config = {**stack.config, "fsdp-eks:scheduling": {"kueue": True, **scheduling}}
    return evaluate(program, config=config, stack=stack.stack_name)


def test_the_program_installs_kueue_before_the_job() -> None:
    result = run_queued_dev()
    crd = result.one("kubernetes:yaml/v2:ConfigFile", "kueue-provisioningrequest-crd")
    release = result.one("kubernetes:helm.sh/v3:Release", "kueue-release")
    assert release.inputs["version"] == "0.19.2"
    assert result.depends_on(release, crd)
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert job.inputs["metadata"]["labels"][QUEUE_LABEL] == "fsdp-eks"
    local_queue = result.one("kubernetes:kueue.x-k8s.io/v1beta2:LocalQueue")
    for resource in (release, local_queue):
        assert result.depends_on(job, resource)
    autoscaler = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    assert autoscaler.inputs["values"]["extraArgs"]["enable-provisioning-requests"] == "true"


def test_without_kueue_nothing_is_installed_and_the_autoscaler_is_unchanged() -> None:
    stack = read_stack_file("dev", STACKS)
    result = evaluate(program, config=stack.config, stack=stack.stack_name)
    assert not [r for r in result.resources if "kueue" in r.type or r.name.startswith("kueue")]
    autoscaler = result.one("kubernetes:helm.sh/v3:Release", "autoscaler-release")
    assert "enable-provisioning-requests" not in autoscaler.inputs["values"]["extraArgs"]
    job = result.one("kubernetes:kubeflow.org/v1:PyTorchJob")
    assert QUEUE_LABEL not in job.inputs["metadata"]["labels"]


def test_the_plan_says_where_the_run_waits_and_what_kueue_deprecated() -> None:
    created = queued_config().scheduling
    lines = plan_lines(created, cluster_mode="create", job_api="pytorchjob")
    assert "LocalQueue 'fsdp-eks'" in lines[0] and "waits for admission" in lines[0]
    assert "best-effort-atomic-scale-up" in lines[0]
    assert "deprecated its PyTorchJob" in lines[1] and "switches it on" in lines[1]
    # TrainJob is the integration Kueue keeps: no deprecation line.
    assert len(plan_lines(created, cluster_mode="create", job_api="trainjob")) == 1
    existing = SchedulingConfig.model_validate({"queue": "team-q", "priorityClass": "high"})
    lines = plan_lines(existing, cluster_mode="existing", job_api="pytorchjob")
    assert "the cluster's Kueue, LocalQueue 'team-q', WorkloadPriorityClass 'high'" in lines[0]
    assert "integrations.frameworks" in lines[1]
    assert plan_lines(SchedulingConfig(), cluster_mode="create", job_api="pytorchjob") == []


def test_the_partial_start_figure_under_kueue_stands_and_says_why() -> None:
    """cluster-autoscaler-1.35.2: AWS has no AtomicIncreaseSize (executor.go falls back to
    IncreaseSize), so one request for all nodes can still be granted all but one."""
    plain = plan_run(queued_config(count=2).model_copy(update={"scheduling": SchedulingConfig()}))
    queued = plan_run(queued_config(count=2))
    assert plain.cost is not None and queued.cost is not None
    assert queued.cost.partial_start_worst_usd == plain.cost.partial_start_worst_usd
    assert queued.cost.partial_start_worst_usd is not None
    assert not any("Kueue" in line for line in plain.cost.summary_lines())
    (said,) = [line for line in queued.cost.summary_lines() if "Kueue" in line]
    assert "all 2 nodes in one scale-up" in said and "EC2 may still grant fewer" in said
    assert queued.cost.as_outputs().keys() == plain.cost.as_outputs().keys()


def test_the_shipped_queued_stack_labels_its_job_and_installs_nothing() -> None:
    """stacks/Pulumi.team-cluster-queued.yaml: the cluster's queue and priority class as Kueue's
    labels (kueue v0.19.2 `pkg/controller/constants/constants.go`), no Kueue object."""
    stack = read_stack_file("team-cluster-queued", STACKS)
    result = evaluate(program, config=stack.config, stack=stack.stack_name)
    labels = result.one("kubernetes:kubeflow.org/v1:PyTorchJob").inputs["metadata"]["labels"]
    assert labels[QUEUE_LABEL] == "team-ml-localqueue"
    assert labels["kueue.x-k8s.io/priority-class"] == "training-priority"
    assert not [r for r in result.resources if "kueue" in r.type.lower()]
    assert not [r for r in result.resources if r.name.startswith("kueue")]
