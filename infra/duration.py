"""How long a stack's run should take, from the trainer's own FLOPs arithmetic.

A deadline (`job.maxRunHours`) that is shorter than the run kills the job half way: the GPUs
were paid for and the model is not finished. The estimate here is the trainer's MFU formula
run backwards, so plan, tests and the trainer's own log line agree on one set of figures:

    hours = max_steps x global batch x context width x FLOPs per token
            / (GPUs x peak bf16 FLOP/s per GPU x MFU) / 3600  +  start-up allowance

FLOPs per token and the per-GPU peak come from `trainer.flops` (what `trainer.metrics`
reports MFU with); nothing is re-derived here. Torch-free: the Pulumi program may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING

from trainer.flops import flops_per_token, peak_flops_of

if TYPE_CHECKING:
    from infra.config import StackConfig
    from trainer.presets import ModelShape

ASSUMED_MFU = 0.35
"""Model FLOPs utilisation assumed for a bf16 FSDP run. torchtitan's published FSDP2 figures
for Llama 3.1 8B on 8 and 128 H100s without Float8 are 33% to 39% MFU (pytorch/torchtitan
`docs/performance.md`); Meta reports 38-43% bf16 MFU for Llama 3 405B on 16K H100s with 4-D
parallelism ("The Llama 3 Herd of Models", 2024, Table 4). Our trainer (FSDP2 over Hugging
Face modules) is assumed to reach the low-middle of that range, not its top."""

STARTUP_HOURS = 0.5
"""Allowance for what is not training steps: GPU nodes scaling from zero, the image pull,
rendezvous, model initialisation or checkpoint loading, and the periodic checkpoint saves."""


def shape_flops_config(shape: ModelShape) -> SimpleNamespace:
    """The attributes `trainer.flops.flops_per_token` reads, under their Hugging Face names
    (as `trainer.models.hf_config_from` sets them), from a preset shape without transformers."""
    return SimpleNamespace(
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.head_dim,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        vocab_size=shape.vocab_size,
        num_local_experts=shape.num_local_experts,
        num_experts_per_tok=shape.num_experts_per_tok,
    )


@dataclass(frozen=True)
class DurationEstimate:
    """A run's expected length and the figures it rests on (for plans and messages)."""

    tokens: int
    """Tokens the run trains on: max steps x global batch x context width."""
    flops_per_token: int
    gpus: int
    peak_flops_per_gpu: float
    mfu: float
    startup_hours: float

    @property
    def training_hours(self) -> float:
        """Hours of training steps at the assumed MFU."""
        achieved = self.gpus * self.peak_flops_per_gpu * self.mfu
        return self.tokens * self.flops_per_token / achieved / 3600

    @property
    def hours(self) -> float:
        """Training steps plus the start-up allowance: what a deadline must cover."""
        return self.training_hours + self.startup_hours

    def summary(self) -> str:
        """One line: how long, and why."""
        return (
            f"~{self.hours:.1f} h ({self.tokens / 1e9:.2f}B tokens x "
            f"{self.flops_per_token / 1e9:.1f} GFLOP/token on {self.gpus} GPUs at "
            f"{self.mfu:.0%} MFU of {self.peak_flops_per_gpu / 1e12:g} TFLOP/s = "
            f"{self.training_hours:.1f} h, + {self.startup_hours:g} h start-up)"
        )


class UnknownPeakError(LookupError):
    """The GPU of an instance type has no peak FLOP/s in `trainer.flops`."""


def estimate_duration(
    config: StackConfig, *, mfu: float = ASSUMED_MFU, startup_hours: float = STARTUP_HOURS
) -> DurationEstimate:
    """Expected wall time of `config`'s run on its GPU nodes at `mfu`."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu must be in (0, 1], got {mfu}")
    gpu = config.instance.gpu_model
    peak = peak_flops_of(gpu)
    if peak is None:
        raise UnknownPeakError(f"no peak bf16 FLOP/s for GPU {gpu!r} in trainer/flops.py")
    context = config.training.context_width
    return DurationEstimate(
        tokens=config.training.max_steps * config.tokens_per_step,
        flops_per_token=flops_per_token(shape_flops_config(config.model_shape()), context),
        gpus=config.world_size,
        peak_flops_per_gpu=peak,
        mfu=mfu,
        startup_hours=startup_hours,
    )
