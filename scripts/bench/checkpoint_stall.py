"""How long a checkpoint save stalls training: synchronous versus asynchronous, disk and S3.

    python scripts/bench/checkpoint_stall.py                       # the default table (both stores)
    python scripts/bench/checkpoint_stall.py --store fs --params-millions 400 --saves 3

One process on the CPU runs the trainer's own checkpoint manager (trainer.checkpoint) on a model
of `--params-millions` parameters (a stack of 4096x4096 linear layers: the state a DCP save
writes is its fp32 weights and AdamW's two moments, 12 bytes per parameter, as for the real
models). Each round times `--steps` training steps, then saves and takes `--steps` more; the
figures are medians per save:

* stall: how long `save()` held the training loop (synchronous: the whole write; asynchronous:
  staging the state into host memory and starting the background write);
* cost: the wall time the save added to a window of `--steps` steps, the checkpoint published
  at its end (the window with the save, `wait()` included, minus the same steps without one).
  On this CPU the background write competes with the steps for the same two cores; on a GPU
  node the steps run on the GPUs and the write on idle host cores, so there the cost of an
  asynchronous save approaches its stall;
* steps: the window without a save, for scale.

The filesystem store writes under the temp dir; the S3 store writes through s3torchconnector to
moto's S3 server on loopback (a subprocess), so its absolute times are this machine's, not
S3's. What carries over to a GPU node is the ratio: the asynchronous stall is a device-to-host
copy there (tens of GB/s), not the write. Also prints the hang watchdog's cost per step (its
`beat()`, the only thing it adds to a step). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

LAYER_WIDTH = 4096
BUCKET = "bench-checkpoints"


def build(params_millions: int) -> tuple[Any, Any]:
    import torch
    from torch import nn

    from trainer.optim import build_optimizer

    layers = max(1, round(params_millions * 1e6 / (LAYER_WIDTH * LAYER_WIDTH + LAYER_WIDTH)))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(LAYER_WIDTH, LAYER_WIDTH) for _ in range(layers)])
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0, beta1=0.9, beta2=0.95)
    return model, optimizer


def train_steps(model: Any, optimizer: Any, steps: int) -> float:
    """Seconds for `steps` steps of a small batch (the AdamW moments exist after the first)."""
    import torch

    batch = torch.randn(8, LAYER_WIDTH)
    started = time.perf_counter()
    for _ in range(steps):
        loss = model(batch).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - started


def measure(store: str, root: str, *, params_millions: int, saves: int, steps: int) -> list[dict]:
    from trainer.checkpoint import CheckpointManager

    model, optimizer = build(params_millions)
    parameters = sum(p.numel() for p in model.parameters())
    train_steps(model, optimizer, 1)
    rows = []
    for mode in ("sync", "async"):
        manager = CheckpointManager(f"{root}/{mode}", keep_last=1, async_save=mode == "async")
        stalls, costs, baselines = [], [], []
        for index in range(saves):
            baseline = train_steps(model, optimizer, steps)
            started = time.perf_counter()
            manager.save(index, model=model, optimizer=optimizer, lr_scheduler=None, train_state={})
            stalls.append(time.perf_counter() - started)
            train_steps(model, optimizer, steps)
            manager.wait()
            costs.append(time.perf_counter() - started - baseline)
            baselines.append(baseline)
        rows.append(
            {
                "store": store,
                "mode": mode,
                "params_millions": round(parameters / 1e6),
                "state_gb": round(parameters * 12 / 1e9, 2),
                "stall_s": round(statistics.median(stalls), 3),
                "window_cost_s": round(statistics.median(costs), 3),
                "steps_s": round(statistics.median(baselines), 3),
            }
        )
    return rows


def watchdog_beat_cost_us(beats: int = 100_000) -> float:
    from trainer.watchdog import HangWatchdog

    watchdog = HangWatchdog(factor=10.0, floor_s=600.0, on_hang=lambda reason: None)
    try:
        started = time.perf_counter()
        for step in range(beats):
            watchdog.beat(step)
        return (time.perf_counter() - started) / beats * 1e6
    finally:
        watchdog.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    """moto's S3 server in its own process (it must not share this one's GIL)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            time.sleep(0.1)
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
    )
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return server, endpoint


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["fs", "s3", "both"], default="both")
    parser.add_argument("--params-millions", type=int, default=400, help="filesystem model size")
    parser.add_argument("--s3-params-millions", type=int, default=100, help="S3 model size")
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))

    rows: list[dict] = []
    if args.store in ("fs", "both"):
        root = tempfile.mkdtemp(prefix="bench-ckpt-")
        try:
            rows += measure(
                "fs", root, params_millions=args.params_millions, saves=args.saves,
                steps=args.steps,
            )  # fmt: skip
        finally:
            shutil.rmtree(root, ignore_errors=True)
    if args.store in ("s3", "both"):
        server, _ = start_moto()
        try:
            rows += measure(
                "s3 (moto)", f"s3://{BUCKET}/run", params_millions=args.s3_params_millions,
                saves=args.saves, steps=args.steps,
            )  # fmt: skip
        finally:
            server.terminate()
    beat_us = watchdog_beat_cost_us()

    print(
        f"{'store':<10} {'mode':<6} {'params':>7} {'state':>8} {'stall':>8} {'cost':>8} "
        f"{'steps':>8}"
    )
    for row in rows:
        print(
            f"{row['store']:<10} {row['mode']:<6} {row['params_millions']:>6}M "
            f"{row['state_gb']:>6} GB {row['stall_s']:>7.2f}s {row['window_cost_s']:>7.2f}s "
            f"{row['steps_s']:>7.2f}s"
        )
    print(f"watchdog beat(): {beat_us:.2f} µs per step")
    print(json.dumps({"checkpoint": rows, "watchdog_beat_us": round(beat_us, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
