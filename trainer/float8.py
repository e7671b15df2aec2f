"""FP8 matmuls for the decoder's linear layers: torchao's float8 training, and what it needs.

`--precision fp8` swaps the decoder's `nn.Linear` layers for torchao's `Float8Linear`
(torchao `float8/float8_linear_utils.py`, `convert_to_float8_training`) before activation
checkpointing, compile and `fully_shard`, as torchtitan's `Float8LinearConverter` does; only
the matmuls change. Left in bf16: the LM head, dimensions not a multiple of 16, and layers
below torchao's size thresholds (`_auto_filter_for_recipe`; rowwise:
out_features <= 2048, or in_features <= 1024, or both <= 4096 / 2048). Recipes: `rowwise`
(default), `tensorwise`. FP8 needs compute capability >= 8.9 and compile, except `emulate`.
Why and sources: docs/design/trainer.md#float8
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
"""Module names never converted (why: docs/design/trainer.md#float8)."""

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
    """Gather in float8 where it pays: tensorwise weights over a shard group of several ranks,
    never with rowwise (torchao `Float8LinearConfig.__post_init__`), and not under CPU offload,
    where FSDP2's copy to the GPU loses the precomputed scale (torch
    `fsdp/_fully_shard/_fsdp_param.py`, torchao `float8/fsdp_utils.py`).
    Why: docs/design/trainer.md#plan_float8"""
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
    """Which `nn.Linear` layers become `Float8Linear` (docs/design/trainer.md#float8).

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

    Checkpoints must not see the wrapper (``WeightWithDynamicFloat8CastTensor``, no storage of
    its own): async staging would write uninitialised memory, and a sync save would pickle a
    class ``torch.load(weights_only=True)`` refuses.
    Why and sources: docs/design/trainer.md#plain_float8_weights
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
