"""What a checkpoint save costs the training loop: blocked time, overlapping steps, durability.

    python scripts/bench/checkpoint_stall.py                          # GPU: 8 GB of state per rank
    python scripts/bench/checkpoint_stall.py --state-gb 1 --s3-state-gb 0.25   # a CPU-sized run

Saves `--state-gb` of state `--saves` times with the trainer's checkpoint manager, `sync`,
`torch default` and `async`, on a directory and on S3 (moto), and prints median blocked time,
overlap slowdown and time to durable: a table, then one JSON line. GPU targets (issue 23):
blocked <= 1 s per save up to 10 GB per rank, overlapping steps <= 5% slower.
Method: docs/design/bench.md#checkpoint_stall
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

BUCKET = "bench-checkpoints"
MODES = ("sync", "torch default", "async")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def init_world_of_one() -> Any:
    """A one-rank process group as torchrun would give the trainer; the device to train on."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
        )
    return device


def build(state_gb: float, width: int, device: Any) -> tuple[Any, Any, int]:
    """Linear layers holding `state_gb` of weights and AdamW moments; the moments exist."""
    import torch
    from torch import nn

    from trainer.optim import build_optimizer

    per_layer = 12 * (width * width + width)
    layers = max(1, round(state_gb * 1e9 / per_layer))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)]).to(device)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0, beta1=0.9, beta2=0.95)
    step_fn = _stepper(model, optimizer, width, device)
    step_fn()  # AdamW's moments are made by the first step
    return model, optimizer, layers * per_layer


def _stepper(model: Any, optimizer: Any, width: int, device: Any) -> Callable[[], float]:
    import torch

    batch = torch.randn(16, width, device=device)

    def step() -> float:
        started = time.perf_counter()
        loss = model(batch).float().pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    return step


class TorchDefault:
    """`dcp.async_save` given no stager, as the trainer called it before: the baseline."""

    def __init__(self, root: str) -> None:
        import torch.distributed as dist

        from trainer.checkpoint_store import open_store

        self.store = open_store(root)
        self.group = dist.new_group(backend="gloo")
        self.future: Any = None
        self.started = 0.0
        self.durable: list[float] = []

    def save(self, step: int, model: Any, optimizer: Any) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        self.wait()
        self.started = time.perf_counter()
        location = self.store.save_location(step)
        self.store.begin(step)
        model_state, optimizer_state = get_state_dict(model, optimizer)
        self.future = dcp.async_save(
            {"model": model_state, "optimizer": optimizer_state},
            storage_writer=self.store.writer(location),
            process_group=self.group,
        )

    def in_flight(self) -> bool:
        return self.future is not None and not self.future.done()

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()
            self.durable.append(time.perf_counter() - self.started)
            self.future = None


def measure(
    store: str, root: str, *, state_gb: float, width: int, saves: int, steps: int, device: Any
) -> list[dict[str, Any]]:
    from trainer.checkpoint import CheckpointManager

    model, optimizer, state_bytes = build(state_gb, width, device)
    step = _stepper(model, optimizer, width, device)
    rows = []
    for mode in MODES:
        manager: Any
        if mode == "torch default":
            manager = TorchDefault(f"{root}/default")
        else:
            manager = CheckpointManager(f"{root}/{mode}", keep_last=1, async_save=mode == "async")
        blocked, baseline, overlapping = [], [], []
        for index in range(saves):
            baseline += [step() for _ in range(steps)]
            started = time.perf_counter()
            if mode == "torch default":
                manager.save(index, model, optimizer)
            else:
                manager.save(
                    index, model=model, optimizer=optimizer, lr_scheduler=None, train_state={}
                )
            blocked.append(time.perf_counter() - started)
            for _ in range(steps):
                if not manager.in_flight():
                    break
                overlapping.append(step())
            manager.wait()
        if mode == "torch default":
            durable = manager.durable
        else:
            durable = [r.durable_s for r in manager.pop_finished() if r.durable_s is not None]
            manager.close()
        base = statistics.median(baseline)
        rows.append(
            {
                "store": store,
                "mode": mode,
                "device": device.type,
                "state_gb": round(state_bytes / 1e9, 2),
                "blocked_first_s": round(blocked[0], 3),
                "blocked_s": round(statistics.median(blocked[1:] or blocked), 3),
                "step_s": round(base, 4),
                "overlap_steps": len(overlapping),
                "overlap_slowdown_pct": (
                    round(100 * (statistics.median(overlapping) / base - 1), 1)
                    if overlapping
                    else None
                ),
                "durable_s": round(statistics.median(durable), 2) if durable else None,
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


MOTO_START_S = 120.0
"""Its import takes under a second on an idle machine; a busy one gets far longer."""


def start_moto() -> subprocess.Popen[bytes]:
    """moto's S3 server in its own process (it must not share this one's GIL)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + MOTO_START_S
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                sys.exit(f"moto's S3 server did not start on port {port}")
            time.sleep(0.1)
    # Set before the upload process is spawned: it inherits this environment.
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench",
        AWS_REGION="us-east-1",
    )
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return server


def _cell(value: Any, unit: str = "s") -> str:
    return "-" if value is None else f"{value}{unit}"


def main(argv: list[str] | None = None) -> int:
    import torch

    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=["fs", "s3", "both"], default="both")
    parser.add_argument(
        "--state-gb", type=float, default=8.0 if on_gpu else 1.0, help="checkpoint state, GB"
    )
    parser.add_argument("--s3-state-gb", type=float, default=1.0 if on_gpu else 0.25)
    parser.add_argument("--width", type=int, default=8192 if on_gpu else 2048)
    parser.add_argument("--saves", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8, help="steps per window")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    import torch.distributed as dist

    owned = not dist.is_initialized()
    device = init_world_of_one()
    try:
        return _measure_and_report(args, device)
    finally:
        if owned:  # called in-process (a test): leave no process group behind
            dist.destroy_process_group()


def _measure_and_report(args: argparse.Namespace, device: Any) -> int:
    rows: list[dict[str, Any]] = []
    common = {"width": args.width, "saves": args.saves, "steps": args.steps, "device": device}
    if args.store in ("s3", "both"):
        # First: the upload process, spawned at the first save, inherits the moto endpoint.
        server = start_moto()
        try:
            rows += measure("s3 (moto)", f"s3://{BUCKET}/run", state_gb=args.s3_state_gb, **common)
        finally:
            server.terminate()
    if args.store in ("fs", "both"):
        root = tempfile.mkdtemp(prefix="bench-ckpt-")
        try:
            rows += measure("fs", root, state_gb=args.state_gb, **common)
        finally:
            shutil.rmtree(root, ignore_errors=True)
    beat_us = watchdog_beat_cost_us()

    print(
        f"{'store':<10} {'mode':<14} {'state':>8} {'blocked 1st':>11} {'blocked':>8} "
        f"{'step':>8} {'overlap':>8} {'slower':>7} {'durable':>8}"
    )
    for row in rows:
        print(
            f"{row['store']:<10} {row['mode']:<14} {row['state_gb']:>5} GB "
            f"{row['blocked_first_s']:>10}s {row['blocked_s']:>7}s {row['step_s']:>7}s "
            f"{row['overlap_steps']:>8} {_cell(row['overlap_slowdown_pct'], '%'):>7} "
            f"{_cell(row['durable_s']):>8}"
        )
    print(f"device: {device.type}; watchdog beat(): {beat_us:.2f} µs per step")
    print(json.dumps({"checkpoint": rows, "watchdog_beat_us": round(beat_us, 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
