"""The plan's memory estimate against a real training step's peak memory on this machine (CPU).

    python scripts/bench/memory_estimate.py                      # the default cases, one table
    torchrun --nproc_per_node=2 scripts/bench/memory_estimate.py --worker --model tiny --layers 4 \
        --batch_size 4 --seq_len 512                     # one case (what the table runs)

Each case runs the trainer's pieces on CPU with gloo and compares the peak RSS growth over a
baseline with `infra.estimates.memory_fit.estimate`. Prints a table, then one JSON line.
Method and its noise: docs/design/bench.md#memory_estimate
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

REPO_ROOT = Path(__file__).resolve().parents[2]

# (preset, layers, ranks, micro-batch, context, activation checkpointing)
CASES: list[tuple[str, int, int, int, int, bool]] = [
    ("tiny", 4, 1, 8, 512, False),
    ("tiny", 4, 2, 8, 512, False),
    ("tiny", 4, 2, 8, 512, True),
    ("llama3.2-1b", 2, 1, 1, 256, False),
    ("llama3.2-1b", 2, 2, 1, 256, False),
]


def max_rss_bytes() -> int:
    """Peak resident set of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(args: argparse.Namespace) -> None:
    """One rank: baseline RSS, build and train, peak RSS; writes its figures as JSON."""
    import torch

    from trainer.distributed import build_mesh, init_distributed, shard_coordinate, shutdown
    from trainer.models import build_model, hf_config_from, materialize
    from trainer.optim import build_optimizer
    from trainer.parallelize import ParallelPlan, parallelize_model
    from trainer.presets import get_preset
    from trainer.train import clip_grad_norm_

    torch.set_num_threads(1)
    info = init_distributed("cpu")
    shape = get_preset(args.model).with_overrides(num_layers=args.layers)
    generator = torch.Generator().manual_seed(info.rank)
    ids = torch.randint(0, shape.vocab_size, (args.batch_size, args.seq_len), generator=generator)
    baseline = max_rss_bytes()

    model = build_model(hf_config_from(shape))
    mesh = build_mesh(info, "full")
    # fp32 compute: bf16 matmuls on a CPU without bf16 units are far slower than fp32 ones.
    plan = ParallelPlan(
        bf16=False, activation_checkpointing="full" if args.activation_checkpointing else "off"
    )
    parallelize_model(model, mesh, plan)
    materialize(model, device=torch.device("cpu"), seed=shard_coordinate(mesh))
    # The fused kernel, as on a GPU (`build_optimizer` picks it there): the foreach path the
    # CPU would get allocates full-size temporaries in every step that a GPU run never has.
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.1, beta1=0.9, beta2=0.95, fused=True)
    parameters = [p for p in model.parameters() if p.requires_grad]
    for _ in range(args.steps):
        outputs = model(input_ids=ids, labels=ids)
        outputs.loss.backward()
        del outputs
        clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = max_rss_bytes()
    Path(args.out, f"rank{info.rank}.json").write_text(
        json.dumps({"rank": info.rank, "baseline": baseline, "peak": peak})
    )
    shutdown()


def estimate_bytes(preset: str, layers: int, ranks: int, batch: int, seq: int, ac: bool) -> int:
    """`infra.estimates.memory_fit`'s tensor terms for the same run (no CUDA allowance)."""
    from infra.estimates.memory_fit import RunShape, estimate
    from trainer.presets import get_preset

    shape = get_preset(preset).with_overrides(num_layers=layers)
    run = RunShape(
        shape=shape,
        micro_batch_size=batch,
        context_width=seq,
        shard_size=ranks,
        reshard_after_forward=True,
        checkpointed_layers=layers if ac else 0,
        bf16=False,
    )
    return sum(estimate(run).values())


def measure(case: tuple[str, int, int, int, int, bool], steps: int) -> dict[str, Any]:
    """Run one case under torchrun and return its figures (largest rank)."""
    preset, layers, ranks, batch, seq, ac = case
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={ranks}",
            str(Path(__file__).resolve()),
            "--worker",
            "--out",
            out,
            "--model",
            preset,
            "--layers",
            str(layers),
            "--batch_size",
            str(batch),
            "--seq_len",
            str(seq),
            "--activation_checkpointing",
            str(int(ac)),
            "--steps",
            str(steps),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
        subprocess.run(command, check=True, env=env, capture_output=True, text=True)
        ranks_figures = [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]
    measured = max(r["peak"] - r["baseline"] for r in ranks_figures)
    estimated = estimate_bytes(preset, layers, ranks, batch, seq, ac)
    return {
        "model": preset,
        "layers": layers,
        "ranks": ranks,
        "batch": batch,
        "seq_len": seq,
        "activation_checkpointing": ac,
        "measured_mib": round(measured / 2**20, 1),
        "estimate_mib": round(estimated / 2**20, 1),
        "error": round(estimated / measured - 1, 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="run one rank (under torchrun)")
    parser.add_argument("--out", default=".")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--activation_checkpointing", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    rows = [measure(case, args.steps) for case in CASES]
    print(
        f"{'model':<12} {'layers':>6} {'ranks':>5} {'batch x seq':>11} {'AC':>3} "
        f"{'measured MiB':>12} {'estimate MiB':>12} {'error':>7}"
    )
    for row in rows:
        checkpointing = "yes" if row["activation_checkpointing"] else "no"
        print(
            f"{row['model']:<12} {row['layers']:>6} {row['ranks']:>5} "
            f"{row['batch']:>4} x {row['seq_len']:<4} {checkpointing:>3} "
            f"{row['measured_mib']:>12.1f} {row['estimate_mib']:>12.1f} {row['error']:>+7.1%}"
        )
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
