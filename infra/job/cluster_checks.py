"""Cluster-validation manifests, rendered from the same stack config as the training job.

Run by `scripts/cli/validate.py`: `gpu-check` (a Job, one pod per GPU node: devices and the FSx
mount) and `nccl` (a PyTorchJob all-reduce over every GPU, launched like the trainer). Same
nodes, namespace and hardening as the job; expected resources from `infra/facts/instances.py`.
Each check and its hardening: docs/design/job.md#cluster_checks
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.config import StackConfig
from infra.estimates.run_plan import RunPlan
from infra.job.job_api import job_api
from infra.job.manifest import (
    API_VERSION,
    CONTAINER_NAME,
    KIND,
    RENDEZVOUS_PORT,
    RENDEZVOUS_PORT_NAME,
    SECCOMP_PROFILE,
    container_env,
    elastic_policy,
    network_policy,
    pod_security_context,
    trainer_security_context,
)
from infra.job.placement import EFA_RESOURCE, GPU_RESOURCE, gpu_placement
from infra.job.trainjob_manifest import as_trainjob

BENCH_SCRIPT_NAME = "nccl_allreduce.py"
BENCH_MOUNT_PATH = "/opt/fsdp-eks-validation"
CHECK_LABEL = "fsdp-eks/validation"
GPU_CHECK_SCRIPT = """\
set -eu
echo "node: ${NODE_NAME}"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader \\
  | sed 's/^/gpu: /'
echo "efa_devices: $(ls /dev/infiniband 2>/dev/null | grep -c '^uverbs' || true)"
awk '/^Max locked memory/ {print "memlock: " $4}' /proc/self/limits
awk '/^MemTotal:/ {print "mem_total_kib: " $2}' /proc/meminfo
if [ -n "${FSX_PATH:-}" ]; then
  probe="${FSX_PATH}/.fsdp-eks-validation-${NODE_NAME}"
  if echo ok > "${probe}" && grep -q ok "${probe}" && rm -f "${probe}"; then
    echo "fsx: writable $(df -P "${FSX_PATH}" | awk 'NR==2 {print $2}') KiB"
  else
    echo "fsx: not writable"
  fi
fi
"""
"""Prints one `gpu:` line per GPU the pod sees, the number of EFA (uverbs) devices, the soft
RLIMIT_MEMLOCK a container gets on the node (`memlock:`, bytes or `unlimited`: every container
there starts from the node's containerd base runtime spec, the trainer's too) beside the node's
memory (`mem_total_kib:`), and, with a Lustre claim mounted, whether a file can be written and
read back on it."""

GPU_CHECK_RESOURCES = {
    "requests": {"cpu": "100m", "memory": "128Mi"},
    "limits": {"cpu": "1", "memory": "256Mi"},
}
"""CPU and memory of the `gpu-check` container beside its GPU and EFA limits: nvidia-smi and a
few shell commands. Without them the pod is BestEffort, and a namespace whose ResourceQuota
covers `requests.cpu`/`limits.memory` refuses it."""

# Deadline for a validation pod: long enough to pull a multi-GB image on a fresh node.
ACTIVE_DEADLINE_SECONDS = 30 * 60
TTL_SECONDS_AFTER_FINISHED = 2 * 3600


@dataclass(frozen=True)
class ExpectedNodeResources:
    """What each GPU node must advertise as allocatable, per the instance facts table."""

    instance_type: str
    node_count: int
    gpus: int
    efa: int
    """EFA devices per node; 0 when the stack does not enable EFA."""
    gpudirect_rdma: bool


def expected_node_resources(config: StackConfig) -> ExpectedNodeResources:
    facts = config.instance
    return ExpectedNodeResources(
        instance_type=config.gpu_nodes.instance_type,
        node_count=config.gpu_nodes.count,
        gpus=facts.gpus,
        efa=config.gpu_nodes.efa_interface_count,
        gpudirect_rdma=facts.gpudirect_rdma and config.gpu_nodes.efa_enabled,
    )


def _whole_node_limits(expected: ExpectedNodeResources) -> dict[str, Any]:
    limits: dict[str, Any] = {GPU_RESOURCE: expected.gpus}
    if expected.efa:
        # Without this request the pod gets no EFA device and NCCL silently uses sockets.
        limits[EFA_RESOURCE] = expected.efa
    return limits


def _labels(run_id: str, check: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": "fsdp-eks",
        CHECK_LABEL: check,
        "fsdp-eks/validation-run": run_id,
    }


def gpu_check_job(
    config: StackConfig, *, image: str, run_id: str, claim_name: str | None = None
) -> dict[str, Any]:
    """`nvidia-smi` on every GPU node: `count` pods that each take a whole node.

    `claim_name`: the job's Lustre claim (`StorageConfig.claim_name`), mounted where the job
    mounts it; None skips the storage probe.
    """
    expected = expected_node_resources(config)
    placement = gpu_placement(config.gpu_nodes)
    labels = _labels(run_id, "gpu-check")
    limits = _whole_node_limits(expected)
    container: dict[str, Any] = {
        "name": "gpu-check",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["/bin/sh", "-c", GPU_CHECK_SCRIPT],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            # The container toolkit mounts nvidia-smi only with the `utility` capability.
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        "resources": {
            "requests": {**limits, **GPU_CHECK_RESOURCES["requests"]},
            "limits": {**limits, **GPU_CHECK_RESOURCES["limits"]},
        },
        "securityContext": _gpu_check_security_context(as_root=claim_name is not None),
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": dict(SECCOMP_PROFILE)},
        "nodeSelector": dict(placement.node_selector),
        "tolerations": list(placement.tolerations),
        # Redundant with the whole-node request, but says what is meant: one pod per node.
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": labels},
                        "topologyKey": "kubernetes.io/hostname",
                    }
                ]
            }
        },
        "containers": [container],
    }
    if claim_name is not None:
        mount_path = config.storage.fsx.mount_path
        container["env"].append({"name": "FSX_PATH", "value": mount_path})
        container["volumeMounts"] = [{"name": "shared", "mountPath": mount_path}]
        pod_spec["volumes"] = [
            {"name": "shared", "persistentVolumeClaim": {"claimName": claim_name}}
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": f"{run_id}-gpu-check",
            "namespace": config.job.namespace,
            "labels": labels,
        },
        "spec": {
            "completions": expected.node_count,
            "parallelism": expected.node_count,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def _gpu_check_security_context(*, as_root: bool) -> dict[str, Any]:
    """The `gpu-check` container: no capability, no escalation, a read-only root (it writes
    only the probe file on the claim).

    With a claim it runs as root without any capability: the probe writes at the volume's root,
    which on a new file system is root's (0755), and the owner needs no capability to write
    its own directory; the trainer image's uid would report "not writable" on a healthy mount
    (the job itself gets its run directories from a root init container). Without a claim it
    runs as the trainer's uid, like the job."""
    context = trainer_security_context()
    context["readOnlyRootFilesystem"] = True
    if as_root:
        context.update(runAsUser=0, runAsGroup=0, runAsNonRoot=False)
    return context


def bench_config_map(config: StackConfig, *, run_id: str, script_text: str) -> dict[str, Any]:
    """The all-reduce benchmark as a ConfigMap, so the image needs only torch."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{run_id}-nccl-bench",
            "namespace": config.job.namespace,
            "labels": _labels(run_id, "nccl"),
        },
        "data": {BENCH_SCRIPT_NAME: script_text},
    }


def nccl_env(plan: RunPlan) -> list[dict[str, Any]]:
    """The trainer's NCCL/EFA environment, with the debug output the verdict is read from."""
    overrides = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    env = [e for e in container_env(plan, hf_secret_name=None) if e["name"] not in overrides]
    return env + [{"name": name, "value": value} for name, value in overrides.items()]


def nccl_job(
    plan: RunPlan,
    *,
    image: str,
    run_id: str,
    max_bytes: int = 1 << 30,
    min_bytes: int = 8 << 20,
) -> dict[str, Any]:
    """All-reduce over every GPU of every node, launched like the trainer (torchrun, PET_*)."""
    config = plan.config
    expected = expected_node_resources(config)
    placement = gpu_placement(config.gpu_nodes)
    facts = config.instance
    labels = _labels(run_id, "nccl")
    limits = _whole_node_limits(expected)
    # Host memory and /dev/shm sized for the benchmark, not the trainer: a few GiB per node.
    memory_gib = max(2, min(64, facts.memory_gib // 4))
    limits_with_memory = {**limits, "memory": f"{memory_gib}Gi"}
    container = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["torchrun"],
        "args": [
            f"--nnodes={expected.node_count}",
            f"--nproc_per_node={expected.gpus}",
            f"{BENCH_MOUNT_PATH}/{BENCH_SCRIPT_NAME}",
            f"--min-bytes={min_bytes}",
            f"--max-bytes={max_bytes}",
        ],
        "env": nccl_env(plan),
        "resources": {
            "requests": {**limits_with_memory, "cpu": str(max(1, facts.vcpus // 4))},
            "limits": limits_with_memory,
        },
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "bench", "mountPath": BENCH_MOUNT_PATH, "readOnly": True},
        ],
        "ports": [{"name": RENDEZVOUS_PORT_NAME, "containerPort": RENDEZVOUS_PORT}],
        "securityContext": trainer_security_context(),
    }
    pod_spec = {
        "nodeSelector": dict(placement.node_selector),
        "tolerations": list(placement.tolerations),
        # As the trainer runs: torchrun and NCCL need no capability (EFA needs the device
        # plugin's /dev/infiniband devices and the nodes' memlock limit) and no API token.
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{memory_gib}Gi"}},
            {"name": "bench", "configMap": {"name": f"{run_id}-nccl-bench"}},
        ],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {
            "name": f"{run_id}-nccl",
            "namespace": config.job.namespace,
            "labels": labels,
        },
        "spec": {
            "nprocPerNode": str(expected.gpus),
            # Workers only, as for the training job: without a Master replica the operator
            # wires the nodes together only through an elastic (c10d) rendezvous.
            "elasticPolicy": elastic_policy(
                workers=expected.node_count,
                max_restarts=0,
                run_name=f"{run_id}-nccl",
                start_timeout_s=config.job.start_timeout_seconds,
            ),
            "runPolicy": {
                # Keep the pods after the run: the verdict is read from their logs.
                "cleanPodPolicy": "None",
                "backoffLimit": 0,
                "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
                "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            },
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": expected.node_count,
                    "restartPolicy": "Never",
                    "template": {"metadata": {"labels": labels}, "spec": pod_spec},
                }
            },
        },
    }


def validation_network_policies(config: StackConfig, *, run_id: str) -> list[dict[str, Any]]:
    """Ingress to the check pods: the NCCL check's pods only from each other (its rendezvous
    store and NCCL's sockets, as for the training job: `network_policy`), the gpu-check pods
    from nothing (they serve nothing). Applied before the checks, so no check pod is ever
    reachable from the rest of a shared cluster."""
    namespace = config.job.namespace
    nccl = network_policy(f"{run_id}-nccl", namespace, job_api(config.job.api))
    nccl["metadata"]["labels"].update(_labels(run_id, "nccl"))
    gpu_labels = _labels(run_id, "gpu-check")
    gpu_check = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{run_id}-gpu-check-no-ingress", "namespace": namespace,
                     "labels": gpu_labels},
        "spec": {
            "podSelector": {"matchLabels": gpu_labels},
            "policyTypes": ["Ingress"],  # and no ingress rule: nothing may connect
        },
    }  # fmt: skip
    return [nccl, gpu_check]


def validation_manifests(
    plan: RunPlan,
    *,
    image: str,
    run_id: str,
    bench_script: str,
    claim_name: str | None = None,
) -> list[dict[str, Any]]:
    """Everything the validation run applies, in apply order: the two NetworkPolicies first,
    then the gpu-check Job, the benchmark's ConfigMap and the NCCL PyTorchJob (with `job.api:
    trainjob`, the NCCL TrainingRuntime and TrainJob: the cluster runs no training operator)."""
    config = plan.config
    nccl = nccl_job(plan, image=image, run_id=run_id)
    workload = [nccl]
    if config.job.api == "trainjob":
        workload = list(
            as_trainjob(
                nccl,
                runtime_name=f"{run_id}-nccl",
                restart_policy="Never",
                backoff_limit=0,
                ttl_seconds=None,  # a TTL would relaunch a failed check (render_trainjob)
            )
        )
    return [
        *validation_network_policies(config, run_id=run_id),
        gpu_check_job(config, image=image, run_id=run_id, claim_name=claim_name),
        bench_config_map(config, run_id=run_id, script_text=bench_script),
        *workload,
    ]
