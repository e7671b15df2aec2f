"""Kernels of one uncompiled training step, counted: the trainer's step against a plain loop.

    python scripts/bench/step_ops.py                     # table + JSON line, CPU, seconds
    python scripts/bench/step_ops.py --num_layers 4 --vocab_size 4096 --seq_len 128

Records every aten op of one step (a dispatch mode, after a warm-up step) for `plain`,
`trainer` and `trainer_shard_grad_op` and prints counts by kind and the bytes non-matmul ops
move, then one JSON line. CPU only, one rank. Method: docs/design/bench.md#step_ops
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MATMULS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
CASTS = frozenset({"_to_copy"})
COPIES = frozenset(
    {"copy_", "_foreach_copy_", "chunk_cat", "cat", "clone", "split_with_sizes_copy"}
)
NORM_AND_ROPE = frozenset({"pow", "mean", "rsqrt", "cos", "sin"})
"""The ops of Hugging Face's eager RMSNorm (pow, mean, rsqrt per norm) and rotary embedding
(cos, sin of the frequencies once per forward): the same modules run in every set-up."""
NOT_KERNELS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_local_scalar_dense",
        "_record_function_enter_new",
        "_record_function_exit",
        "detach",
        "alias",
        "_unsafe_view",
        "lift_fresh",
    }
)
"""Allocations, host reads, profiler markers and aliases: no kernel of their own."""


@dataclass
class StepOps:
    """One step's aten ops, by kind."""

    kernels: int = 0
    matmuls: int = 0
    matmul_flops: int = 0
    casts: int = 0
    cast_bytes: int = 0
    copies: int = 0
    copy_bytes: int = 0
    other_bytes: int = 0
    """Bytes read and written by non-matmul kernels other than casts and copies."""
    norm_and_rope: int = 0
    by_op: Counter[str] = field(default_factory=Counter)

    @property
    def memory_bound_bytes(self) -> int:
        return self.cast_bytes + self.copy_bytes + self.other_bytes

    def summary(self) -> dict[str, int]:
        values = {k: v for k, v in asdict(self).items() if k != "by_op"}
        return {**values, "memory_bound_bytes": self.memory_bound_bytes}


def _nbytes(tensors: Sequence[Any]) -> int:
    total = 0
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            total += local.numel() * local.element_size()
    return total


class OpRecorder(TorchDispatchMode):
    """Classifies every aten op dispatched while active (DTensor ops arrive as their local
    ops, since the mode sits below DTensor's dispatch)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = StepOps()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if func.is_view or name in NOT_KERNELS:
            return out
        ops = self.ops
        ops.kernels += 1
        ops.by_op[name] += 1
        inputs = tree_flatten((args, kwargs))[0]
        moved = _nbytes(inputs) + _nbytes(tree_flatten(out)[0])
        if name in MATMULS:
            ops.matmuls += 1
            first, second = (args[1], args[2]) if name in ("addmm", "baddbmm") else args[:2]
            *batch, rows, inner = first.shape
            columns = second.shape[-1]
            ops.matmul_flops += 2 * rows * inner * columns * (batch[0] if batch else 1)
        elif name in CASTS and "dtype" in (kwargs or {}) and kwargs["dtype"] != args[0].dtype:
            ops.casts += 1
            ops.cast_bytes += moved
        elif name in COPIES or name in CASTS:
            ops.copies += 1
            ops.copy_bytes += moved
        elif not name.startswith("_scaled_dot_product"):
            ops.other_bytes += moved
        if name in NORM_AND_ROPE:
            ops.norm_and_rope += 1
        return out


@dataclass(frozen=True)
class Shape:
    num_layers: int = 4
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 2
    loss_chunk_tokens: int = 64


def _config(shape: Shape) -> Any:
    from trainer.models import hf_config_from
    from trainer.presets import get_preset

    preset = get_preset("tiny").with_overrides(
        num_layers=shape.num_layers, vocab_size=shape.vocab_size
    )
    return hf_config_from(preset)


def _tokens(shape: Shape) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(
        0, shape.vocab_size, (shape.batch_size, shape.seq_len), generator=generator
    )


def _count(step: Callable[[], None]) -> StepOps:
    step()  # lazy initialisation (FSDP2's, the optimizer's states) is not a step's cost
    recorder = OpRecorder()
    with recorder:
        step()
    return recorder.ops


def plain_step_ops(shape: Shape) -> StepOps:
    """The loop a user writes around Hugging Face's model."""
    from trainer.models import build_model

    model = build_model(_config(shape), device=torch.device("cpu"), seed=0)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.1, fused=True)
    tokens = _tokens(shape)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _count(step)


def trainer_step_ops(shape: Shape, strategy: str = "full") -> StepOps:
    """The trainer's uncompiled step over a one-rank mesh (one GPU), with the trainer's code.

    Needs a one-rank default process group (`init_distributed("cpu")` outside torchrun)."""
    from trainer.distributed import DistInfo, build_mesh
    from trainer.loss import install_chunked_loss
    from trainer.models import build_model, materialize
    from trainer.optim import build_optimizer
    from trainer.parallelize import ParallelPlan, parallelize_model
    from trainer.train import clip_grad_norm_

    info = DistInfo(0, 1, 0, 1, torch.device("cpu"), "gloo")
    model = build_model(_config(shape))
    if shape.loss_chunk_tokens:
        install_chunked_loss(model, shape.loss_chunk_tokens)
    parallelize_model(model, build_mesh(info, strategy), ParallelPlan(strategy, bf16=True))
    materialize(model, device=info.device, seed=0)
    params = [p for p in model.parameters() if p.requires_grad]
    # fused=True: what build_optimizer picks on CUDA, the device these counts stand for.
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, fused=True)
    tokens = _tokens(shape)

    def step() -> None:
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _count(step)


def count_all(shape: Shape) -> dict[str, StepOps]:
    return {
        "plain": plain_step_ops(shape),
        "trainer": trainer_step_ops(shape, "full"),
        "trainer_shard_grad_op": trainer_step_ops(shape, "shard_grad_op"),
    }


def table(results: dict[str, StepOps]) -> str:
    rows = [
        ("kernels", "kernels"),
        ("matmuls", "matmuls"),
        ("matmul GFLOP", "matmul_flops"),
        ("casts", "casts"),
        ("cast MB", "cast_bytes"),
        ("copies", "copies"),
        ("copy MB", "copy_bytes"),
        ("other memory-bound MB", "other_bytes"),
        ("all memory-bound MB", "memory_bound_bytes"),
        ("RMSNorm + rotary ops", "norm_and_rope"),
    ]
    names = list(results)
    lines = [
        "| per step | " + " | ".join(names) + " |",
        "|---" * (len(names) + 1) + "|",
    ]
    for label, key in rows:
        cells = []
        for name in names:
            value = results[name].summary()[key]
            if key == "matmul_flops":
                cells.append(f"{value / 1e9:.3f}")
            elif key.endswith("bytes"):
                cells.append(f"{value / 1e6:.2f}")
            else:
                cells.append(str(value))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="step_ops.py", description=__doc__.split("\n")[0])
    defaults = Shape()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name}", type=int, default=value)
    args = parser.parse_args(argv)
    shape = Shape(**{name: getattr(args, name) for name in asdict(defaults)})
    for name, value in asdict(shape).items():
        if value < (0 if name == "loss_chunk_tokens" else 1):
            parser.error(f"--{name} must be >= 1, got {value}")
    from trainer.distributed import init_distributed, shutdown

    init_distributed("cpu")
    try:
        results = count_all(shape)
    finally:
        shutdown()
    print(table(results))
    print(json.dumps({"shape": asdict(shape), **{k: v.summary() for k, v in results.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
