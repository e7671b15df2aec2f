"""The whole stack config: every section, the checks between them, and the ways to load it.

One stack file is one training run, so this model is the single source of truth for every
component: the node group, the storage, the image and the PyTorchJob all read the same parsed
object. Loading fails *before* any resource is registered, with one line per problem that names
the key as written in the stack file (`gpuNodes.instanceType`), the bad value and what is
allowed, because a reviewer or a CI log should say what to change, not where pydantic failed.

Three entry points share one parser (`parse_stack_config`):
* `load_stack_config()` inside the Pulumi program (reads every key the engine passed),
* `read_stack_file()` / `load_stack_file()` for the offline plan, tests and the local run,
  which have a `stacks/Pulumi.<name>.yaml` file but no Pulumi engine.
This module imports neither pulumi nor torch at import time: the local run uses it too.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_core import ErrorDetails

from infra.config.addons import AddonsConfig
from infra.config.base import ConfigSection
from infra.config.cluster import ClusterConfig, GpuNodesConfig
from infra.config.cost import CostConfig
from infra.config.image import ImageConfig
from infra.config.job import DataConfig, JobConfig, ModelConfig, TrainingConfig
from infra.config.storage import StorageConfig
from infra.estimates.duration import UnknownPeakError, estimate_duration, steps_within
from infra.estimates.memory_fit import memory_problems, memory_warnings
from infra.facts.instances import (
    CAPACITY_BLOCK_TYPES,
    HYPERPOD_PREFIX,
    InstanceFacts,
    is_hyperpod_type,
)
from infra.facts.prices import CostEstimate, PriceUnknownError, estimate_cost
from trainer.presets import ModelShape, get_preset

PROJECT = "fsdp-eks"
"""The Pulumi project name, and so the namespace of every stack-config key."""

HF_TOKEN_KEY = "hfToken"

# Hub organisations whose models and tokenizers are gated: downloading them needs a token.
GATED_HUB_ORGS = ("meta-llama/", "mistralai/")


class StackConfigError(ValueError):
    """A stack config that cannot run; `problems` holds one message per problem."""

    def __init__(self, problems: list[str], *, source: str = "stack config") -> None:
        self.problems = problems
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{source} is invalid ({len(problems)} problem(s)):\n{lines}")


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


def cross_section_problems(config: StackConfig) -> list[str]:
    """Problems that only show when sections are read together, one message each."""
    problems: list[str] = []
    facts = config.instance
    nodes = config.gpu_nodes
    training = config.training

    if config.job.gpus_per_node is not None and config.job.gpus_per_node > facts.gpus:
        problems.append(
            f"job.gpusPerNode {config.job.gpus_per_node} exceeds the {facts.gpus} GPU(s) of "
            f"gpuNodes.instanceType {nodes.instance_type!r}; allowed: 1 to {facts.gpus}"
        )
        return problems  # every figure below depends on a possible GPU count

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

    if not problems:
        # Only a run whose shape and GPU count are possible has a memory figure worth showing.
        memory = memory_problems(config)
        problems.extend(memory)
        if not memory:  # a run that cannot start has no duration worth showing
            problems.extend(_duration_problems(config))
    problems.extend(_cost_problems(config))
    return problems


def config_warnings(config: StackConfig) -> list[str]:
    """What a valid stack should still hear before it costs anything (the plan prints them)."""
    return [*memory_warnings(config), *_duration_warnings(config)]


def _duration_problems(config: StackConfig) -> list[str]:
    """A run expected to outlast its own deadline is killed half way, after it was paid for."""
    deadline = config.job.max_run_hours
    try:
        estimate = estimate_duration(config)
    except UnknownPeakError as err:
        return [f"gpuNodes.instanceType {config.gpu_nodes.instance_type!r}: {err}"]
    if deadline is None or estimate.hours <= deadline:
        return []
    steps = steps_within(config, deadline)
    fewer = f"lower training.maxSteps to at most {steps}, " if steps else ""
    return [
        f"job.maxRunHours {deadline:g} is shorter than the run: training.maxSteps "
        f"{config.training.max_steps} takes {estimate.summary()}; raise job.maxRunHours to at "
        f"least {math.ceil(estimate.hours)} (and cost.maxUsdPerRun with it), {fewer}or add "
        "GPU nodes (gpuNodes.count)"
    ]


def _duration_warnings(config: StackConfig) -> list[str]:
    deadline = config.job.max_run_hours
    try:
        estimate = estimate_duration(config)
    except UnknownPeakError:
        return []
    if deadline is None or estimate.high_hours <= deadline:
        return []
    return [
        f"duration: at the low end of the assumed MFU the run takes ~{estimate.high_hours:.1f} h, "
        f"beyond job.maxRunHours {deadline:g}: it may stop before training.maxSteps "
        f"{config.training.max_steps} (its last checkpoint is kept; resume from it)"
    ]


def _expected_hours(config: StackConfig) -> float | None:
    """The run's expected hours; None when it cannot be estimated (a GPU without figures, or
    a shape or batch another problem of the same stack already reports)."""
    try:
        return estimate_duration(config).hours
    except (UnknownPeakError, ValueError):
        return None


def lease_tail_hours(config: StackConfig) -> float | None:
    """How long leased GPU nodes outlive the job (infra.platform.autoscaler); None when not leased:
    kept warm, or on an existing cluster whose autoscaling the stack does not own."""
    autoscaler = config.addons.cluster_autoscaler
    if config.cluster.mode != "create" or not autoscaler.install or config.gpu_nodes.keep_warm:
        return None
    return autoscaler.scale_down_unneeded_minutes / 60


def cost_estimate(config: StackConfig) -> CostEstimate:
    """The GPU nodes' estimated cost (infra.facts.prices), as plans and stack outputs show it."""
    nodes, cost = config.gpu_nodes, config.cost
    return estimate_cost(
        nodes.instance_type,
        nodes.count,
        nodes.capacity.type,
        run_hours=cost.run_hours(config.job.max_run_hours),
        expected_hours=_expected_hours(config),
        lease_tail_hours=lease_tail_hours(config),
        nodes_owned=config.cluster.mode == "create",
        max_usd_per_run=cost.max_usd_per_run,
        usd_per_instance_hour=cost.usd_per_instance_hour,
    )


def _cost_problems(config: StackConfig) -> list[str]:
    """A run must be priced, and priced under its ceiling, before anything is created."""
    cost = config.cost
    try:
        estimate = cost_estimate(config)
    except PriceUnknownError as err:
        return [f"gpuNodes.instanceType: {err}"]
    if not estimate.exceeds_ceiling:
        return []
    if estimate.usd_per_run is None:
        return [
            f"cost.maxUsdPerRun {cost.max_usd_per_run:g} needs a run length to check against: "
            "set job.maxRunHours (a deadline, recommended) or cost.maxRunHours, or "
            "cost.maxUsdPerRun: null to switch the ceiling off"
        ]
    return [
        f"cost.maxUsdPerRun {cost.max_usd_per_run:g} is below the estimate "
        f"${estimate.usd_per_run:,.2f} ({estimate.summary()}); raise the ceiling, shorten "
        "job.maxRunHours or use fewer/cheaper gpuNodes"
    ]


# --- turning pydantic's errors into messages that name stack-file keys -------------------------


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted(field.alias or name for name, field in model.model_fields.items())


def _model_at(path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model found at `path` (aliases) under StackConfig, if the path leads to one."""
    model: type[BaseModel] = StackConfig
    for part in path:
        if isinstance(part, int):
            continue
        by_alias = {field.alias or name: field for name, field in model.model_fields.items()}
        field = by_alias.get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _describe_error(error: ErrorDetails) -> str:
    path = tuple(error["loc"])
    key = ".".join(str(part) for part in path) or "stack config"
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(path[:-1])
        allowed = _allowed_keys(parent) if parent else []
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"{key}: unknown key{suggestion}; allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{key} is required and missing"
    if kind == "value_error":
        message = str(error["msg"]).removeprefix("Value error, ")
        # Section validators already name their keys; add the path only when they did not.
        return message if path and str(path[0]) in message else f"{key}: {message}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key} must be a mapping of keys, got {value!r}"
    message = str(error["msg"])
    return f"{key} = {value!r}: {message[0].lower()}{message[1:]}"


def format_validation_error(err: ValidationError) -> list[str]:
    """One message per pydantic error, naming the camelCase key path.

    A misspelt required key is one problem, not two: its "missing" error is dropped when an
    unknown key next to it is the misspelling (the unknown-key message suggests the name).
    """
    errors = err.errors()
    suggested: set[tuple[int | str, ...]] = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            path = tuple(error["loc"])
            parent = _model_at(path[:-1])
            allowed = _allowed_keys(parent) if parent else []
            for hint in difflib.get_close_matches(str(path[-1]), allowed, n=1):
                suggested.add((*path[:-1], hint))
    return [
        _describe_error(error)
        for error in errors
        if not (error["type"] == "missing" and tuple(error["loc"]) in suggested)
    ]


# --- parsing --------------------------------------------------------------------------------


def config_keys() -> list[str]:
    """The keys a stack may set in the `fsdp-eks:` namespace."""
    return _allowed_keys(StackConfig)


def _unqualified(key: str) -> str | None:
    """`fsdp-eks:gpuNodes` or `gpuNodes` → `gpuNodes`; another namespace → None."""
    namespace, sep, name = key.rpartition(":")
    if not sep:
        return key
    return name if namespace == PROJECT else None


def _looks_like_project(namespace: str) -> bool:
    """`fsdp_eks`, `fsdp-EKS`, `fsdpeks`: a misspelt project namespace, not a provider's."""
    folded = re.sub(r"[^a-z0-9]", "", namespace.lower())
    return folded == re.sub(r"[^a-z0-9]", "", PROJECT) or bool(
        difflib.get_close_matches(namespace, [PROJECT], n=1, cutoff=0.75)
    )


def dns_name(stack_name: str) -> str:
    """A stack name as a DNS-1035 label (what the training operator accepts as a job name),
    for the default job name: a name that starts with a digit gets a `job-` prefix."""
    name = re.sub(r"[^a-z0-9-]+", "-", stack_name.lower()).strip("-")
    if name[:1].isdigit():
        name = f"job-{name}"
    return name[:48].rstrip("-") or "training"


def parse_stack_config(
    values: Mapping[str, Any],
    *,
    stack_name: str,
    secret_keys: Collection[str] = (),
    source: str | None = None,
) -> StackConfig:
    """Validate raw stack-config values (`[fsdp-eks:]key` → value) into a StackConfig.

    Values may be Python objects or JSON text (as the engine passes them). `secret_keys` are
    the keys that were Pulumi secrets. Raises StackConfigError listing every problem.
    """
    where = source or f"stack {stack_name!r}"
    problems: list[str] = []
    sections: dict[str, Any] = {}
    allowed = config_keys()
    secret_names = {_unqualified(key) for key in secret_keys}
    for key, raw in values.items():
        name = _unqualified(key)
        if name is None:
            namespace = key.rpartition(":")[0]
            if _looks_like_project(namespace):
                problems.append(
                    f"{key} is in namespace {namespace!r}, which the program does not read (it "
                    f"reads {PROJECT}:<key> only): the setting would be silently ignored; "
                    f"allowed: {PROJECT}:{key.rpartition(':')[2]}"
                )
            continue  # provider config such as aws:region belongs to its provider
        if name not in allowed:
            hint = difflib.get_close_matches(name, allowed, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
            problems.append(
                f"{PROJECT}:{name} is not a stack config key{suggestion}; "
                f"allowed: {', '.join(allowed)}"
            )
            continue
        if name == HF_TOKEN_KEY:
            if raw not in (None, "") and name not in secret_names:
                problems.append(
                    f"{PROJECT}:{HF_TOKEN_KEY} is stored in plaintext; a token must be a "
                    f"Pulumi secret: `pulumi config set --secret {HF_TOKEN_KEY} hf_...` "
                    "(and rotate the exposed token)"
                )
                continue
            sections[name] = raw
            continue
        value = raw
        if isinstance(raw, str):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        if value is None:
            continue
        if not isinstance(value, dict):
            problems.append(
                f"{PROJECT}:{name} must be a mapping of keys (e.g. {name}: {{...}}), got {value!r}"
            )
            continue
        sections[name] = value
    if problems:
        raise StackConfigError(problems, source=where)
    try:
        config = StackConfig.model_validate(sections)
    except ValidationError as err:
        raise StackConfigError(format_validation_error(err), source=where) from None
    filled: dict[str, Any] = {}
    if config.job.name is None:
        filled["name"] = dns_name(stack_name)
    if config.job.create_namespace is None:
        filled["create_namespace"] = config.cluster.mode == "create"
    if filled:
        config = config.model_copy(update={"job": config.job.model_copy(update=filled)})
    problems = cross_section_problems(config)
    problems.extend(region_problems(config, values.get("aws:region")))
    if problems:
        raise StackConfigError(problems, source=where)
    return config


def region_problems(config: StackConfig, region: Any) -> list[str]:
    """Every AZ the stack names must be in the provider's region (`aws:region`).

    Caught here, an AZ of another region is one line in the same list as every other
    mistake; left to the program, it surfaces from the first EC2 call of `pulumi up` as a
    provider error on a half-created stack.
    """
    if not isinstance(region, str) or not region:
        return []  # the AWS provider's own default (AWS_REGION, the profile) applies
    named = [
        ("gpuNodes.availabilityZone", config.gpu_nodes.availability_zone),
        *(
            (f"cluster.network.availabilityZones[{index}]", zone)
            for index, zone in enumerate(config.cluster.network.availability_zones or [])
        ),
    ]
    return [
        f"{key} {zone!r} is not in aws:region {region!r}; allowed: an AZ of {region} "
        f"({region}a, {region}b, ...), or set aws:region to the zone's region"
        for key, zone in named
        if zone is not None and not _in_region(zone, region)
    ]


def _in_region(zone: str, region: str) -> bool:
    """`us-west-2b` is in `us-west-2` (the config model accepts only region + letter names)."""
    return zone[:-1] == region


# --- sources: the Pulumi engine, or a stack file ----------------------------------------------


def load_stack_config() -> StackConfig:
    """The stack config of the running Pulumi program, from every key the engine passed.

    Reads the whole config map, not single keys, so that a misspelt key is an error instead of
    a silently ignored setting (the Pulumi CLI accepts undeclared keys).
    """
    import pulumi
    from pulumi.runtime import config as runtime_config

    values: dict[str, Any] = {**runtime_config.get_config_env(), **runtime_config.CONFIG.get()}
    secret_keys = {k for k in values if pulumi.runtime.is_config_secret(k)}
    secret_keys |= set(runtime_config.get_config_secret_keys_env())
    return parse_stack_config(values, stack_name=pulumi.get_stack(), secret_keys=secret_keys)


SECRET_PLACEHOLDER = "offline-placeholder-secret"
"""Stands in for an encrypted value when a stack file is read without its secrets provider."""


@dataclass(frozen=True)
class StackFile:
    """A `Pulumi.<stack>.yaml` as the engine would pass it: values plus which are secret."""

    stack_name: str
    path: Path
    config: dict[str, Any]
    secret_keys: list[str]
    warnings: list[str] = dataclass_field(default_factory=list)
    """What `pulumi up` needs that the file lacks: a secret the run needs and only the
    deployer sets (`hfToken` for a gated model), read here as a placeholder so that the
    offline plan shows the run as it will be; the program itself refuses without it."""


STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def stack_names(stacks_dir: Path | None = None) -> list[str]:
    """The stacks that have a file under `stacks/`, by name."""
    directory = stacks_dir or STACKS_DIR
    names = (p.name.removeprefix("Pulumi.") for p in directory.glob("Pulumi.*.yaml"))
    return sorted(name.removesuffix(".yaml") for name in names)


def stack_file_path(stack: str | Path, stacks_dir: Path | None = None) -> Path:
    """`dev`, `Pulumi.dev.yaml` or a path → the stack file's path."""
    candidate = Path(stack)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    path = (stacks_dir or STACKS_DIR) / f"Pulumi.{stack}.yaml"
    if not path.exists():
        names = ", ".join(stack_names(stacks_dir))
        raise FileNotFoundError(f"no stack file {path}; stacks: {names}")
    return path


def read_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> StackFile:
    """Read a stack file; `secure:` values become a placeholder and are listed as secret."""
    path = stack_file_path(stack, stacks_dir)
    name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    document = yaml.safe_load(path.read_text()) or {}
    raw = document.get("config") or {}
    if not isinstance(raw, dict):
        raise StackConfigError([f"{path.name}: 'config' must be a mapping"], source=str(path))
    config: dict[str, Any] = {}
    secret_keys: list[str] = []
    for key, value in raw.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            config[key] = SECRET_PLACEHOLDER
            secret_keys.append(key)
        else:
            config[key] = value
    warnings = []
    token_needed_by = _gated_in_raw(config)
    if token_needed_by and not any(_unqualified(key) == HF_TOKEN_KEY for key in config):
        # A shipped stack cannot carry a token (only the deployer's secrets provider can
        # decrypt one), so the file has none until `pulumi config set --secret` writes it.
        key = f"{PROJECT}:{HF_TOKEN_KEY}"
        config[key] = SECRET_PLACEHOLDER
        secret_keys.append(key)
        warnings.append(
            f"{HF_TOKEN_KEY} is not set and {', '.join(token_needed_by)} is gated on the "
            f"Hugging Face hub: `pulumi up` refuses this stack until you run `pulumi config "
            f"set --secret {HF_TOKEN_KEY} hf_... -s {name}` (planned here as if it were set)"
        )
    return StackFile(
        stack_name=name, path=path, config=config, secret_keys=secret_keys, warnings=warnings
    )


def _gated_in_raw(values: Mapping[str, Any]) -> list[str]:
    """gated_hub_references over a stack file's raw sections (before validation)."""
    sections = {_unqualified(key): value for key, value in values.items()}
    model = sections.get("model")
    data = sections.get("data")
    model = model if isinstance(model, Mapping) else {}
    data = data if isinstance(data, Mapping) else {}
    return gated_hub_references(
        init_from=model.get("initFrom"),
        tokenizer=data.get("tokenizer"),
        dataset=data.get("dataset"),
    )


def load_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> StackConfig:
    """Read and validate a stack file without the Pulumi engine (plan, tests, local run)."""
    stack_file = read_stack_file(stack, stacks_dir)
    return parse_stack_config(
        stack_file.config,
        stack_name=stack_file.stack_name,
        secret_keys=stack_file.secret_keys,
        source=str(stack_file.path.name),
    )
