"""All-reduce bandwidth across every process of a torchrun job, printed like nccl-tests.

Shipped to the cluster in a ConfigMap by `scripts/cli/validate.py` and run with
`torchrun` inside the trainer image (torch + NCCL + the AWS OFI plugin), so checking EFA needs
no MPI and no separate nccl-tests image. Output follows `all_reduce_perf`'s table (size,
count, type, redop, root, time, algbw, busbw, #wrong) and its `# Avg bus bandwidth` line, so
one parser reads both. Bus bandwidth is nccl-tests' definition for all-reduce:
`algbw * 2 * (n - 1) / n`, comparable with published figures.

    torchrun --nproc_per_node=2 infra/job/payloads/nccl_allreduce.py \
        --backend gloo --max-bytes 1048576
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

FLOAT_BYTES = 4


def bus_bandwidth(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s for one all-reduce of `size_bytes` that took `seconds`."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (world_size - 1) / world_size


def message_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """Sizes from `min_bytes` to `max_bytes`, multiplied by `factor`, whole float32 counts."""
    if not 0 < min_bytes <= max_bytes or factor < 2:
        raise ValueError(
            f"need 0 < --min-bytes ({min_bytes}) <= --max-bytes ({max_bytes}) and --factor "
            f"({factor}) >= 2"
        )
    sizes = []
    size = min_bytes
    while size <= max_bytes:
        sizes.append(max(FLOAT_BYTES, size - size % FLOAT_BYTES))
        size *= factor
    return sizes


def format_row(size: int, seconds: float, world_size: int, wrong: int) -> str:
    algbw, busbw = bus_bandwidth(size, seconds, world_size)
    return (
        f"{size:>12d}  {size // FLOAT_BYTES:>12d}  {'float':>8}  {'sum':>6}  {-1:>6d}  "
        f"{seconds * 1e6:>9.1f}  {algbw:>7.2f}  {busbw:>7.2f}  {wrong:>6d}"
    )


HEADER = (
    "#        size         count      type   redop    root   time(us)   algbw   busbw  #wrong\n"
    "#         (B)    (elements)                                        (GB/s)  (GB/s)"
)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-bytes", type=int, default=8 << 20)
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--factor", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    return parser.parse_args(argv)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    sizes = message_sizes(args.min_bytes, args.max_bytes, args.factor)
    dist.init_process_group(backend=args.backend)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if rank == 0:
        print(f"# nranks {world_size} backend {args.backend}", flush=True)
        print(HEADER, flush=True)
    busbws = []
    wrong_total = 0
    for size in sizes:
        buffer = torch.ones(size // FLOAT_BYTES, dtype=torch.float32, device=device)
        # Correctness once per size: all-reduce of ones is the world size everywhere.
        dist.all_reduce(buffer)
        wrong = int((buffer != world_size).sum().item())
        buffer.zero_()  # timed all-reduces of zeros stay finite however many ranks add up
        for _ in range(args.warmup):
            dist.all_reduce(buffer)
        _synchronize(device)
        start = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(buffer)
        _synchronize(device)
        # The slowest rank defines the collective's time, as in nccl-tests.
        elapsed = torch.tensor([(time.perf_counter() - start) / args.iters], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        counts = torch.tensor([wrong], device=device)
        dist.all_reduce(counts)
        wrong_total += int(counts.item())
        if rank == 0:
            seconds = float(elapsed.item())
            busbws.append(bus_bandwidth(size, seconds, world_size)[1])
            print(format_row(size, seconds, world_size, int(counts.item())), flush=True)
    if rank == 0:
        print(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}")
        print(f"# Avg bus bandwidth    : {sum(busbws) / len(busbws):.4f}", flush=True)
    dist.destroy_process_group()
    return 0 if wrong_total == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
