"""Throughput, MFU and the sinks that record them (log line, JSONL file, TensorBoard).

The FLOPs-per-token formula and the peak table live in `trainer.flops` (torch-free, so the
Pulumi program estimates a run's length with the same figures); they are re-exported here.
"""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import torch

from trainer.flops import (  # noqa: F401  (re-exported: the trainer and tests use them here)
    PEAK_BF16_FLOPS,
    flops_per_token,
    matmul_params_per_token,
    peak_flops_of,
)
from trainer.log import get_logger

logger = get_logger("metrics")


def peak_flops(device: torch.device) -> float | None:
    """Peak bf16 FLOP/s of one device of this kind, or None when unknown (CPU, new GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    flops = peak_flops_of(name)
    if flops is None:
        logger.warning("no peak FLOP/s known for GPU %r: MFU will not be reported", name)
    return flops


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process: allocated on the GPU, or resident set size on the CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    # ru_maxrss is KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**30


def format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


@dataclass
class StepTimer:
    """Wall time and tokens between logging points, and the run's average step time for ETA.

    The first interval after start or resume includes warm-up (allocator, compile), so the
    ETA uses the intervals after it once there are any.
    """

    start_step: int
    max_steps: int
    clock: Callable[[], float] = time.perf_counter
    _last_time: float = 0.0
    _last_step: int = -1
    _steady_time: float = 0.0
    _steady_steps: int = 0
    _intervals: int = 0

    def __post_init__(self) -> None:
        self._last_step = self.start_step
        self._last_time = self.clock()

    def lap(self, step: int) -> tuple[float, int]:
        """(seconds, steps) since the previous lap."""
        now = self.clock()
        elapsed, steps = now - self._last_time, step - self._last_step
        self._intervals += 1
        if self._intervals > 1 or step >= self.max_steps:
            self._steady_time += elapsed
            self._steady_steps += steps
        self._last_time, self._last_step = now, step
        return elapsed, steps

    def eta_seconds(self, step: int, fallback_step_time: float) -> float:
        per_step = (
            self._steady_time / self._steady_steps if self._steady_steps else fallback_step_time
        )
        return per_step * (self.max_steps - step)


@dataclass(frozen=True)
class TrainRecord:
    """One logging point's figures; `loss` is the mean over ranks of the step's loss."""

    step: int
    loss: float
    lr: float
    grad_norm: float
    samples_per_sec: float
    tokens_per_sec: float
    tokens_per_sec_per_gpu: float
    mfu: float | None
    step_time_s: float
    peak_mem_gib: float
    eta_s: float
    extra: dict[str, Any] = field(default_factory=dict)

    def log_line(self) -> str:
        """The seed's prefix (`Batch N Loss: X, Speed: Y samples/sec, lr: Z`), then ours."""
        mfu = "n/a" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        return (
            f"Batch {self.step} Loss: {self.loss:.5f}, "
            f"Speed: {self.samples_per_sec:.2f} samples/sec, lr: {self.lr:.6g}, "
            f"grad_norm: {self.grad_norm:.3f}, "
            f"tokens/s: {self.tokens_per_sec:,.0f} ({self.tokens_per_sec_per_gpu:,.0f}/gpu), "
            f"MFU: {mfu}, step: {self.step_time_s:.3f}s, "
            f"peak_mem: {self.peak_mem_gib:.2f}GiB, ETA: {format_duration(self.eta_s)}"
        )

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "kind": "train",
            "step": self.step,
            "loss": self.loss,
            "lr": self.lr,
            "grad_norm": self.grad_norm,
            "samples_per_sec": self.samples_per_sec,
            "tokens_per_sec": self.tokens_per_sec,
            "tokens_per_sec_per_gpu": self.tokens_per_sec_per_gpu,
            "mfu": self.mfu,
            "step_time_s": self.step_time_s,
            "peak_mem_gib": self.peak_mem_gib,
            "eta_s": self.eta_s,
        }
        record.update(self.extra)
        return record


@dataclass(frozen=True)
class ThroughputModel:
    """What one optimizer step processes, to turn wall time into rates and MFU."""

    samples_per_step: int  # global: micro-batch x accumulation x data-parallel ranks
    seq_len: int
    world_size: int
    flops_per_token: int
    peak_flops_per_device: float | None

    def record(
        self,
        *,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float,
        elapsed_s: float,
        steps: int,
        peak_mem_gib: float,
        eta_s: float,
        extra: dict[str, Any] | None = None,
    ) -> TrainRecord:
        step_time = elapsed_s / max(steps, 1)
        samples_per_sec = self.samples_per_step / step_time if step_time > 0 else 0.0
        tokens_per_sec = samples_per_sec * self.seq_len
        per_gpu = tokens_per_sec / self.world_size
        mfu = None
        if self.peak_flops_per_device:
            mfu = per_gpu * self.flops_per_token / self.peak_flops_per_device
        return TrainRecord(
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            samples_per_sec=samples_per_sec,
            tokens_per_sec=tokens_per_sec,
            tokens_per_sec_per_gpu=per_gpu,
            mfu=mfu,
            step_time_s=step_time,
            peak_mem_gib=peak_mem_gib,
            eta_s=eta_s,
            extra=dict(extra or {}),
        )


class MetricSink:
    """Where records go besides the log; the base class drops them (used on ranks > 0)."""

    def write(self, record: dict[str, Any]) -> None:
        """`record` has a `kind` ("train", "validation", ...) and a `step`."""

    def close(self) -> None:
        """Flush and release files."""


class JsonlSink(MetricSink):
    """One JSON object per line, appended and flushed, so a resumed run continues the file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            raise ValueError(f"metrics file {self.path} is closed")
        self._file.write(json.dumps({"time": time.time(), **record}) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class TensorBoardSink(MetricSink):
    """Scalars under `<kind>/<name>`; tensorboard is imported only when asked for."""

    def __init__(self, log_dir: str | Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, record: dict[str, Any]) -> None:
        kind, step = record.get("kind", "train"), int(record["step"])
        for name, value in record.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and name != "step":
                self._writer.add_scalar(f"{kind}/{name}", value, step)

    def close(self) -> None:
        self._writer.close()


class MultiSink(MetricSink):
    def __init__(self, sinks: list[MetricSink]) -> None:
        self.sinks = sinks

    def write(self, record: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


def build_sinks(
    *, is_main: bool, metrics_file: str | Path | None, tensorboard_dir: str | Path | None
) -> MetricSink:
    """The sinks rank 0 writes to; other ranks get the no-op base."""
    if not is_main:
        return MetricSink()
    sinks: list[MetricSink] = []
    if metrics_file is not None:
        sinks.append(JsonlSink(metrics_file))
    if tensorboard_dir is not None:
        sinks.append(TensorBoardSink(tensorboard_dir))
    return MultiSink(sinks)
