"""The training run itself: a Kubeflow PyTorchJob (plus its HF-token Secret) on the cluster.

The manifest comes from `infra.job.manifest`; this component registers it, replaced
delete-first on any spec change, and `up` returns once every worker runs (`JobStartWatch`).
Why those two choices, and construction: docs/design/program.md#training_job
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra.config.job import JobConfig
from infra.estimates.run_plan import RunPlan
from infra.job.flags import CHECKPOINT_BUCKET_ENV, RunPaths
from infra.job.job_api import TRAINJOB, job_api
from infra.job.manifest import (
    API_VERSION,
    HF_TOKEN_SECRET_KEY,
    KIND,
    JobManifest,
    S3Bucket,
    kubectl_commands,
    network_policy,
    render_job,
)
from infra.job.start_wait import wait_limit_seconds
from infra.job.trainjob_manifest import render_trainjob
from infra.launch.start_watch import JobStartWatch


def create_timeout(start_timeout_s: int) -> str:
    """The engine's timeout for the job's start watch (`pulumi.CustomTimeouts`): as long as
    every worker may take to start (`job.startTimeoutMinutes`: GPU nodes scaling up, a 20 GB
    image pull), plus the minute each must then run without a restart."""
    return f"{-(-int(wait_limit_seconds(start_timeout_s)) // 60)}m"


def content_name(prefix: str, spec: Any) -> str:
    """`prefix` plus a digest of `spec` (resolved): a TrainingRuntime whose content changes gets
    a new name, so the TrainJob naming it changes too and is replaced, as a PyTorchJob whose
    spec changes is. Trainer v2.3.0 never updates a running JobSet from a changed runtime
    (`plugins/jobset/jobset.go` `Build`); a TrainJob keeps its own snapshot of the runtime it
    started from (`core/snapshot.go`), and the old runtime goes after the TrainJob using it."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:10]
    return f"{prefix}-{digest}"


def _uid(metadata: Any) -> str | None:
    """`metadata.uid` of the job as the provider returns it (a dict for a CustomResource)."""
    if isinstance(metadata, dict):
        return metadata.get("uid")
    return getattr(metadata, "uid", None)


@dataclass
class JobNamespaceArgs:
    config: JobConfig
    k8s_provider: pulumi.ProviderResource
    depends_on: Sequence[pulumi.Resource] = ()


class JobNamespace(pulumi.ComponentResource):
    """The job's namespace: created by the stack, or an existing one referenced by name.

    Separate from TrainingJob because the FSx claim (Storage) must live in it before the job.
    """

    name: pulumi.Output[str]

    def __init__(
        self, name: str, args: JobNamespaceArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:job:JobNamespace", name, None, opts)
        if args.config.create_namespace:
            namespace = k8s.core.v1.Namespace(
                f"{name}-namespace",
                metadata={
                    "name": args.config.namespace,
                    "labels": {"app.kubernetes.io/part-of": "fsdp-eks"},
                },
                opts=pulumi.ResourceOptions(
                    parent=self, provider=args.k8s_provider, depends_on=list(args.depends_on)
                ),
            )
            self.name = namespace.metadata.apply(lambda meta: str(meta["name"]))
        else:
            self.name = pulumi.Output.from_input(args.config.namespace)
        self.register_outputs({"name": self.name})


@dataclass
class TrainingJobArgs:
    plan: RunPlan
    """The checked run plan: the stack config and every figure the job renders from it."""
    image_uri: pulumi.Input[str]
    """Digest-pinned image (TrainerImage.image_uri) or image.uri from the config."""
    k8s_provider: pulumi.ProviderResource
    kubeconfig: pulumi.Input[str]
    """The same kubeconfig as `k8s_provider` (Cluster.kubeconfig): `up` watches the job's start
    through it."""
    namespace: pulumi.Input[str]
    """JobNamespace.name, so the job waits for its namespace."""
    pvc_name: pulumi.Input[str] | None = None
    """FSx claim in the namespace (Storage.pvc_name); None: a pod-local checkpoint volume."""
    mount_path: str | None = None
    """Where the claim is mounted (Storage.mount_path); default storage.fsx.mountPath."""
    depends_on: Sequence[pulumi.Resource] = field(default_factory=list)
    """Node groups, device plugins, training operator, storage: all must exist first."""
    service_account_name: str | None = None
    """The pods' own service account (infra.platform.run_access, for a run in S3)."""
    bucket: S3Bucket | None = None
    """The bucket a run without FSx lives in (its checkpoints, metrics and export)."""


def checkpoint_location(paths: RunPaths, bucket: S3Bucket | None) -> pulumi.Output[str]:
    """Where the run's checkpoints are, with the bucket's real name in place of the
    `$(CHECKPOINT_BUCKET)` the kubelet expands in the pod."""
    if not paths.in_s3 or bucket is None:
        return pulumi.Output.from_input(paths.run_dir)
    placeholder = f"$({CHECKPOINT_BUCKET_ENV})"
    return pulumi.Output.from_input(bucket.name).apply(
        lambda name: paths.run_dir.replace(placeholder, name)
    )


class TrainingJob(pulumi.ComponentResource):
    """`fsdp-eks:job:TrainingJob`: the PyTorchJob running `torchrun ... -m trainer <args>`."""

    job_name: pulumi.Output[str]
    namespace: pulumi.Output[str]
    image: pulumi.Output[str]
    run_id: str
    checkpoint_path: pulumi.Output[str]
    """The run's checkpoint directory on FSx, or its `s3://` URI."""
    manifest: JobManifest
    kubectl: dict[str, str]
    network_policy: k8s.networking.v1.NetworkPolicy
    start: JobStartWatch

    def __init__(
        self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("fsdp-eks:job:TrainingJob", name, None, opts)
        config = args.plan.config
        job_name = config.job.name
        assert job_name is not None  # filled from the stack name by parse_stack_config
        k8s_opts = pulumi.ResourceOptions(parent=self, provider=args.k8s_provider)

        secret_name = None
        depends_on = list(args.depends_on)
        if config.hf_token is not None:
            secret_name = f"{job_name}-hf-token"
            secret = k8s.core.v1.Secret(
                f"{name}-hf-token",
                metadata={"name": secret_name, "namespace": args.namespace},
                type="Opaque",
                string_data={
                    HF_TOKEN_SECRET_KEY: pulumi.Output.secret(config.hf_token.get_secret_value())
                },
                opts=k8s_opts,
            )
            # A pod started before its Secret exists fails to start (CreateContainerConfigError).
            depends_on.append(secret)

        api = job_api(config.job.api)
        rendering: dict[str, Any] = dict(
            image=args.image_uri,
            pvc_name=args.pvc_name,
            mount_path=args.mount_path,
            hf_secret_name=secret_name,
            service_account_name=args.service_account_name,
            bucket=args.bucket,
        )
        self.manifest = render_job(args.plan, **rendering)
        # Only the job's own pods may connect to its rendezvous store and NCCL ports; created
        # first, so no pod of the job is ever reachable from the rest of a shared cluster.
        policy = network_policy(job_name, args.namespace, api)
        self.network_policy = k8s.networking.v1.NetworkPolicy(
            f"{name}-network-policy",
            metadata=policy["metadata"],
            spec=policy["spec"],
            opts=pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=list(args.depends_on))
            ),
        )
        depends_on.append(self.network_policy)
        job = (
            self._trainjob(name, args, rendering, k8s_opts, depends_on)
            if api is TRAINJOB
            else self._pytorchjob(name, args, k8s_opts, depends_on)
        )
        # `up` waits here for every worker to run, and fails with the reason when they can't.
        # A new uid is a new job (a replaced spec): only then is there a start to wait for.
        # `metadata` is set by the SDK, untyped (pulumi `rpc.py` `transfer_properties`).
        # Why: docs/design/program.md#the-start-watch
        job_metadata: pulumi.Output[Any] = job.metadata  # type: ignore[attr-defined]
        start_budget_s = args.plan.timeouts.start_budget_seconds
        wait_for = create_timeout(start_budget_s)
        self.start = JobStartWatch(
            f"{name}-start",
            kubeconfig=args.kubeconfig,
            namespace=args.namespace,
            job_name=job_name,
            job_uid=job_metadata.apply(_uid),
            workers=config.gpu_nodes.count,
            backoff_limit=config.job.backoff_limit,
            start_timeout_seconds=start_budget_s,
            api=api,
            opts=pulumi.ResourceOptions(
                parent=self,
                depends_on=[job],
                custom_timeouts=pulumi.CustomTimeouts(create=wait_for, update=wait_for),
            ),
        )
        # Derived from the job's id so that anything reading the name waits for the job.
        self.job_name = job.id.apply(lambda _: job_name)
        self.namespace = pulumi.Output.from_input(args.namespace)
        self.image = pulumi.Output.from_input(args.image_uri)
        self.run_id = self.manifest.run_id
        self.checkpoint_path = checkpoint_location(self.manifest.paths, args.bucket)
        self.kubectl = kubectl_commands(job_name, config.job.namespace, api)
        self.register_outputs(
            {
                "jobName": self.job_name,
                "namespace": self.namespace,
                "image": self.image,
                "runId": self.run_id,
                "checkpointPath": self.checkpoint_path,
            }
        )

    def _pytorchjob(
        self,
        name: str,
        args: TrainingJobArgs,
        k8s_opts: pulumi.ResourceOptions,
        depends_on: list[pulumi.Resource],
    ) -> k8s.apiextensions.CustomResource:
        """The PyTorchJob, replaced (old one deleted first) whenever its spec changes."""
        metadata = {**self.manifest.metadata, "namespace": args.namespace}
        return k8s.apiextensions.CustomResource(
            f"{name}-pytorchjob",
            api_version=API_VERSION,
            kind=KIND,
            metadata=metadata,
            spec=self.manifest.spec,
            opts=pulumi.ResourceOptions.merge(
                k8s_opts,
                pulumi.ResourceOptions(
                    depends_on=depends_on,
                    # Same-name relaunch: the old job must be gone before the new one exists.
                    delete_before_replace=True,
                    replace_on_changes=["spec"],
                ),
            ),
        )

    def _trainjob(
        self,
        name: str,
        args: TrainingJobArgs,
        rendering: dict[str, Any],
        k8s_opts: pulumi.ResourceOptions,
        depends_on: list[pulumi.Resource],
    ) -> k8s.apiextensions.CustomResource:
        """The TrainingRuntime (named by its content) and the TrainJob using it, replaced as
        the PyTorchJob is whenever either changes."""
        rendered = render_trainjob(args.plan, **rendering)
        runtime_spec = pulumi.Output.from_input(rendered.runtime["spec"])
        runtime_name = runtime_spec.apply(
            lambda spec: content_name(str(rendered.runtime["metadata"]["name"]), spec)
        )
        runtime = k8s.apiextensions.CustomResource(
            f"{name}-trainingruntime",
            api_version=rendered.runtime["apiVersion"],
            kind=rendered.runtime["kind"],
            metadata={
                **rendered.runtime["metadata"],
                "name": runtime_name,
                "namespace": args.namespace,
            },
            spec=rendered.runtime["spec"],
            opts=pulumi.ResourceOptions.merge(
                k8s_opts, pulumi.ResourceOptions(depends_on=depends_on)
            ),
        )
        spec = dict(rendered.trainjob["spec"])
        spec["runtimeRef"] = {**spec["runtimeRef"], "name": runtime_name}
        # `runtimeRef` and `trainer` are immutable (Trainer v2.3.0 `trainjob_types.go`
        # XValidation `self == oldSelf`): any change of the spec replaces the TrainJob.
        return k8s.apiextensions.CustomResource(
            f"{name}-trainjob",
            api_version=rendered.trainjob["apiVersion"],
            kind=rendered.trainjob["kind"],
            metadata={**rendered.trainjob["metadata"], "namespace": args.namespace},
            spec=spec,
            opts=pulumi.ResourceOptions.merge(
                k8s_opts,
                pulumi.ResourceOptions(
                    depends_on=[*depends_on, runtime],
                    delete_before_replace=True,
                    replace_on_changes=["spec"],
                ),
            ),
        )
