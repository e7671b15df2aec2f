"""AdamW with decoupled weight decay groups, and the warmup + decay learning-rate schedule.

The schedule is over 1-based optimizer steps ``n = 1 .. max_steps``: linear warmup from
``lr / warmup_steps`` (the first step already moves the weights), then cosine, linear or
constant decay to ``min_lr`` at ``max_steps``, held after. ``LambdaLR`` passes ``n - 1``; the
factor function does the shift. The full rule: docs/design/trainer.md#optim
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch
from torch import nn

from trainer.log import get_logger

logger = get_logger("optim")

DecayStyle = Literal["cosine", "linear", "constant"]
DECAY_STYLES: tuple[str, ...] = get_args(DecayStyle)

# Parameters whose (lower-cased) name contains one of these are never weight-decayed, whatever
# their rank. Norm weights are 1-D anyway; the names catch them if a model ever stores them 2-D.
_NO_DECAY_NAME_PARTS: tuple[str, ...] = ("bias", "norm")


def _decays(name: str, param: nn.Parameter) -> bool:
    """Decay only matrices: decaying gains, biases or norm scales pulls them towards 0, which is
    not regularisation but damage (GPT-2/Llama recipes exclude them)."""
    lowered = name.lower()
    if any(part in lowered for part in _NO_DECAY_NAME_PARTS):
        return False
    return param.ndim >= 2


def param_groups(model: nn.Module, *, weight_decay: float) -> list[dict[str, object]]:
    """Split trainable parameters into a decayed group and a non-decayed group.

    Shared (tied) parameters appear once: ``named_parameters`` de-duplicates them, and an
    optimizer given the same tensor twice raises.
    """
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (decay if _decays(name, param) else no_decay).append(param)
    groups: list[dict[str, object]] = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    if not groups:
        raise ValueError("model has no trainable parameters (all have requires_grad=False)")
    return groups


FUSED_DEVICE_TYPES = ("cuda", "cpu")
"""Where torch has a fused AdamW kernel that FSDP2's DTensor parameters can use (torch
`utils/_foreach_utils.py` `_get_fused_kernels_supported_devices`; CPU since torch 2.4)."""


def _fused_by_default(model: nn.Module) -> bool:
    """Fused where all parameters share one device type with the kernel: GPUs, and the CPU for
    offloaded shards (`--cpu_offload`) and CPU runs, where it steps the tiny preset's shards
    5x faster than the per-parameter loop (docs/benchmarks.md "Fused AdamW on the CPU")."""
    devices = {p.device.type for p in model.parameters()}
    return len(devices) == 1 and devices <= set(FUSED_DEVICE_TYPES)


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    eps: float = 1e-8,
    fused: bool | None = None,
) -> torch.optim.AdamW:
    """AdamW over ``model``'s trainable parameters, weight decay on matrices only.

    ``fused=None`` picks the fused kernel (one kernel per parameter group instead of a loop of
    small ones) where the parameters' device has one (`FUSED_DEVICE_TYPES`).
    Call after ``fully_shard``: the optimizer must hold the sharded DTensor parameters.
    """
    if lr < 0:
        raise ValueError(f"lr must be >= 0, got {lr}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    for flag, beta in (("beta1", beta1), ("beta2", beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{flag} must be in [0, 1), got {beta}")
    use_fused = _fused_by_default(model) if fused is None else fused
    groups = param_groups(model, weight_decay=weight_decay)
    optimizer = torch.optim.AdamW(
        groups,
        lr=lr,
        betas=(beta1, beta2),
        eps=eps,
        weight_decay=weight_decay,
        fused=use_fused,
    )
    sizes = [sum(p.numel() for p in g["params"]) for g in optimizer.param_groups]
    logger.info(
        "AdamW lr=%g betas=(%g, %g) weight_decay=%g fused=%s; parameter elements per group "
        "(decayed first): %s",
        lr,
        beta1,
        beta2,
        weight_decay,
        use_fused,
        sizes,
    )
    return optimizer


def lr_at(
    step: int,
    *,
    warmup_steps: int,
    max_steps: int,
    decay_style: DecayStyle,
    lr: float,
    min_lr: float,
) -> float:
    """Learning rate for optimizer step number ``step`` (1-based). Pure, so it is easy to test
    and to print a schedule from."""
    n = min(max(step, 1), max_steps)
    if n <= warmup_steps:
        return lr * n / warmup_steps
    if decay_style == "constant":
        return lr
    progress = (n - warmup_steps) / (max_steps - warmup_steps)
    if decay_style == "linear":
        return min_lr + (lr - min_lr) * (1.0 - progress)
    if decay_style == "cosine":
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"decay_style must be one of {DECAY_STYLES}, got {decay_style!r}")


def build_lr_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    warmup_steps: int,
    max_steps: int,
    decay_style: DecayStyle,
    lr: float,
    min_lr: float,
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup, then cosine / linear / constant decay to ``min_lr`` at ``max_steps``.

    Call ``scheduler.step()`` once after each ``optimizer.step()``. The factor is a plain closure,
    which ``LambdaLR.state_dict`` does not serialise: a checkpoint holds only the step count, and
    on resume the schedule comes from the current flags.
    """
    if decay_style not in DECAY_STYLES:
        raise ValueError(f"decay_style must be one of {DECAY_STYLES}, got {decay_style!r}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    if not 0 <= warmup_steps <= max_steps:
        raise ValueError(f"warmup_steps must be in [0, max_steps={max_steps}], got {warmup_steps}")
    if lr <= 0:
        raise ValueError(f"lr must be > 0 for a schedule, got {lr}")
    if not 0 <= min_lr <= lr:
        raise ValueError(f"min_lr must be in [0, lr={lr}], got {min_lr}")
    for group in optimizer.param_groups:
        # A scheduler built earlier on this optimizer has already moved "lr" and kept the
        # construction value as "initial_lr", which is what LambdaLR scales.
        base = group.get("initial_lr", group["lr"])
        if base != lr:
            raise ValueError(
                f"optimizer group lr {base} differs from the schedule's lr {lr}: "
                "build the optimizer and the schedule from the same lr"
            )

    def factor(scheduler_steps: int) -> float:
        # LambdaLR multiplies each group's initial lr by this; scheduler_steps is n - 1.
        n = scheduler_steps + 1
        return (
            lr_at(
                n,
                warmup_steps=warmup_steps,
                max_steps=max_steps,
                decay_style=decay_style,
                lr=lr,
                min_lr=min_lr,
            )
            / lr
        )

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=factor)


def apply_scheduled_lr(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Write the scheduler's current LR into its optimizer's groups.

    ``LambdaLR.load_state_dict`` restores the step count but leaves the optimizer's ``lr``
    untouched; without this, the first step after a resume would run at the construction-time
    LR (the warmup's first value). Recomputing from the factor, rather than copying the saved
    ``_last_lr``, keeps the schedule of the current flags.
    """
    step = scheduler.last_epoch
    factors = scheduler.lr_lambdas
    lrs = [base * fn(step) for base, fn in zip(scheduler.base_lrs, factors, strict=True)]
    for group, value in zip(scheduler.optimizer.param_groups, lrs, strict=True):
        group["lr"] = value
    scheduler._last_lr = lrs  # what get_last_lr() reports, e.g. to the log line


def load_schedule_position(
    scheduler: torch.optim.lr_scheduler.LambdaLR, state: dict[str, object]
) -> None:
    """Restore how far a saved schedule had got, keeping the schedule of the current flags.

    ``LambdaLR.load_state_dict`` would also bring back the saved base LRs, so a resume with a
    new ``--lr`` would silently keep the old one; only the step count is taken from ``state``.
    """
    current_base_lrs = list(scheduler.base_lrs)
    scheduler.load_state_dict(state)
    scheduler.base_lrs = current_base_lrs
    apply_scheduled_lr(scheduler)


def step_unless_non_finite(
    optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor
) -> torch.Tensor:
    """`optimizer.step()`, skipped when the global gradient norm is not finite (a NaN or inf
    anywhere in the model's gradients). Returns 1.0 on a skip, else 0.0, on the norm's device.

    The norm is the whole model's (reduced over every rank by `clip_grad_norm_`), so every
    rank skips the same steps. Fused AdamW takes the decision as a tensor, the way GradScaler
    hands it over (`optimizer.found_inf`, torch `amp/grad_scaler.py`): its kernel leaves
    parameters and moments alone and the step counts are restored (torch `optim/adam.py`
    `_fused_adam`), with no host-device sync. The other implementations refuse `found_inf`
    (`_single_tensor_adam`, `_multi_tensor_adam`), so there the decision is read on the host:
    on a CPU run a CPU tensor, no device sync either.
    """
    skipped = (~torch.isfinite(grad_norm)).to(torch.float32)
    if optimizer.defaults.get("fused"):
        optimizer.found_inf = skipped  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif not bool(skipped.item()):
        optimizer.step()
    return skipped
