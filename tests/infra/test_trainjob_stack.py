"""The shipped TrainJob stack under the mock runtime: Trainer v2 instead of the training
operator, a TrainingRuntime and TrainJob valid for the pinned CRDs, watched and fenced as the
PyTorchJob stacks' jobs are (tests/infra/test_stacks.py)."""

from __future__ import annotations

from functools import cache
from typing import Any

from infra.config import load_stack_file, read_stack_file
from infra.job.flags import TRAINER_LAUNCHER
from infra.launch.training_job import content_name
from infra.offline import Evaluation, RecordedResource, evaluate
from infra.program import main as program
from tests.crd_schemas import validate as validate_against_schema
from trainer.config import parse_args

STACK = "llama32-1b-g5-trainjob"
RUNTIME = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainingRuntime"
TRAINJOB = "kubernetes:trainer.kubeflow.org/v1alpha1:TrainJob"


@cache
def evaluation() -> Evaluation:
    stack_file = read_stack_file(STACK)
    return evaluate(
        program, config=stack_file.config, secret_keys=stack_file.secret_keys, stack=STACK
    )


def _whole(value: Any) -> Any:
    """The engine's wire format turns integers into floats; the API server gets integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _whole(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_whole(v) for v in value]
    return value


def manifest(resource: RecordedResource) -> dict[str, Any]:
    return _whole({k: resource.inputs[k] for k in ("apiVersion", "kind", "metadata", "spec")})


def test_the_stack_submits_a_trainjob_and_installs_trainer_v2_not_the_operator() -> None:
    result = evaluation()
    assert load_stack_file(STACK).job.api == "trainjob"
    assert result.of_type("kubernetes:kubeflow.org/v1:PyTorchJob") == []
    charts = [r.inputs["chart"] for r in result.of_type("kubernetes:helm.sh/v3:Release")]
    assert "oci://ghcr.io/kubeflow/charts/kubeflow-trainer" in charts
    assert not [d for d in result.of_type("kubernetes:apps/v1:Deployment")
                if d.name.startswith("addons-training-operator")]  # fmt: skip
    assert result.stack_outputs["jobApi"] == "trainjob"


def test_its_objects_validate_against_the_pinned_crds(
    trainjob_schema: dict[str, Any], trainingruntime_schema: dict[str, Any]
) -> None:
    result = evaluation()
    validate_against_schema(manifest(result.one(RUNTIME)), trainingruntime_schema)
    validate_against_schema(manifest(result.one(TRAINJOB)), trainjob_schema)


def test_the_trainjob_names_its_runtime_by_content_and_waits_for_the_platform() -> None:
    result = evaluation()
    runtime, job = result.one(RUNTIME), result.one(TRAINJOB)
    name = runtime.inputs["metadata"]["name"]
    assert name == content_name(f"{STACK}-runtime", _whole(runtime.inputs["spec"]))
    assert job.inputs["spec"]["runtimeRef"] == {
        "name": name, "apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime"
    }  # fmt: skip
    assert "suspend" not in job.inputs["spec"]  # `fsdp-eks stop` / `start` own it
    assert job.delete_before_replace and job.replace_on_changes == ["spec"]
    assert result.depends_on(job, runtime)
    for release in result.of_type("kubernetes:helm.sh/v3:Release"):
        # Every release but Grafana's, which only shows the run (as test_stacks.py holds).
        is_grafana = release.inputs["chart"] == "grafana"
        assert result.depends_on(job, release) != is_grafana, release.name
    for node_group in result.of_type("aws:eks/nodeGroup:NodeGroup"):
        assert result.depends_on(job, node_group)
    for claim in result.of_type("kubernetes:core/v1:PersistentVolumeClaim"):
        assert result.depends_on(job, claim)
    watch = result.one("pulumi-python:dynamic/job:JobStartWatch")
    assert watch.inputs["job_api"] == "trainjob" and watch.inputs["workers"] == 4
    assert job.urn in watch.dependencies


def test_the_pod_runs_the_trainer_with_the_stacks_flags_on_its_nodes() -> None:
    result = evaluation()
    config = load_stack_file(STACK)
    [node] = result.one(RUNTIME).inputs["spec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "node"
    assert container["image"] == result.stack_outputs["image"]
    assert container["command"] == list(TRAINER_LAUNCHER)
    parsed = parse_args(container["args"][4:])
    assert parsed.model.preset_name == config.model.preset
    assert parsed.checkpoint.checkpoint_dir == result.stack_outputs["checkpointPath"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "g5.8xlarge"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "persistentVolumeClaim" in volumes["shared"]
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"


def test_only_the_jobs_own_pods_reach_it_and_the_outputs_say_how_to_follow_it() -> None:
    result = evaluation()
    [policy] = [p for p in result.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                if p.name == "job-network-policy"]  # fmt: skip
    selector = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": STACK}}
    assert policy.inputs["spec"]["podSelector"] == selector
    assert policy.inputs["spec"]["ingress"] == [{"from": [{"podSelector": selector}]}]
    kubectl = result.stack_outputs["kubectl"]
    assert kubectl["status"] == f"kubectl -n training get trainjob {STACK} -o wide"
    assert kubectl["logs"].endswith(
        f"-l jobset.sigs.k8s.io/jobset-name={STACK},"
        "batch.kubernetes.io/job-completion-index=0 -c node"
    )


def test_the_metrics_are_scraped_from_the_trainjobs_pods() -> None:
    """Without the JobSet label the scraper would keep no trainer pod, and the scrape policy
    would open the metrics port of none (their label is not the training operator's)."""
    result = evaluation()
    [scraper] = result.of_type("aws:amp/scraper:Scraper")
    config = scraper.inputs["scrapeConfiguration"]
    assert "__meta_kubernetes_pod_label_jobset_sigs_k8s_io_jobset_name" in config
    assert "training_kubeflow_org_job_name" not in config
    [policy] = [p for p in result.of_type("kubernetes:networking.k8s.io/v1:NetworkPolicy")
                if p.name == "observability-trainer-policy"]  # fmt: skip
    assert policy.inputs["spec"]["podSelector"] == {
        "matchLabels": {"jobset.sigs.k8s.io/jobset-name": STACK}
    }
