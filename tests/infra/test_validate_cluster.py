"""The cluster-validation kit: manifests rendered from the stack config (checked against the
PyTorchJob CRD schema and Kubernetes shapes), expected device counts from the instance table,
and the parsing of node lists, nvidia-smi output and NCCL logs into a verdict."""

import os
import resource as rlimits
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from infra.config import parse_stack_config
from infra.estimates.run_plan import plan_run
from infra.job.cluster_checks import (
    BENCH_MOUNT_PATH,
    BENCH_SCRIPT_NAME,
    expected_node_resources,
    gpu_check_job,
    nccl_job,
    validation_manifests,
)
from infra.job.kube_client import KubeClient
from infra.job.payloads import nccl_allreduce
from scripts.cli import validate as validate_cluster
from scripts.cli.support.errors import CliError
from scripts.cli.validate import (
    GpuCheckReport,
    NodeResources,
    check_gpu_reports,
    check_nccl,
    check_nodes,
    job_state,
    parse_gpu_check_log,
    parse_nccl_log,
    parse_nodes,
    run_gpu_check,
    run_nccl_check,
    wait_until,
)
from tests.cli.conftest import run_cli
from tests.crd_schemas import validate as validate_against_schema
from tests.infra.kube_fake import ClusterApiServer, kubeconfig, serving

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN_ENV = {"NCCL_SOCKET_IFNAME", "NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_DISABLE"}


def stack(instance_type: str, count: int, **gpu_nodes: Any):
    return parse_stack_config(
        {
            "gpuNodes": {"instanceType": instance_type, "count": count, **gpu_nodes},
            "cost": {"maxUsdPerRun": None},
            # Small enough for every instance type's GPU memory (the memory-fit check).
            "model": {"preset": "llama3.2-1b", "numLayers": 2},
        },
        stack_name="val",
    )


P5 = stack("p5.48xlarge", 2)


# -- expected counts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance_type", "gpus", "efa", "gdr"),
    [
        ("p4d.24xlarge", 8, 4, True),
        ("p5.48xlarge", 8, 32, True),
        ("p5en.48xlarge", 8, 16, True),
        ("p6-b200.48xlarge", 8, 8, True),
        ("g5.8xlarge", 1, 1, False),
        ("g5.12xlarge", 4, 1, False),
        ("g5.xlarge", 1, 0, False),
    ],
)
def test_expected_node_resources_follow_the_instance_table(instance_type, gpus, efa, gdr):
    expected = expected_node_resources(stack(instance_type, 2))
    assert (expected.gpus, expected.efa, expected.gpudirect_rdma) == (gpus, efa, gdr)
    assert expected.node_count == 2 and expected.instance_type == instance_type


def test_efa_switched_off_expects_no_efa_devices():
    assert expected_node_resources(stack("p5.48xlarge", 2, efa=False)).efa == 0


# -- manifests ----------------------------------------------------------------------------------


def _container(manifest: dict[str, Any]) -> dict[str, Any]:
    if manifest["kind"] == "Job":
        spec = manifest["spec"]["template"]["spec"]
    else:
        spec = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
    [container] = spec["containers"]
    return container


def test_gpu_check_runs_one_whole_node_pod_per_gpu_node():
    job = gpu_check_job(P5, image="repo/trainer@sha256:abc", run_id="validate-1")
    assert job["apiVersion"] == "batch/v1" and job["kind"] == "Job"
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 2
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    [term] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert (
        term["labelSelector"]["matchLabels"].items()
        <= spec["template"]["metadata"]["labels"].items()
    )
    container = _container(job)
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": 8,
        "vpc.amazonaws.com/efa": 32,
        "cpu": "1",
        "memory": "256Mi",
    }
    # Not BestEffort: a namespace's ResourceQuota on requests.* admits it.
    assert container["resources"]["requests"] == {
        "nvidia.com/gpu": 8,
        "vpc.amazonaws.com/efa": 32,
        "cpu": "100m",
        "memory": "128Mi",
    }
    assert "nvidia-smi" in container["command"][-1]
    assert job["metadata"]["namespace"] == "training"


def test_gpu_check_probes_the_jobs_fsx_claim_where_the_job_mounts_it():
    job = gpu_check_job(P5, image="img:1", run_id="validate-1", claim_name="val-fsx")
    pod = job["spec"]["template"]["spec"]
    assert pod["volumes"] == [{"name": "shared", "persistentVolumeClaim": {"claimName": "val-fsx"}}]
    container = _container(job)
    assert container["volumeMounts"] == [{"name": "shared", "mountPath": "/fsx"}]
    assert {"name": "FSX_PATH", "value": "/fsx"} in container["env"]
    assert "FSX_PATH" in container["command"][-1]
    # The volume's root is root's on a new file system; the trainer image's uid cannot write it.
    # Root as its owner needs no capability to write there: every one is dropped.
    context = container["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (0, 0, False)
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    no_claim = gpu_check_job(P5, image="img:1", run_id="validate-1")
    assert "volumes" not in no_claim["spec"]["template"]["spec"]
    assert _container(no_claim)["securityContext"]["runAsNonRoot"] is True


def test_gpu_check_on_an_instance_without_efa_requests_no_efa():
    job = gpu_check_job(stack("g5.xlarge", 1), image="img:1", run_id="validate-1")
    assert "vpc.amazonaws.com/efa" not in _container(job)["resources"]["limits"]
    assert _container(job)["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_nccl_job_uses_every_gpu_of_every_node_with_the_trainers_environment():
    job = nccl_job(plan_run(P5), image="repo/trainer@sha256:abc", run_id="validate-1")
    assert job["apiVersion"] == "kubeflow.org/v1" and job["kind"] == "PyTorchJob"
    assert job["spec"]["nprocPerNode"] == "8"
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 2
    assert job["spec"]["runPolicy"]["cleanPodPolicy"] == "None"
    container = _container(job)
    assert container["name"] == "pytorch"
    assert container["command"] == ["torchrun"]
    assert "--nnodes=2" in container["args"] and "--nproc_per_node=8" in container["args"]
    assert f"{BENCH_MOUNT_PATH}/{BENCH_SCRIPT_NAME}" in container["args"]
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == 8 and limits["vpc.amazonaws.com/efa"] == 32
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and "NET" in env["NCCL_DEBUG_SUBSYS"]
    assert env["FI_PROVIDER"] == "efa"
    assert not FORBIDDEN_ENV & env.keys()
    assert [e["name"] for e in container["env"]].count("NCCL_DEBUG") == 1
    volumes = {v["name"]: v for v in worker["template"]["spec"]["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["bench"]["configMap"]["name"] == "validate-1-nccl-bench"
    # Workers only: the operator connects them through the elastic rendezvous on worker 0.
    elastic = job["spec"]["elasticPolicy"]
    assert elastic["rdzvBackend"] == "c10d"
    assert elastic["minReplicas"] == elastic["maxReplicas"] == 2
    assert {"name": "pytorchjob-port", "containerPort": 23456} in container["ports"]


def test_nccl_job_without_efa_does_not_ask_for_the_efa_provider():
    job = nccl_job(plan_run(stack("g5.xlarge", 2)), image="img:1", run_id="validate-1")
    container = _container(job)
    assert "vpc.amazonaws.com/efa" not in container["resources"]["limits"]
    assert "FI_PROVIDER" not in {item["name"] for item in container["env"]}


@pytest.mark.parametrize(
    ("instance_type", "count"), [("p5.48xlarge", 4), ("g5.8xlarge", 2), ("g5.xlarge", 1)]
)
def test_nccl_job_validates_against_the_pytorchjob_crd_schema(instance_type, count, crd_schema):
    job = nccl_job(plan_run(stack(instance_type, count)), image="img:1", run_id="validate-1")
    # Through YAML, as kubectl sends it.
    document = yaml.safe_load(validate_cluster.to_yaml([job]))
    validate_against_schema(document, crd_schema)


def test_the_crd_schema_check_catches_a_broken_job(crd_schema):
    job = nccl_job(plan_run(P5), image="img:1", run_id="validate-1")
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "two"
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(job, crd_schema)


def _check_pod_shape(pod: dict[str, Any]) -> None:
    """The parts of the core/v1 PodSpec shape these manifests use."""
    names = set()
    for container in pod["containers"]:
        assert isinstance(container["name"], str) and container["image"]
        names.add(container["name"])
        for key in ("requests", "limits"):
            for resource, value in container["resources"].get(key, {}).items():
                assert isinstance(value, int | str), resource
        for mount in container.get("volumeMounts", []):
            assert mount["name"] in {v["name"] for v in pod.get("volumes", [])}
            assert mount["mountPath"].startswith("/")
        for variable in container.get("env", []):
            assert set(variable) in ({"name", "value"}, {"name", "valueFrom"})
            if "value" in variable:
                assert isinstance(variable["value"], str), variable
    assert len(names) == len(pod["containers"])


def test_all_manifests_have_kubernetes_shapes():
    manifests = validation_manifests(
        plan_run(P5), image="img:1", run_id="validate-1", bench_script="x=1\n"
    )
    assert [m["kind"] for m in manifests] == [
        "NetworkPolicy",
        "NetworkPolicy",
        "Job",
        "ConfigMap",
        "PyTorchJob",
    ]
    for manifest in manifests:
        metadata = manifest["metadata"]
        assert metadata["namespace"] == "training"
        assert len(metadata["name"]) <= 63 and metadata["name"].startswith("validate-1-")
    _, _, job, config_map, pytorchjob = manifests
    _check_pod_shape(job["spec"]["template"]["spec"])
    _check_pod_shape(pytorchjob["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"])
    assert config_map["data"] == {BENCH_SCRIPT_NAME: "x=1\n"}
    assert job["spec"]["template"]["spec"]["restartPolicy"] in ("Never", "OnFailure")


def test_render_only_prints_the_manifests_of_a_stack_file(tmp_path):
    path = tmp_path / "Pulumi.val.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "config": {
                    "fsdp-eks:gpuNodes": {"instanceType": "p4d.24xlarge", "count": 2},
                    "fsdp-eks:cost": {"maxUsdPerRun": None},
                }
            }
        )
    )
    result = run_cli("validate", str(path), "--render-only", "--image", "img:1")
    assert result.code == 0, result
    documents = list(yaml.safe_load_all(result.out))
    kinds = [d["kind"] for d in documents if d]
    assert kinds == ["NetworkPolicy", "NetworkPolicy", "Job", "ConfigMap", "PyTorchJob"]
    gpu_job, bench_map, nccl = documents[2:]
    bench = bench_map["data"][BENCH_SCRIPT_NAME]
    assert bench == (REPO / "infra" / "job" / "payloads" / "nccl_allreduce.py").read_text()
    assert _container(nccl)["resources"]["limits"]["vpc.amazonaws.com/efa"] == 4
    # The stack has FSx (the default): the probe mounts the stack's claim.
    [volume] = gpu_job["spec"]["template"]["spec"]["volumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == "val-fsx"


# -- node allocatable ---------------------------------------------------------------------------


def _node(name: str, gpus: str | None, efa: str | None, ready: bool = True) -> dict[str, Any]:
    allocatable = {"cpu": "191450m", "memory": "2047Gi", "pods": "100"}
    if gpus is not None:
        allocatable["nvidia.com/gpu"] = gpus
    if efa is not None:
        allocatable["vpc.amazonaws.com/efa"] = efa
    return {
        "metadata": {"name": name, "labels": {"node.kubernetes.io/instance-type": "p5.48xlarge"}},
        "status": {
            "allocatable": allocatable,
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


NODES = {
    "apiVersion": "v1",
    "kind": "List",
    "items": [
        _node("ip-10-0-64-12.us-west-2.compute.internal", "8", "32"),
        _node("ip-10-0-64-7.us-west-2.compute.internal", "8", "32"),
    ],
}


def test_parse_nodes_reads_readiness_and_extended_resources():
    nodes = parse_nodes(NODES)
    assert [(n.gpus, n.efa, n.ready) for n in nodes] == [(8, 32, True), (8, 32, True)]


def test_nodes_pass_when_every_node_advertises_its_devices():
    result = check_nodes(parse_nodes(NODES), expected_node_resources(P5))
    assert result.passed, result.problems
    assert "2/2" in result.detail


def test_nodes_fail_on_missing_plugins_and_missing_nodes():
    nodes = parse_nodes(
        {
            "items": [
                _node("a", None, "32"),
                _node("b", "8", None, ready=False),
            ]
        }
    )
    result = check_nodes(nodes, expected_node_resources(stack("p5.48xlarge", 3)))
    assert not result.passed
    text = "\n".join(result.problems)
    assert "1 Ready p5.48xlarge node(s), expected 3" in text
    assert "a: allocatable nvidia.com/gpu=0, expected 8 (NVIDIA device plugin" in text
    assert "b: allocatable vpc.amazonaws.com/efa=0, expected 32 (EFA device plugin" in text
    assert "b: not Ready" in text


def test_an_instance_without_efa_passes_with_no_efa_resource():
    nodes = [NodeResources("g", True, 1, 0)]
    assert check_nodes(nodes, expected_node_resources(stack("g5.xlarge", 1))).passed


# -- nvidia-smi ---------------------------------------------------------------------------------

GPU_CHECK_LOG = """\
node: ip-10-0-64-12.us-west-2.compute.internal
gpu: 0, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 1, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 2, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 3, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 4, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 5, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 6, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
gpu: 7, NVIDIA H100 80GB HBM3, 81559 MiB, 570.133.20
efa_devices: 32
fsx: writable 1168351232 KiB
"""


def test_parse_gpu_check_log():
    report = parse_gpu_check_log(GPU_CHECK_LOG)
    assert report.node == "ip-10-0-64-12.us-west-2.compute.internal"
    assert len(report.gpus) == 8 and report.efa_devices == 32
    assert report.fsx == "writable 1168351232 KiB"
    assert parse_gpu_check_log("node: n\nefa_devices: 0\n").fsx is None


def test_fsx_probe_failures_are_reported_per_node():
    expected = expected_node_resources(stack("p5.48xlarge", 1))
    good = parse_gpu_check_log(GPU_CHECK_LOG)
    assert check_gpu_reports([good], expected, fsx=True).passed
    unwritable = GpuCheckReport(good.node, good.gpus, 32, "not writable")
    result = check_gpu_reports([unwritable], expected, fsx=True)
    assert result.problems == [f"{good.node}: FSx claim not writable"]
    missing = GpuCheckReport(good.node, good.gpus, 32, None)
    assert check_gpu_reports([missing], expected, fsx=True).problems == [
        f"{good.node}: FSx claim not mounted"
    ]
    assert check_gpu_reports([missing], expected, fsx=False).passed


def test_gpu_reports_pass_and_fail():
    expected = expected_node_resources(P5)
    good = parse_gpu_check_log(GPU_CHECK_LOG)
    other = GpuCheckReport("ip-10-0-64-7", good.gpus, 32)
    result = check_gpu_reports([good, other], expected)
    assert result.passed and "NVIDIA H100 80GB HBM3" in result.detail
    short = GpuCheckReport("ip-10-0-64-7", good.gpus[:4], 0)
    failed = check_gpu_reports([good, short], expected)
    assert not failed.passed
    assert "ip-10-0-64-7: nvidia-smi lists 4 GPU(s), expected 8" in failed.problems
    assert "ip-10-0-64-7: 0 EFA device(s) in the pod, expected 32" in failed.problems
    assert not check_gpu_reports([good], expected).passed  # one node of two


# -- NCCL logs ----------------------------------------------------------------------------------

# Captured format of an EFA run: aws-ofi-nccl init lines, NCCL's network choice, GDRDMA
# channels and the nccl-tests style table printed by infra/job/payloads/nccl_allreduce.py.
NCCL_EFA_LOG = """\
[rank0]: NCCL version 2.26.2+cuda12.8
val-nccl-worker-0:52:52 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI Using Libfabric version 2.1
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI GUID of rdmap79s0: 0000000000000000
val-nccl-worker-0:52:52 [0] NCCL INFO Using network Libfabric
val-nccl-worker-0:52:60 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Libfabric/0/GDRDMA
val-nccl-worker-0:52:60 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/Libfabric/1/GDRDMA
# nranks 16 backend nccl
#        size         count      type   redop    root   time(us)   algbw   busbw  #wrong
#         (B)    (elements)                                        (GB/s)  (GB/s)
     8388608       2097152     float     sum      -1      155.2   54.05  101.34       0
    16777216       4194304     float     sum      -1      229.9   72.98  136.83       0
   268435456      67108864     float     sum      -1     2304.1  116.50  218.44       0
  1073741824     268435456     float     sum      -1     8855.6  121.25  227.34       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 170.9875
"""  # noqa: E501

# Captured format of the silent fallback: no EFA devices in the pods, the plugin finds no
# provider and NCCL goes over TCP sockets.
NCCL_SOCKET_LOG = """\
val-nccl-worker-0:52:52 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v9)
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0
val-nccl-worker-0:52:52 [0] NCCL INFO NET/OFI Unable to find a protocol that worked.  Failing initialization.
val-nccl-worker-0:52:52 [0] NCCL INFO NET/Plugin: Failed to initialize Libfabric network plugin
val-nccl-worker-0:52:52 [0] NCCL INFO NET/IB : No device found.
val-nccl-worker-0:52:52 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.64.12<0>
val-nccl-worker-0:52:52 [0] NCCL INFO Using network Socket
val-nccl-worker-0:52:60 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] [receive] via NET/Socket/0
# nranks 16 backend nccl
     8388608       2097152     float     sum      -1     6001.0    1.40    2.62       0
  1073741824     268435456     float     sum      -1   590001.0    1.82    3.41       0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 3.0150
"""  # noqa: E501

# Captured format of nccl-tests' own all_reduce_perf (out-of-place and in-place columns).
ALL_REDUCE_PERF_LOG = """\
# nThread 1 nGpus 1 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20
#
# Using devices
#  Rank  0 Group  0 Pid     45 on ip-10-0-64-12 device  0 [0x53] NVIDIA H100 80GB HBM3
ip-10-0-64-12:45:45 [0] NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)
ip-10-0-64-12:45:45 [0] NCCL INFO Using network AWS Libfabric
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   134217728      33554432     float     sum      -1   1421.2   94.44  177.08      0   1418.7   94.61  177.39      0
  1073741824     268435456     float     sum      -1   8801.3  122.00  228.75      0   8795.0  122.09  228.91      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 202.9
#
"""  # noqa: E501


def test_parse_nccl_log_over_efa():
    report = parse_nccl_log(NCCL_EFA_LOG)
    assert report.network == "OFI" and report.provider == "efa"
    assert report.gpudirect_rdma
    assert report.sizes == [8388608, 16777216, 268435456, 1073741824]
    assert report.busbw == [101.34, 136.83, 218.44, 227.34]
    assert report.avg_busbw == pytest.approx(170.9875)
    assert report.peak_busbw == pytest.approx(227.34)
    assert report.wrong == 0


def test_parse_nccl_log_socket_fallback_despite_the_plugin_loading():
    report = parse_nccl_log(NCCL_SOCKET_LOG)
    assert report.network == "Socket"
    assert report.provider is None and not report.gpudirect_rdma
    assert report.avg_busbw == pytest.approx(3.015)


def test_parse_nccl_tests_all_reduce_perf_output():
    report = parse_nccl_log(ALL_REDUCE_PERF_LOG)
    assert report.network == "OFI" and report.provider == "efa"
    assert report.busbw == [177.08, 228.75]  # out-of-place column
    assert report.avg_busbw == pytest.approx(202.9)


def test_nccl_verdicts():
    expected = expected_node_resources(P5)
    good = check_nccl(parse_nccl_log(NCCL_EFA_LOG), expected)
    assert good.passed and not good.warnings
    assert "busbw avg 171.0 GB/s, peak 227.3 GB/s" in good.detail
    assert "OFI (efa, GPUDirect RDMA)" in good.detail
    fallback = check_nccl(parse_nccl_log(NCCL_SOCKET_LOG), expected)
    assert not fallback.passed
    assert "NCCL used Socket, not NET/OFI" in fallback.problems[0]
    truncated = check_nccl(parse_nccl_log(NCCL_EFA_LOG.split("# nranks")[0]), expected)
    assert not truncated.passed and "no bandwidth rows" in truncated.problems[0]


def test_tcp_provider_is_not_efa():
    log = NCCL_EFA_LOG.replace("provider is efa, fabric is efa-direct", "provider is tcp")
    result = check_nccl(parse_nccl_log(log), expected_node_resources(P5))
    assert not result.passed and "'tcp'" in result.problems[0]


def test_missing_gdr_on_a_gdr_instance_is_a_warning():
    log = NCCL_EFA_LOG.replace("/GDRDMA", "")
    result = check_nccl(parse_nccl_log(log), expected_node_resources(P5))
    assert result.passed and "GPUDirect RDMA" in result.warnings[0]


def test_sockets_are_right_without_efa_and_one_node_exercises_no_network():
    no_efa = expected_node_resources(stack("g5.xlarge", 2))
    assert check_nccl(parse_nccl_log(NCCL_SOCKET_LOG), no_efa).passed
    one_node = check_nccl(
        parse_nccl_log(NCCL_SOCKET_LOG), expected_node_resources(stack("p5.48xlarge", 1))
    )
    assert one_node.passed and "network is not exercised" in one_node.detail


# -- the benchmark script -----------------------------------------------------------------------


def test_bus_bandwidth_is_nccl_tests_definition():
    algbw, busbw = nccl_allreduce.bus_bandwidth(1_000_000_000, 0.01, 16)
    assert algbw == pytest.approx(100.0)
    assert busbw == pytest.approx(100.0 * 2 * 15 / 16)
    assert nccl_allreduce.message_sizes(8, 64, 2) == [8, 16, 32, 64]
    with pytest.raises(ValueError, match="--min-bytes"):
        nccl_allreduce.message_sizes(0, 64, 2)


def test_benchmark_rows_parse_back():
    rows = [
        nccl_allreduce.format_row(1 << 20, 0.0005, 8, 0),
        nccl_allreduce.format_row(1 << 30, 0.01, 8, 0),
    ]
    report = parse_nccl_log("\n".join([nccl_allreduce.HEADER, *rows]))
    assert report.sizes == [1 << 20, 1 << 30]
    expected = [
        nccl_allreduce.bus_bandwidth(s, t, 8)[1] for s, t in ((1 << 20, 0.0005), (1 << 30, 0.01))
    ]
    assert report.busbw == pytest.approx(expected, abs=0.01)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_benchmark_runs_under_torchrun_and_its_output_parses():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        f"--master_port={_free_port()}",
        str(REPO / "infra" / "job" / "payloads" / "nccl_allreduce.py"),
        "--backend=gloo",
        "--min-bytes=65536",
        "--max-bytes=4194304",
        "--factor=8",
        "--warmup=1",
        "--iters=3",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=240, env=env, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = parse_nccl_log(done.stdout)
    assert report.sizes == [65536, 524288, 4194304]
    assert report.wrong == 0 and report.avg_busbw is not None
    assert all(b >= 0 for b in report.busbw) and report.busbw[-1] > 0


# -- orchestration against the loopback API fake ----------------------------------------------


def _check_pod(name: str, job: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "training", "labels": {"job-name": job}}}


def test_wait_until_times_out_without_real_sleeping():
    now = [0.0]
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    assert (
        wait_until(lambda: None, timeout_s=30, interval_s=10, sleep=sleep, clock=lambda: now[0])
        == "timeout"
    )
    assert slept == [10, 10, 10]
    assert wait_until(lambda: "Complete", timeout_s=30, sleep=sleep) == "Complete"


def test_a_long_wait_says_what_it_waits_for_and_how_long():
    """Silent for up to `--timeout` (30 minutes) before; now a line a minute."""
    now = [0.0]
    said: list[str] = []

    def sleep(seconds: float) -> None:
        now[0] += seconds

    state = wait_until(
        lambda: "Complete" if now[0] >= 200 else None,
        timeout_s=1800,
        what="job v-gpu (nvidia-smi on every GPU node)",
        report=said.append,
        sleep=sleep,
        clock=lambda: now[0],
    )
    assert state == "Complete"
    assert said == [
        f"waiting for job v-gpu (nvidia-smi on every GPU node): {elapsed} of 30:00"
        for elapsed in ("1:00", "2:00", "3:00")
    ]


def test_job_state_reads_batch_and_pytorchjob_conditions():
    assert (
        job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}})
        == "Complete"
    )
    assert job_state({"status": {"conditions": [{"type": "Running", "status": "True"}]}}) is None
    assert job_state({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "Failed"
    assert job_state({}) is None


def test_gpu_check_collects_every_pods_log():
    job = gpu_check_job(P5, image="img:1", run_id="validate-1")
    second = GPU_CHECK_LOG.replace("ip-10-0-64-12", "ip-10-0-64-7")
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    with serving(ClusterApiServer(namespace="training")) as server:
        server.objects["/apis/batch/v1/namespaces/training/jobs/validate-1-gpu-check"] = done
        for name, log in (("p-0", GPU_CHECK_LOG), ("p-1", second)):
            server.pods[name] = _check_pod(name, "validate-1-gpu-check")
            server.logs[name] = log.splitlines(keepends=True)
        client = KubeClient.from_kubeconfig(kubeconfig(server.url))
        result = run_gpu_check(client, job, expected_node_resources(P5), timeout_s=5)
    assert result.passed, result.problems
    listed = [r.query for r in server.requests if r.path.endswith("/pods")]
    assert listed == [{"labelSelector": "job-name=validate-1-gpu-check"}]
    logs = [r.path.split("/")[-2] for r in server.requests if r.path.endswith("/log")]
    assert logs == ["p-0", "p-1"]


def test_nccl_check_reads_worker_0_and_fails_a_failed_job():
    job = nccl_job(plan_run(P5), image="img:1", run_id="validate-1")
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    with serving(ClusterApiServer(namespace="training")) as server:
        server.objects["/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/validate-1-nccl"] = (
            failed
        )
        server.logs["validate-1-nccl-worker-0"] = NCCL_EFA_LOG.splitlines(keepends=True)
        client = KubeClient.from_kubeconfig(kubeconfig(server.url))
        result, text = run_nccl_check(client, job, expected_node_resources(P5), timeout_s=5)
    assert text == NCCL_EFA_LOG
    assert not result.passed and "ended Failed" in result.problems[0]
    (log,) = [r for r in server.requests if r.path.endswith("/log")]
    assert log.query == {"container": "pytorch"}


def test_image_comes_from_the_flag_then_the_stack_config():
    config = stack("p5.48xlarge", 2)
    assert validate_cluster.resolve_image(config, "val", "img:flag", {}) == "img:flag"
    own = parse_stack_config(
        {
            "gpuNodes": {"instanceType": "p5.48xlarge", "count": 2},
            "cost": {"maxUsdPerRun": None},
            "image": {"uri": "123456789012.dkr.ecr.us-west-2.amazonaws.com/t@sha256:" + "a" * 64},
        },
        stack_name="val",
    )
    assert validate_cluster.resolve_image(own, "val", None, {}).endswith("a" * 64)
    built = "123456789012.dkr.ecr.us-west-2.amazonaws.com/t@sha256:" + "b" * 64
    assert validate_cluster.resolve_image(config, "val", None, {"image": built}) == built
    with pytest.raises(CliError, match="no image output: pass --image"):
        validate_cluster.resolve_image(config, "val", None, {})


P5_MEMORY_KIB = 2 * 1024**3  # MemTotal of a 2 TiB node


@pytest.mark.parametrize(
    ("memlock", "efa_stack", "passes", "shown"),
    [
        ("8388608", True, False, "8 MiB"),  # containerd's default: the preflight refuses
        (str(10**18), True, True, "888.2 PiB"),  # what the stack's NodeConfig sets
        ("unlimited", True, True, "unlimited"),
        ("8388608", False, True, "8 MiB"),  # no EFA: nothing registers memory
    ],
)
def test_gpu_check_reports_the_nodes_locked_memory_limit(memlock, efa_stack, passes, shown):
    """An existing cluster's nodes rarely lift RLIMIT_MEMLOCK (only this project's launch template
    does): validate says the figure, and fails an EFA stack where the preflight would refuse."""
    log_text = GPU_CHECK_LOG + f"memlock: {memlock}\nmem_total_kib: {P5_MEMORY_KIB}\n"
    report = parse_gpu_check_log(log_text)
    assert report.memlock == memlock and report.mem_total_kib == P5_MEMORY_KIB
    config = stack("p5.48xlarge", 1) if efa_stack else stack("p5.48xlarge", 1, efa=False)
    expected = expected_node_resources(config)
    report = GpuCheckReport(report.node, report.gpus, expected.efa, None, memlock, P5_MEMORY_KIB)
    result = check_gpu_reports([report], expected)
    assert result.passed is passes, result.problems
    assert f"memlock {shown}" in result.detail
    if not passes:
        [problem] = result.problems
        assert problem.startswith(f"{report.node}: containers may lock 8 MiB of memory")
        assert "docs/validation.md" in problem


def test_gpu_check_script_output_parses(tmp_path):
    """The pod's shell script, run here with a stand-in nvidia-smi, prints what the parser reads."""
    from infra.job.cluster_checks import GPU_CHECK_SCRIPT

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/sh\n"
        "echo '0, NVIDIA A10G, 23028 MiB, 570.133.20'\n"
        "echo '1, NVIDIA A10G, 23028 MiB, 570.133.20'\n"
    )
    fake.chmod(0o755)
    shared = tmp_path / "fsx"
    shared.mkdir()
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODE_NAME": "ip-10-0-1-1", "FSX_PATH": str(shared)}
    limit = 4 * 2**20
    _, hard = rlimits.getrlimit(rlimits.RLIMIT_MEMLOCK)
    done = subprocess.run(
        ["/bin/sh", "-c", GPU_CHECK_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        # The limit a container on the node would start with: the script must report it.
        preexec_fn=lambda: rlimits.setrlimit(rlimits.RLIMIT_MEMLOCK, (limit, hard)),
    )
    assert done.returncode == 0, done.stderr
    report = parse_gpu_check_log(done.stdout)
    assert report.memlock == str(limit)
    mem_total = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert report.mem_total_kib == mem_total
    assert report.node == "ip-10-0-1-1"
    assert [gpu.split(",")[1].strip() for gpu in report.gpus] == ["NVIDIA A10G"] * 2
    assert report.efa_devices == 0
    assert report.fsx is not None and report.fsx.startswith("writable")
    assert list(shared.iterdir()) == []  # the probe file is removed again
