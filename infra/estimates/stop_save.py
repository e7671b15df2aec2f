"""Whether a stop's save fits the time a stop has: a warning in the plan when it does not.

A stop (SIGTERM) lets the save in flight land and then writes the state of the step it stops
after (trainer.train `_stop`): the pod's grace period is sized for that
(`duration.shutdown_grace_seconds`). A Spot reclaim does not wait for it: EC2 reclaims the
instance two minutes after its interruption notice (AWS EC2 User Guide, "Spot Instance
interruption notices"), whatever `terminationGracePeriodSeconds` says.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from infra.estimates.duration import (
    CHECKPOINT_BYTES_PER_PARAMETER,
    checkpoint_write_bytes_per_s,
)
from trainer.presets import approx_num_parameters

if TYPE_CHECKING:
    from infra.config import StackConfig

SPOT_NOTICE_S = 120
"""From EC2's Spot interruption notice to the instance's reclaim."""


def storage_name(config: StackConfig) -> str:
    """Where checkpoints are written, as the throughput figure knows it."""
    fsx = config.storage.fsx
    if fsx.creates_file_system:
        return (
            f"FSx for Lustre ({fsx.per_unit_storage_throughput} MB/s/TiB x "
            f"{fsx.storage_capacity_gib} GiB)"
        )
    return "S3"


def stop_save_warnings(config: StackConfig, *, grace_s: int, checkpoint_s: float) -> list[str]:
    """A warning when a stop needs more than the capacity gives it (`grace_s`: SIGTERM to exit,
    a step and two saves; `checkpoint_s`: one save at the storage's throughput)."""
    if config.gpu_nodes.capacity.type != "spot" or grace_s <= SPOT_NOTICE_S:
        return []
    saved_gb = approx_num_parameters(config.model_shape()) * CHECKPOINT_BYTES_PER_PARAMETER / 1e9
    rate_gb_s = checkpoint_write_bytes_per_s(config) / 1e9
    faster = (
        "raise storage.fsx.perUnitStorageThroughput or storage.fsx.storageCapacityGiB"
        if config.storage.fsx.creates_file_system
        else "mount an FSx file system (storage.fsx)"
    )
    return [
        f"gpuNodes.capacity.type spot: a Spot reclaim comes {SPOT_NOTICE_S} s after its "
        f"notice, but a stop needs ~{grace_s} s (the step in flight; the save in flight and "
        f"the stop's own save, {saved_gb:,.0f} GB each at {rate_gb_s:.2f} GB/s to "
        f"{storage_name(config)}, ~{checkpoint_s:.0f} s each; a margin): a reclaim loses "
        "those saves and the run resumes from the last periodic one (training.checkpointEvery "
        f"{config.training.checkpoint_every} steps); {faster}, or use gpuNodes.capacity.type "
        "on-demand"
    ]
