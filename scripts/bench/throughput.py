"""Training throughput of a model preset on this machine: tokens/s (total and per GPU) and MFU.

    python scripts/bench/throughput.py --matrix          # the GPU matrix into docs/benchmarks.md
    torchrun --nproc_per_node=1 scripts/bench/throughput.py --model llama3.2-3b --seq_len 4096 \
        --batch_size 2 --steps 20 --warmup_steps 5 --compile 1 --activation_checkpointing off
    python scripts/bench/throughput.py --model tiny --seq_len 256 --batch_size 4 --device cpu

Runs the trainer's own pieces on synthetic tokens (`--loop plain`: a Hugging Face baseline).
Prints a table, then one JSON line (the last line of stdout) for scripts to parse.
Method: docs/design/bench.md#throughput
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # Run as a file (`torchrun scripts/bench/throughput.py`): make the repository importable.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from scripts.bench.matrix import DOCS, MATRIX_BATCH_SIZE, run_matrix
from scripts.bench.matrix import MODELS as MATRIX_MODELS
from trainer.config import AC_SWITCHES, TrainConfig, parse_switch
from trainer.distributed import (
    DistInfo,
    all_reduce_max,
    all_reduce_mean,
    build_mesh,
    init_distributed,
    shard_coordinate,
    shutdown,
)
from trainer.float8 import (
    FP8_RECIPES,
    PRECISIONS,
    Float8Error,
    after_optimizer_step,
    check_fp8_device,
    plan_float8,
)
from trainer.log import get_logger, setup_logging
from trainer.loss import install_chunked_loss
from trainer.metrics import (
    ThroughputModel,
    flops_per_token,
    peak_flops,
    peak_memory_gib,
)
from trainer.models import build_model, hf_config_from, materialize
from trainer.optim import build_optimizer
from trainer.parallelize import AC_MODES, ParallelPlan, parallelize_model, parameter_device
from trainer.presets import PRESETS, get_preset
from trainer.train import clip_grad_norm_

logger = get_logger("bench")

LOOPS = ("trainer", "plain")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="throughput.py",
        description="Training throughput (tokens/s/GPU) and MFU of a model preset, on "
        "synthetic tokens, with the trainer's own model, FSDP2 and optimizer code.",
        allow_abbrev=False,
    )
    add = parser.add_argument
    add("--model", default=None, help=f"Model preset: {', '.join(PRESETS)}.")
    add("--seq_len", type=int, default=4096, help="Tokens per sequence.")
    add(
        "--batch_size",
        type=int,
        default=None,
        help="Sequences per GPU per step (micro-batch); default 1, with --matrix 2.",
    )
    add("--steps", type=int, default=20, help="Timed steps.")
    add("--warmup_steps", type=int, default=5, help="Untimed steps first (compile, allocator).")
    add("--compile", type=parse_switch, default=False, help="torch.compile each decoder layer.")
    add(
        "--activation_checkpointing",
        type=lambda text: AC_SWITCHES.get(text.lower(), text),
        choices=("off", *AC_MODES),
        default="off",
        help="As the trainer's flag: off; full: every layer; op: keep attention and every "
        "second matmul; selective: every --ac_every-th layer (trainer.parallelize).",
    )
    add(
        "--loss_chunk_tokens",
        type=int,
        default=TrainConfig().parallel.loss_chunk_tokens,
        help="As the trainer's flag: the loss in slices of this many positions; 0: whole.",
    )
    add(
        "--ac_every",
        type=int,
        default=2,
        help="With --activation_checkpointing selective: one layer in N.",
    )
    add(
        "--sharding_strategy",
        choices=("full", "hybrid", "shard_grad_op", "no_shard"),
        default="full",
        help="As the trainer's flag.",
    )
    add("--bf16", type=parse_switch, default=True, help="bf16 mixed precision (fp32 master).")
    add(
        "--precision",
        choices=PRECISIONS,
        default="bf16",
        help="As the trainer's flag: fp8 runs the large decoder projections in float8 (torchao).",
    )
    add("--fp8_recipe", choices=FP8_RECIPES, default="rowwise", help="As the trainer's flag.")
    add(
        "--fp8_emulate",
        type=parse_switch,
        default=False,
        help="Testing: torchao's fp32 emulation of the float8 matmuls (CPU smoke runs).",
    )
    add(
        "--loop",
        choices=LOOPS,
        default="trainer",
        help="trainer: the trainer's pieces; plain: the Hugging Face loop a user would write "
        "(the baseline; one process).",
    )
    add("--cpu_offload", type=parse_switch, default=False, help="FSDP2 CPU offload.")
    add("--device", choices=("auto", "cuda", "cpu"), default="auto", help="Where to run.")
    add("--num_layers", type=int, default=None, help="Override the preset's layer count.")
    add(
        "--peak_tflops",
        type=float,
        default=0.0,
        help="Peak dense bf16 TFLOP/s per device for MFU; 0 uses the trainer's GPU table "
        "(no MFU on devices it does not know, e.g. CPUs).",
    )
    add("--seed", type=int, default=0, help="Seed for initial weights and synthetic tokens.")
    add("--json_out", type=Path, default=None, help="Also append the JSON line to this file.")
    matrix = parser.add_argument_group("matrix", "One command for the whole GPU table.")
    matrix.add_argument(
        "--matrix",
        type=parse_switch,
        nargs="?",
        const=True,
        default=False,
        help="Run every model x compile x activation-checkpointing cell (one process each) "
        "and write the table into --docs.",
    )
    matrix.add_argument(
        "--matrix_models",
        type=_comma_list,
        default=None,
        help=f"Comma-separated presets (default: {','.join(MATRIX_MODELS)}).",
    )
    matrix.add_argument(
        "--matrix_compile",
        type=lambda text: [parse_switch(v) for v in _comma_list(text)],
        default=[False, True],
        help="Comma-separated compile settings to run (default: 0,1).",
    )
    matrix.add_argument("--docs", type=Path, default=DOCS, help="Markdown file for the table.")
    matrix.add_argument("--cell_timeout", type=int, default=900, help="Seconds one cell may take.")
    return parser


def _comma_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size is None:
        args.batch_size = MATRIX_BATCH_SIZE if args.matrix else 1
    if args.matrix:
        unknown = [m for m in args.matrix_models or [] if m not in PRESETS]
        if unknown:
            parser.error(
                f"--matrix_models {unknown[0]!r} is not a preset; allowed: {', '.join(PRESETS)}"
            )
    elif args.model is None:
        parser.error("--model is required (or --matrix)")
    elif args.model not in PRESETS:
        parser.error(f"--model {args.model!r} is not a preset; allowed: {', '.join(PRESETS)}")
    if args.loss_chunk_tokens < 0:
        parser.error(f"--loss_chunk_tokens must be >= 0, got {args.loss_chunk_tokens}")
    for flag in ("seq_len", "batch_size", "steps", "ac_every"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if args.warmup_steps < 0:
        parser.error(f"--warmup_steps must be >= 0, got {args.warmup_steps}")
    if args.compile and args.warmup_steps < 1:
        parser.error("--compile 1 needs --warmup_steps >= 1 (the first step compiles)")
    if args.precision == "fp8" and not args.bf16:
        parser.error("--precision fp8 needs --bf16 1")
    if args.precision == "fp8" and not (args.compile or args.fp8_emulate or args.matrix):
        parser.error("--precision fp8 needs --compile 1 (float8 casts unfused are slower)")
    if args.fp8_emulate and args.precision != "fp8":
        parser.error("--fp8_emulate applies only to --precision fp8")
    if args.loop == "plain" and not args.matrix:
        if args.precision != "bf16" or args.activation_checkpointing != "off" or args.cpu_offload:
            parser.error(
                "--loop plain is the bf16 baseline: no --precision fp8, "
                "--activation_checkpointing or --cpu_offload"
            )
        if args.sharding_strategy != "full":
            parser.error("--loop plain runs one unsharded process: no --sharding_strategy")
    if args.num_layers is not None and args.num_layers < 1:
        parser.error(f"--num_layers must be >= 1, got {args.num_layers}")
    if args.peak_tflops < 0:
        parser.error(f"--peak_tflops must be >= 0, got {args.peak_tflops}")
    return args


@dataclass(frozen=True)
class BenchResult:
    """The figures of one benchmark run (rates are over the timed steps only)."""

    model: str
    params: int
    num_layers: int
    seq_len: int
    batch_size: int
    world_size: int
    device: str
    dtype: str
    loop: str
    precision: str
    compile: bool
    activation_checkpointing: str
    loss_chunk_tokens: int
    sharding_strategy: str
    steps: int
    warmup_steps: int
    tokens_per_step: int
    step_time_s: float
    tokens_per_sec: float
    tokens_per_sec_per_gpu: float
    model_tflops_per_gpu: float
    peak_tflops_per_gpu: float | None
    mfu: float | None
    peak_mem_gib: float
    final_loss: float
    torch_version: str

    def table(self) -> str:
        mfu = "n/a (unknown peak)" if self.mfu is None else f"{100 * self.mfu:.1f}%"
        peak = "unknown" if self.peak_tflops_per_gpu is None else f"{self.peak_tflops_per_gpu:g}"
        rows = [
            ("model", f"{self.model} ({self.params / 1e9:.3f}B params, {self.num_layers} layers)"),
            ("device", f"{self.world_size} x {self.device}"),
            ("loop", self.loop),
            ("precision", f"{self.precision} ({self.dtype})"),
            (
                "compile / AC",
                f"{int(self.compile)} / {self.activation_checkpointing}",
            ),
            ("loss", f"slices of {self.loss_chunk_tokens}" if self.loss_chunk_tokens else "whole"),
            ("sharding", self.sharding_strategy),
            ("batch", f"{self.batch_size} x {self.seq_len} tokens per GPU"),
            ("steps", f"{self.steps} timed after {self.warmup_steps} warm-up"),
            ("step time", f"{self.step_time_s:.4f} s"),
            ("tokens/s (total)", f"{self.tokens_per_sec:,.0f}"),
            ("tokens/s per GPU", f"{self.tokens_per_sec_per_gpu:,.0f}"),
            ("model TFLOP/s per GPU", f"{self.model_tflops_per_gpu:.4g}"),
            ("peak TFLOP/s per GPU", peak),
            ("MFU", mfu),
            ("peak memory", f"{self.peak_mem_gib:.2f} GiB"),
            ("final loss", f"{self.final_loss:.4f}"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "bench", **asdict(self)}


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_name(info: DistInfo) -> str:
    if info.device.type == "cuda":
        return torch.cuda.get_device_name(info.device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


Step = Callable[[torch.Tensor], torch.Tensor]


def _trainer_step(args: argparse.Namespace, info: DistInfo, hf_config: Any) -> tuple[Step, int]:
    """The trainer's pieces, in Trainer.train_step's order with one micro-batch."""
    model = build_model(hf_config)  # meta device: no memory yet
    if args.loss_chunk_tokens:
        install_chunked_loss(model, args.loss_chunk_tokens)
    mesh = build_mesh(info, args.sharding_strategy)
    float8 = None
    if args.precision == "fp8":
        check_fp8_device(info.device, emulate=args.fp8_emulate)
        float8 = plan_float8(
            args.fp8_recipe,
            emulate=args.fp8_emulate,
            shard_group_size=mesh.size(mesh.ndim - 1),
            cpu_offload=args.cpu_offload,
        )
    plan = ParallelPlan(
        sharding_strategy=args.sharding_strategy,
        bf16=args.bf16,
        activation_checkpointing=args.activation_checkpointing,
        ac_every=args.ac_every,
        compile=args.compile,
        cpu_offload=args.cpu_offload,
        float8=float8,
    )
    parallelize_model(model, mesh, plan)
    # As in the trainer: offloaded shards are materialised in CPU memory (FSDP2 refuses GPU ones),
    # the buffers the computation uses on the GPU.
    materialize(
        model,
        device=parameter_device(plan, info.device),
        buffer_device=info.device,
        seed=args.seed + shard_coordinate(mesh),
    )
    params = sum(p.numel() for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.1, beta1=0.9, beta2=0.95)

    def step(tokens: torch.Tensor) -> torch.Tensor:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        after_optimizer_step(model, float8)
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, params


def _plain_step(args: argparse.Namespace, info: DistInfo, hf_config: Any) -> tuple[Step, int]:
    """The baseline a user writes: the whole fp32 model on the device, bf16 autocast, SDPA,
    Hugging Face's loss, fused AdamW (on CUDA), clipping, whole-model torch.compile."""
    model = build_model(hf_config, device=info.device, seed=args.seed)
    params = sum(p.numel() for p in model.parameters())
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        trainable, lr=1e-4, weight_decay=0.1, betas=(0.9, 0.95), fused=info.device.type == "cuda"
    )
    forward = torch.compile(model) if args.compile else model

    def step(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(info.device.type, dtype=torch.bfloat16, enabled=args.bf16):
            loss = forward(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, params


def run_benchmark(args: argparse.Namespace, info: DistInfo) -> BenchResult:
    """Build the loop (the trainer's, sharded, or the plain baseline) and train the preset on
    synthetic tokens; collective over all ranks."""
    shape = get_preset(args.model)
    shape = shape.with_overrides(
        num_layers=args.num_layers,
        max_position_embeddings=max(shape.max_position_embeddings, args.seq_len),
    )
    hf_config = hf_config_from(shape)
    if args.loop == "plain" and info.world_size > 1:
        raise Float8Error("--loop plain is one process: run it with --nproc_per_node=1")
    build = _plain_step if args.loop == "plain" else _trainer_step
    train_step, params = build(args, info, hf_config)

    generator = torch.Generator(device=info.device).manual_seed(args.seed + info.rank)
    vocab = int(hf_config.vocab_size)

    def step() -> torch.Tensor:
        tokens = torch.randint(
            0, vocab, (args.batch_size, args.seq_len), device=info.device, generator=generator
        )
        return train_step(tokens)

    logger.info("bench: %d warm-up steps (not timed)", args.warmup_steps)
    for _ in range(args.warmup_steps):
        step()
    _synchronize(info.device)
    torch.distributed.barrier()
    logger.info("bench: %d timed steps", args.steps)
    started = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    _synchronize(info.device)
    elapsed = time.perf_counter() - started

    # The slowest rank sets the pace; the loss is the mean, as the trainer logs it.
    elapsed = float(all_reduce_max(torch.tensor(elapsed, device=info.device)).item())
    final_loss = float(all_reduce_mean(loss.float()).item())
    peak_mem = float(
        all_reduce_max(torch.tensor(peak_memory_gib(info.device), device=info.device)).item()
    )
    if not math.isfinite(final_loss):
        raise RuntimeError(f"bench: the loss is not finite ({final_loss}): the figures are void")

    peak = args.peak_tflops * 1e12 if args.peak_tflops else peak_flops(info.device)
    fpt = flops_per_token(hf_config, args.seq_len)
    throughput = ThroughputModel(
        samples_per_step=args.batch_size * info.world_size,
        seq_len=args.seq_len,
        world_size=info.world_size,
        flops_per_token=fpt,
        peak_flops_per_device=peak,
    )
    record = throughput.record(
        step=args.warmup_steps + args.steps,
        loss=final_loss,
        lr=1e-4,
        grad_norm=math.nan,
        elapsed_s=elapsed,
        steps=args.steps,
        peak_mem_gib=peak_mem,
        eta_s=0.0,
    )
    return BenchResult(
        model=args.model,
        params=params,
        num_layers=shape.num_layers,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        world_size=info.world_size,
        device=_device_name(info),
        dtype="bf16 compute, fp32 master/reduce" if args.bf16 else "fp32",
        loop=args.loop,
        precision=args.precision if args.precision == "bf16" else f"fp8 {args.fp8_recipe}",
        compile=args.compile,
        activation_checkpointing=args.activation_checkpointing,
        loss_chunk_tokens=args.loss_chunk_tokens,
        sharding_strategy=args.sharding_strategy,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        tokens_per_step=args.batch_size * args.seq_len * info.world_size,
        step_time_s=record.step_time_s,
        tokens_per_sec=record.tokens_per_sec,
        tokens_per_sec_per_gpu=record.tokens_per_sec_per_gpu,
        model_tflops_per_gpu=record.tokens_per_sec_per_gpu * fpt / 1e12,
        peak_tflops_per_gpu=None if peak is None else peak / 1e12,
        mfu=record.mfu,
        peak_mem_gib=peak_mem,
        final_loss=final_loss,
        torch_version=torch.__version__,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.matrix:
        return run_matrix(args)
    info = init_distributed(args.device, cpu_offload=args.cpu_offload)
    setup_logging(info.rank)
    try:
        result = run_benchmark(args, info)
    except Float8Error as error:
        # fp8 on a GPU without FP8 tensor cores (or the plain loop over ranks): one line.
        sys.stderr.write(f"throughput.py: error: {error}\n")
        return 2
    finally:
        shutdown()
    if info.is_main:
        line = json.dumps(result.to_json())
        print(result.table())
        print(line, flush=True)
        if args.json_out is not None:
            args.json_out.parent.mkdir(parents=True, exist_ok=True)
            with args.json_out.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
