"""The stack schema: every section of one stack file, and the rules between sections.

One stack file is one training run, so this model is the single source of truth for every
component: the node group, the storage, the image and the PyTorchJob all read the same parsed
object. It holds what the file says and what follows from it by arithmetic (world size, batch
sizes); what the run will need or cost is estimated above it (`infra.estimates`), so the schema
stands on nothing but the facts tables. No pulumi and no torch here: the local run uses it too.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, SecretStr, field_validator

from infra.config.addons import AddonsConfig
from infra.config.alerts import AlertsConfig
from infra.config.base import ConfigSection
from infra.config.cluster import ClusterConfig, GpuNodesConfig
from infra.config.cost import CostConfig
from infra.config.image import ImageConfig
from infra.config.job import DataConfig, JobConfig, ModelConfig, TrainingConfig
from infra.config.job_api import job_api_problems
from infra.config.observability import ObservabilityConfig, observability_problems
from infra.config.scheduling import SchedulingConfig, scheduling_problems
from infra.config.storage import StorageConfig
from infra.facts.instances import (
    CAPACITY_BLOCK_TYPES,
    GPU_COMPUTE_CAPABILITY,
    HYPERPOD_PREFIX,
    INSTANCE_FACTS,
    InstanceFacts,
    is_hyperpod_type,
)
from trainer.flops import MIN_FP8_CAPABILITY
from trainer.presets import ModelShape, get_preset

PROJECT = "fsdp-eks"
"""The Pulumi project name, and so the namespace of every stack-config key."""

HF_TOKEN_KEY = "hfToken"

# Hub organisations whose models and tokenizers are gated: downloading them needs a token.
GATED_HUB_ORGS = ("meta-llama/", "mistralai/")


class StackConfig(ConfigSection):
    """Every key of one stack file (`fsdp-eks:<key>`), validated together."""

    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig,
        description="The EKS cluster: create one, or use an existing one by name.",
    )
    gpu_nodes: GpuNodesConfig = Field(
        description="The GPU nodes the job runs on (instance type, count, capacity, EFA)."
    )
    storage: StorageConfig = Field(
        default_factory=StorageConfig,
        description="S3 bucket and FSx for Lustre volume for data and checkpoints.",
    )
    addons: AddonsConfig = Field(
        default_factory=AddonsConfig,
        description="Device plugins and the Kubeflow training operator.",
    )
    image: ImageConfig = Field(
        default_factory=ImageConfig,
        description="The trainer image: built by `pulumi up`, or your own `uri`.",
    )
    job: JobConfig = Field(
        default_factory=JobConfig, description="The PyTorchJob: name, lifetime, restarts, env."
    )
    model: ModelConfig = Field(
        default_factory=ModelConfig, description="The model preset, shape overrides, weights."
    )
    data: DataConfig = Field(default_factory=DataConfig, description="Dataset and tokenizer.")
    training: TrainingConfig = Field(
        default_factory=TrainingConfig,
        description="Steps, batch sizes, context, optimizer, sharding, checkpoints.",
    )
    cost: CostConfig = Field(
        default_factory=CostConfig, description="Per-run cost ceiling and pricing inputs."
    )
    alerts: AlertsConfig = Field(
        default_factory=AlertsConfig,
        description="Who hears about the run (SNS e-mail or a topic) and the tunable thresholds.",
    )
    observability: ObservabilityConfig = Field(
        default_factory=ObservabilityConfig,
        description="The run's metrics (trainer, DCGM, EFA) and where they are collected.",
    )
    scheduling: SchedulingConfig = Field(
        default_factory=SchedulingConfig,
        description="Whether the run waits in a Kueue queue: the stack's own, or the cluster's.",
    )
    hf_token: SecretStr | None = Field(
        default=None,
        description=(
            "Hugging Face token for gated models, datasets and tokenizers. Secret only: "
            "`pulumi config set --secret hfToken hf_...`; a plaintext value is rejected."
        ),
    )

    @field_validator("hf_token")
    @classmethod
    def _empty_token_is_none(cls, value: SecretStr | None) -> SecretStr | None:
        # Pulumi.yaml declares hfToken with an empty default so that it stays optional.
        if value is not None and not value.get_secret_value():
            return None
        return value

    # Derived figures: computed once here so that node groups, the job and the plan agree.

    @property
    def instance(self) -> InstanceFacts:
        return self.gpu_nodes.facts

    @property
    def gpus_per_node(self) -> int:
        """Trainer processes per node (PyTorchJob `nprocPerNode`)."""
        return self.job.gpus_per_node or self.instance.gpus

    @property
    def world_size(self) -> int:
        """Trainer processes in the whole job."""
        return self.gpu_nodes.count * self.gpus_per_node

    @property
    def gradient_accumulation_steps(self) -> int:
        """Micro-batches per optimizer step: given, else derived from the global batch size."""
        training = self.training
        if training.gradient_accumulation_steps is not None:
            return training.gradient_accumulation_steps
        if training.global_batch_size is not None:
            return max(1, training.global_batch_size // self._sequences_per_micro_step)
        return 1

    @property
    def global_batch_size(self) -> int:
        """Sequences per optimizer step over all GPUs."""
        return self._sequences_per_micro_step * self.gradient_accumulation_steps

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.training.context_width

    @property
    def _sequences_per_micro_step(self) -> int:
        return self.training.micro_batch_size * self.world_size

    def model_shape(self) -> ModelShape:
        """The preset's published shape with the stack's overrides applied."""
        model = self.model
        return get_preset(model.preset).with_overrides(
            num_layers=model.num_layers,
            hidden_size=model.hidden_size,
            num_heads=model.num_heads,
            num_key_value_heads=model.num_key_value_heads,
            intermediate_size=model.intermediate_size,
            vocab_size=model.vocab_size,
        )


def gated_hub_references(*, init_from: Any, tokenizer: Any, dataset: Any) -> list[str]:
    """`key 'value'` for each Hugging Face Hub reference that needs hfToken to download."""
    return [
        f"{key} {value!r}"
        for key, value in (
            ("model.initFrom", init_from),
            ("data.tokenizer", tokenizer),
            ("data.dataset", dataset),
        )
        if isinstance(value, str) and value.startswith(GATED_HUB_ORGS)
    ]


def gpus_per_node_problem(config: StackConfig) -> str | None:
    """`job.gpusPerNode` beyond the instance's GPUs, the one count no figure survives."""
    gpus, asked = config.instance.gpus, config.job.gpus_per_node
    if asked is None or asked <= gpus:
        return None
    return (
        f"job.gpusPerNode {asked} exceeds the {gpus} GPU(s) of gpuNodes.instanceType "
        f"{config.gpu_nodes.instance_type!r}; allowed: 1 to {gpus}"
    )


def figures_possible(config: StackConfig) -> bool:
    """Whether the run's figures (memory, duration, cost) can be computed at all: a GPU count
    the instance has and a model shape that exists. Every other problem leaves them
    meaningful, so they are listed beside the rest."""
    if gpus_per_node_problem(config) is not None:
        return False
    try:
        config.model_shape()
    except ValueError:
        return False
    return True


def cross_section_problems(config: StackConfig) -> list[str]:
    """Problems that only show when sections are read together, one message each."""
    problems: list[str] = []
    facts = config.instance
    nodes = config.gpu_nodes
    training = config.training

    if (too_many := gpus_per_node_problem(config)) is not None:
        return [too_many]  # every figure below depends on a possible GPU count

    per_micro_step = training.micro_batch_size * config.world_size
    if training.global_batch_size is not None:
        if training.global_batch_size % per_micro_step:
            problems.append(
                f"training.globalBatchSize {training.global_batch_size} is not a multiple of "
                f"microBatchSize {training.micro_batch_size} x {config.world_size} GPUs "
                f"({nodes.count} nodes x {config.gpus_per_node}) = {per_micro_step}; allowed: "
                f"{per_micro_step}, {2 * per_micro_step}, {4 * per_micro_step}, ..."
            )
        elif (
            training.gradient_accumulation_steps is not None
            and training.gradient_accumulation_steps * per_micro_step != training.global_batch_size
        ):
            problems.append(
                f"training.globalBatchSize {training.global_batch_size} disagrees with "
                f"microBatchSize {training.micro_batch_size} x {config.world_size} GPUs x "
                f"gradientAccumulationSteps {training.gradient_accumulation_steps} = "
                f"{training.gradient_accumulation_steps * per_micro_step}; set one of the two"
            )

    if training.sharding_strategy == "hybrid":
        shard = training.hsdp_shard_size or config.gpus_per_node
        if config.world_size % shard:
            problems.append(
                f"training.hsdpShardSize {shard} does not divide the world size "
                f"{config.world_size} ({nodes.count} nodes x {config.gpus_per_node} GPUs)"
            )

    try:
        shape = config.model_shape()
    except ValueError as err:
        problems.append(f"model: the overrides give an impossible shape: {err}")
    else:
        if training.context_width > shape.max_position_embeddings:
            problems.append(
                f"training.contextWidth {training.context_width} is longer than the "
                f"{shape.max_position_embeddings}-token context of model.preset "
                f"{config.model.preset!r}; allowed: up to {shape.max_position_embeddings}"
            )

    capability = GPU_COMPUTE_CAPABILITY.get(facts.gpu_model)
    if training.precision == "fp8" and (capability is None or capability < MIN_FP8_CAPABILITY):
        has = f"compute capability {capability[0]}.{capability[1]}" if capability else "unknown"
        fp8_types = sorted(
            {t.split(".")[0] for t, f in INSTANCE_FACTS.items()
             if GPU_COMPUTE_CAPABILITY.get(f.gpu_model, (0, 0)) >= MIN_FP8_CAPABILITY}
        )  # fmt: skip
        problems.append(
            f"training.precision 'fp8' needs FP8 tensor cores (compute capability >= "
            f"{MIN_FP8_CAPABILITY[0]}.{MIN_FP8_CAPABILITY[1]}), which the {facts.gpu_model} of "
            f"gpuNodes.instanceType {nodes.instance_type!r} lacks ({has}); allowed here: bf16, "
            f"or fp8 on {', '.join(fp8_types)} instances"
        )

    shm = config.job.shm_size_gib
    if shm is not None and shm >= facts.memory_gib // 2:
        problems.append(
            f"job.shmSizeGiB {shm} leaves too little of the {facts.memory_gib} GiB of "
            f"{nodes.instance_type} for the trainer; allowed: below {facts.memory_gib // 2}"
        )

    if config.hf_token is None:
        gated = gated_hub_references(
            init_from=config.model.init_from,
            tokenizer=config.data.tokenizer,
            dataset=config.data.dataset,
        )
        if gated:
            problems.append(
                f"{', '.join(gated)} is gated on the Hugging Face hub and hfToken is not set; "
                "add it with `pulumi config set --secret hfToken hf_...`"
            )

    cluster = config.cluster
    if cluster.mode == "create" and is_hyperpod_type(nodes.instance_type):
        # HyperPod launches its ml.* nodes itself; an EKS node group cannot ask for one.
        problems.append(
            f"gpuNodes.instanceType {nodes.instance_type!r} is a SageMaker HyperPod type, which "
            "only an existing HyperPod EKS cluster has; allowed with cluster.mode create: "
            f"the EC2 type {nodes.instance_type.removeprefix('ml.')!r}, or set cluster.mode: "
            "existing and cluster.name to your HyperPod cluster's EKS cluster"
        )

    if (
        cluster.mode == "create"
        and cluster.network.creates_vpc
        and nodes.capacity.is_reserved
        and nodes.availability_zone is None
    ):
        # A reservation or block exists in one AZ; a new VPC's GPU subnet would otherwise go to
        # the first AZ, and the node group would wait until EKS gives up on it.
        problems.append(
            f"gpuNodes.availabilityZone is required with gpuNodes.capacity.type "
            f"{nodes.capacity.type!r} in a new VPC: the GPU subnet must be in the AZ of "
            f"{nodes.capacity.reservation_id or 'the reservation'}; allowed: that AZ's name, "
            "e.g. us-west-2b"
        )

    block_type = nodes.instance_type.removeprefix(HYPERPOD_PREFIX)
    if nodes.capacity.type == "block" and block_type not in CAPACITY_BLOCK_TYPES:
        problems.append(
            f"gpuNodes.capacity.type 'block' with gpuNodes.instanceType "
            f"{nodes.instance_type!r}: EC2 Capacity Blocks are not sold for that type; allowed: "
            f"{', '.join(sorted(CAPACITY_BLOCK_TYPES))} (or capacity type 'reservation' for an "
            "On-Demand Capacity Reservation)"
        )

    fsx = config.storage.fsx
    if cluster.mode == "create" and fsx.enabled and fsx.existing_claim_name is not None:
        # A cluster the stack creates has no claim but the stack's own: the pods would wait
        # for one until the start budget ran out.
        problems.append(
            f"storage.fsx.existingClaimName {fsx.existing_claim_name!r} names a claim, but "
            "cluster.mode create makes a new cluster, where none exists; allowed: unset it "
            "(the stack creates the file system and its claim), or cluster.mode existing with "
            "the cluster that has the claim"
        )

    if (
        cluster.mode == "existing"
        and fsx.creates_file_system
        and cluster.network.gpu_subnet_id is None
        and cluster.platform_stack is None
    ):
        problems.append(
            "storage.fsx would create a file system on the existing cluster but its subnet is "
            "not known, so it could land in another AZ than the GPU nodes: set "
            "cluster.network.gpuSubnetId (the GPU nodes' subnet) or cluster.platformStack, or "
            "mount an existing claim (storage.fsx.existingClaimName) or none (enabled: false)"
        )

    problems.extend(observability_problems(config.observability, cluster_mode=config.cluster.mode))
    problems.extend(
        scheduling_problems(
            config.scheduling,
            cluster_mode=cluster.mode,
            autoscaler_installed=config.addons.cluster_autoscaler.install,
            creates_namespace=bool(config.job.create_namespace),
        )
    )
    problems.extend(
        job_api_problems(config.job, cluster, config.addons, nodes=config.gpu_nodes.count)
    )
    return problems
