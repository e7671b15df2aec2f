"""The run as a Kubeflow Trainer v2 TrainJob: a TrainingRuntime for this trainer and the
TrainJob that uses it, rendered from the PyTorchJob's own pod (`infra.job.manifest`), so the
two APIs run the same container on the same nodes with the same volumes.

The trainer keeps the c10d rendezvous (`PET_RDZV_*`); differences are in `POD_DIFFERENCES`.
What Trainer v2.3.0 does with them, with sources: docs/design/job.md#trainjob_manifest
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.estimates.run_plan import RunPlan
from infra.job.job_api import TRAININGRUNTIME, TRAINJOB
from infra.job.manifest import (
    CONTAINER_NAME,
    RENDEZVOUS_PORT_NAME,
    JobManifest,
    S3Bucket,
    render_job,
)

TRAINER_CONTAINER = "node"
"""The container the torch plugin injects into (kubeflow/trainer v2.3.0 `pkg/constants`
`Node`), and the replicated job's name, so pods are `<job>-node-<job index>-<pod index>`."""
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
ANCESTOR_TRAINER = "trainer"
TRAINER_PORT = 29500
"""`PET_MASTER_PORT` and the port the torch plugin adds (`pkg/constants` `ContainerTrainerPort`):
node 0 serves the c10d store on it."""
FRAMEWORK_LABEL = {"trainer.kubeflow.org/framework": "torch"}
"""As the release's own torch runtimes carry it (`manifests/base/runtimes/
torch_distributed.yaml`)."""

RETRYABLE_EXIT_CODES = range(128, 256)
"""What training operator v1.9's `ExitCode` policy restarts (`pkg/util/train/train_util.go`
`IsRetryableExitCode`: >= 128, a signal); anything else fails the job."""

POD_DIFFERENCES = {
    "container name": "`pytorch` (the operator's) becomes `node` (the torch plugin's)",
    "rendezvous port": "`pytorchjob-port` 23456 goes; the plugin adds 29500 (unnamed)",
    "rendezvous variables": "PET_RDZV_* set in the runtime, not injected by an operator",
    "restartPolicy": "set in the pod template (the operator copies it from the replica spec)",
}
"""Everything in which the TrainJob's pod template differs from the PyTorchJob's
(tests/infra/test_trainjob_manifest.py compares the two)."""


@dataclass(frozen=True)
class TrainJobManifests:
    """The rendered TrainingRuntime and TrainJob, and the PyTorchJob rendering they came from
    (its run id, paths, pod size and command, which plans and outputs show)."""

    job: JobManifest
    runtime: dict[str, Any]
    trainjob: dict[str, Any]

    @property
    def pod_template(self) -> dict[str, Any]:
        """The trainer pods' template inside the runtime's JobSet."""
        [node] = self.runtime["spec"]["template"]["spec"]["replicatedJobs"]
        return dict(node["template"]["spec"]["template"])


def runtime_name(job_name: str) -> str:
    """The TrainingRuntime's name: one per job, in the job's namespace."""
    return f"{job_name}-runtime"


def rendezvous_env(policy: dict[str, Any], job_name: str) -> list[dict[str, str]]:
    """The `PET_*` variables training operator v1.9 gives a worker for `policy` (an
    `elasticPolicy`: `pkg/controller.v1/pytorch/elastic.go`), with node 0's JobSet hostname
    (`<jobset>-node-0-0.<subdomain>`: jobset v0.12.0 `jobset_controller.go` `constructJob`,
    subdomain = the JobSet's name) as the endpoint. `PET_NNODES` is the plugin's (`N`, not the
    operator's `N:N`); the command's `--nnodes` wins over either."""
    conf = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    values = {
        "PET_RDZV_ENDPOINT": f"{job_name}-{TRAINER_CONTAINER}-0-0.{job_name}:{TRAINER_PORT}",
        "PET_RDZV_BACKEND": policy["rdzvBackend"],
        "PET_MAX_RESTARTS": str(policy["maxRestarts"]),
        "PET_RDZV_ID": policy["rdzvId"],
        "PET_RDZV_CONF": conf,
    }
    return [{"name": name, "value": value} for name, value in values.items()]


def restart_rules(restart_policy: str, backoff_limit: int) -> tuple[str, dict[str, Any]]:
    """(pod restartPolicy, the batch Job's restart fields) for `job.restartPolicy`.

    The training operator counts every restart of the job's pods against `backoffLimit`; the
    trainer nodes are one batch Job here, whose `backoffLimit` counts the same thing across
    its pods (container restarts under OnFailure, failed pods under Never). `ExitCode`:
    a pod failure policy fails the Job at once on a non-retryable code of the trainer
    container (Kubernetes `batch/v1` `PodFailurePolicyOnExitCodesRequirement`, which needs
    restartPolicy Never); a retryable one recreates the pod, counted.
    """
    if restart_policy == "OnFailure":
        return "OnFailure", {"backoffLimit": backoff_limit}
    if restart_policy == "Never":
        return "Never", {"backoffLimit": 0}
    permanent = [code for code in range(1, 256) if code not in RETRYABLE_EXIT_CODES]
    rule = {
        "action": "FailJob",
        "onExitCodes": {"containerName": TRAINER_CONTAINER, "operator": "In", "values": permanent},
    }
    return "Never", {"backoffLimit": backoff_limit, "podFailurePolicy": {"rules": [rule]}}


def _copy_tree(value: Any) -> Any:
    """A copy of the dicts and lists of a manifest, its leaves shared: they may be Pulumi
    outputs (the image digest, the claim's name), which cannot be deep-copied."""
    if isinstance(value, dict):
        return {key: _copy_tree(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_tree(item) for item in value]
    return value


def trainer_pod_template(pytorchjob: dict[str, Any], backoff_limit: int) -> dict[str, Any]:
    """A PyTorchJob's worker pod, changed only as `POD_DIFFERENCES` says."""
    job_name = str(pytorchjob["metadata"]["name"])
    spec = pytorchjob["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    template = _copy_tree(worker["template"])
    pod = template["spec"]
    [container] = [c for c in pod["containers"] if c["name"] == CONTAINER_NAME]
    container["name"] = TRAINER_CONTAINER
    container["ports"] = [p for p in container["ports"] if p["name"] != RENDEZVOUS_PORT_NAME]
    container["env"] = [*container["env"], *rendezvous_env(spec["elasticPolicy"], job_name)]
    pod["restartPolicy"], _ = restart_rules(worker["restartPolicy"], backoff_limit)
    return dict(template)


def as_trainjob(
    pytorchjob: dict[str, Any],
    *,
    runtime_name: str,
    restart_policy: str,
    backoff_limit: int,
    ttl_seconds: int | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(TrainingRuntime, TrainJob) running the workers of `pytorchjob` (a rendered
    PyTorchJob of Workers only, with an elastic policy), its deadline and TTL carried over."""
    metadata = pytorchjob["metadata"]
    name, namespace = metadata["name"], metadata["namespace"]
    spec = pytorchjob["spec"]
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    workers = int(worker["replicas"])
    _, job_restarts = restart_rules(restart_policy, backoff_limit)
    jobset_spec: dict[str, Any] = {
        # Node 0's hostname is the rendezvous endpoint (`rendezvous_env`).
        "network": {"enableDNSHostnames": True},
        # Restarts are the batch Job's (`restart_rules`); a failed Job fails the JobSet.
        "failurePolicy": {"maxRestarts": 0},
        "replicatedJobs": [
            {
                "name": TRAINER_CONTAINER,
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {ANCESTOR_LABEL: ANCESTOR_TRAINER}},
                    "spec": {
                        "parallelism": workers,
                        "completions": workers,
                        "completionMode": "Indexed",
                        **job_restarts,
                        "template": trainer_pod_template(pytorchjob, backoff_limit),
                    },
                },
            }
        ],
    }
    if ttl_seconds is not None:
        # The JobSet (and its pods) go; the TrainJob itself stays until `pulumi destroy`.
        jobset_spec["ttlSecondsAfterFinished"] = ttl_seconds
    labels = dict(metadata.get("labels") or {})
    runtime = {
        "apiVersion": TRAININGRUNTIME.api_version,
        "kind": TRAININGRUNTIME.kind,
        "metadata": {
            "name": runtime_name,
            "namespace": namespace,
            # Kueue's queue labels are the TrainJob's alone: Kueue queues jobs, not runtimes.
            "labels": {
                **{k: v for k, v in labels.items() if not k.startswith("kueue.x-k8s.io/")},
                **FRAMEWORK_LABEL,
            },
        },
        "spec": {
            "mlPolicy": {"numNodes": workers, "torch": {}},
            "template": {"spec": jobset_spec},
        },
    }
    trainjob_spec: dict[str, Any] = {
        "runtimeRef": {
            "name": runtime_name,
            "apiGroup": TRAININGRUNTIME.group,
            "kind": TRAININGRUNTIME.kind,
        },
        "trainer": {"numNodes": workers, "numProcPerNode": int(spec["nprocPerNode"])},
    }
    deadline = (spec.get("runPolicy") or {}).get("activeDeadlineSeconds")
    if deadline is not None:
        trainjob_spec["activeDeadlineSeconds"] = int(deadline)
    # Never `suspend`: `fsdp-eks stop` / `start` own it, as on the PyTorchJob.
    trainjob = {
        "apiVersion": TRAINJOB.api_version,
        "kind": TRAINJOB.kind,
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": trainjob_spec,
    }
    return runtime, trainjob


def render_trainjob(
    plan: RunPlan,
    *,
    image: Any,
    pvc_name: Any | None,
    mount_path: str | None = None,
    hf_secret_name: str | None = None,
    service_account_name: str | None = None,
    bucket: S3Bucket | None = None,
) -> TrainJobManifests:
    """The TrainingRuntime and TrainJob of the planned run (arguments as `render_job`'s)."""
    pytorchjob = render_job(
        plan,
        image=image,
        pvc_name=pvc_name,
        mount_path=mount_path,
        hf_secret_name=hf_secret_name,
        service_account_name=service_account_name,
        bucket=bucket,
    )
    job = plan.config.job
    runtime, trainjob = as_trainjob(
        pytorchjob.as_dict(),
        runtime_name=runtime_name(pytorchjob.name),
        restart_policy=job.restart_policy,
        backoff_limit=job.backoff_limit,
        # No JobSet TTL: Trainer v2.3.0 drops a TrainJob's Failed condition on every reconcile
        # and builds a missing JobSet again (`pkg/controller/trainjob_controller.go`
        # `removeFailedCondition`; kubeflow/trainer#3779, fixed by #3891 after v2.3.0), so a
        # failed run whose JobSet a TTL removed would start again on GPUs.
        ttl_seconds=None,
    )
    return TrainJobManifests(job=pytorchjob, runtime=runtime, trainjob=trainjob)
