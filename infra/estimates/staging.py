"""What one node stages in /dev/shm for an asynchronous save.

An asynchronous save copies each rank's shards of the model and optimizer state into host
buffers in shared memory, so the upload process can read them (trainer.checkpoint_upload:
torch's stager allocates them with `_new_shared`, `distributed/checkpoint/_state_dict_stager.py`
at torch 2.13, POSIX shared memory, which Linux keeps in /dev/shm).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from infra.estimates.duration import CHECKPOINT_BYTES_PER_PARAMETER, async_saves
from infra.estimates.memory_fit import shard_size
from trainer.presets import approx_num_parameters

if TYPE_CHECKING:
    from infra.config import StackConfig

GIB = 2**30
STAGING_SHARE = 0.9
"""Share of /dev/shm the staged state may fill: NCCL and DataLoader workers use it too."""


def staged_bytes_per_node(config: StackConfig) -> int:
    """What one node's ranks stage per save: each rank's shard (1/shard size) of the fp32
    weights and AdamW moments, the checkpoint's precision; a replica stages its own copy."""
    per_rank = approx_num_parameters(config.model_shape()) * CHECKPOINT_BYTES_PER_PARAMETER
    return math.ceil(per_rank * config.gpus_per_node / shard_size(config))


def staging_shm_gib(config: StackConfig) -> int:
    """The /dev/shm a node needs for its staged state (0: saves are synchronous, and write
    from the trainer's own memory)."""
    if not async_saves(config):
        return 0
    return math.ceil(staged_bytes_per_node(config) / STAGING_SHARE / GIB)
