"""Process groups, device choice and the device mesh for each sharding strategy."""

from __future__ import annotations

import datetime
import os
import socket
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.distributed_c10d import _set_pg_timeout

from trainer.log import get_logger

logger = get_logger("distributed")

# Long enough for a slow checkpoint write or a first torch.compile on one rank while the
# others wait in a collective; the awsome-distributed-training guides use 30 minutes too.
DEFAULT_TIMEOUT = datetime.timedelta(minutes=30)
REPLICATE_DIM = "replicate"
SHARD_DIM = "shard"


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job (torchrun's environment, or a single process)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device
    backend: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value in (None, "") else int(value)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pick_device(choice: str, local_rank: int) -> torch.device:
    """`auto`: this rank's GPU when there is one, else the CPU."""
    if choice not in ("auto", "cuda", "cpu"):
        raise ValueError(f"--device {choice!r} is not supported; allowed: auto, cuda, cpu")
    if choice == "cpu" or (choice == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("--device cuda was requested but torch sees no CUDA device")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def process_group_backend(device: torch.device, *, cpu_offload: bool = False) -> str:
    """nccl for GPU tensors, gloo for CPU ones; both when a GPU run offloads to the CPU.

    Under CPU offload the sharded parameters and gradients are CPU tensors, and the collectives
    on them (reducing the global gradient norm, the replica check) fail on an nccl-only group:
    NCCL takes no CPU tensors. A `cuda:nccl,cpu:gloo` group routes each tensor by its device.
    """
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if cpu_offload else "nccl"


ALLOCATOR_SETTINGS = "expandable_segments:True"
"""CUDA caching allocator settings every run gets (job, benchmark, bare metal alike):
expandable segments let the allocator grow a segment instead of leaving gaps, which FSDP's
per-layer gather/free pattern fragments (torch docs, "CUDA memory management")."""


def configure_cuda_allocator() -> None:
    """Default the allocator settings before the first CUDA allocation, which reads them
    once. A value the user exported (`PYTORCH_CUDA_ALLOC_CONF`, or its newer name
    `PYTORCH_ALLOC_CONF`) wins."""
    if "PYTORCH_CUDA_ALLOC_CONF" not in os.environ and "PYTORCH_ALLOC_CONF" not in os.environ:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = ALLOCATOR_SETTINGS


def init_distributed(device_choice: str = "auto", *, cpu_offload: bool = False) -> DistInfo:
    """Join (or, without torchrun, create) the default process group: nccl on GPU, gloo on CPU."""
    configure_cuda_allocator()
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    device = pick_device(device_choice, local_rank)
    backend = process_group_backend(device, cpu_offload=cpu_offload)
    if not dist.is_initialized():
        # Binding the GPU up front lets NCCL create its communicators eagerly and lets
        # barriers know their device.
        device_id = device if device.type == "cuda" else None
        if "MASTER_ADDR" in os.environ:
            dist.init_process_group(backend, timeout=DEFAULT_TIMEOUT, device_id=device_id)
        else:
            # A plain `python -m trainer`: a one-process group, so the same code path runs.
            dist.init_process_group(
                backend,
                init_method=f"tcp://127.0.0.1:{_free_port()}",
                rank=0,
                world_size=1,
                timeout=DEFAULT_TIMEOUT,
                device_id=device_id,
            )
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=local_world_size,
        device=device,
        backend=backend,
    )


def hsdp_shape(world_size: int, shard_size: int) -> tuple[int, int]:
    """(replicas, shard group size) for hybrid sharding; the shard size must divide the world."""
    if shard_size < 1 or world_size % shard_size:
        raise ValueError(
            f"hybrid sharding needs a shard group size that divides the world size {world_size}, "
            f"got {shard_size} (set --hsdp_shard_size, default LOCAL_WORLD_SIZE)"
        )
    return world_size // shard_size, shard_size


def build_mesh(info: DistInfo, strategy: str, hsdp_shard_size: int = 0) -> DeviceMesh:
    """The mesh `fully_shard` gets: 1-D for full/shard_grad_op, 2-D (replicate, shard) otherwise.

    `fully_shard` on a 2-D mesh is HSDP: parameters are sharded along `shard` and replicated
    along `replicate`, gradients reduce-scattered within a shard group then all-reduced across
    replicas. `no_shard` is the degenerate case with shard groups of one rank, i.e. DDP.
    """
    device_type = info.device.type
    if strategy in ("full", "shard_grad_op"):
        return init_device_mesh(device_type, (info.world_size,), mesh_dim_names=(SHARD_DIM,))
    if strategy == "hybrid":
        shape = hsdp_shape(info.world_size, hsdp_shard_size or info.local_world_size)
    elif strategy == "no_shard":
        shape = (info.world_size, 1)
    else:
        raise ValueError(
            f"--sharding_strategy {strategy!r} is not supported; "
            "allowed: full, hybrid, shard_grad_op, no_shard"
        )
    mesh = init_device_mesh(device_type, shape, mesh_dim_names=(REPLICATE_DIM, SHARD_DIM))
    for dim in (REPLICATE_DIM, SHARD_DIM):
        set_collective_timeout(mesh.get_group(dim))
    return mesh


def set_collective_timeout(group: dist.ProcessGroup) -> None:
    """Give a sub-group the default group's timeout.

    `new_group` without a timeout takes the backend's default, not the default group's
    (torch `distributed_c10d._new_group_with_tag`: `_get_default_timeout(backend)`, 10 min
    for NCCL), and DeviceMesh creates its sub-groups that way; a dimension that spans the
    whole world reuses the default group instead. So HSDP's and no_shard's groups would abort
    a slow collective (a checkpoint's, a straggler's) after 10 minutes while the rest wait 30.
    `_set_pg_timeout` is torch's API for exactly this change.
    """
    _set_pg_timeout(DEFAULT_TIMEOUT, group)


def shard_coordinate(mesh: DeviceMesh) -> int:
    """This rank's index along the mesh's shard dimension (0 for every rank of a replica set)."""
    return mesh.get_local_rank(SHARD_DIM)


def all_reduce_mean(value: torch.Tensor) -> torch.Tensor:
    """Mean over all ranks. Collective: every rank must call it at the same point."""
    reduced = value.detach().clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.SUM)
    return reduced / dist.get_world_size()


def all_reduce_max(value: torch.Tensor) -> torch.Tensor:
    reduced = value.detach().clone()
    dist.all_reduce(reduced, op=dist.ReduceOp.MAX)
    return reduced


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def exit_without_finalization(code: int) -> None:
    """Leave the process without the interpreter's finalization, once the run is closed.

    The process group is destroyed and every file written and closed by then; what is left is
    CPython tearing down modules while C++ threads of torch.distributed (gloo's work threads,
    the store's) may still hold objects with Python references. Destroying those during
    finalization takes the GIL of a dying interpreter and aborts the process (SIGABRT,
    "terminate called without an active exception": pytorch/pytorch#190489, and the analysis
    in pytorch/pytorch#179291, abandoned upstream). A finished run (or a test's worker) seen
    to abort after its work is done counts as failed, so skip what there is nothing left to do
    in. Call it only after the process group is destroyed and every file is closed.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
