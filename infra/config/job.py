"""The experiment itself: `job`, `model`, `data` and `training` sections of a stack file.

These four sections are what a reviewer reads to know *what will be trained*; the other
sections say *where*. Every training field maps onto one flag of the trainer's own parser
(`trainer.config`), so a stack file uses names people know from that sample's flags while the
program stays the only place that turns them into a command line. Checks that need only one
section live here; checks that relate sections (world size, context vs. preset, GPUs per
node) live in `infra.config.stack`, and what the run will need or cost in `infra.estimates`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from infra.config.trainer_keys import TrainerKeyedSection, extra_arg_problem
from trainer.presets import PRESETS

# Kubernetes names pods `<job>-worker-<i>` and services after them; a DNS-1123 label is at
# most 63 characters, so the job name leaves room for the suffix.
JOB_NAME_MAX_LENGTH = 48
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# The training operator's webhook and Kubernetes Services (one per worker, named after the job)
# require a DNS-1035 label: a leading digit is refused at `pulumi up`, not before.
_DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# Variables that silently slow down or break NCCL over EFA (design brief); `extraEnv` may not
# set them. Values matter for two of them, so the rule is a predicate per name.
FORBIDDEN_ENV: dict[str, str] = {
    "NCCL_SOCKET_IFNAME": "P4d/P5 do not use eth0 for EFA; NCCL finds the interfaces itself",
    "NCCL_PROTO": "overrides the aws-ofi-nccl tuner's protocol choice",
    "NCCL_ALGO": "overrides the aws-ofi-nccl tuner's algorithm choice",
    "NCCL_P2P_DISABLE": "disables NVLink between GPUs of a node (10-100x slower)",
    "CUDA_LAUNCH_BLOCKING": "makes every CUDA call synchronous (debugging only)",
    "FI_EFA_USE_DEVICE_RDMA": "auto-enabled by libfabric >= 1.18; setting it can conflict",
    "FI_EFA_FORK_SAFE": "managed by aws-ofi-nccl >= 1.13",
}


DEFAULT_START_TIMEOUT_MINUTES = 60
"""How long one worker may take from the job's creation to a running trainer: GPU nodes scaling
up from zero (instance launch, EFA, device plugins: minutes) and a ~20 GB image pull (minutes
more). An hour leaves room for a slow AZ without letting a half-started job hold GPUs long."""


def _check_dns_label(value: str, what: str) -> str:
    if len(value) > JOB_NAME_MAX_LENGTH or not _DNS_LABEL.match(value):
        raise ValueError(
            f"{what} {value!r} must be a DNS-1123 label of at most {JOB_NAME_MAX_LENGTH} "
            "characters: lowercase letters, digits and '-', starting and ending alphanumeric"
        )
    return value


JOB_APIS = ("pytorchjob", "trainjob")
"""The job APIs a run can be submitted as (`infra.job.job_api`)."""


class JobConfig(TrainerKeyedSection, stack_section="job"):
    """`fsdp-eks:job`: the PyTorchJob around the trainer: name, lifetime, restarts."""

    api: Literal["pytorchjob", "trainjob"] = Field(
        default="pytorchjob",
        description=(
            "The job API the run is submitted as. pytorchjob: Kubeflow training operator v1's "
            "PyTorchJob. trainjob: Kubeflow Trainer v2's TrainJob (trainer.kubeflow.org/"
            "v1alpha1, alpha) on JobSet, with a TrainingRuntime rendered for this trainer; a "
            "created cluster gets Trainer v2 (Helm chart 2.3.0, with JobSet) instead of the "
            "training operator, an existing one must declare it (cluster.trainerV2)."
        ),
    )

    name: str | None = Field(
        default=None,
        description=(
            "PyTorchJob name (pods are <name>-worker-<i>). Default: the stack name, made "
            "DNS-safe. Changing it launches a new job next to nothing: the old one is deleted."
        ),
    )
    namespace: str = Field(
        default="training",
        description="Kubernetes namespace of the job, its HF-token Secret and the FSx claim.",
    )
    create_namespace: bool | None = Field(
        default=None,
        description=(
            "Create job.namespace with the stack (false: it exists already, e.g. a team "
            "namespace on a shared cluster; the stack then never deletes it). Default: true "
            "when the stack creates its cluster, false on an existing one, where a namespace "
            "shared by several experiments must not belong to (and be deleted with) one stack."
        ),
    )
    run_id: str | None = Field(
        default=None,
        description=(
            "Name of the run's directory under the shared checkpoint root. Default: the job "
            "name plus a hash of the trainer arguments, so a restarted pod resumes the same "
            "run while a changed experiment starts a fresh one. Set it to continue a run "
            "across config changes (e.g. a longer training.maxSteps)."
        ),
    )
    gpus_per_node: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Trainer processes (GPUs) per node (nprocPerNode). Default: every GPU of "
            "gpuNodes.instanceType."
        ),
    )
    max_run_hours: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Deadline: the operator stops the job after this many hours "
            "(runPolicy.activeDeadlineSeconds). null: no deadline."
        ),
    )
    ttl_hours_after_finished: float | None = Field(
        default=24.0,
        ge=0,
        description=(
            "Hours a finished job (and its pods' logs) is kept before the operator deletes it "
            "(runPolicy.ttlSecondsAfterFinished). null: keep until `pulumi destroy`."
        ),
    )
    start_timeout_minutes: int = Field(
        default=DEFAULT_START_TIMEOUT_MINUTES,
        ge=10,
        le=240,
        description=(
            "All or nothing: minutes every worker may take to be placed and running (GPU nodes "
            "scaled up, image pulled). Past it `pulumi up` fails with the reason and suspends "
            "the job so the nodes it got scale back to zero, and in the cluster the started "
            "workers' rendezvous times out. Also the top of the plan's duration range."
        ),
    )
    backoff_limit: int = Field(
        default=3,
        ge=0,
        description="Pod restarts before the job is marked failed (runPolicy.backoffLimit).",
    )
    restart_policy: Literal["OnFailure", "ExitCode", "Never"] = Field(
        default="OnFailure",
        description=(
            "Worker restart policy. OnFailure: a crashed worker restarts and resumes from the "
            "latest checkpoint; ExitCode: restart only on retryable exit codes; Never."
        ),
    )
    clean_pod_policy: Literal["Running", "All", "None"] = Field(
        default="Running",
        description=(
            "Pods deleted when the job finishes (runPolicy.cleanPodPolicy): Running frees GPUs "
            "of stragglers and keeps finished pods' logs; All; None (the operator's default, "
            "which leaves running pods holding GPUs)."
        ),
    )
    preflight: Literal["enforce", "warn", "off"] = Field(
        default="enforce",
        description=(
            "Before step 1 each pod checks its GPUs (count, model, memory, a matmul), its EFA "
            "devices and that NCCL is held to the EFA plugin, then all ranks measure an "
            "all-reduce against a floor for the instance type. enforce: a failure exits "
            "(code 140) with one line naming the node and the check; warn: it is logged."
        ),
    )
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] = Field(
        default="WARN",
        description="NCCL_DEBUG level; INFO shows whether NCCL picked EFA (look for 'NET/OFI').",
    )
    shm_size_gib: int | None = Field(
        default=None,
        ge=1,
        alias="shmSizeGiB",
        description=(
            "Size of the memory-backed /dev/shm. Default: a quarter of the node's memory, "
            "at most 256 GiB, or more where an asynchronous save stages more (each node's "
            "shards of the model and optimizer state, in fp32, with 10% to spare)."
        ),
    )
    extra_env: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "More environment variables for the trainer container. Variables that break "
            "NCCL/EFA (NCCL_SOCKET_IFNAME, NCCL_PROTO, NCCL_ALGO, NCCL_P2P_DISABLE, "
            "CUDA_LAUNCH_BLOCKING, ...) are rejected."
        ),
    )

    @field_validator("name")
    @classmethod
    def _name_is_dns_label(cls, value: str | None) -> str | None:
        if value is not None and (
            len(value) > JOB_NAME_MAX_LENGTH or not _DNS_1035_LABEL.match(value)
        ):
            raise ValueError(
                f"job.name {value!r} must be a DNS-1035 label of at most "
                f"{JOB_NAME_MAX_LENGTH} characters: lowercase letters, digits and '-', "
                "starting with a letter and ending alphanumeric"
            )
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace_is_dns_label(cls, value: str) -> str:
        return _check_dns_label(value, "job.namespace")

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_directory_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", value):
            raise ValueError(
                f"job.runId {value!r} must be one directory name: letters, digits, '.', '_', '-'"
            )
        return value

    @field_validator("extra_env")
    @classmethod
    def _no_forbidden_env(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if name in FORBIDDEN_ENV:
                raise ValueError(
                    f"job.extraEnv.{name} must not be set: {FORBIDDEN_ENV[name]}; remove it"
                )
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(
                    f"job.extraEnv key {name!r} is not a valid environment variable name"
                )
        return value

    @property
    def start_timeout_seconds(self) -> int:
        """The all-or-nothing start budget: the rendezvous timeouts (`infra.job.manifest`),
        `pulumi up`'s wait for the job (`infra.launch.start_watch`) and the duration range's top
        derive from it."""
        return self.start_timeout_minutes * 60


class ModelConfig(TrainerKeyedSection, stack_section="model"):
    """`fsdp-eks:model`: which architecture to train, and from which weights."""

    preset: str = Field(
        default="llama3.1-8b",
        description="Model preset with the published shape: " + ", ".join(PRESETS) + ".",
    )
    num_layers: int | None = Field(default=None, ge=1, description="Override: decoder layers.")
    hidden_size: int | None = Field(default=None, ge=1, description="Override: hidden width.")
    num_heads: int | None = Field(default=None, ge=1, description="Override: attention heads.")
    num_key_value_heads: int | None = Field(
        default=None, ge=1, description="Override: key/value heads (grouped-query attention)."
    )
    intermediate_size: int | None = Field(
        default=None, ge=1, description="Override: MLP inner width."
    )
    vocab_size: int | None = Field(default=None, ge=1, description="Override: vocabulary size.")
    init_from: str | None = Field(
        default=None,
        description=(
            "Hugging Face hub id or path (e.g. under /fsx) of pretrained weights to start from. "
            "Default: random initialisation (pretraining). Gated models need hfToken."
        ),
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        default="sdpa", description="Attention kernel."
    )

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str) -> str:
        if value not in PRESETS:
            raise ValueError(
                f"model.preset {value!r} is not a preset the trainer knows; allowed: "
                f"{', '.join(sorted(PRESETS))}"
            )
        return value


class DataConfig(TrainerKeyedSection, stack_section="data"):
    """`fsdp-eks:data`: where the tokens come from."""

    dataset: str = Field(
        default="allenai/c4",
        description=(
            "Hugging Face hub dataset id (streamed) or a path the pods can read (e.g. under "
            "/fsx): a save_to_disk directory or a folder of json/jsonl/parquet/txt files."
        ),
    )
    dataset_config_name: str | None = Field(
        default="en", description="Dataset configuration (subset) name; null for none."
    )
    tokenizer: str = Field(
        default="hf-internal-testing/llama-tokenizer",
        description="Tokenizer: hub id or path. Its vocabulary must fit the model's.",
    )
    text_column: str = Field(default="text", description="Dataset column with the raw text.")
    num_workers: int = Field(default=2, ge=0, description="DataLoader workers per GPU process.")


class TrainingConfig(TrainerKeyedSection, stack_section="training"):
    """`fsdp-eks:training`: the optimisation and its memory/speed trade-offs."""

    max_steps: int = Field(default=5000, ge=1, description="Optimizer steps; training stops here.")
    micro_batch_size: int = Field(
        default=2, ge=1, description="Sequences per GPU per forward/backward (train_batch_size)."
    )
    gradient_accumulation_steps: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Micro-batches per optimizer step. Default: derived from globalBatchSize, else 1."
        ),
    )
    global_batch_size: int | None = Field(
        default=None,
        ge=1,
        description=(
            "Sequences per optimizer step over all GPUs; must equal microBatchSize x GPUs x "
            "gradientAccumulationSteps. Default: whatever those give."
        ),
    )
    context_width: int = Field(
        default=2048,
        ge=16,
        description="Tokens per sequence (max_context_width); at most the preset's context.",
    )
    lr: float = Field(default=1e-4, gt=0, description="Peak learning rate.")
    min_lr: float = Field(default=1e-5, ge=0, description="Learning rate at the end of decay.")
    warmup: float = Field(
        default=0.0032,
        ge=0,
        description="Warmup: a fraction of maxSteps when below 1, else a number of steps.",
    )
    lr_decay_style: Literal["cosine", "linear", "constant"] = Field(
        default="cosine", description="Decay after warmup, down to minLr."
    )
    weight_decay: float = Field(default=0.2, ge=0, description="AdamW weight decay.")
    beta1: float = Field(default=0.9, ge=0, lt=1, description="AdamW beta1.")
    beta2: float = Field(default=0.95, ge=0, lt=1, description="AdamW beta2.")
    grad_clip: float = Field(
        default=1.0, ge=0, description="Clip the global gradient norm (0: off)."
    )
    seed: int = Field(default=12345, description="Seed for init, data order and dropout.")
    sharding_strategy: Literal["auto", "full", "hybrid", "shard_grad_op", "no_shard"] = Field(
        default="auto",
        description=(
            "full (ZeRO-3), hybrid (shard within a node, replicate across nodes), "
            "shard_grad_op (ZeRO-2), no_shard (DDP-like). auto: hybrid across nodes when one "
            "node's GPUs hold the sharded state with room to spare (gradients cross EFA once "
            "per step instead of every micro-batch's all-gathers and reduce-scatters), else "
            "full; the plan says which and why."
        ),
    )
    hsdp_shard_size: int | None = Field(
        default=None,
        ge=1,
        description="GPUs per shard group with hybrid sharding. Default: the GPUs of one node.",
    )
    bf16: bool = Field(default=True, description="bf16 mixed precision (fp32 master weights).")
    precision: Literal["bf16", "fp8"] = Field(
        default="bf16",
        description=(
            "Matmul precision of the decoder's linear layers. fp8: torchao's float8 training "
            "(the LM head and layers too small to gain stay bf16). Weights, optimizer state "
            "and checkpoints are those of bf16, so a run switched either way resumes (with "
            "job.runId pinned: another precision is another run id). Needs GPUs with FP8 "
            "tensor cores (L40S, H100, H200, B200), training.bf16 and compile; the plan "
            "assumes +10% (rowwise) or +25% (tensorwise) tokens/s on Hopper until measured."
        ),
    )
    fp8_recipe: Literal["rowwise", "tensorwise"] | None = Field(
        default=None,
        description=(
            "With precision fp8, torchao's scaling: rowwise (per-row scales, the more accurate) "
            "or tensorwise (one scale per tensor, faster; weights all-gathered in float8 across "
            "a shard group, except under cpuOffload). Default: rowwise."
        ),
    )
    activation_checkpointing: Literal["auto", "full", "op", "off"] = Field(
        default="auto",
        description=(
            "Recompute activations in backward to save memory. full: every decoder layer's "
            "forward again (8N instead of 6N FLOPs per token); op: keep attention and every "
            "second matmul's output, recompute the rest (torchtitan's op-level selective "
            "checkpointing); off. auto: op when the run fits with it, else full. true/false "
            "mean full/off."
        ),
    )
    cpu_offload: bool = Field(default=False, description="Keep sharded state in CPU memory.")
    compile: bool | None = Field(
        default=None,
        description="torch.compile each decoder layer. Default: on (the GPU nodes run CUDA).",
    )
    checkpoint_every: int = Field(
        default=500, ge=0, description="Save a checkpoint every N steps (0: only at the end)."
    )
    keep_last_checkpoints: int = Field(
        default=3, ge=1, description="Checkpoints kept in the run directory; older are deleted."
    )
    export_model: bool = Field(
        default=False,
        description="At the end, write a Hugging Face model to <run directory>/export.",
    )
    logging_every: int = Field(
        default=10,
        ge=1,
        description=(
            "Log loss/throughput every N steps. Each log is a host-device sync (the loss "
            "averaged over ranks); the steps between run without one."
        ),
    )
    validation_every: int = Field(default=0, ge=0, description="Validate every N steps (0: never).")
    validation_batches: int = Field(default=10, ge=1, description="Batches per validation.")
    extra_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict,
        description=(
            "More trainer flags, {flag: value} without dashes (`fsdp-eks trainer-flags` lists "
            "them). Flags this program renders from other keys are rejected here."
        ),
    )

    @field_validator("extra_args")
    @classmethod
    def _extra_args_are_other_trainer_flags(
        cls, value: dict[str, str | int | float | bool]
    ) -> dict[str, str | int | float | bool]:
        for flag, setting in value.items():
            problem = extra_arg_problem(flag, setting)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("activation_checkpointing", mode="before")
    @classmethod
    def _switch_means_full_or_off(cls, value: object) -> object:
        if isinstance(value, bool):
            return "full" if value else "off"
        return value
