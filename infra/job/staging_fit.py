"""Whether a node's staged checkpoint fits the pod's /dev/shm (`infra.estimates.staging`).

The pod's /dev/shm is a memory-backed emptyDir of `job.shmSizeGiB` (`manifest.pod_size`): a
node whose ranks stage more than it holds fails at its first save, after the GPUs were paid for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.estimates.staging import GIB, STAGING_SHARE, staged_bytes_per_node, staging_shm_gib
from infra.job.manifest import max_shm_gib, pod_size

if TYPE_CHECKING:
    from infra.config import StackConfig


def staging_problems(config: StackConfig) -> list[str]:
    """A refusal, naming the key that fixes it, when a node's staged state overfills /dev/shm."""
    needed_gib = staging_shm_gib(config)
    shm_gib = pod_size(config).shm_gib
    if needed_gib <= shm_gib:
        return []
    fixes = "set training.extraArgs.async_checkpoint: 0 (every save then stops the steps)"
    if needed_gib <= max_shm_gib(config):
        fixes = f"raise job.shmSizeGiB to at least {needed_gib}, or {fixes}"
    else:
        fixes = f"add GPU nodes (gpuNodes.count) to shard the state further, or {fixes}"
    return [
        f"job.shmSizeGiB {shm_gib}: an asynchronous save stages "
        f"{staged_bytes_per_node(config) / GIB:,.0f} GiB of model and optimizer shards per "
        f"{config.gpu_nodes.instance_type} node in /dev/shm, more than {STAGING_SHARE:.0%} of "
        f"it (NCCL and data loaders use the rest); {fixes}"
    ]
