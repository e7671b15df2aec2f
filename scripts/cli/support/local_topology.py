"""The job's topology in miniature: what the local rehearsal runs for a stack, and how.

The PyTorchJob runs one torchrun agent per GPU node, each in its own pod, found through c10d
rendezvous (`infra.job.manifest.elastic_policy`), with its checkpoints where every pod sees
them: FSx, or the run's prefix in the stack's bucket. `plan_local_run` maps that onto this
machine: one agent per node (at most MAX_LOCAL_NODES), the same rendezvous settings as the
operator hands them to torchrun, one directory playing FSx or S3 for all agents, and the
stack's trainer flags scaled to the `tiny` preset. Pure: nothing is started here
(`scripts/cli/local.py` launches it), so tests can check the topology in milliseconds.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from infra.config import StackConfigError
from infra.estimates.run_plan import RunPlan
from infra.job.flags import RunPaths, run_paths, torchrun_command, trainer_flags
from infra.job.manifest import elastic_policy
from trainer.config import format_args, parse_args
from trainer.telemetry_names import DEFAULT_METRICS_PORT, NODE_ENV, STACK_ENV

MAX_LOCAL_NODES = 2
"""Agents (nodes) a rehearsal runs at most: two already show every cross-node effect (a
rendezvous of several agents, a directory one node cannot see) and fit two CPU cores."""

# What a laptop can do in a few minutes on two CPU cores: a ~1M-parameter model, short
# sequences, a learning rate a tiny model learns quickly with.
LOCAL_OVERRIDES: dict[str, Any] = {
    "num_layers": None,
    "hidden_width": None,
    "num_heads": None,
    "num_key_value_heads": None,
    "intermediate_size": None,
    "vocab_size": None,
    "init_from": None,
    "attn_implementation": "sdpa",
    "dataset_config_name": "",
    "text_column": "text",
    "num_workers": 0,
    "gradient_accumulation_steps": 1,
    "lr": 3e-3,
    "min_lr": 3e-4,
    "weight_decay": 0.0,
    "activation_checkpointing": "off",
    "compile": False,
    "cpu_offload": False,
    "validation_freq": 0,
    "export_dir": None,
    "tensorboard_dir": None,
    "progress_bar": False,
    # This machine is not the stack's node: the preflight still runs (and its all-reduce),
    # without the GPU model, EFA devices and bandwidth floor only the cluster can meet.
    "expect_gpu": None,
    "expect_gpu_memory_gib": None,
    "expect_efa_devices": 0,
    "allreduce_floor_gbps": 0.0,
}


REPLACED_STACK_KEYS: dict[str, str] = {
    "lr": "training.lr",
    "min_lr": "training.minLr",
    "weight_decay": "training.weightDecay",
    "gradient_accumulation_steps": "training.gradientAccumulationSteps",
}
"""The stack's training values `LOCAL_OVERRIDES` replaces, by trainer flag: what the rehearsal
says it changed (a run of the stack's own values is the cluster's, not this one)."""


def replaced_values(stack_flags: dict[str, Any]) -> list[str]:
    """`training.lr 0.0003 -> 0.003`, ...: each stack value the rehearsal replaces, as set."""
    return [
        f"{key} {stack_flags[flag]:g} -> {LOCAL_OVERRIDES[flag]:g}"
        for flag, key in REPLACED_STACK_KEYS.items()
        if stack_flags.get(flag) != LOCAL_OVERRIDES[flag]
    ]


@dataclass(frozen=True)
class LocalAgent:
    """One torchrun agent of the rehearsal: what one node (one worker pod) runs on the cluster."""

    index: int
    """Which pod it plays: `<job>-worker-<index>`; agent 0 hosts the rendezvous store."""
    nproc: int
    volume_dir: Path
    """The directory that plays where the job keeps the run (FSx, or the bucket): one for all."""
    run_dir: Path
    """The run's checkpoint directory inside `volume_dir`, at the path the job uses."""
    args: list[str]
    """Arguments after `-m trainer`; only the run's paths and the metrics port differ."""
    visible_devices: str | None = None
    """CUDA_VISIBLE_DEVICES: this agent's share of the local GPUs (None on CPU)."""
    metrics_port: int = 0
    """Where its local rank 0 serves the trainer's metrics: each pod's port on the cluster,
    one port per agent here, where every agent shares one address (0: metrics off)."""


@dataclass(frozen=True)
class LocalPlan:
    """The stack's cluster command and the scaled topology this machine runs instead."""

    stack_name: str
    job_name: str
    """The job's name: the metrics' `stack` label, as on the cluster."""
    cluster_command: list[str]
    cluster_nodes: int
    shared_storage: bool
    """Whether the stack mounts FSx (otherwise the run lives in S3)."""
    agents: tuple[LocalAgent, ...]
    rendezvous: dict[str, Any]
    """The job's `elasticPolicy`, rendered for the local number of agents."""
    device: str
    metrics_file: Path
    fail_at_step: int
    max_steps: int
    preset: str
    replaced: tuple[str, ...] = ()
    """The stack's training values replaced for a model this small (`replaced_values`)."""

    @property
    def nproc(self) -> int:
        """Trainer processes on this machine, over all agents."""
        return sum(agent.nproc for agent in self.agents)

    @property
    def local_args(self) -> list[str]:
        """Agent 0's trainer arguments (the others differ only in their paths)."""
        return self.agents[0].args

    @property
    def run_dir(self) -> Path:
        """Agent 0's checkpoint directory (every agent's, when the stack mounts FSx)."""
        return self.agents[0].run_dir


def local_agent_count(nodes: int, processes: int) -> int:
    """Agents for a stack of `nodes` nodes when this machine runs `processes` processes: one
    per node, at most MAX_LOCAL_NODES, and never more than there are processes to give them."""
    return max(1, min(nodes, MAX_LOCAL_NODES, processes))


def volume_dirs(out_dir: Path, *, agents: int) -> list[Path]:
    """The directory each agent sees where the job keeps the run: one for all.

    FSx (or an existing claim) is one file system every pod mounts, and the bucket of a run
    without FSx is one store every pod reaches; a directory here plays either. (A pod-local
    volume would be one directory per node, and a multi-node run on it would die at its first
    save: DCP writes each rank's shards where that rank writes.)
    """
    return [out_dir / "shared"] * agents


def local_run_dir(volume: Path, paths: RunPaths) -> Path:
    """The cluster's run directory (`<mount>/checkpoints/<run id>`, or its S3 URI) inside a
    local directory playing the volume or the bucket."""
    if paths.in_s3:
        inside = PurePosixPath(paths.run_dir.removeprefix("s3://").partition("/")[2])
    else:
        inside = PurePosixPath(paths.run_dir).relative_to(paths.mount_path)
    return volume.joinpath(*inside.parts)


def local_run_root(out_dir: Path, stack_name: str) -> Path:
    """The folder a local run of `stack_name` owns under `--out`."""
    return out_dir / stack_name


def local_metrics_file(out_dir: Path, stack_name: str) -> Path:
    """Where a local run of `stack_name` writes its metrics (and beside it, its loss plot)."""
    return local_run_root(out_dir, stack_name) / "metrics.jsonl"


def plan_local_run(
    run: RunPlan,
    stack_name: str,
    *,
    out_dir: Path,
    assets_dir: Path,
    steps: int,
    context: int,
    batch_size: int,
    device: str,
    nproc: int,
    check_config: bool = True,
) -> LocalPlan:
    """Scale the stack's job to this machine, keeping its topology and what else it sets.

    `nproc` is the number of trainer processes this machine runs, shared by the agents.
    `check_config=False` lets a run plan with problems through, only so that a test can show
    the failure a check exists for (tests/test_local_run.py).
    """
    from trainer.tiny_assets import ensure_tiny_assets

    config = run.config
    if check_config and run.problems:
        raise StackConfigError(list(run.problems), source=f"stack {stack_name!r}")
    assert config.job.name is not None  # parse_stack_config fills it from the stack name
    paths = run_paths(run)
    cluster_command = torchrun_command(run, paths)
    assets = ensure_tiny_assets(assets_dir)
    metrics_file = local_metrics_file(out_dir, stack_name)
    run_root = metrics_file.parent
    agent_count = local_agent_count(config.gpu_nodes.count, nproc)
    per_agent = max(1, nproc // agent_count)
    checkpoint_every = max(1, steps // 5)
    # Interrupt half way between two checkpoints, so the restart visibly replays a few steps.
    fail_at = (steps // 2 // checkpoint_every) * checkpoint_every + max(1, checkpoint_every // 2)
    stack_flags = trainer_flags(run)
    flags = {
        **stack_flags,
        **LOCAL_OVERRIDES,
        # The same kind of model at debug size: mixture-of-experts stacks get the tiny MoE.
        "model": "tiny-moe" if config.model_shape().num_local_experts else "tiny",
        "dataset": str(assets.corpus_dir),
        "tokenizer": str(assets.tokenizer_dir),
        "max_context_width": min(context, config.training.context_width),
        "train_batch_size": batch_size,
        "max_steps": steps,
        "warmup": max(1, steps // 20),
        "checkpoint_freq": checkpoint_every,
        "keep_last_checkpoints": 2,
        "logging_freq": max(1, steps // 30),
        "metrics_file": str(metrics_file),
        "fail_at_step": fail_at,
        "device": device,
        # fp8 needs bf16 and, for its speed, compile (off here): rehearsed with torchao's
        # emulation, the same conversion and numerics at fp32 matmul speed.
        "bf16": (device == "cuda" and config.training.bf16) or config.training.precision == "fp8",
        "fp8_emulate": config.training.precision == "fp8",
        # Hybrid sharding shards within a node (one agent here) and replicates across them.
        "hsdp_shard_size": (per_agent if run.parallelism.sharding_strategy == "hybrid" else None),
    }
    agents = []
    base_port = int(config.training.extra_args.get("metrics_port", DEFAULT_METRICS_PORT))
    for index, volume in enumerate(volume_dirs(run_root, agents=agent_count)):
        run_dir = local_run_dir(volume, paths)
        metrics_port = base_port + index if base_port else 0
        args = format_args(
            {
                **flags,
                "checkpoint_dir": str(run_dir),
                "resume_from_checkpoint": str(run_dir),
                "metrics_port": metrics_port,
            }
        )
        parse_args(args)  # the scaled command must still be one the trainer accepts
        devices = None
        if device == "cuda":
            devices = ",".join(str(index * per_agent + i) for i in range(per_agent))
        agents.append(LocalAgent(index, per_agent, volume, run_dir, args, devices, metrics_port))
    return LocalPlan(
        stack_name=stack_name,
        job_name=config.job.name,
        cluster_command=cluster_command,
        cluster_nodes=config.gpu_nodes.count,
        shared_storage=paths.shared,
        agents=tuple(agents),
        # The job's own rendering, for the local number of nodes: same backend, id and conf.
        rendezvous=elastic_policy(
            workers=agent_count,
            max_restarts=config.job.backoff_limit,
            run_name=config.job.name,
            start_timeout_s=run.timeouts.start_budget_seconds,
        ),
        device=device,
        metrics_file=metrics_file,
        fail_at_step=fail_at,
        max_steps=steps,
        preset=str(flags["model"]),
        replaced=tuple(replaced_values(stack_flags)),
    )


def operator_env(policy: dict[str, Any], *, endpoint: str) -> dict[str, str]:
    """The `PET_*` variables training operator v1.9 gives each worker for `elasticPolicy`.

    As `pkg/controller.v1/pytorch/elastic.go` (`ElasticEnvVarGenerator.Generate`) builds them:
    the endpoint (`<job>-worker-0:<port>` there), the backend, `PET_NNODES=min:max`,
    `PET_MAX_RESTARTS`, `PET_RDZV_ID` and `PET_RDZV_CONF` as `key=value` joined by commas.
    torchrun reads each as the default of its flag (`torch/distributed/argparse_util.env`).
    """
    env = {
        "PET_RDZV_ENDPOINT": endpoint,
        "PET_RDZV_BACKEND": str(policy.get("rdzvBackend", "c10d")),
        "PET_NNODES": f"{policy['minReplicas']}:{policy['maxReplicas']}",
    }
    if "maxRestarts" in policy:
        env["PET_MAX_RESTARTS"] = str(policy["maxRestarts"])
    if "rdzvId" in policy:
        env["PET_RDZV_ID"] = str(policy["rdzvId"])
    if policy.get("rdzvConf"):
        env["PET_RDZV_CONF"] = ",".join(f"{c['key']}={c['value']}" for c in policy["rdzvConf"])
    return env


def agent_env(plan: LocalPlan, agent: LocalAgent, *, endpoint: str) -> dict[str, str]:
    """What one agent's container would hold, with its node's share of this machine.

    On the cluster worker 0 hosts the c10d store because the endpoint names its hostname
    (torch `elastic/rendezvous/c10d_rendezvous_backend.py` `_create_tcp_store`: `is_host` from
    the conf, else `_matches_machine_hostname`). Here every agent's host is 127.0.0.1, so the
    conf says which one hosts, as the hostname does there.
    """
    env = operator_env(plan.rendezvous, endpoint=endpoint)
    is_host = f"is_host={1 if agent.index == 0 else 0}"
    env["PET_RDZV_CONF"] = ",".join(filter(None, [env.get("PET_RDZV_CONF"), is_host]))
    if agent.visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = agent.visible_devices
    # The metrics' labels, as the pod template sets them (infra/job/manifest.py).
    env[STACK_ENV] = plan.job_name
    env[NODE_ENV] = f"local-node-{agent.index}"
    return env


def metrics_line(plan: LocalPlan) -> str:
    """Where the rehearsal serves the trainer's Prometheus metrics, in one line."""
    served = [a for a in plan.agents if a.metrics_port]
    if not served:
        return "Trainer metrics: off (--metrics_port 0)"
    where = ", ".join(f"http://127.0.0.1:{a.metrics_port}/metrics (node {a.index})" for a in served)
    return f"Trainer metrics (Prometheus, every rank of a node on its port): {where}"


def agent_command(plan: LocalPlan, agent: LocalAgent) -> list[str]:
    """torchrun for one agent, through `trainer.launch` as the pod runs it (so the agent exits
    with its workers' code); the rendezvous comes from `agent_env`, as on the cluster.

    `--max-restarts=0` overrides the job's PET_MAX_RESTARTS: this script plays the operator
    restarting the pods (`main` launches again), so a failure ends the launch at once.
    """
    return [
        sys.executable,
        "-m",
        "trainer.launch",
        f"--nnodes={len(plan.agents)}",
        f"--nproc_per_node={agent.nproc}",
        "--max-restarts=0",
        "-m",
        "trainer",
        *agent.args,
    ]


def describe_topology(plan: LocalPlan) -> str:
    """What the rehearsal runs, in the words of the cluster it stands for."""
    agents = len(plan.agents)
    scaled = "" if agents == plan.cluster_nodes else f" (the stack's {plan.cluster_nodes})"
    playing = "FSx" if plan.shared_storage else "the run's prefix in S3"
    storage = f"one shared directory for all, as {playing}: {plan.agents[0].volume_dir}"
    conf = operator_env(plan.rendezvous, endpoint="127.0.0.1:<port>")
    rendezvous = " ".join(f"{k}={v}" for k, v in sorted(conf.items()))
    return (
        f"{agents} node(s){scaled} x {plan.agents[0].nproc} process(es) on {plan.device}, "
        f"{storage}\nRendezvous as the job's elasticPolicy: {rendezvous}"
    )
