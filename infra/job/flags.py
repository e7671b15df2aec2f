"""The trainer's command line, rendered from the stack config.

The PyTorchJob, the offline plan and the local run all print or execute the command this module
renders, and a test parses it with the trainer's own parser (`trainer.config.parse_args`), so a
stack file can never produce a flag the trainer would reject at minute twenty of a GPU run.
No pulumi and no torch here: the local run imports it on a laptop.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infra.config.trainer_keys import TABLE_SUPPLIED_KEYS, stack_value
from infra.facts.instances import ALLREDUCE_BUSBW_FLOOR_GBPS, HYPERPOD_PREFIX
from trainer.config import flag_table, format_args

if TYPE_CHECKING:
    from infra.config import StackConfig
    from infra.estimates.run_plan import RunPlan

CHECKPOINTS_DIR = "checkpoints"
"""Directory under the shared mount, or key prefix in the bucket, with one entry per run."""
LOCAL_CHECKPOINT_MOUNT = "/scratch"
"""The pod-local volume of a stack without FSx: where outputs bound for S3 are staged."""
CHECKPOINT_BUCKET_ENV = "CHECKPOINT_BUCKET"
"""The container variable holding the bucket's name. The name is known only at deploy time,
so the trainer's arguments refer to it as `$(CHECKPOINT_BUCKET)`, which the kubelet expands
from the container's environment before it starts the command (Kubernetes docs, "Define a
command and arguments for a container": "Use environment variables to define arguments")."""


def preflight_flags(config: StackConfig) -> dict[str, Any]:
    """What each node must be (trainer.preflight), from the same instance facts the node group
    and the pod's resource requests are built from."""
    facts, nodes = config.instance, config.gpu_nodes
    instance_type = nodes.instance_type.removeprefix(HYPERPOD_PREFIX)
    return {
        "preflight": config.job.preflight,
        "expect_gpu": facts.gpu_model,
        "expect_gpu_memory_gib": facts.gpu_memory_gib,
        "expect_efa_devices": nodes.efa_interface_count if nodes.efa_enabled else 0,
        "allreduce_floor_gbps": ALLREDUCE_BUSBW_FLOOR_GBPS.get(instance_type, 0.0),
    }


RUN_PATH_FLAGS = frozenset(
    {"checkpoint_dir", "resume_from_checkpoint", "export_dir", "tensorboard_dir", "staging_dir"}
)
"""Flags rendered from the run's paths (`trainer_argv`): not in `trainer_flags` nor its hash."""


def resolved_flags(plan: RunPlan) -> dict[str, Any]:
    """The flags whose value is not their stack key's as written: an `auto` the plan resolves,
    a value derived from other keys, and those rendered from no key of their own."""
    config = plan.config
    chosen = plan.parallelism
    return {
        # `auto` keys resolved by the memory estimate (the run plan's parallelism).
        "sharding_strategy": chosen.sharding_strategy,
        "activation_checkpointing": chosen.activation_checkpointing,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        # The trainer's own default is 'en': a null stack value is rendered as ''.
        "dataset_config_name": config.data.dataset_config_name or "",
        # A save of this model is no hang (trainer.watchdog): the floor is sized from it.
        "watchdog_floor_s": plan.timeouts.watchdog_floor_seconds,
        **preflight_flags(config),
    }


def trainer_flags(plan: RunPlan) -> dict[str, Any]:
    """Every trainer flag the experiment sets, except the run's paths (`{flag: value}`), in
    the order of the trainer's table of flags (`trainer.config.flag_table`): each flag with a
    stack key takes that key's value, resolved where the plan resolves it; `training.extraArgs`
    follow. Values left `None` keep the trainer's default."""
    resolved = resolved_flags(plan)
    flags: dict[str, Any] = {}
    for row in flag_table():
        if row.name in resolved:
            flags[row.name] = resolved[row.name]
        elif row.stack_key is not None:
            value = stack_value(plan.config, row.stack_key)
            if value is not None or row.stack_key not in TABLE_SUPPLIED_KEYS:
                flags[row.name] = value
        elif row.rendered_from is not None and row.name not in RUN_PATH_FLAGS:
            raise AssertionError(f"--{row.name} is rendered from {row.rendered_from}: no rule")
    return {**flags, **plan.config.training.extra_args}


def run_id(plan: RunPlan) -> str:
    """The run's directory name: `job.runId`, else the job name plus a hash of the flags.

    A pod that restarts (same flags) finds its checkpoints and resumes; an edited experiment
    (other flags, so another hash) starts fresh instead of loading an incompatible checkpoint.
    """
    job = plan.config.job
    if job.run_id is not None:
        return job.run_id
    text = json.dumps(trainer_flags(plan), sort_keys=True, default=str)
    return f"{job.name}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class RunPaths:
    """Where one run keeps its state: on the FSx volume, or in the stack's S3 bucket.

    Either way every pod of the job sees the same checkpoints, and a restarted or rescheduled
    pod resumes from them.
    """

    mount_path: str
    """The FSx mount, or (in S3) the pod-local volume where outputs are staged."""
    shared: bool
    """Whether the pods mount FSx; otherwise the run lives in S3."""
    run_dir: str
    """A directory under the FSx mount, or `s3://$(CHECKPOINT_BUCKET)/checkpoints/<run id>`."""
    export_dir: str | None
    tensorboard_dir: str
    staging_dir: str | None = None
    """In S3: the local directory rank 0 writes the metrics, events and export into first."""

    @property
    def in_s3(self) -> bool:
        return not self.shared

    @property
    def local_dump_dir(self) -> str:
        """A local directory for files the process writes as it dies (flight recorder)."""
        return self.staging_dir if self.staging_dir is not None else self.run_dir


def s3_run_prefix(plan: RunPlan) -> str:
    """The run's key prefix in the bucket when it has no FSx."""
    return f"{CHECKPOINTS_DIR}/{run_id(plan)}"


def run_paths(
    plan: RunPlan, *, shared: bool | None = None, mount_path: str | None = None
) -> RunPaths:
    """The run's paths: under the FSx mount, or in S3 when the pods mount no claim.

    `shared` defaults to whether the stack mounts FSx; `mount_path` to storage.fsx.mountPath.
    """
    config = plan.config
    fsx = config.storage.fsx
    if shared is None:
        shared = fsx.enabled
    if shared:
        mount = mount_path or fsx.mount_path
        run_dir = f"{mount.rstrip('/')}/{CHECKPOINTS_DIR}/{run_id(plan)}"
        staging = None
    else:
        mount = LOCAL_CHECKPOINT_MOUNT
        run_dir = f"s3://$({CHECKPOINT_BUCKET_ENV})/{s3_run_prefix(plan)}"
        staging = f"{mount}/outputs"
    return RunPaths(
        mount_path=mount,
        shared=shared,
        run_dir=run_dir,
        export_dir=f"{run_dir}/export" if config.training.export_model else None,
        tensorboard_dir=f"{run_dir}/tensorboard",
        staging_dir=staging,
    )


def trainer_argv(plan: RunPlan, paths: RunPaths) -> list[str]:
    """Arguments after `-m trainer`: the experiment's flags plus the run's paths.

    `--resume_from_checkpoint` is the checkpoint directory itself: the trainer resumes from the
    newest complete step there and starts fresh when there is none, so a restarted pod resumes.
    """
    flags = {
        **trainer_flags(plan),
        "checkpoint_dir": paths.run_dir,
        "resume_from_checkpoint": paths.run_dir,
        "export_dir": paths.export_dir,
        "tensorboard_dir": paths.tensorboard_dir,
        "staging_dir": paths.staging_dir,
    }
    return format_args(flags)


TRAINER_LAUNCHER = ("python3", "-m", "trainer.launch")
"""torchrun's own `main`, exiting with the code of the worker that failed (143 after a stop
checkpoint, 142 after the hang watchdog) instead of torchrun's 1 (`trainer/launch.py`), so the
operator's `ExitCode` restart policy sees why the pod ended."""


def torchrun_command(plan: RunPlan, paths: RunPaths) -> list[str]:
    """The container's whole command line: torchrun's arguments after `TRAINER_LAUNCHER`.

    torchrun takes the rendezvous endpoint and backend from the `PET_*` variables the training
    operator injects (see `job_manifest.elastic_policy`); the node and process counts are
    written out so the manifest shows them.
    """
    config = plan.config
    return [
        *TRAINER_LAUNCHER,
        f"--nnodes={config.gpu_nodes.count}",
        f"--nproc_per_node={config.gpus_per_node}",
        "-m",
        "trainer",
        *trainer_argv(plan, paths),
    ]
