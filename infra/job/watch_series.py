"""The series the run's alerts and dashboard read, by the role each plays.

The trainer's names come from its own table (`trainer.telemetry_names`); the GPU and EFA names
from the exporters' (`infra.facts.exporter_metrics`). Rules and panels name a role here, so a
renamed series is one edit, and a test holds every name a query uses to what the exporters
serve.
"""

from __future__ import annotations

from infra.facts.exporter_metrics import efa_metric_name, metric_names
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

# --- NVIDIA DCGM exporter (infra/facts/exporter_metrics.py DCGM_COUNTERS) ----------------
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
"""Percent, 0..100."""
GPU_MEMORY_USED_MIB = "DCGM_FI_DEV_FB_USED"
GPU_MEMORY_FREE_MIB = "DCGM_FI_DEV_FB_FREE"
GPU_POWER_WATTS = "DCGM_FI_DEV_POWER_USAGE"
GPU_TEMPERATURE_C = "DCGM_FI_DEV_GPU_TEMP"
GPU_LAST_XID = "DCGM_FI_DEV_XID_ERRORS"
"""The last XID error's code: non-zero once a GPU has reported one since its driver loaded."""
GPU_XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"
"""XIDs reported in the exporter's last window, one series per `xid` code."""
GPU_HEALTH = "DCGM_EXP_GPU_HEALTH_STATUS"
"""DCGM's health watches per GPU: 0 is healthy."""
GPU_ROW_REMAP_FAILURE = "DCGM_FI_DEV_ROW_REMAP_FAILURE"
"""1 when the GPU could not remap a failing memory row: the GPU must be replaced."""
GPU_NODE_LABEL = "node"
"""The node a DCGM series describes: set at scrape time from the pod's node
(infra/platform/observability_manifests.py), the same label the trainer's series carry."""

# --- EFA counters per device (exporter_metrics.EFA_METRICS, `device` and `port` labels) ----
EFA_RX_BYTES = efa_metric_name("rx_bytes")
EFA_TX_BYTES = efa_metric_name("tx_bytes")
EFA_RETRANSMITTED_BYTES = efa_metric_name("retrans_bytes")
EFA_ERRORS: tuple[str, ...] = tuple(
    efa_metric_name(counter)
    for counter in (
        "rdma_read_wr_err",
        "rdma_write_wr_err",
        "retrans_timeout_events",
        "unresponsive_remote_events",
        "impaired_remote_conn_events",
    )
)
"""Counters that only move when something is wrong (drops and retransmits are shown, not
alerted on: a busy fabric has some)."""
EFA_NODE_LABEL = "node"
"""The node an EFA series describes, set at scrape time like the GPU series'."""

NODE_SERIES = (
    GPU_UTIL, GPU_MEMORY_USED_MIB, GPU_MEMORY_FREE_MIB, GPU_POWER_WATTS, GPU_TEMPERATURE_C,
    GPU_LAST_XID, GPU_XID_COUNT, GPU_HEALTH, GPU_ROW_REMAP_FAILURE, EFA_RX_BYTES, EFA_TX_BYTES,
    EFA_RETRANSMITTED_BYTES, *EFA_ERRORS,
)  # fmt: skip
_EMITTED = metric_names("dcgm") | metric_names("efa")
assert set(NODE_SERIES) <= _EMITTED, set(NODE_SERIES) - _EMITTED


def exported_names() -> frozenset[str]:
    """Every series name the trainer and the node exporters serve: all a query may name."""
    return trainer_metric_names() | _EMITTED
