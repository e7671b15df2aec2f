"""Peak GPU memory per GPU of a stack's run, in closed form, before anything is paid for.

A run that does not fit fails at its first step, after the GPU nodes started. This estimates
the peak from the stack config alone (torch-free) by following what the trainer does: fp32
parameters and AdamW moments sharded over the shard group, bf16 gathered FSDP2 units,
activations per checkpointing mode, the chunked or Hugging Face loss's logits; fp8 changes no
term. Coefficients checked against torch's `FSDPMemTracker`: `tests/trainer/test_memory_tracer.py`.
Term by term, with sources: docs/design/estimates.md#memory_fit
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from infra.facts.instances import INSTANCE_FACTS
from trainer.config import TrainConfig
from trainer.presets import ModelShape

if TYPE_CHECKING:
    from infra.config import StackConfig

GIB = 2**30

TRAINER_DEFAULTS: dict[str, Any] = {
    name: value for section in TrainConfig().to_dict().values() for name, value in section.items()
}
"""Every trainer flag's default, by flag name (names are unique across the sections)."""

CUDA_CONTEXT_BYTES = int(1.5 * GIB)
"""Memory the allocator never sees: the CUDA context and loaded kernels (0.5 to 1 GiB with
PyTorch's kernels on Hopper), cuBLAS workspaces and NCCL's communication buffers."""

FRAGMENTATION = 0.10
"""Share of the tensor peak the caching allocator holds beyond live tensors (freed blocks of
the wrong size between the per-layer all-gathers); PyTorch's CUDA-semantics notes describe the
caching and `expandable_segments`, which narrows but does not remove it."""

HOST_SHARE = 0.75
"""Share of a node's memory CPU offload may fill: the rest is the data loaders, the page cache
of checkpoint writes and `/dev/shm` (`job.shmSizeGiB`)."""

NEAR_LIMIT = 0.90
"""Above this share of the GPU's memory the plan warns: the estimate's tolerance (±15%
against torch's tracer) and a longer sequence in a later batch can tip it over."""

# Bytes per token saved for backward by one Hugging Face Llama/Mistral decoder layer in bf16,
# as multiples of the hidden size, KV width and MLP width (torch's tracer: 229.5 KB per token
# for llama3.1-8b). The terms: docs/design/estimates.md#layer-activations
_LAYER_H = 27
_LAYER_KV = 4
_LAYER_I = 8
# Outside the layers: embedding output, final norm (fp32 in, bf16 out) and the LM head input.
_ROOT_H = 10
# Logits per token and vocabulary entry: bf16 logits (2; 4 in fp32, where `.float()` is the
# same tensor) and the fp32 log-softmax (4) saved by the loss, plus its fp32 gradient and the
# log-softmax backward's fp32 output (8) at the start of backward.
_LOGITS_SAVED = 6
_LOGITS_BACKWARD = 8


@dataclass(frozen=True)
class RunShape:
    """What the estimate depends on: the model, the batch and the parallelism of one GPU."""

    shape: ModelShape
    micro_batch_size: int
    context_width: int
    shard_size: int
    """Ranks each parameter is sharded over (1 for no_shard)."""
    reshard_after_forward: bool
    """full/hybrid: True; shard_grad_op/no_shard: False."""
    checkpointed_layers: int
    """Decoder layers that recompute their activations in backward."""
    ac_keeps_matmuls: bool = False
    """Op-level checkpointing (`trainer.parallelize`, `--activation_checkpointing op`): a
    checkpointed layer keeps attention's and every second matmul's output, not only its input."""
    cpu_offload: bool = False
    bf16: bool = True
    loss_chunk_tokens: int = 0
    """Positions per slice of the chunked loss; 0: the whole micro-batch's logits at once."""


@dataclass(frozen=True)
class MemoryFit:
    """The estimated peak per GPU against the GPU's memory, and what it is made of."""

    per_gpu_bytes: int
    gpu_bytes: int
    breakdown: dict[str, int]
    """Bytes per term at the peak phase (their sum is `per_gpu_bytes`)."""

    @property
    def fits(self) -> bool:
        return self.per_gpu_bytes <= self.gpu_bytes

    @property
    def share(self) -> float:
        """The estimate as a share of the GPU's memory."""
        return self.per_gpu_bytes / self.gpu_bytes

    @property
    def near_limit(self) -> bool:
        return self.fits and self.share > NEAR_LIMIT

    def summary(self) -> str:
        """One line for the plan: the estimate, the GPU and the biggest terms."""
        top = sorted(self.breakdown.items(), key=lambda item: -item[1])[:4]
        parts = ", ".join(f"{name} {value / GIB:.1f}" for name, value in top)
        return (
            f"~{self.per_gpu_bytes / GIB:.1f} GiB of {self.gpu_bytes / GIB:.0f} GiB per GPU "
            f"({self.share:.0%}; {parts} GiB)"
        )


def _layer_tensors(shape: ModelShape) -> list[tuple[int, int]]:
    """[dim 0, dim 1] of each parameter of one decoder layer, as the Hugging Face modules hold
    them (`nn.Linear` weights are [out, in]; transformers keeps a Mixtral layer's experts fused
    as [experts, 2 x intermediate, hidden] and [experts, hidden, intermediate], flattened here
    after dim 1: `models/mixtral/modeling_mixtral.py`, `MixtralExperts`)."""
    h = shape.hidden_size
    q = shape.num_heads * shape.head_dim
    kv = shape.num_key_value_heads * shape.head_dim
    i = shape.intermediate_size
    attention = [(q, h), (kv, h), (kv, h), (h, q)]
    norms = [(h, 1), (h, 1)]
    if shape.num_local_experts:
        experts = shape.num_local_experts
        mlp = [(experts, 2 * i * h), (experts, h * i), (experts, h)]
    else:
        mlp = [(i, h), (i, h), (h, i)]
    return attention + mlp + norms


def _root_tensors(shape: ModelShape) -> list[tuple[int, int]]:
    """Embeddings, the final norm and (unless tied to the embeddings) the LM head."""
    embeddings = (shape.vocab_size, shape.hidden_size)
    head = [] if shape.tie_word_embeddings else [embeddings]
    return [embeddings, (shape.hidden_size, 1), *head]


def _padded(tensors: list[tuple[int, int]], shards: int) -> int:
    """Elements of the gathered unit, padding included.

    FSDP2 splits the sharded dim into `shards` chunks and pads every shard to the first
    chunk's size (torch `distributed/fsdp/_fully_shard/_fsdp_param.py`,
    `_init_sharded_param`: `_chunk_with_empty`, then `padded_sharded_param_size`).
    `trainer.parallelize.shard_placement` shards dim 1 instead when dim 0 has fewer rows than
    the group has ranks (Mixtral's 8 experts); a Mixtral expert tensor's dim 1 here is its
    flattened rest, whose leading size (2 x intermediate or hidden) divides by the group.
    """
    total = 0
    for dim0, dim1 in tensors:
        if dim1 > dim0 and dim0 < shards:
            total += dim0 * dim1
        else:
            total += shards * math.ceil(dim0 / shards) * dim1
    return total


def layer_parameters(shape: ModelShape) -> int:
    """Parameters of one decoder layer (one FSDP unit)."""
    return sum(dim0 * row for dim0, row in _layer_tensors(shape))


def layer_activation_bytes_per_token(shape: ModelShape) -> int:
    """Bytes one decoder layer saves for backward per token, in bf16 compute.

    A mixture-of-experts layer runs each token through `num_experts_per_tok` experts: the
    MLP term is paid that many times, plus the token's gathered copy and its weighted output
    per expert (4 h each).
    """
    h = shape.hidden_size
    kv = shape.num_key_value_heads * shape.head_dim
    mlp = _LAYER_I * shape.intermediate_size
    if shape.num_local_experts:
        mlp = shape.num_experts_per_tok * (mlp + 4 * h) + 4 * shape.num_local_experts
    return _LAYER_H * h + _LAYER_KV * kv + mlp


def _checkpointed_layer_bytes(run: RunShape, tokens: int, full_layer: int) -> int:
    """What a checkpointed layer keeps until its backward: its input (full), or with op-level
    checkpointing also the outputs of q, v, gate and down (the odd matmuls in call order) and
    of attention: 4 h + kv + i per token in the compute dtype. A mixture-of-experts layer's
    expert matmuls are not counted one by one here: it is taken to keep everything."""
    shape = run.shape
    compute = 2 if run.bf16 else 4
    if not run.ac_keeps_matmuls:
        return compute * shape.hidden_size * tokens
    if shape.num_local_experts:
        return full_layer
    kv = shape.num_key_value_heads * shape.head_dim
    return compute * (4 * shape.hidden_size + kv + shape.intermediate_size) * tokens


def estimate(run: RunShape) -> dict[str, int]:
    """Bytes per term at the peak: the largest of the three phases where memory peaks.

    * The loss's backward: every saved activation, the logits and their fp32 gradients, the
      gathered root and layer units, no gradients yet (`zero_grad(set_to_none=True)`).
    * The last layer's backward: the logits are down to the bf16 copy `outputs` holds, but
      the layer's bf16 gradients and their fp32 copy for reduce-scatter (`reduce_dtype`
      fp32) replace its activations, or join them when they were recomputed.
    * The end of backward: the root's gradient and its fp32 reduce-scatter copy beside every
      fp32 gradient shard, the parameters and AdamW states (the fused AdamW step adds no
      temporaries).
    """
    shape = run.shape
    shards = run.shard_size
    layer = _padded(_layer_tensors(shape), shards)
    root = _padded(_root_tensors(shape), shards)
    compute = 2 if run.bf16 else 4
    scale = compute / 2
    tokens = run.micro_batch_size * run.context_width

    offloaded = run.cpu_offload
    sharded = 0 if offloaded else (shape.num_layers * layer + root) * 4 // shards
    state = {"parameters (fp32 shards)": sharded, "AdamW states (fp32)": 2 * sharded}

    # The root and two layer units (the one computing and the one prefetched) are gathered;
    # without resharding after forward every layer stays gathered into backward.
    gathered_layers = 2 if run.reshard_after_forward else shape.num_layers
    gathered = compute * (root + gathered_layers * layer)

    full_layer = int(layer_activation_bytes_per_token(shape) * tokens * scale)
    checkpointed = min(run.checkpointed_layers, shape.num_layers)
    activations = (
        checkpointed * _checkpointed_layer_bytes(run, tokens, full_layer)
        + (shape.num_layers - checkpointed) * full_layer
        + int(_ROOT_H * shape.hidden_size * tokens * scale)
    )
    chunked = 0 < run.loss_chunk_tokens < tokens
    logits = (run.loss_chunk_tokens if chunked else tokens) * shape.vocab_size

    loss_backward = {
        **state,
        "gathered weights (bf16)": gathered,
        "activations": activations,
        "logits and loss": (compute + _LOGITS_SAVED - 2 + _LOGITS_BACKWARD) * logits
        # The LM head's gradient, summed slice by slice from the first slice's backward on.
        + (compute * shape.vocab_size * shape.hidden_size if chunked else 0),
    }
    layer_backward = {
        **state,
        "gradients (fp32 shards)": 0 if offloaded else root * 4 // shards,
        "gathered weights (bf16)": gathered,
        # A layer's own activations are freed as its gradients appear (whichever is larger
        # counts); recomputed ones (checkpointing) were seen by torch's tracer to stay until
        # the layer's gradients are reduce-scattered, so both count.
        "layer in backward": (
            full_layer + (compute + 4) * layer
            if checkpointed
            else max(full_layer, (compute + 4) * layer)
        ),
        "activations": activations - (0 if checkpointed else full_layer),
        # The chunked loss keeps no logits past its own backward.
        "logits and loss": 0 if chunked else compute * logits,
    }
    end_of_backward = {
        **state,
        "gradients (fp32 shards)": sharded,
        # The root's gradient (LM head, then embeddings) is reduce-scattered last, in fp32;
        # its gathered weights are freed first (torch `_fsdp_param_group.py`,
        # `FSDPParamGroup.post_backward`: `reshard()` before `foreach_reduce`).
        "root gradient (unsharded)": (compute + 4) * root,
    }
    phases = (loss_backward, layer_backward, end_of_backward)
    return max(phases, key=lambda phase: sum(phase.values()))


@dataclass(frozen=True)
class Parallelism:
    """How the run shards and checkpoints: the stack's keys, or what `auto` chose for them."""

    sharding_strategy: str
    """full, hybrid, shard_grad_op or no_shard."""
    activation_checkpointing: str
    """full, op or off."""
    reason: str
    """Why, for the plan: which keys were `auto` and what decided them."""


def _shard_size(config: StackConfig, strategy: str) -> int:
    """Ranks a parameter is sharded over, as `trainer.distributed.build_mesh` builds the mesh."""
    if strategy == "no_shard":
        return 1
    if strategy == "hybrid":
        return config.training.hsdp_shard_size or config.gpus_per_node
    return config.world_size


def shard_size(config: StackConfig) -> int:
    """Ranks a parameter is sharded over in `config`'s run."""
    return _shard_size(config, parallelism(config).sharding_strategy)


def trainer_setting(config: StackConfig, flag: str) -> Any:
    """A trainer flag the stack leaves to `training.extraArgs`: its value there, else the
    trainer's own default (`trainer.config`, torch-free)."""
    if flag in config.training.extra_args:
        return config.training.extra_args[flag]
    return TRAINER_DEFAULTS[flag]


def _run_shape(config: StackConfig, strategy: str, checkpointing: str) -> RunShape:
    shape = config.model_shape()
    training = config.training
    return RunShape(
        shape=shape,
        micro_batch_size=training.micro_batch_size,
        context_width=training.context_width,
        shard_size=_shard_size(config, strategy),
        reshard_after_forward=strategy in ("full", "hybrid"),
        checkpointed_layers=0 if checkpointing == "off" else shape.num_layers,
        ac_keeps_matmuls=checkpointing == "op",
        cpu_offload=training.cpu_offload,
        bf16=training.bf16,
        loss_chunk_tokens=int(trainer_setting(config, "loss_chunk_tokens")),
    )


def _fit_of(config: StackConfig, run: RunShape) -> MemoryFit:
    breakdown = with_allowance(estimate(run))
    return MemoryFit(
        per_gpu_bytes=sum(breakdown.values()),
        gpu_bytes=config.instance.gpu_memory_gib * GIB,
        breakdown=breakdown,
    )


def parallelism(config: StackConfig) -> Parallelism:
    """The stack's sharding and checkpointing, with `auto` resolved by the memory estimate.

    Candidates, fastest first: op-level checkpointing before full (6N + what op recomputes,
    against 8N FLOPs per token), and across nodes hybrid before full sharding (HSDP moves only
    the once-per-step gradient all-reduce over EFA). The first that fits below `NEAR_LIMIT` of
    the GPU's memory, and with `training.cpuOffload` in the node's memory too, wins: offloaded,
    a hybrid group keeps the whole state in every node's memory, where full sharding keeps a
    node's share. When none does, the most frugal is kept and the memory check refuses the
    run with its options."""
    training = config.training
    explicit_strategy = training.sharding_strategy != "auto"
    explicit_ac = training.activation_checkpointing != "auto"
    if explicit_strategy:
        strategies = [training.sharding_strategy]
    else:
        strategies = ["hybrid", "full"] if config.gpu_nodes.count > 1 else ["full"]
    modes = [training.activation_checkpointing] if explicit_ac else ["op", "full"]
    candidates = [(strategy, mode) for mode in modes for strategy in strategies]
    if explicit_strategy and explicit_ac:
        return Parallelism(*candidates[0], reason="as set")
    for strategy, mode in candidates:
        run = _run_shape(config, strategy, mode)
        fit = _fit_of(config, run)
        if fit.fits and not fit.near_limit and _host_fits(config, run):
            return Parallelism(strategy, mode, reason=f"auto: fits in {fit.share:.0%}")
    return Parallelism(*candidates[-1], reason="auto: the most frugal choice, and still too big")


def run_shape(config: StackConfig) -> RunShape:
    """The figures of `config` the estimate reads."""
    chosen = parallelism(config)
    return _run_shape(config, chosen.sharding_strategy, chosen.activation_checkpointing)


def with_allowance(breakdown: dict[str, int]) -> dict[str, int]:
    """The tensor terms plus the CUDA context and the allocator's fragmentation."""
    tensors = sum(breakdown.values())
    return {
        **breakdown,
        "CUDA context": CUDA_CONTEXT_BYTES,
        "fragmentation": int(FRAGMENTATION * tensors),
    }


def memory_fit(config: StackConfig) -> MemoryFit:
    """The estimated peak memory per GPU of `config`'s run against its GPU's memory."""
    return _fit_of(config, run_shape(config))


def _host_bytes(config: StackConfig, run: RunShape) -> int:
    per_gpu = estimate(replace(run, cpu_offload=False))["parameters (fp32 shards)"] * 4
    return per_gpu * config.gpus_per_node


def host_state_bytes(config: StackConfig) -> int:
    """Host memory per node that CPU offload fills: every local GPU's fp32 parameters,
    gradients and AdamW states (16 bytes per sharded parameter element)."""
    return _host_bytes(config, run_shape(config))


def _host_limit(config: StackConfig) -> float:
    return HOST_SHARE * config.instance.memory_gib * GIB


def _host_fits(config: StackConfig, run: RunShape) -> bool:
    """Without offload nothing of the state is on the host; with it, a node's share must fit."""
    return not run.cpu_offload or _host_bytes(config, run) <= _host_limit(config)


def _total(run: RunShape) -> int:
    return sum(with_allowance(estimate(run)).values())


def _nodes_that_fit(config: StackConfig, run: RunShape, gpu_bytes: int) -> int | None:
    """The fewest nodes (up to 512) over which full sharding fits, or None."""
    for count in range(config.gpu_nodes.count + 1, 513):
        world = count * config.gpus_per_node
        if _total(replace(run, shard_size=world)) <= gpu_bytes:
            return count
    return None


@dataclass(frozen=True)
class Remedy:
    """A change of the stack that lowers the estimate: the keys it sets (as users write them;
    None: unset the key) and what the run then needs."""

    changes: dict[str, Any]
    label: str
    """The change for a person: `training.microBatchSize: 1 (instead of 4)`."""
    per_gpu_bytes: int
    fits: bool
    """Whether the run then fits on its own (GPU and, offloaded, host memory)."""

    def __str__(self) -> str:
        verdict = "fits" if self.fits else "not enough alone"
        return f"{self.label} -> ~{self.per_gpu_bytes / GIB:.1f} GiB ({verdict})"


def _divisors_above(world: int, current: int) -> list[int]:
    """HSDP shard sizes larger than `current` that divide the world (trainer.distributed
    `hsdp_shape` requires it), smallest first; the world itself is full sharding, offered as
    such."""
    return [k for k in range(current + 1, world) if world % k == 0]


def _shard_size_remedy(
    config: StackConfig, run: RunShape, fits: Callable[[RunShape], bool]
) -> Remedy | None:
    """Explicit hybrid sharding: the smallest larger shard group with which `fits` holds, as
    `training.hsdpShardSize` (its default, one node's GPUs, as unsetting it)."""
    training = config.training
    if training.sharding_strategy != "hybrid":
        return None
    current = training.hsdp_shard_size or config.gpus_per_node
    for size in _divisors_above(config.world_size, current):
        option = replace(run, shard_size=size)
        if not fits(option):
            continue
        if size == config.gpus_per_node:
            changes: dict[str, Any] = {"training.hsdpShardSize": None}
            label = (
                f"unset training.hsdpShardSize (instead of {current}: its default, one "
                f"node's {size} GPUs)"
            )
        else:
            changes = {"training.hsdpShardSize": size}
            label = f"training.hsdpShardSize: {size} (instead of {current})"
        return Remedy(changes, label, _total(option), True)
    return None


def _full_sharding_changes(config: StackConfig) -> dict[str, Any]:
    changes: dict[str, Any] = {"training.shardingStrategy": "full"}
    if config.training.hsdp_shard_size is not None:  # only hybrid takes it
        changes["training.hsdpShardSize"] = None
    return changes


def remedies(config: StackConfig) -> list[Remedy]:
    """Changes that lower the GPU estimate, each naming its keys and what it would give.

    Each is evaluated on this run alone; only those that lower the estimate are offered, and
    each says whether it fits on its own. CPU offload is offered only when the node's memory
    can hold the offloaded state.
    """
    training = config.training
    strategy = parallelism(config).sharding_strategy
    run = run_shape(config)
    not_full_ac = run.checkpointed_layers < run.shape.num_layers or run.ac_keeps_matmuls
    full_ac = replace(run, checkpointed_layers=run.shape.num_layers, ac_keeps_matmuls=False)
    gpu_bytes = config.instance.gpu_memory_gib * GIB

    def fits(option: RunShape) -> bool:
        return _total(option) <= gpu_bytes and _host_fits(config, option)

    options: list[tuple[dict[str, Any], str, RunShape]] = []
    if strategy in ("hybrid", "no_shard", "shard_grad_op"):
        options.append(
            (
                _full_sharding_changes(config),
                f"training.shardingStrategy: full (shards over all {config.world_size} GPUs)",
                replace(run, shard_size=config.world_size, reshard_after_forward=True),
            )
        )
    if not_full_ac:
        options.append(
            (
                {"training.activationCheckpointing": "full"},
                "training.activationCheckpointing: full (every layer)",
                full_ac,
            )
        )
    if training.micro_batch_size > 1:
        options.append(
            (
                {"training.microBatchSize": 1},
                f"training.microBatchSize: 1 (instead of {training.micro_batch_size})",
                replace(run, micro_batch_size=1),
            )
        )
    if strategy in ("full", "shard_grad_op"):
        nodes = _nodes_that_fit(config, run, gpu_bytes)
        if nodes is not None:
            options.append(
                (
                    {"gpuNodes.count": nodes},
                    f"gpuNodes.count: {nodes} (instead of {config.gpu_nodes.count})",
                    replace(run, shard_size=nodes * config.gpus_per_node),
                )
            )
        else:
            # More GPUs alone cannot shrink the activations: offer them with the lean batch.
            lean = replace(full_ac, micro_batch_size=1)
            nodes = _nodes_that_fit(config, lean, gpu_bytes)
            with_keys = {
                key: value
                for key, value, needed in (
                    ("training.microBatchSize", 1, run.micro_batch_size > 1),
                    ("training.activationCheckpointing", "full", not_full_ac),
                )
                if needed
            }
            if nodes is not None and with_keys:
                described = " and ".join(f"{key}: {value}" for key, value in with_keys.items())
                options.append(
                    (
                        {"gpuNodes.count": nodes, **with_keys},
                        f"gpuNodes.count: {nodes} with {described}",
                        replace(lean, shard_size=nodes * config.gpus_per_node),
                    )
                )
    offloaded = replace(run, cpu_offload=True)
    if not training.cpu_offload and _host_fits(config, offloaded):
        options.append(
            (
                {"training.cpuOffload": True},
                "training.cpuOffload: true (parameters, gradients and AdamW states in host "
                "memory; slower steps)",
                offloaded,
            )
        )
    current = _total(run)
    found = [
        Remedy(changes, label, _total(option), fits(option))
        for changes, label, option in options
        if _total(option) < current
    ]
    shard = _shard_size_remedy(config, run, fits)
    if shard is not None:
        found.insert(0, shard)  # the key that caused the overrun comes first
    return found


def host_remedies(config: StackConfig) -> list[Remedy]:
    """Changes after which the offloaded state fits the node's memory and the rest the GPU's:
    each one is checked, none is offered on faith. Full sharding and a larger HSDP group
    spread the state over more nodes; more nodes help only where the shard group is the whole
    world (full, shard_grad_op); no offload, when the GPUs hold the state themselves; or an
    instance type with more memory."""
    run = run_shape(config)
    gpu_bytes = config.instance.gpu_memory_gib * GIB

    def fits(option: RunShape) -> bool:
        return _total(option) <= gpu_bytes and _host_fits(config, option)

    found: list[Remedy] = []
    strategy = parallelism(config).sharding_strategy
    shard = _shard_size_remedy(config, run, fits)
    if shard is not None:
        found.append(shard)
    if run.shard_size < config.world_size:
        option = replace(run, shard_size=config.world_size, reshard_after_forward=True)
        if fits(option):
            label = (
                f"training.shardingStrategy: full (each node holds 1/{config.gpu_nodes.count} "
                f"of the state: ~{_host_bytes(config, option) / GIB:.0f} GiB)"
            )
            found.append(Remedy(_full_sharding_changes(config), label, _total(option), True))
    if strategy in ("full", "shard_grad_op"):
        for count in range(config.gpu_nodes.count + 1, 513):
            option = replace(run, shard_size=count * config.gpus_per_node)
            if fits(option):
                label = f"gpuNodes.count: {count} (instead of {config.gpu_nodes.count})"
                found.append(Remedy({"gpuNodes.count": count}, label, _total(option), True))
                break
    on_gpu = replace(run, cpu_offload=False)
    if fits(on_gpu):
        label = "training.cpuOffload: false (the GPUs hold the state themselves)"
        found.append(Remedy({"training.cpuOffload": False}, label, _total(on_gpu), True))
    larger = _larger_instance(config)
    if larger is not None:
        found.append(larger)
    return found


def _larger_instance(config: StackConfig) -> Remedy | None:
    """The instance type with the least host memory beyond this one's on which the same run
    (same node count) fits both memories; None when none does."""
    current = config.instance.memory_gib
    for name, facts in sorted(INSTANCE_FACTS.items(), key=lambda item: item[1].memory_gib):
        if facts.memory_gib <= current or facts.gpus < config.gpus_per_node:
            continue
        nodes = config.gpu_nodes.model_copy(update={"instance_type": name})
        candidate = config.model_copy(update={"gpu_nodes": nodes})
        run = run_shape(candidate)
        gpu_bytes = facts.gpu_memory_gib * GIB
        if _total(run) <= gpu_bytes and _host_fits(candidate, run):
            label = f"gpuNodes.instanceType: {name} ({facts.memory_gib} GiB per node)"
            return Remedy({"gpuNodes.instanceType": name}, label, _total(run), True)
    return None


def memory_problems(config: StackConfig) -> list[str]:
    """One message per way the run cannot fit: its GPUs' memory (the estimate, the memory
    and the options that would lower it), or, offloaded, its nodes' memory."""
    problems = []
    fit = memory_fit(config)
    if not fit.fits:
        options = [*map(str, remedies(config)), "a GPU with more memory (gpuNodes.instanceType)"]
        hint = "; ".join(options)
        problems.append(
            f"the run needs ~{fit.per_gpu_bytes / GIB:.1f} GiB per GPU but gpuNodes.instanceType "
            f"{config.gpu_nodes.instance_type!r} has {fit.gpu_bytes / GIB:.0f} GiB "
            f"({fit.summary()}); options that lower it: {hint}"
        )
    if config.training.cpu_offload:
        host = host_state_bytes(config)
        if host > _host_limit(config):
            options = [remedy.label for remedy in host_remedies(config)]
            hint = "; ".join(options) or (
                "none of a larger shard group, more nodes, no offload or another instance type "
                "fits it: a smaller model (model.preset)"
            )
            problems.append(
                f"training.cpuOffload: true puts ~{host / GIB:.0f} GiB of parameters, gradients "
                f"and AdamW states in the memory of each {config.gpu_nodes.instance_type} node, "
                f"which has {config.instance.memory_gib} GiB; allowed: up to "
                f"{HOST_SHARE:.0%} of it; options that fit: {hint}"
            )
    return problems


def memory_warnings(config: StackConfig) -> list[str]:
    """A warning when the run fits but with little margin."""
    fit = memory_fit(config)
    if not fit.near_limit:
        return []
    return [
        f"memory: the run is estimated at {fit.summary()}, above {NEAR_LIMIT:.0%}: a small "
        "error in the estimate means an out-of-memory error at the first step; consider "
        "training.activationCheckpointing or a smaller training.microBatchSize"
    ]
