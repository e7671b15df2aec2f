"""How long a stack's run should take, from the trainer's own FLOPs arithmetic.

A deadline (`job.maxRunHours`) shorter than the run kills it half way. The estimate is the
trainer's MFU formula run backwards (FLOPs per token and peaks from `trainer.flops`, fp32 peak
from `infra.facts.instances`), plus checkpoint writes and a start-up allowance; MFU is a
per-GPU-family range (`MFU_BY_GPU`). Torch-free: the Pulumi program may import it.
Formula and worked example: docs/design/estimates.md#duration
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import TYPE_CHECKING

from infra.facts.instances import GPU_PEAK_FP32_FLOPS
from trainer.flops import flops_per_token, peak_flops_of
from trainer.presets import approx_num_parameters

if TYPE_CHECKING:
    from infra.config import StackConfig
    from trainer.presets import ModelShape


@dataclass(frozen=True)
class MfuAssumption:
    """Model FLOPs utilisation expected of a bf16 FSDP2 run on one GPU family, with its range.

    Every figure is assumed (`measured` False) until `scripts/bench/throughput.py` on that GPU
    gives a measured one (docs/benchmarks.md); the plan says which it used."""

    low: float
    expected: float
    high: float
    source: str
    measured: bool = False


_HOPPER = MfuAssumption(
    0.25,
    0.35,
    0.42,
    "torchtitan docs/performance.md: FSDP2 bf16 Llama 3.1 8B on 8-128 H100s without Float8 "
    "runs at 33-39% MFU; Meta's Llama 3 paper (2024, Table 4) reports 38-43% at 16K H100s "
    "with 4-D parallelism. Ours (FSDP2 over Hugging Face modules) is assumed at the low "
    "middle, and lower where EFA traffic is exposed",
)
MFU_BY_GPU: dict[str, MfuAssumption] = {
    "H100": _HOPPER,
    "H200": _HOPPER,
    "A100": MfuAssumption(
        0.30,
        0.40,
        0.52,
        "foundation-model-stack/fms-fsdp README: Llama 2 7B at 3760 tokens/GPU/s on 128 "
        "A100s (seq 4096, HSDP), ~57% MFU by our FLOPs formula; assumed lower for ours",
    ),
    "B200": MfuAssumption(
        0.20,
        0.30,
        0.40,
        "no published FSDP2 figure; assumed below Hopper while kernels mature on the part",
    ),
    "L40S": MfuAssumption(
        0.20,
        0.30,
        0.40,
        "no published figure; PCIe GPUs without NVLink expose FSDP's all-gathers; assumed",
    ),
    "A10G": MfuAssumption(
        0.20,
        0.30,
        0.40,
        "no published figure; 24 GB forces small micro-batches on PCIe without NVLink; assumed",
    ),
}
"""Keys are `infra.facts.instances` GPU models; a GPU missing here cannot be planned."""


@dataclass(frozen=True)
class Fp8Speedup:
    """Tokens/s of `training.precision: fp8` over bf16 on one GPU family, per torchao recipe:
    the expected MFU (measured against the bf16 peak, as the trainer reports it) is the bf16
    one times this. Assumed until `scripts/bench/matrix.py`'s fp8 cells measure it."""

    rowwise: float
    tensorwise: float
    source: str

    def of(self, recipe: str) -> float:
        return self.tensorwise if recipe == "tensorwise" else self.rowwise


_HOPPER_FP8 = Fp8Speedup(
    1.10,
    1.25,
    "pytorch/ao torchao/float8/README.md, 'Training benchmarks': Llama 3 8B on 8 x H100 with "
    "FSDP2 and compile, up to 1.25x tokens/s for tensorwise with float8 all-gather and about "
    "1.1x for rowwise. An upper figure for smaller models: there every decoder linear "
    "converts, where torchao's size filter leaves a 1B model's attention in bf16 "
    "(trainer/float8.py); one-GPU runs gather nothing, so tensorwise gains less there",
)
FP8_SPEEDUP_BY_GPU: dict[str, Fp8Speedup] = {
    "H100": _HOPPER_FP8,
    "H200": _HOPPER_FP8,
    "B200": Fp8Speedup(
        1.10, 1.25, "no published FSDP2 float8 figure on B200; assumed as on Hopper"
    ),
    "L40S": Fp8Speedup(
        1.0,
        1.0,
        "no published figure; PCIe all-gathers bound these runs more than the matmuls do, "
        "so no gain is assumed",
    ),
}
"""GPU families with FP8 tensor cores (`infra.facts.instances.GPU_COMPUTE_CAPABILITY` >= 8.9);
the config refuses fp8 on the others before it gets here."""


def mfu_assumption(gpu: str, precision: str = "bf16", recipe: str | None = None) -> MfuAssumption:
    """The MFU assumed for a run on `gpu` at `precision`: fp8 scales the bf16 figure's
    expected and high ends by its assumed speed-up and keeps the low end (no gain at worst)."""
    bf16 = MFU_BY_GPU[gpu]
    if precision != "fp8":
        return bf16
    recipe = recipe or "rowwise"
    speedup = FP8_SPEEDUP_BY_GPU.get(gpu, Fp8Speedup(1.0, 1.0, "no figure; no gain assumed"))
    gain = speedup.of(recipe)
    return MfuAssumption(
        bf16.low,
        bf16.expected * gain,
        max(bf16.high * gain, bf16.expected * gain),
        f"bf16: {bf16.source}; fp8 {recipe} x{gain:g} over bf16: {speedup.source}",
        measured=False,
    )


STARTUP_HOURS = 0.5
"""Expected time that is not training steps at start: GPU nodes launched (or scaled from
zero), the ~20 GB image pulled, rendezvous, model initialisation or checkpoint loading. The
worst case is the stack's `job.startTimeoutMinutes`, counted in the range's top."""

S3_WRITE_BYTES_PER_S_PER_NODE = 1.25e9
"""A checkpoint written to S3 (no FSx) by s3torchconnector's CRT client: its default
throughput target is 10 Gbit/s per client (`S3ClientConfig.throughput_target_gbps`), one client
per rank, so a node's NIC is not the limit; assumed 1.25 GB/s per node, every node writing its
own shards in parallel (S3 scales per prefix: 3,500 PUT/s each, AWS S3 User Guide,
"Best practices design patterns: optimizing Amazon S3 performance")."""

CHECKPOINT_BYTES_PER_PARAMETER = 12
"""What a distributed checkpoint holds per parameter: fp32 weights and AdamW's two fp32
moments (`trainer.checkpoint` saves the model and optimizer state dicts)."""


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
    """A run's expected length, its range, and the figures it rests on."""

    tokens: int
    """Tokens the run trains on: max steps x global batch x context width."""
    flops_per_token: int
    gpus: int
    peak_flops_per_gpu: float
    mfu: MfuAssumption
    startup_hours: float
    start_budget_hours: float
    """The all-or-nothing start budget (`job.startTimeoutMinutes`): the slowest start that
    still trains."""
    checkpoint_hours: float
    """Time the steps stand still for checkpoints (`checkpoint_stall_hours`)."""
    precision: str = "bf16"
    """What the MFU was assumed for: `bf16`, or `fp8 <recipe>`."""

    def training_hours_at(self, mfu: float) -> float:
        """Hours of training steps at `mfu`."""
        achieved = self.gpus * self.peak_flops_per_gpu * mfu
        return self.tokens * self.flops_per_token / achieved / 3600

    @property
    def training_hours(self) -> float:
        """Hours of training steps at the expected MFU."""
        return self.training_hours_at(self.mfu.expected)

    @property
    def hours(self) -> float:
        """The expected wall time: steps, checkpoints and start-up; what a deadline must cover."""
        return self.training_hours + self.checkpoint_hours + self.startup_hours

    @property
    def low_hours(self) -> float:
        return self.training_hours_at(self.mfu.high) + self.checkpoint_hours + self.startup_hours

    @property
    def high_hours(self) -> float:
        """At the low MFU, with the whole pod-start budget spent on start-up."""
        start = max(self.startup_hours, self.start_budget_hours)
        return self.training_hours_at(self.mfu.low) + self.checkpoint_hours + start

    def headline(self) -> str:
        """How long, and the range."""
        return f"~{self.hours:.1f} h (range {self.low_hours:.1f}-{self.high_hours:.1f} h)"

    def arithmetic(self) -> str:
        """Why: the tokens, the FLOPs and the MFU the training hours rest on, and the rest."""
        kind = "measured" if self.mfu.measured else "assumed"
        return (
            f"{count_text(self.tokens)} tokens x {self.flops_per_token / 1e9:.1f} GFLOP/token on "
            f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} at {self.mfu.expected:.0%} MFU "
            f"({self.precision}, {kind}, range "
            f"{self.mfu.low:.0%}-{self.mfu.high:.0%}) of {self.peak_flops_per_gpu / 1e12:g} "
            f"TFLOP/s = {hours_text(self.training_hours)}, + {hours_text(self.checkpoint_hours)} "
            f"checkpoints, + {hours_text(self.startup_hours)} start-up"
        )

    def summary(self) -> str:
        """One line: how long, the range, and why."""
        return f"{self.headline()}: {self.arithmetic()}"


def count_text(count: int) -> str:
    """`7.34B`, `12.6M`, `819,200`: a count with its magnitude, never `0.00B`."""
    if count >= 1e9:
        return f"{count / 1e9:.2f}B"
    if count >= 1e6:
        return f"{count / 1e6:.1f}M"
    return f"{count:,}"


def hours_text(hours: float) -> str:
    """`10.7 h`, `0.5 h`, `3 min`, `40 s`: small figures in the unit that shows them (never
    `0.00 h`)."""
    if hours >= 0.1:
        return f"{hours:.1f} h"
    if hours * 60 >= 1:
        return f"{hours * 60:.0f} min"
    return f"{hours * 3600:.0f} s"


class UnknownPeakError(LookupError):
    """The GPU of an instance type has no peak FLOP/s in `trainer.flops` or no MFU here."""


def checkpoint_write_bytes_per_s(config: StackConfig) -> float:
    """How fast one checkpoint is written: the FSx file system's throughput (MB/s per TiB x
    TiB, the PERSISTENT_2 baseline) when the stack mounts one it sized, else S3 from every
    node in parallel (an existing claim, of unknown size, is taken to write like S3)."""
    fsx = config.storage.fsx
    if fsx.creates_file_system:
        return fsx.per_unit_storage_throughput * 1e6 * fsx.storage_capacity_gib / 1024
    return S3_WRITE_BYTES_PER_S_PER_NODE * config.gpu_nodes.count


def async_saves(config: StackConfig) -> bool:
    """Whether periodic saves write in the background (the trainer's `--async_checkpoint`, on
    unless `training.extraArgs` turns it off)."""
    return str(config.training.extra_args.get("async_checkpoint", 1)) not in ("0", "False")


def checkpoint_stall_hours(config: StackConfig, training_hours: float) -> float:
    """Hours the steps stand still for checkpoints over the whole run.

    Synchronous saves stall for their whole write. Asynchronous ones (the default) stall only
    for staging into host memory (seconds: trainer.checkpoint_upload) while the write goes on
    beside the next `checkpointEvery` steps; a save whose write outlasts that interval holds
    the next save until it lands (trainer.checkpoint `save` waits for the one in flight), so
    each periodic save costs what its write takes beyond the interval. The last save, at the
    end of the run, is written whole before the job ends, as is a stop's."""
    saves = checkpoint_saves(config)
    write_s = checkpoint_seconds(config)
    if not async_saves(config):
        return saves * write_s / 3600
    every = config.training.checkpoint_every
    interval_s = training_hours * 3600 / config.training.max_steps * every if every else 0.0
    return (write_s + (saves - 1) * max(0.0, write_s - interval_s)) / 3600


def checkpoint_saves(config: StackConfig) -> int:
    """Saves in a whole run: every `checkpointEvery` steps, and one at the end."""
    training = config.training
    every = training.checkpoint_every
    periodic = training.max_steps // every if every else 0
    return periodic + (0 if every and training.max_steps % every == 0 else 1)


def estimate_duration(
    config: StackConfig, *, mfu: float | None = None, startup_hours: float = STARTUP_HOURS
) -> DurationEstimate:
    """Expected wall time of `config`'s run on its GPU nodes; `mfu` pins the MFU (no range)."""
    gpu = config.instance.gpu_model
    training = config.training
    # bf16: false computes in fp32 on the CUDA cores, at a tenth or less of the bf16 peak.
    peak = peak_flops_of(gpu) if training.bf16 else GPU_PEAK_FP32_FLOPS.get(gpu)
    if peak is None or gpu not in MFU_BY_GPU:
        kind = "bf16 FLOP/s (trainer/flops.py)" if training.bf16 else (
            "fp32 FLOP/s (infra/facts/instances.py)"
        )  # fmt: skip
        raise UnknownPeakError(
            f"no peak {kind} or MFU (infra/estimates/duration.py) for GPU {gpu!r}"
        )
    assumption = mfu_assumption(gpu, training.precision, training.fp8_recipe)
    if mfu is not None:
        if not 0 < mfu <= 1:
            raise ValueError(f"mfu must be in (0, 1], got {mfu}")
        assumption = MfuAssumption(mfu, mfu, mfu, "given", measured=True)
    shape = config.model_shape()
    estimate = DurationEstimate(
        tokens=config.training.max_steps * config.tokens_per_step,
        flops_per_token=flops_per_token(shape_flops_config(shape), config.training.context_width),
        gpus=config.world_size,
        peak_flops_per_gpu=peak,
        mfu=assumption,
        startup_hours=startup_hours,
        start_budget_hours=config.job.start_timeout_seconds / 3600,
        precision=(
            f"fp8 {training.fp8_recipe or 'rowwise'}"
            if training.precision == "fp8"
            else ("bf16" if training.bf16 else "fp32")
        ),
        checkpoint_hours=0.0,
    )
    stall = checkpoint_stall_hours(config, estimate.training_hours)
    return replace(estimate, checkpoint_hours=stall)


def steps_within(config: StackConfig, hours: float) -> int:
    """The most optimizer steps whose expected wall time fits in `hours` (0 if none does).
    A bisection over `training.maxSteps`: checkpoint saves grow with the steps too."""

    def fits(steps: int) -> bool:
        training = config.training.model_copy(update={"max_steps": steps})
        return estimate_duration(config.model_copy(update={"training": training})).hours <= hours

    low, high = 0, config.training.max_steps
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if fits(middle) else (low, middle - 1)
    return low


SHUTDOWN_MARGIN_S = 60
"""What a stop needs beyond its step and its save: the ranks' agreement, the metrics line,
leaving the process group, and the agent reaping its workers."""


def shutdown_grace_seconds(
    estimate: DurationEstimate, *, max_steps: int, checkpoint_s: float
) -> int:
    """How long a worker needs between SIGTERM and its exit: the step in flight (at the low
    MFU), two checkpoint writes (an asynchronous save still in flight, which the stop save
    waits for, then the stop save itself; or one save on a slow, busy file system) and a
    margin.
    The pod's `terminationGracePeriodSeconds` and torchrun's shutdown timeout derive from it
    (`infra.job.manifest`); a Kubernetes default of 30 s would kill a large save half way."""
    step_s = estimate.training_hours_at(estimate.mfu.low) * 3600 / max_steps
    return math.ceil(step_s + 2 * checkpoint_s + SHUTDOWN_MARGIN_S)


def checkpoint_seconds(config: StackConfig) -> float:
    """Seconds one checkpoint of this run takes to write."""
    saved_bytes = approx_num_parameters(config.model_shape()) * CHECKPOINT_BYTES_PER_PARAMETER
    return saved_bytes / checkpoint_write_bytes_per_s(config)


WATCHDOG_FLOOR_MIN_S = 600
"""The trainer's own default floor: whatever the estimate, a hang is not called sooner."""


def watchdog_floor_seconds(shutdown_grace_s: int) -> int:
    """The trainer's `--watchdog_floor_s` for this run: twice the longest stretch between two
    steps that is not a hang (a step at the low MFU with a checkpoint save), at least 10 min."""
    return max(WATCHDOG_FLOOR_MIN_S, 2 * shutdown_grace_s)
