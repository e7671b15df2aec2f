"""The PyTorchJob manifest, rendered from the stack config alone (no pulumi, no cloud calls).

Kept apart from the Pulumi component so that the offline plan can print exactly what will be
applied, tests can validate it against the operator's CRD schema, and the numbers in it (GPUs,
EFA interfaces, CPU, memory, /dev/shm) come from the same instance facts as the node group.
Values that only exist at deploy time (the image digest, the FSx claim name) are passed in and
may be Pulumi outputs; they are placed into the structure untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.estimates.staging import staging_shm_gib
from infra.facts.instances import scheduling_labels
from infra.job.flags import (
    CHECKPOINT_BUCKET_ENV,
    TRAINER_LAUNCHER,
    RunPaths,
    run_paths,
    torchrun_command,
)
from infra.job.job_api import PYTORCHJOB, JobApi
from infra.job.placement import EFA_RESOURCE, GPU_RESOURCE, gpu_placement
from infra.job.queueing import queue_labels
from trainer.telemetry_names import DEFAULT_METRICS_PORT, METRICS_PORT_NAME, STACK_ENV

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.estimates.run_plan import RunPlan

API_VERSION = PYTORCHJOB.api_version
KIND = PYTORCHJOB.kind
CONTAINER_NAME = "pytorch"  # the training operator finds the trainer container by this name
HF_TOKEN_SECRET_KEY = "HF_TOKEN"
HF_TOKEN_VOLUME = "hf-token"
HF_TOKEN_DIR = "/var/run/secrets/huggingface"
HF_TOKEN_PATH = f"{HF_TOKEN_DIR}/token"
"""Where the trainer container finds the Hugging Face token: a file, named by `HF_TOKEN_PATH`.

huggingface_hub reads `HF_TOKEN_PATH` (`constants.py`: the token file's location, default
`$HF_HOME/token`; `utils/_auth.py` `_get_token_from_file`) when `HF_TOKEN` is unset. A file is
read only by what opens it; an environment variable is inherited by every process torchrun,
DataLoader workers and compile workers start, and is printed by any crash dump of `environ`."""
HF_TOKEN_FILE_MODE = 0o440
"""Owner and group read. Secret volume files stay owned by root; kubelet gives them the pod's
fsGroup and ORs in group read for read-only volumes (kubernetes `pkg/volume/volume_linux.go`
`SetVolumeOwnership`, `roMask = 0440`), so the trainer (uid/gid 10001 = fsGroup) reads the
token through its group and no other uid can. A literal 0400 would still end up 0440."""
HF_HOME = "/tmp/hf-home"
"""Hugging Face cache on the container's own disk, writable by any uid. An image that has no
passwd entry for the trainer's uid (NGC/DLC bases) gives it HOME=/, where `~/.cache` cannot be
created."""


TRITON_CACHE_DIR = "/tmp/triton_cache"
RENDEZVOUS_PORT_NAME = "pytorchjob-port"  # the operator reads the rendezvous port by this name
RENDEZVOUS_PORT = 23456  # the operator's default for that port


def container_ports(config: StackConfig) -> list[dict[str, Any]]:
    """The rendezvous port, and the one local rank 0 serves the trainer's metrics on
    (trainer/telemetry.py; `--metrics_port`, unrendered, so its default unless extraArgs
    sets it), named so that a scrape selects it by name."""
    ports: list[dict[str, Any]] = [{"name": RENDEZVOUS_PORT_NAME, "containerPort": RENDEZVOUS_PORT}]
    metrics_port = int(config.training.extra_args.get("metrics_port", DEFAULT_METRICS_PORT))
    if metrics_port:
        ports.append({"name": METRICS_PORT_NAME, "containerPort": metrics_port})
    return ports


TRAINER_USER_ID = 10001
"""uid:gid the trainer runs as: the project's image's `USER` (docker/Dockerfile), and set in the
pod's securityContext so an `image.uri` base that runs as root (NGC, DLC) runs the job as this
uid too, not silently as root. A fresh FSx file system is owned by root, so the run's
directories are created for this uid before the trainer starts."""
PREPARE_CONTAINER_NAME = "prepare-run-dirs"

FLIGHT_RECORDER_ENTRIES = 2000
"""Collectives kept per process group for a dump: a few steps of an FSDP run's all-gathers
and reduce-scatters (torch's recorder is off at 0, its default)."""

AGENT_EXIT_S = 30
"""Between torchrun's SIGKILL of a stuck worker and the kubelet's of the whole container: time
for the agent to reap the workers and exit itself."""

# Headroom left on a node for the kubelet, the CNI, device plugins and the FSx client.
_RESERVED_CPU_FRACTION = 1 / 16
_MIN_RESERVED_CPUS = 2
_MEMORY_FRACTION = 0.85
_MAX_DEFAULT_SHM_GIB = 256


@dataclass(frozen=True)
class PodSize:
    """What one worker pod asks of its node."""

    gpus: int
    efa_interfaces: int
    cpus: int
    memory_gib: int
    shm_gib: int


def pod_size(config: StackConfig) -> PodSize:
    """One worker per node, sized to its share of the node (all of it by default).

    CPU and memory are the node's minus headroom for system daemons, scaled by the share of
    GPUs the worker uses; EFA devices belong to the node, so the worker takes all of them.
    """
    facts = config.instance
    share = config.gpus_per_node / facts.gpus
    reserved_cpus = max(_MIN_RESERVED_CPUS, int(facts.vcpus * _RESERVED_CPU_FRACTION))
    cpus = max(1, int((facts.vcpus - reserved_cpus) * share))
    memory = max(1, int(facts.memory_gib * _MEMORY_FRACTION * share))
    # By default also room for an asynchronous save's staged state (infra.estimates.staging).
    default_shm = max(1, min(_MAX_DEFAULT_SHM_GIB, memory // 4), staging_shm_gib(config))
    shm = config.job.shm_size_gib or min(default_shm, max_shm_gib(config))
    return PodSize(
        gpus=config.gpus_per_node,
        efa_interfaces=config.gpu_nodes.efa_interface_count,
        cpus=cpus,
        memory_gib=memory,
        shm_gib=shm,
    )


def max_shm_gib(config: StackConfig) -> int:
    """The most /dev/shm a pod may ask for: `job.shmSizeGiB`'s bound (infra.config.stack)."""
    return config.instance.memory_gib // 2 - 1


def container_resources(size: PodSize) -> dict[str, dict[str, Any]]:
    """Requests and limits. Extended resources (GPU, EFA) must sit in limits; memory limit =
    request so the pod is never the first evicted; no CPU limit, which would only throttle."""
    limits: dict[str, Any] = {GPU_RESOURCE: size.gpus, "memory": f"{size.memory_gib}Gi"}
    if size.efa_interfaces:
        # Without this request the pod gets no EFA device and NCCL silently uses TCP sockets.
        limits[EFA_RESOURCE] = size.efa_interfaces
    requests: dict[str, Any] = {**limits, "cpu": str(size.cpus)}
    return {"requests": requests, "limits": limits}


@dataclass(frozen=True)
class S3Bucket:
    """The bucket a run without FSx lives in; plain strings or Pulumi outputs."""

    name: Any
    region: Any


def s3_env(bucket: S3Bucket | None) -> list[dict[str, Any]]:
    """The bucket for the `$(CHECKPOINT_BUCKET)` in the trainer's arguments, and its region
    (s3torchconnector's client is built for one region: trainer.checkpoint_store)."""
    if bucket is None:
        return []
    return [
        {"name": CHECKPOINT_BUCKET_ENV, "value": bucket.name},
        {"name": "AWS_REGION", "value": bucket.region},
    ]


def container_env(
    plan: RunPlan, *, hf_secret_name: str | None, run_dir: str | None = None
) -> list[dict[str, Any]]:
    """The NCCL/EFA environment of the design brief, plus the HF token and `job.extraEnv`.

    The variables that break NCCL over EFA (NCCL_SOCKET_IFNAME, NCCL_PROTO, NCCL_ALGO,
    NCCL_P2P_DISABLE, CUDA_LAUNCH_BLOCKING) are never set; the config model rejects them in
    extraEnv. The collective timeout is the trainer's own (30 minutes, trainer.distributed).
    """
    config = plan.config
    values: dict[str, str] = {}
    if config.gpu_nodes.efa_enabled:
        values["FI_PROVIDER"] = "efa"
        values["FI_EFA_USE_HUGE_PAGE"] = "0"  # huge pages fail allocations after fork/GC
        # The aws-ofi-nccl plugin or an error, never a silent fallback to TCP sockets: the
        # plugin answers to this name in every release (aws/aws-ofi-nccl
        # `nvidia_plugin_name_fixup`), and NCCL fails when the named network is missing.
        values["NCCL_NET"] = "AWS Libfabric"
    values.update(
        {
            "NCCL_DEBUG": config.job.nccl_debug,
            "NCCL_NVLS_ENABLE": "0",  # NVLink SHARP causes peer access errors on some nodes
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # a failed collective ends the process
            # The flight recorder: the last collectives of every group, dumped by NCCL's own
            # watchdog on a collective timeout and by the trainer's on a hang.
            "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_RECORDER_ENTRIES),
            "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
            "TRITON_CACHE_DIR": TRITON_CACHE_DIR,  # local disk: FSx file locks stall startup
        }
    )
    values["HF_HOME"] = HF_HOME
    # torchrun SIGKILLs its workers this long after forwarding a SIGTERM (torch
    # `distributed/launcher/api.py`, default 30 s): long enough for the trainer's stop save,
    # and shorter than the pod's grace period so the agent itself exits before the kubelet's kill.
    values["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(plan.timeouts.shutdown_grace_seconds)
    if run_dir is not None:  # beside the checkpoints, so the dump outlives the pod
        values["TORCH_FR_DUMP_TEMP_FILE"] = f"{run_dir}/flight-recorder-rank-"
    if hf_secret_name is not None:
        # The token itself stays in its file (`hf_token_volume`); only its path is in env.
        values["HF_TOKEN_PATH"] = HF_TOKEN_PATH
    values.update(config.job.extra_env)
    return [{"name": k, "value": v} for k, v in values.items()]


def hf_token_volume(hf_secret_name: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The HF token Secret as a read-only file at HF_TOKEN_PATH: (volume, trainer mount)."""
    volume = {
        "name": HF_TOKEN_VOLUME,
        "secret": {
            "secretName": hf_secret_name,
            "items": [{"key": HF_TOKEN_SECRET_KEY, "path": HF_TOKEN_PATH.rsplit("/", 1)[1]}],
            "defaultMode": HF_TOKEN_FILE_MODE,
        },
    }
    mount = {"name": HF_TOKEN_VOLUME, "mountPath": HF_TOKEN_DIR, "readOnly": True}
    return volume, mount


SECCOMP_PROFILE = {"type": "RuntimeDefault"}
"""The container runtime's default seccomp filter (containerd `contrib/seccomp/seccomp_default.go`)
for every container of the job. Its one cost here: it allows the NUMA memory-policy calls
(mbind, set_mempolicy, get_mempolicy) only with CAP_SYS_NICE, and migrate_pages/move_pages not
at all. Neither the trainer nor torchrun binds memory (torch's `--numa-binding` sets only CPU
affinity), aws-ofi-nccl and libfabric's EFA provider make none of these calls; NCCL probes
cuMem host-NUMA allocations once and, when the runtime refuses them, falls back to its
/dev/shm transport (NVIDIA/nccl `src/misc/cudawrap.cc` `ncclCuMemHostEnable`), which the job
gives a sized memory-backed /dev/shm for. docs/validation.md says what to check on a first
run."""


def pod_security_context() -> dict[str, Any]:
    """Pod defaults: every container non-root as the trainer's uid, RuntimeDefault seccomp.

    fsGroup makes the HF token file group-readable by the trainer (see HF_TOKEN_FILE_MODE);
    `OnRootMismatch` skips the recursive chown when a volume's root already has that group (the
    FSx CSI driver's `fsGroupPolicy: ReadWriteOnceWithFSType` leaves the RWX FSx volume alone).
    """
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_USER_ID,
        "runAsGroup": TRAINER_USER_ID,
        "fsGroup": TRAINER_USER_ID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": dict(SECCOMP_PROFILE),
    }


def trainer_security_context() -> dict[str, Any]:
    """The trainer container: no capability, no privilege escalation, the trainer's uid.

    The root filesystem stays writable: Triton and Inductor write their kernel caches under
    /tmp (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR: local disk on purpose, see
    TRITON_CACHE_DIR), as does the HF cache (HF_HOME); a read-only root would need an emptyDir
    per cache, sized for compiled kernels and downloaded weights alike.
    """
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsNonRoot": True,
        "runAsUser": TRAINER_USER_ID,
        "runAsGroup": TRAINER_USER_ID,
        "readOnlyRootFilesystem": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": dict(SECCOMP_PROFILE),
    }


PREPARE_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
"""All the init container keeps of root: CHOWN to give the run's directories to the trainer,
DAC_OVERRIDE to create them under directories other users own, FOWNER to change files it does
not own. Everything else (the runtime's default set included) is dropped."""


def _volumes(
    paths: RunPaths, size: PodSize, pvc_name: Any | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        # NCCL and DataLoader workers exchange tensors through /dev/shm; the container
        # runtime's 64 MiB default makes them fail, so it is memory-backed and sized.
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{size.shm_gib}Gi"}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if pvc_name is not None:
        volumes.append({"name": "shared", "persistentVolumeClaim": {"claimName": pvc_name}})
    else:
        # No FSx: the run lives in S3; this pod-local volume only stages what goes there.
        volumes.append({"name": "shared", "emptyDir": {}})
    mounts.append({"name": "shared", "mountPath": paths.mount_path})
    return volumes, mounts


def _prepare_run_dirs(image: Any, paths: RunPaths, mounts: list[dict[str, Any]]) -> dict[str, Any]:
    """An init container that gives the trainer's uid the run's directories on the volume.

    The trainer runs unprivileged, but a new FSx file system (and any directory another user
    made) is root's; without this, the first checkpoint save fails hours into a run. Only the
    run's own directories change owner: other runs on the shared volume are left alone.
    """
    if paths.staging_dir is not None:  # in S3: only the local staging directory
        run_dirs = [paths.staging_dir]
    else:
        run_dirs = [paths.run_dir, paths.tensorboard_dir]
        if paths.export_dir is not None:
            run_dirs.append(paths.export_dir)
    quoted = " ".join(f"'{d}'" for d in run_dirs)
    owner = f"{TRAINER_USER_ID}:{TRAINER_USER_ID}"
    return {
        "name": PREPARE_CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", f"mkdir -p {quoted} && chown {owner} {quoted}"],
        # Root, because a fresh FSx file system (and any directory another run made) is not
        # the trainer's to write: the one container of the job that is. Its capabilities are
        # cut to the three that mkdir + chown need, and it cannot gain more.
        "securityContext": {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], "add": list(PREPARE_CAPABILITIES)},
            "seccompProfile": dict(SECCOMP_PROFILE),
        },
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "256Mi"},
        },
        "volumeMounts": [m for m in mounts if m["name"] == "shared"],
    }


@dataclass(frozen=True)
class JobManifest:
    """The rendered PyTorchJob plus the figures plans and outputs show next to it."""

    name: str
    namespace: str
    run_id: str
    paths: RunPaths
    size: PodSize
    command: list[str]
    metadata: dict[str, Any]
    spec: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": self.metadata,
            "spec": self.spec,
        }


def render_job(
    plan: RunPlan,
    *,
    image: Any,
    pvc_name: Any | None,
    mount_path: str | None = None,
    hf_secret_name: str | None = None,
    service_account_name: str | None = None,
    bucket: S3Bucket | None = None,
) -> JobManifest:
    """The whole PyTorchJob of the planned run.

    `image` (digest-pinned URI) and `pvc_name` may be plain strings or Pulumi outputs.
    `mount_path` is where the claim is mounted (default: storage.fsx.mountPath). Without a
    claim the run lives in S3: `bucket` names it and `service_account_name` is the account
    bound to the run's prefix (infra.platform.run_access).
    """
    config = plan.config
    job = config.job
    assert job.name is not None  # parse_stack_config fills it from the stack name
    shared = pvc_name is not None
    paths = run_paths(plan, shared=shared, mount_path=mount_path if shared else None)
    size = pod_size(config)
    where = gpu_placement(config.gpu_nodes)
    command = torchrun_command(plan, paths)
    volumes, mounts = _volumes(paths, size, pvc_name)
    trainer_mounts = list(mounts)
    if hf_secret_name is not None:
        token_volume, token_mount = hf_token_volume(hf_secret_name)
        volumes.append(token_volume)
        trainer_mounts.append(token_mount)
    labels = {
        "app.kubernetes.io/name": "fsdp-eks-trainer",
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/part-of": "fsdp-eks",
    }
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command[: len(TRAINER_LAUNCHER)],
        "args": command[len(TRAINER_LAUNCHER) :],
        "env": [
            *container_env(plan, hf_secret_name=hf_secret_name, run_dir=paths.local_dump_dir),
            *s3_env(bucket),
            # The node a preflight failure names (Kubernetes downward API), and the metrics'
            # `node` label; `stack` is the job's name (trainer.telemetry).
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": STACK_ENV, "value": job.name},
        ],
        "resources": container_resources(size),
        "volumeMounts": trainer_mounts,
        "ports": container_ports(config),
        "securityContext": trainer_security_context(),
    }
    pod_spec: dict[str, Any] = {
        "initContainers": [_prepare_run_dirs(image, paths, mounts)],
        "containers": [container],
        "volumes": volumes,
        # On HyperPod, also only nodes whose health checks passed (infra.facts.instances).
        "nodeSelector": {
            **where.node_selector,
            **scheduling_labels(config.gpu_nodes.instance_type),
        },
        "tolerations": list(where.tolerations),
        "securityContext": pod_security_context(),
        # SIGTERM (spot interruption, drain, deadline) to SIGKILL: the trainer saves a
        # checkpoint at the next step boundary (trainer.preemption) and torchrun waits for it.
        "terminationGracePeriodSeconds": plan.timeouts.shutdown_grace_seconds + AGENT_EXIT_S,
        # No pod calls the API, and Pod Identity mounts its own token whatever this says
        # (amazon-eks-pod-identity-webhook v0.6.17 `pkg/handler/handler.go`).
        # Why: docs/design/job.md#no-service-account-token
        "automountServiceAccountToken": False,
    }
    if service_account_name is not None:
        pod_spec["serviceAccountName"] = service_account_name
    # Never `suspend`: stop/start own it, and leaving it out keeps Pulumi blind to it
    # (pulumi-kubernetes `provider.go` `Diff`, `pruneLiveState`).
    # Why: docs/design/job.md#suspend-never-rendered
    run_policy: dict[str, Any] = {
        "cleanPodPolicy": job.clean_pod_policy,
        "backoffLimit": job.backoff_limit,
    }
    if job.max_run_hours is not None:
        run_policy["activeDeadlineSeconds"] = int(job.max_run_hours * 3600)
    if job.ttl_hours_after_finished is not None:
        run_policy["ttlSecondsAfterFinished"] = int(job.ttl_hours_after_finished * 3600)
    spec: dict[str, Any] = {
        "nprocPerNode": str(config.gpus_per_node),
        "runPolicy": run_policy,
        # Workers only (one per GPU node, one pod template), found through c10d rendezvous.
        "elasticPolicy": elastic_policy(
            workers=config.gpu_nodes.count,
            max_restarts=job.backoff_limit,
            run_name=job.name,
            start_timeout_s=plan.timeouts.start_budget_seconds,
        ),
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": config.gpu_nodes.count,
                "restartPolicy": job.restart_policy,
                "template": {"metadata": {"labels": labels}, "spec": pod_spec},
            }
        },
    }
    run_id_label = paths.run_dir.rsplit("/", 1)[-1][:63].rstrip("-_.")
    metadata: dict[str, Any] = {
        "name": job.name,
        "namespace": job.namespace,
        # Kueue's queue and priority labels when the run is queued (infra.job.queueing):
        # Kueue's webhook then creates the job suspended and Kueue owns `suspend`.
        "labels": {**labels, "fsdp-eks/run-id": run_id_label, **queue_labels(config.scheduling)},
        # No `pulumi.com/waitFor`: it can only wait (a failed job held `up` for the whole
        # timeout) and counts crash-looping pods as running; `infra.launch.start_watch` waits
        # instead.
    }
    return JobManifest(
        name=job.name,
        namespace=job.namespace,
        run_id=paths.run_dir.rsplit("/", 1)[-1],
        paths=paths,
        size=size,
        command=command,
        metadata=metadata,
        spec=spec,
    )


def elastic_policy(
    *, workers: int, max_restarts: int, run_name: str, start_timeout_s: int
) -> dict[str, Any]:
    """c10d rendezvous on worker 0, for a PyTorchJob whose replicas are all Workers.

    Training operator v1.9 sets MASTER_ADDR / PET_NODE_RANK only when the job has a Master
    replica; without one, torchrun finds its peers through this policy: the operator points
    PET_RDZV_ENDPOINT at `<job>-worker-0:<pytorchjob-port>` and sets PET_RDZV_BACKEND and
    PET_NNODES. Elastic rendezvous also lets torchrun restart the whole worker group (up to
    `max_restarts` times) when one node's processes fail, so every node resumes together from
    the latest checkpoint. min = max = the node count: the job never runs on fewer nodes.
    Read and join timeouts as long as the start budget (`rendezvous_conf`) let late pods
    join instead of restarting the early ones.
    """
    return {
        "rdzvBackend": "c10d",
        "rdzvId": run_name,
        "minReplicas": workers,
        "maxReplicas": workers,
        "maxRestarts": max_restarts,
        # The operator passes these to torchrun as PET_RDZV_CONF (`--rdzv-conf`).
        "rdzvConf": [
            {"key": key, "value": value} for key, value in rendezvous_conf(start_timeout_s).items()
        ],
    }


def rendezvous_conf(start_timeout_s: int) -> dict[str, str]:
    """torchrun's c10d rendezvous timeouts: both the job's start budget
    (`job.startTimeoutMinutes`), so workers wait for each other as long as the job may take to
    start, and give up (in the cluster, without `pulumi up` watching) once it is spent.

    A shorter `read_timeout` would not release workers from a hung worker 0 (torch
    `csrc/distributed/c10d/TCPStore.cpp` `TCPStore::doWait`).
    Why and sources: docs/design/job.md#rendezvous_conf
    """
    return {"join_timeout": str(start_timeout_s), "read_timeout": str(start_timeout_s)}


JOB_NAME_LABEL = PYTORCHJOB.job_name_label
"""The label training operator v1.9 puts on every pod of a job, valued with the job's name
(kubeflow/trainer v1.9.0 `pkg/apis/kubeflow.org/v1/common_types.go` `JobNameLabel`, set by
`pkg/controller.v1/common/job_controller.go` `GenLabels`)."""


def network_policy(job_name: str, namespace: Any, api: JobApi = PYTORCHJOB) -> dict[str, Any]:
    """Ingress to the job's pods only from the job's own pods.

    Worker 0 serves the c10d rendezvous store (RENDEZVOUS_PORT) and every worker listens on
    ephemeral ports for NCCL's bootstrap and socket fallback: on a shared cluster any pod
    could connect to them. All ports stay open between the job's pods (NCCL's are not fixed);
    egress is untouched (S3, the Hub, FSx). EFA traffic itself does not pass through the pod
    network. A cluster the stack creates enforces it (its VPC CNI add-on is configured with
    `enableNetworkPolicy`: infra/platform/cluster.py); an existing cluster enforces it only if
    its operators turned that on, and otherwise stores the object and changes nothing, so it
    is rendered for every stack (tests/infra/test_network_policies.py evaluates the flows).
    The job's pods are those `api` labels with the job's name (a TrainJob's: its JobSet's).
    """
    selector = {"matchLabels": {api.job_name_label: job_name}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": f"{job_name}-same-job-only",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/part-of": "fsdp-eks",
                "app.kubernetes.io/instance": job_name,
            },
        },
        "spec": {
            "podSelector": selector,
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": selector}]}],
        },
    }


def kubectl_commands(name: str, namespace: str, api: JobApi = PYTORCHJOB) -> dict[str, str]:
    """The commands a user runs to follow the job (stack outputs and the plan show them)."""
    selector = api.pod_selector(name)
    if api is not PYTORCHJOB:  # pod names carry a random suffix: worker 0 by its labels
        kind = api.kubectl_name
        first = api.first_worker_selector(name)
        return {
            "status": f"kubectl -n {namespace} get {kind} {name} -o wide",
            "pods": f"kubectl -n {namespace} get pods -l {selector} -o wide",
            "logs": f"kubectl -n {namespace} logs -f -l {first} -c {api.container_name}",
            "events": f"kubectl -n {namespace} describe {kind} {name}",
            "delete": f"kubectl -n {namespace} delete {kind} {name}",
        }
    return {
        "status": f"kubectl -n {namespace} get pytorchjob {name} -o wide",
        "pods": f"kubectl -n {namespace} get pods -l {selector} -o wide",
        "logs": f"kubectl -n {namespace} logs -f {name}-worker-0 -c {CONTAINER_NAME}",
        "events": f"kubectl -n {namespace} describe pytorchjob {name}",
        "delete": f"kubectl -n {namespace} delete pytorchjob {name}",
    }
