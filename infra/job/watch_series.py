"""The series the run's alerts and dashboard read, by the role each plays.

The trainer's names come from its own table (`trainer.telemetry_names`); the GPU and EFA names
from the exporters' (`infra.facts.exporter_metrics`). Rules and panels name a role here, so a
renamed series is one edit, and a test holds every name a query uses to what the exporters
serve.
"""

from __future__ import annotations

from trainer.telemetry_names import trainer_metric_names

# --- the trainer (trainer/telemetry_names.py) ---------------------------------------------
STEP = "fsdp_train_step"
MAX_STEPS = "fsdp_train_max_steps"
LOSS = "fsdp_train_loss"
TOKENS_PER_SECOND = "fsdp_train_tokens_per_second"
MFU = "fsdp_train_mfu_ratio"
STEP_SECONDS = "fsdp_train_step_duration_seconds"
DATA_WAIT_SECONDS = "fsdp_train_data_wait_seconds"
GRAD_NORM = "fsdp_train_grad_norm"
LAST_STEP_TIME = "fsdp_train_last_step_timestamp_seconds"
SKIPPED_STEPS = "fsdp_train_skipped_steps_total"
ROLLBACKS = "fsdp_train_rollbacks_total"
CHECKPOINT_STAGED_SECONDS = "fsdp_checkpoint_staged_seconds"
CHECKPOINT_DURABLE_SECONDS = "fsdp_checkpoint_durable_seconds"
CHECKPOINT_FAILURES = "fsdp_checkpoint_failures_total"
RESTARTS = "fsdp_run_restarts"
GOODPUT = "fsdp_run_goodput_ratio"
RUN_STATE = "fsdp_run_state"

TRAINER_SERIES = (
    STEP, MAX_STEPS, LOSS, TOKENS_PER_SECOND, MFU, STEP_SECONDS, DATA_WAIT_SECONDS, GRAD_NORM,
    LAST_STEP_TIME, SKIPPED_STEPS, ROLLBACKS, CHECKPOINT_STAGED_SECONDS,
    CHECKPOINT_DURABLE_SECONDS, CHECKPOINT_FAILURES, RESTARTS, GOODPUT, RUN_STATE,
)  # fmt: skip
assert set(TRAINER_SERIES) <= trainer_metric_names(), set(TRAINER_SERIES) - trainer_metric_names()

# --- NVIDIA DCGM exporter (NVIDIA/dcgm-exporter etc/default-counters.csv) ------------------
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""Percent, 0..100."""
GPU_MEMORY_USED_MIB = "DCGM_FI_DEV_FB_USED"
GPU_MEMORY_FREE_MIB = "DCGM_FI_DEV_FB_FREE"
GPU_POWER_WATTS = "DCGM_FI_DEV_POWER_USAGE"
GPU_TEMPERATURE_C = "DCGM_FI_DEV_GPU_TEMP"
GPU_LAST_XID = "DCGM_FI_DEV_XID_ERRORS"
"""The last XID error's code: non-zero once a GPU has reported one."""
GPU_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
"""1 when the GPU could not remap a failing memory row: the GPU must be replaced."""
GPU_UNCORRECTABLE_REMAPPED_ROWS = "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"
GPU_NODE_LABEL = "Hostname"
"""The node a DCGM series describes."""

# --- EFA counters per device (node_exporter's infiniband collector) -----------------------
EFA_RX_BYTES = "node_infiniband_port_data_received_bytes_total"
EFA_TX_BYTES = "node_infiniband_port_data_transmitted_bytes_total"
EFA_ERRORS: tuple[str, ...] = (
    "node_infiniband_port_errors_received_total",
    "node_infiniband_port_transmit_discards_total",
)
EFA_NODE_LABEL = "instance"
"""The node an EFA series describes."""

NODE_SERIES = (
    GPU_UTIL, GPU_MEMORY_USED_MIB, GPU_MEMORY_FREE_MIB, GPU_POWER_WATTS, GPU_TEMPERATURE_C,
    GPU_LAST_XID, GPU_ROW_REMAP_FAILURE, GPU_UNCORRECTABLE_REMAPPED_ROWS, EFA_RX_BYTES,
    EFA_TX_BYTES, *EFA_ERRORS,
)  # fmt: skip


def exported_names() -> frozenset[str]:
    """Every series name the exporters serve that rules and panels may name."""
    return trainer_metric_names() | frozenset(NODE_SERIES)
