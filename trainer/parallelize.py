"""Apply float8 layers, activation checkpointing, torch.compile and FSDP2, in that order.

The order matters: float8 layers are swapped in first (their weights are what FSDP2 shards
and, with float8 all-gather, gathers); checkpoint wrappers and compiled blocks must be inside
the FSDP units so that each decoder layer's all-gather, compute and recompute are one
schedulable unit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor, Shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from trainer.distributed import REPLICATE_DIM
from trainer.float8 import Float8Plan, convert_to_float8
from trainer.log import get_logger
from trainer.models import decoder_layers

logger = get_logger("parallelize")


@dataclass(frozen=True)
class ParallelPlan:
    """The parallelism choices `parallelize_model` applies (from `--sharding_strategy` etc.)."""

    sharding_strategy: str = "full"
    bf16: bool = True
    activation_checkpointing: str = "off"
    """off, full, op or selective (`--activation_checkpointing`)."""
    ac_every: int = 1
    compile: bool = False
    cpu_offload: bool = False
    float8: Float8Plan | None = None
    """`--precision fp8`: how the decoder's linear layers run in float8 (None: bf16)."""


AC_MODES = ("full", "op", "selective")
"""The ways a layer can be checkpointed (`--activation_checkpointing` besides off)."""

_ATTENTION_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(torch.ops.aten, name)
)
"""SDPA's kernels (CUDA flash, memory-efficient, cuDNN; the CPU one for local runs): their
outputs are kept, so backward never runs attention's forward again."""
_MATMUL = torch.ops.aten.mm.default
_AMAX = torch.ops.aten.max.default
"""The absolute maximum float8 layers compute each scale from: tiny, and worth keeping
(torchtitan's `_op_sac_save_list` keeps it for low-precision training)."""


def _keep_attention_and_every_other_matmul() -> Any:
    """Op-level selective checkpointing, the policy torchtitan uses for its Llama blocks: keep
    the output of attention and of every second matmul (the projections q, v, gate and down
    of a Llama/Mistral layer, counted in call order), recompute everything else (norms,
    rotary, SiLU, the other matmuls). The policy is asked during forward only: the
    recomputation replays forward's decisions by op index (torch `utils/checkpoint.py`,
    `create_selective_checkpoint_contexts`; `SelectiveCheckpointContext.is_recompute` is
    always False in torch 2.13), and a fresh count starts with every checkpointed call."""
    matmuls = 0

    def policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        nonlocal matmuls
        if op in _ATTENTION_OPS or op == _AMAX:
            return CheckpointPolicy.MUST_SAVE
        if op == _MATMUL:
            matmuls += 1
            if matmuls % 2 == 1:
                return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def checkpointed_layer_indices(num_layers: int, mode: str, every: int) -> list[int]:
    """Which decoder layers are wrapped: all (full, op), or one in every `every` (selective)."""
    if mode in ("full", "op"):
        return list(range(num_layers))
    if mode == "selective":
        return [i for i in range(num_layers) if i % every == 0]
    raise ValueError(
        f"--activation_checkpointing {mode!r} is not supported; allowed: {', '.join(AC_MODES)}"
    )


def apply_activation_checkpointing(model: nn.Module, mode: str, every: int) -> int:
    """Wrap the chosen decoder layers in non-reentrant checkpointing; returns how many.

    full and selective recompute a wrapped layer's whole forward in backward (only its input
    is kept); op keeps what is costly to recompute (`_keep_attention_and_every_other_matmul`)
    and recomputes the rest, for less memory than none and less recomputation than full."""
    layers = decoder_layers(model)
    chosen = checkpointed_layer_indices(len(layers), mode, every)
    extra: dict[str, Any] = {}
    if mode == "op":
        extra["context_fn"] = _keep_attention_and_every_other_matmul
    for index in chosen:
        # preserve_rng_state=False: these models have no dropout in training, and saving the
        # RNG state per layer costs a device sync.
        layers[index] = checkpoint_wrapper(layers[index], preserve_rng_state=False, **extra)
    return len(chosen)


def apply_compile(model: nn.Module) -> None:
    """Compile each decoder layer: identical blocks share one compiled graph.

    The compiled wrapper replaces the layer in the list, so `fully_shard` later wraps it
    from outside and its all-gather/reduce-scatter hooks stay out of the compiled graph.
    Checkpoint FQNs are unaffected: DCP's state-dict helpers drop the `_orig_mod` prefix.
    """
    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        layers[index] = cast(nn.Module, torch.compile(layer, fullgraph=False))


def mixed_precision_policy(bf16: bool) -> MixedPrecisionPolicy:
    """bf16 compute and all-gathers, fp32 gradient reduction (keeps small updates exact)."""
    if bf16:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def parameter_device(plan: ParallelPlan, compute_device: torch.device) -> torch.device:
    """Where the sharded parameters are materialised: CPU memory under CPU offload (FSDP2
    refuses offloaded parameters anywhere else), the compute device otherwise."""
    return torch.device("cpu") if plan.cpu_offload else compute_device


def reshard_after_forward(strategy: str) -> bool:
    """Free gathered parameters after forward (ZeRO-3) or keep them until backward (ZeRO-2).

    With shard groups of one rank (`no_shard`) there is nothing to free.
    """
    return strategy in ("full", "hybrid")


def shard_placement(shard_size: int) -> Callable[[nn.Parameter], Shard | None]:
    """Shard a parameter along dim 1 when dim 0 has fewer rows than the shard group has ranks.

    FSDP2 splits dim 0 into one chunk per rank and pads every chunk to the first one's size
    (torch `distributed/fsdp/_fully_shard/_fsdp_param.py`, `_init_sharded_param`), so
    Mixtral's fused experts ([8 experts, ...] in transformers) over 64 ranks would leave
    each of 8 ranks a whole expert and 56 ranks padding of the same size: the state sharded 8
    ways instead of 64, and gathered and reduced at 8 times its size. `None` keeps dim 0.
    """

    def place(param: nn.Parameter) -> Shard | None:
        if param.dim() > 1 and param.size(0) < shard_size and param.size(1) > param.size(0):
            return Shard(1)
        return None

    return place


def apply_fsdp(model: nn.Module, mesh: DeviceMesh, plan: ParallelPlan) -> None:
    """`fully_shard` every decoder layer, then the root (embeddings, final norm, LM head)."""
    offload = OffloadPolicy()
    if plan.cpu_offload:
        offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    mp_policy = mixed_precision_policy(plan.bf16)
    reshard = reshard_after_forward(plan.sharding_strategy)
    placement = shard_placement(mesh.size(mesh.ndim - 1))
    layers = decoder_layers(model)
    for index, layer in enumerate(layers):
        # The last layer's parameters are needed again first thing in backward: keep them.
        last = index == len(layers) - 1
        fully_shard(
            layer,
            mesh=mesh,
            reshard_after_forward=reshard and not last,
            shard_placement_fn=placement,
            mp_policy=mp_policy,
            offload_policy=offload,
        )
    # The root (embeddings, final norm, LM head) is needed again as soon as backward begins:
    # resharding it after forward only buys one exposed all-gather. torch's own default for
    # the root (`reshard_after_forward=None`: False for root modules, fully_shard docstring);
    # passing the ZeRO-3 `True` here would defeat it.
    fully_shard(
        model,
        mesh=mesh,
        reshard_after_forward=False,
        shard_placement_fn=placement,
        mp_policy=mp_policy,
        offload_policy=offload,
    )


def _weighted_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Position-weighted, so swapped values show too; float64 so the sum is reproducible."""
    values = tensor.detach().double().flatten()
    weights = torch.linspace(1, 2, values.numel(), device=values.device, dtype=torch.float64)
    return (values * weights).sum()


def check_replicas_identical(model: nn.Module, mesh: DeviceMesh) -> None:
    """Fail fast if replicas of the same shard hold different weights (collective).

    HSDP and no_shard assume every replica starts identical and stays so (their gradients are
    all-reduced); a seeding mistake would otherwise train silently diverging copies.
    """
    names = mesh.mesh_dim_names or ()
    if REPLICATE_DIM not in names or mesh.size(names.index(REPLICATE_DIM)) == 1:
        return
    local = [p.to_local() if isinstance(p, DTensor) else p for p in model.parameters()]
    checksum = torch.stack([_weighted_sum(t) for t in local]).sum()
    low, high = checksum.clone(), checksum.clone()
    group = mesh.get_group(REPLICATE_DIM)
    dist.all_reduce(low, op=dist.ReduceOp.MIN, group=group)
    dist.all_reduce(high, op=dist.ReduceOp.MAX, group=group)
    if not torch.equal(low, high):
        raise RuntimeError(
            f"replicas hold different weights (checksums {low.item()} .. {high.item()}): "
            "initialisation must be seeded equally on every replica of a shard"
        )
    logger.info("replicas identical across the %d-way replicate dimension", mesh.size(0))


def parallelize_model(model: nn.Module, mesh: DeviceMesh, plan: ParallelPlan) -> FSDPModule:
    """Float8 layers → activation checkpointing → compile → FSDP2, on a model still on the
    meta device."""
    if plan.float8 is not None:
        convert_to_float8(model, plan.float8)
    checkpointed = 0
    if plan.activation_checkpointing != "off":
        checkpointed = apply_activation_checkpointing(
            model, plan.activation_checkpointing, plan.ac_every
        )
    if plan.compile:
        apply_compile(model)
    apply_fsdp(model, mesh, plan)
    logger.info(
        "parallelized: strategy=%s mesh=%s bf16=%s precision=%s checkpointed_layers=%d/%d "
        "compile=%s cpu_offload=%s",
        plan.sharding_strategy,
        dict(zip(mesh.mesh_dim_names or (), mesh.shape, strict=True)),
        plan.bf16,
        "bf16" if plan.float8 is None else plan.float8.describe(),
        checkpointed,
        len(decoder_layers(model)),
        plan.compile,
        plan.cpu_offload,
    )
    assert isinstance(model, FSDPModule), type(model)
    return model
