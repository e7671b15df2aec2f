"""`fsdp-eks validate` on a TrainJob stack: its cluster runs no training operator, so the NCCL
all-reduce runs as a TrainingRuntime and TrainJob (tests/infra/test_validate_cluster.py holds
the PyTorchJob's)."""

from __future__ import annotations

from typing import Any

from infra.config import load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.cluster_checks import expected_node_resources, validation_manifests
from infra.job.kube_client import KubeClient
from scripts.cli.validate import run_nccl_check
from tests.crd_schemas import validate as validate_against_schema
from tests.infra.kube_fake import ClusterApiServer, kubeconfig, serving
from tests.infra.test_validate_cluster import NCCL_EFA_LOG

STACK = "llama32-1b-g5-trainjob"


def documents() -> list[dict[str, Any]]:
    return validation_manifests(
        plan_run(load_stack_file(STACK)), image="img:1", run_id="validate-1", bench_script="#"
    )


def test_the_nccl_check_is_a_trainjob_valid_for_the_pinned_crds(
    trainjob_schema: dict[str, Any], trainingruntime_schema: dict[str, Any]
) -> None:
    *_, runtime, trainjob = documents()
    assert [d["kind"] for d in documents()].count("PyTorchJob") == 0
    validate_against_schema(runtime, trainingruntime_schema)
    validate_against_schema(trainjob, trainjob_schema)
    assert trainjob["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
    assert trainjob["spec"]["trainer"]["numNodes"] == 4
    [node] = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["backoffLimit"] == 0
    [container] = node["template"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["PET_RDZV_ENDPOINT"] == "validate-1-nccl-node-0-0.validate-1-nccl:29500"
    policies = [d for d in documents() if d["kind"] == "NetworkPolicy"]
    selector = {"matchLabels": {"jobset.sigs.k8s.io/jobset-name": "validate-1-nccl"}}
    assert selector in [p["spec"]["podSelector"] for p in policies]


def test_the_nccl_check_reads_node_0_of_the_trainjob() -> None:
    *_, trainjob = documents()
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/validate-1-nccl"
    with serving(ClusterApiServer(namespace="training")) as server:
        server.objects[path] = done
        pod = server._new_pod("validate-1-nccl-node-0-0-abcde")
        pod["metadata"]["labels"] = {
            "jobset.sigs.k8s.io/jobset-name": "validate-1-nccl",
            "batch.kubernetes.io/job-completion-index": "0",
        }
        server.pods[pod["metadata"]["name"]] = pod
        server.logs[pod["metadata"]["name"]] = NCCL_EFA_LOG.splitlines(keepends=True)
        client = KubeClient.from_kubeconfig(kubeconfig(server.url))
        config = load_stack_file(STACK)
        result, text = run_nccl_check(client, trainjob, expected_node_resources(config), 5)
    assert text == NCCL_EFA_LOG
    assert not any("ended" in p for p in result.problems)
    (log,) = [r for r in server.requests if r.path.endswith("/log")]
    assert log.path.endswith("/validate-1-nccl-node-0-0-abcde/log")
    assert log.query == {"container": "node"}
