"""Before step 1: are these the GPUs and the network the run was planned for?

Every rank checks its node (`gpus`, `efa`, `memlock`), so a bad GPU, missing EFA devices or a
silent NCCL fallback to sockets fail before the run is paid for; then all ranks compare a short
all-reduce's bus bandwidth with a floor for the instance type. `--preflight enforce` exits with
`PREFLIGHT_EXIT_CODE` (retryable); `warn` logs. Why and sources: docs/design/trainer.md#preflight
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from trainer.log import get_logger

logger = get_logger("preflight")

PREFLIGHT_EXIT_CODE = 140
"""Above 128, so `restartPolicy: ExitCode` retries it (training-operator v1.9.0
`IsRetryableExitCode`); distinct from a SIGTERM stop (143) and a hang (142)."""

EFA_DEVICE_DIR = Path("/dev/infiniband")
NCCL_NET_OFI = ("AWS Libfabric", "OFI")
ALLREDUCE_ITERATIONS = 5


class PreflightError(RuntimeError):
    """A check failed under `--preflight enforce`; the message is the one line to show."""


@dataclass(frozen=True)
class Expectations:
    """What the stack planned for each node (rendered by the job from the instance facts)."""

    gpu_model: str | None = None
    gpu_memory_gib: int | None = None
    efa_devices: int = 0
    busbw_floor_gbps: float = 0.0
    """GB/s of all-reduce bus bandwidth below which the network is broken (0: no floor)."""
    allreduce_mib: int = 64


def _check_gpus(expect: Expectations, device: torch.device, local_world_size: int) -> str | None:
    if device.type != "cuda":
        return None if expect.gpu_model is None else f"expected {expect.gpu_model} GPUs, got none"
    visible = torch.cuda.device_count()
    if visible < local_world_size:
        return f"{visible} GPU(s) visible, {local_world_size} requested"
    properties = torch.cuda.get_device_properties(device)
    if expect.gpu_model is not None and expect.gpu_model not in properties.name:
        return f"GPU is {properties.name!r}, expected {expect.gpu_model}"
    memory_gib = properties.total_memory / 2**30
    if expect.gpu_memory_gib is not None and memory_gib < 0.9 * expect.gpu_memory_gib:
        return f"GPU has {memory_gib:.0f} GiB, expected {expect.gpu_memory_gib} GiB"
    ones = torch.ones(256, 256, device=device)
    product = (ones @ ones).sum().item()  # one sync, once, before training
    if product != 256.0**3:
        return f"a 256x256 matmul of ones summed to {product}, not {256**3}"
    return None


def _check_efa(expect: Expectations) -> str | None:
    if expect.efa_devices <= 0:
        return None
    found = len(list(EFA_DEVICE_DIR.glob("uverbs*"))) if EFA_DEVICE_DIR.is_dir() else 0
    if found < expect.efa_devices:
        return f"{found} EFA device(s) in /dev/infiniband, expected {expect.efa_devices}"
    if os.environ.get("FI_PROVIDER") != "efa":
        return f"FI_PROVIDER is {os.environ.get('FI_PROVIDER')!r}, expected 'efa'"
    if os.environ.get("NCCL_NET", "").lower() not in {name.lower() for name in NCCL_NET_OFI}:
        return (
            f"NCCL_NET is {os.environ.get('NCCL_NET')!r}: NCCL may fall back to TCP sockets; "
            "expected 'AWS Libfabric' (the aws-ofi-nccl plugin, or fail)"
        )
    return None


CAP_IPC_LOCK = 14
"""Bit of CAP_IPC_LOCK in /proc/<pid>/status `CapEff` (include/uapi/linux/capability.h)."""
PROC_STATUS = Path("/proc/self/status")


def _has_ipc_lock() -> bool:
    """Whether this process holds CAP_IPC_LOCK, which lets it lock memory past the limit (the
    trainer's container drops every capability, so on the GPU nodes it does not)."""
    try:
        for line in PROC_STATUS.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_IPC_LOCK & 1)
    except OSError:
        pass
    return False


def _check_memlock(expect: Expectations) -> str | None:
    """EFA registers host memory with the kernel (`ibv_reg_mr` -> `ib_umem_get`,
    drivers/infiniband/core/umem.c), which refuses once the pinned pages pass the *soft*
    RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. A limit at or above the node's memory
    never binds; the GPU nodes' NodeConfig sets one (infra/platform/gpu_nodes.py)."""
    if expect.efa_devices <= 0:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return None
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if soft >= physical or _has_ipc_lock():
        return None
    return (
        f"RLIMIT_MEMLOCK is {soft / 2**20:g} MiB, below the node's {physical / 2**30:.0f} GiB: "
        "EFA cannot register NCCL's buffers (ibv_reg_mr fails with ENOMEM); raise the limit in "
        "the GPU nodes' containerd base runtime spec (nodeadm NodeConfig "
        "spec.containerd.baseRuntimeSpec, as infra/platform/gpu_nodes.py NODE_CONFIG does; "
        "docs/validation.md, 'Locked memory')"
    )


def allreduce_busbw_gbps(device: torch.device, mib: int) -> float:
    """Bus bandwidth of an all-reduce of `mib` MiB over every rank, in GB/s (nccl-tests'
    `busbw`: algorithm bandwidth x 2(n-1)/n). Collective."""
    world = dist.get_world_size()
    buffer = torch.ones(mib * 2**20 // 4, dtype=torch.float32, device=device)
    for _ in range(2):  # warm-up: connections, buffers
        dist.all_reduce(buffer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(ALLREDUCE_ITERATIONS):
        dist.all_reduce(buffer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / ALLREDUCE_ITERATIONS
    return buffer.numel() * 4 * 2 * (world - 1) / world / seconds / 1e9


def run_preflight(
    expect: Expectations,
    *,
    device: torch.device,
    local_world_size: int,
    mode: str,
    inject: str | None = None,
) -> list[str]:
    """Every check on every rank; returns the failures (the same list on every rank).
    Collective. Raises PreflightError under `enforce` when any check failed."""
    if mode == "off":
        return []
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("NODE_NAME") or os.uname().nodename
    mine: list[str] = []
    checks = {"gpus": lambda: _check_gpus(expect, device, local_world_size)}
    checks["efa"] = lambda: _check_efa(expect)
    checks["memlock"] = lambda: _check_memlock(expect)
    for name, check in checks.items():
        problem = check()
        if inject == name and rank == world - 1:
            problem = "injected by --preflight_fail_check"
        if problem is not None:
            mine.append(f"node {node} rank {rank}: {name}: {problem}")
    gathered: list[list[str] | None] = [None] * world
    dist.all_gather_object(gathered, mine)
    failures = [line for lines in gathered for line in lines or []]
    if not failures and world > 1:
        busbw = allreduce_busbw_gbps(device, expect.allreduce_mib)
        logger.info("preflight: all-reduce bus bandwidth %.1f GB/s over %d ranks", busbw, world)
        if busbw < expect.busbw_floor_gbps:
            failures.append(
                f"all ranks: allreduce: bus bandwidth {busbw:.1f} GB/s is below the floor "
                f"{expect.busbw_floor_gbps:g} GB/s for this instance type (NCCL over TCP, or a "
                "slow link: see NCCL_DEBUG=INFO)"
            )
    if not failures:
        logger.info("preflight: every check passed on %d rank(s)", world)
        return []
    for line in failures:
        logger.warning("preflight failed: %s", line)
    if mode == "enforce":
        raise PreflightError(f"preflight failed: {failures[0]}")
    return failures
