"""FP8 matmuls for the decoder's linear layers: torchao's float8 training, and what it needs.

`--precision fp8` swaps the decoder's `nn.Linear` layers for torchao's `Float8Linear`
(torchao `float8/float8_linear_utils.py`, `convert_to_float8_training`) before activation
checkpointing, compile and `fully_shard`, as torchtitan's float8 converter does
(torchtitan `components/quantization/float8.py`, `Float8LinearConverter`). Each converted
layer keeps its bf16/fp32 weight and casts input, weight and output gradient to float8 with
dynamic scales right before each of its three matmuls (`float8_linear.py`,
`matmul_with_hp_or_float8_args`), so weights, optimizer state, gradients and checkpoints are
exactly those of a bf16 run: only the matmuls change.

What is left in bf16, and why:
- the LM head (`lm_head`): the logits feed a softmax over the whole vocabulary, where float8's
  3-bit mantissa costs accuracy first; torchtitan leaves its output layer out by default for
  the same reason, and the chunked loss (`trainer/loss.py`) calls the head's weight directly;
- layers whose weight has a dimension that is not a multiple of 16 (what the FP8 tensor-core
  kernels accept; `_auto_filter_for_rowwise`/`_tensorwise`), e.g. Mixtral's router [8, hidden];
- layers too small for the FP8 GEMM to win back the cost of computing scales and casting,
  by torchao's thresholds from H100 microbenchmarks (`float8_linear_utils.py`,
  `_auto_filter_for_recipe`; torchao docs `workflows/training.md`, "Performance"). rowwise:
  out_features <= 2048, or in_features <= 1024, or both <= 4096 / 2048; tensorwise:
  in_features <= 4096 and out_features <= 1024. For Llama 3.2 3B that leaves out k_proj and
  v_proj ([1024, 3072]) and converts q/o/gate/up/down; for Llama 3.2 1B rowwise converts only
  gate/up ([8192, 2048]). Mixtral's experts are fused 3-D parameters, not `nn.Linear`: they stay
  bf16 (torchao's grouped-GEMM float8 is a prototype).

Recipes: `rowwise` (torchao's `ROWWISE`: per-row scales, rounded down to powers of two, every
operand in e4m3) is the default for its accuracy; `tensorwise` (one scale per tensor, e5m2 for
gradients) is faster and is the one that can all-gather weights in float8: with more than one
rank per shard group FSDP2 then gathers 1 byte per parameter instead of 2
(`enable_fsdp_float8_all_gather`, `fsdp_utils.py` `WeightWithDynamicFloat8CastTensor`), and
the scales of all weights come from one all-reduce after each optimizer step
(`precompute_float8_dynamic_scale_for_fsdp`). torchao's own table (8 x H100, Llama 3 8B):
+25% tokens/s for tensorwise with float8 all-gather, +10% for rowwise.

FP8 tensor cores start at compute capability 8.9 (Ada: L4, L40S; Hopper: H100, H200; Blackwell):
torch's `_scaled_mm` refuses anything older (pytorch `aten/src/ATen/native/cuda/Blas.cpp`,
`_scaled_mm_out_cuda`: "only supported on CUDA devices with compute capability >= 9.0 or 8.9").
The scale and cast kernels are separate small kernels without torch.compile, which fuses them
into their neighbours; eager float8 is slower than bf16, so fp8 requires compile. The one
exception is `emulate` (torchao's `Float8LinearConfig.emulate`: the matmuls run in fp32 on the
float8-rounded values), which tests use on CPUs, uncompiled, for numerics alone.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.flops import MIN_FP8_CAPABILITY
from trainer.log import get_logger

logger = get_logger("float8")

PRECISIONS = ("bf16", "fp8")
FP8_RECIPES = ("rowwise", "tensorwise")

LEFT_IN_BF16 = ("lm_head",)
"""Module names never converted (see the module docstring)."""

TORCHAO_TORCH_RANGE = ((2, 11), (2, 13))
"""The torch releases (major, minor) the pinned torchao (uv.lock) runs with: its own floor
(torchao 0.18.0 `torchao/__init__.py`: prebuilt kernels need torch >= 2.11.0) up to the release
its CI tests (torchao 0.18.0 `.github/workflows/regression_test.yml`: torch 2.13.0). The image
keeps its base image's torch: `docker/smoke_test.py` checks that torch against this range, and
tests/trainer/test_float8.py checks uv.lock's torch and torchao against it."""


class Float8Error(ValueError):
    """fp8 cannot run here (device, torch version, a missing compile): the user's to change."""


@dataclass(frozen=True)
class Float8Plan:
    """How the decoder's linear layers run in float8 (`--precision fp8`)."""

    recipe: str = "rowwise"
    emulate: bool = False
    """torchao's emulation (fp32 matmuls of float8-rounded values): tests on CPUs only."""
    all_gather: bool = False
    """FSDP2 gathers converted weights in float8 (tensorwise over shard groups of > 1 rank,
    without CPU offload: `plan_float8`)."""

    def __post_init__(self) -> None:
        if self.recipe not in FP8_RECIPES:
            raise ValueError(
                f"--fp8_recipe {self.recipe!r} is not supported; allowed: {', '.join(FP8_RECIPES)}"
            )
        if self.all_gather and self.recipe != "tensorwise":
            raise ValueError("float8 all-gather needs --fp8_recipe tensorwise (torchao)")

    def describe(self) -> str:
        """For the trainer's `choices:` line."""
        gather = "float8 all-gather" if self.all_gather else "bf16 all-gather"
        emulated = ", emulated (testing)" if self.emulate else ""
        return f"fp8 {self.recipe}, {gather}{emulated}"


def plan_float8(
    recipe: str, *, emulate: bool, shard_group_size: int, cpu_offload: bool
) -> Float8Plan:
    """Gather in float8 where it pays: tensorwise weights over a shard group of several ranks
    (one rank gathers nothing; torchtitan's converter enables it only when data-parallel
    sharding is on), never with rowwise (torchao supports float8 all-gather for tensorwise
    scales only: `Float8LinearConfig.__post_init__`), and not under CPU offload.

    Under CPU offload FSDP2 copies each shard to the GPU before asking it for its all-gather
    input (torch `fsdp/_fully_shard/_fsdp_param.py`, `FSDPParam.all_gather_inputs`:
    `.to(self.device)`, then `fsdp_pre_all_gather` on the copy). torchao's wrapper survives
    that copy but not the scale precomputed for it: `__torch_dispatch__` rebuilds it from
    the tensor, config and dtype alone (torchao `float8/fsdp_utils.py`,
    `WeightWithDynamicFloat8CastTensor`). So the one all-reduce of all scales after each
    optimizer step (`precompute_float8_dynamic_scale_for_fsdp`, itself run on the CPU shards)
    would be wasted, and every weight's gather would pay an all-reduce of its own for its
    scale: the latency float8 all-gather exists to save, on a run already bound by host
    transfers. The weights are gathered in bf16 there and cast to float8 after the gather,
    as with a one-rank shard group."""
    return Float8Plan(
        recipe=recipe,
        emulate=emulate,
        all_gather=recipe == "tensorwise" and shard_group_size > 1 and not cpu_offload,
    )


def torch_release(version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string; pre-release and local tags (NGC's
    "2.11.0a0+abc.nv26.3") count as their release, as torchao's own check does."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch_pairing(torch_version: str | None = None) -> None:
    """One line when this torch (default: the running one) is outside what the pinned
    torchao runs with."""
    torch_version = torch.__version__ if torch_version is None else torch_version
    low, high = TORCHAO_TORCH_RANGE
    if not low <= torch_release(torch_version) <= high:
        raise Float8Error(
            f"--precision fp8: torchao (uv.lock) runs with torch {low[0]}.{low[1]} to "
            f"{high[0]}.{high[1]}, this is torch {torch_version}; use --precision bf16 or an "
            "image whose torch is in that range"
        )


def check_fp8_device(device: torch.device, *, emulate: bool) -> None:
    """One line when `device` has no FP8 tensor cores (unless emulating, for tests)."""
    if emulate:
        return
    if device.type != "cuda":
        raise Float8Error(
            f"--precision fp8 needs a GPU with FP8 tensor cores (compute capability >= "
            f"{MIN_FP8_CAPABILITY[0]}.{MIN_FP8_CAPABILITY[1]}: L4, L40S, H100, H200, B200); "
            f"this run is on {device.type}; use --precision bf16"
        )
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_FP8_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise Float8Error(
            f"--precision fp8 needs a GPU with FP8 tensor cores (compute capability >= "
            f"{MIN_FP8_CAPABILITY[0]}.{MIN_FP8_CAPABILITY[1]}: L4, L40S, H100, H200, B200); "
            f"{name} is {capability[0]}.{capability[1]}; use --precision bf16"
        )


def module_filter(recipe: str, *, by_size: bool) -> Callable[[nn.Module, str], bool]:
    """Which `nn.Linear` layers become `Float8Linear` (see the module docstring).

    `by_size=False` (emulation: no speed to win or lose) keeps only the hardware rule and the
    head, so the tiny test models convert every layer a real model would."""
    from torchao.float8 import _auto_filter_for_recipe

    by_recipe = _auto_filter_for_recipe(recipe, filter_fqns=list(LEFT_IN_BF16))

    def convert(module: nn.Module, fqn: str) -> bool:
        if not isinstance(module, nn.Linear) or fqn.split(".")[-1] in LEFT_IN_BF16:
            return False
        if by_size:
            return bool(by_recipe(module, fqn))
        out_features, in_features = module.weight.shape
        return out_features % 16 == 0 and in_features % 16 == 0

    return convert


def torchao_config(plan: Float8Plan) -> Any:
    """torchao's `Float8LinearConfig` for the plan's recipe (`from_recipe_name`)."""
    from torchao.float8 import Float8LinearConfig

    config = Float8LinearConfig.from_recipe_name(plan.recipe)
    return dataclasses.replace(
        config, emulate=plan.emulate, enable_fsdp_float8_all_gather=plan.all_gather
    )


def convert_to_float8(model: nn.Module, plan: Float8Plan) -> list[str]:
    """Swap the chosen linear layers for `Float8Linear`, in place; returns their names.

    On a model still on the meta device: `Float8Linear.from_float` reuses each layer's own
    weight Parameter, so initialisation, tied weights and state-dict keys are unchanged."""
    from torchao.float8 import convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    if plan.recipe == "rowwise" and not plan.emulate:
        # Inductor must round the rowwise scales as eager does (pytorch/pytorch#150859; set
        # by torchtitan's converter for the same recipe).
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True
    convert_to_float8_training(
        model,
        module_filter_fn=module_filter(plan.recipe, by_size=not plan.emulate),
        config=torchao_config(plan),
    )
    converted = [name for name, module in model.named_modules() if isinstance(module, Float8Linear)]
    logger.info(
        "float8: %d linear layers converted (%s); left in bf16: the LM head%s",
        len(converted),
        plan.describe(),
        "" if plan.emulate else " and layers below torchao's size thresholds",
    )
    return converted


def after_optimizer_step(model: nn.Module, plan: Float8Plan | None) -> None:
    """With float8 all-gather: every converted weight's scale from one all-reduce (instead of
    one per weight inside the next all-gather). Also due whenever the weights change otherwise
    (a checkpoint loaded in place, a rollback): the scale is kept on each weight's shard
    (``_precomputed_scale``, torchao ``fsdp_utils.py``
    ``precompute_float8_dynamic_scale_for_fsdp``) and the next gather casts with it as it is
    (``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``), however stale."""
    if plan is None or not plan.all_gather:
        return
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    precompute_float8_dynamic_scale_for_fsdp(model)


def plain_float8_weights(state: Any) -> Any:
    """``state`` (nested dicts and lists, as ``get_state_dict`` returns) with each DTensor whose
    local shard is torchao's float8 all-gather wrapper replaced by a plain DTensor over the
    wrapper's own tensor: same storage, so DCP reads the real values when saving and writes
    the real parameters when loading.

    With float8 all-gather each converted weight's shard is a ``WeightWithDynamicFloat8CastTensor``
    (torchao ``float8/fsdp_utils.py``), a wrapper subclass with no storage of its own
    (``data_ptr() == 0``) whose ``__torch_dispatch__`` keeps the subclass only for the ops in
    ``_ops_to_preserve_subclass``. Checkpoints must not see it:
    - staging copies a tensor without storage through ``x.new_empty(x.size())`` (torch
      ``distributed/checkpoint/_state_dict_stager.py``, ``StateDictStager._offload_tensor``);
      ``new_empty`` is not preserved, so the staged copy is a plain, uninitialised tensor (the
      wrapper's ``_tensor`` is copied as an attribute beside it), and an asynchronous save
      writes that uninitialised memory; each save also allocates it afresh;
    - a synchronous save pickles the wrapper class itself (``torch.save`` in
      ``filesystem.py`` ``_write_item``), which ``torch.load(weights_only=True)`` (the reader,
      ``FileSystemReader.read_data``) refuses unless torchao's safe globals are registered, so a
      process that has not imported ``torchao.float8`` would find the checkpoint unreadable.
    The optimizer's moments are plain already (``zeros_like`` is not preserved either).
    """
    # The wrapper exists only once torchao's float8 module was imported (by the conversion):
    # otherwise there is nothing to replace, and no reason to import it.
    fsdp_utils = sys.modules.get("torchao.float8.fsdp_utils")
    if fsdp_utils is None:
        return state
    return _replace_wrapped(state, fsdp_utils.WeightWithDynamicFloat8CastTensor)


def _replace_wrapped(obj: Any, wrapper: type) -> Any:
    if isinstance(obj, DTensor):
        local = obj._local_tensor
        if not isinstance(local, wrapper):
            return obj
        inner = local._tensor.detach()  # type: ignore[attr-defined]  # a view: same storage
        return DTensor.from_local(
            inner,
            obj.device_mesh,
            obj.placements,
            shape=obj.shape,
            stride=obj.stride(),
            run_check=False,
        )
    if isinstance(obj, dict):
        return {key: _replace_wrapped(value, wrapper) for key, value in obj.items()}
    if isinstance(obj, list):
        return [_replace_wrapped(value, wrapper) for value in obj]
    return obj
