"""Time of one AdamW step over FSDP2's shards, the fused kernel against the per-parameter loop.

    python scripts/bench/optimizer_step.py                  # tiny preset, CPU, one rank
    python scripts/bench/optimizer_step.py --model llama3.2-1b --num_layers 2 --steps 5

Builds the trainer's model as the trainer does (meta device, `fully_shard`, materialised on
the CPU), takes one backward pass for the gradients, then times `--steps` optimizer steps of
`build_optimizer(fused=...)` for each implementation, alternating, twice. Prints one line per
implementation and a JSON line. What the CPU default (`trainer/optim.py`) rests on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
import torch.distributed as dist

from trainer.distributed import DistInfo, build_mesh
from trainer.models import build_model, hf_config_from, materialize
from trainer.optim import build_optimizer
from trainer.parallelize import ParallelPlan, parallelize_model
from trainer.presets import PRESETS, get_preset


def step_ms(model_name: str, num_layers: int, fused: bool, steps: int) -> float:
    """Milliseconds per optimizer step, after one untimed step (the state's allocation)."""
    shape = get_preset(model_name)
    if num_layers:
        shape = shape.with_overrides(num_layers=num_layers)
    info = DistInfo(
        rank=0, world_size=1, local_rank=0, local_world_size=1, device=torch.device("cpu"),
        backend="gloo",
    )  # fmt: skip
    model = build_model(hf_config_from(shape))
    parallelize_model(model, build_mesh(info, "full"), ParallelPlan(sharding_strategy="full"))
    materialize(model, device=torch.device("cpu"), seed=0)
    optimizer = build_optimizer(
        model, lr=1e-3, weight_decay=0.1, beta1=0.9, beta2=0.95, fused=fused
    )
    tokens = torch.randint(0, shape.vocab_size, (2, 64))
    model(input_ids=tokens, labels=tokens).loss.backward()
    optimizer.step()
    start = time.perf_counter()
    for _ in range(steps):
        optimizer.step()
    return (time.perf_counter() - start) / steps * 1000


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--num_layers", type=int, default=0, help="0: the preset's")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank of a CPU run (OMP_NUM_THREADS=1)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="tcp://127.0.0.1:0")
    try:
        timings: dict[str, list[float]] = {"loop": [], "fused": []}
        for _ in range(2):
            for name, values in timings.items():
                values.append(step_ms(args.model, args.num_layers, name == "fused", args.steps))
    finally:
        dist.destroy_process_group()
        torch.set_num_threads(threads)
    for name, values in timings.items():
        runs = ", ".join(f"{value:.2f}" for value in values)
        print(f"{name:>5}: {min(values):.2f} ms per optimizer step (runs: {runs})")
    print(json.dumps({"model": args.model, "steps": args.steps, "ms_per_step": timings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
