"""The trainer's Prometheus metrics: one table of names, types, units and meanings.

The trainer's exporter (`trainer.telemetry`), the alert rules and the run's dashboard all read
this table, so a rule or a panel can name only a series the trainer serves (a test holds them
together). Names follow Prometheus conventions: the unit in the name, counters end in
`_total`, ratios are 0..1 (https://prometheus.io/docs/practices/naming/). No torch here: the
Pulumi program imports it to render rules and the dashboard.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PREFIX = "fsdp_"
LABELS: tuple[str, ...] = ("stack", "run", "node", "rank")
"""Every series carries these: the stack (experiment), the run id (its checkpoint directory's
name), the Kubernetes node the pod runs on, and the global rank of the process."""

DEFAULT_METRICS_PORT = 9450
"""The port each pod's local rank 0 serves `/metrics` on (`--metrics_port`; 0 turns it off).
Clear of the exporters a GPU node already runs (node_exporter 9100, DCGM exporter 9400)."""
METRICS_PORT_NAME = "metrics"
"""The trainer container's named port (infra/job/manifest.py): what a scrape config selects."""
STACK_ENV = "FSDP_EKS_STACK"
"""The pod's environment variable that holds the `stack` label (the job's name)."""
NODE_ENV = "NODE_NAME"
"""The `node` label: the pod template sets it from `spec.nodeName` (downward API)."""
RUN_ENV = "FSDP_EKS_RUN_ID"
"""Overrides the `run` label, which is otherwise the name of `--checkpoint_dir` (the run id)."""

RUN_STATES: tuple[str, ...] = (
    "starting",
    "training",
    "checkpointing",
    "rolling_back",
    "stopping",
    "finished",
    "failed",
)
"""The values of `fsdp_run_state`'s `state` label: one gauge per state, 1 for the current one.

Served as a labelled gauge, not prometheus_client's `Enum`: an Enum names its label after the
metric (`fsdp_run_state="training"`), and it does not work in multiprocess mode
(prometheus_client 0.26 `metrics.py` `Enum`), which serves the ranks of a pod (trainer.telemetry).
The text exposition is the same as an Enum's: a gauge sample per state."""
STATE_LABEL = "state"


@dataclass(frozen=True)
class MetricName:
    name: str
    kind: Literal["gauge", "counter", "enum"]
    help: str
    per_rank: bool = False
    """Served by every rank (what each rank measures itself); otherwise by global rank 0 only
    (figures of the whole run: one series per run, not one per GPU)."""


TRAINER_METRICS: tuple[MetricName, ...] = (
    MetricName("fsdp_train_step", "gauge", "Last completed optimizer step.", per_rank=True),
    MetricName("fsdp_train_max_steps", "gauge", "Optimizer steps the run trains to."),
    MetricName("fsdp_train_loss", "gauge", "Mean training loss over ranks at the last log."),
    MetricName(
        "fsdp_train_tokens_per_second", "gauge", "Global training tokens per second (last log)."
    ),
    MetricName(
        "fsdp_train_mfu_ratio", "gauge", "Model FLOPs utilisation, 0..1 (last log; GPU only)."
    ),
    MetricName(
        "fsdp_train_step_duration_seconds",
        "gauge",
        "Mean wall time of a step since the last log.",
        per_rank=True,
    ),
    MetricName(
        "fsdp_train_data_wait_seconds",
        "gauge",
        "Mean time a step waited for its batches since the last log.",
        per_rank=True,
    ),
    MetricName("fsdp_train_grad_norm", "gauge", "Global gradient norm at the last log."),
    MetricName("fsdp_train_learning_rate", "gauge", "Learning rate at the last log."),
    MetricName(
        "fsdp_train_last_step_timestamp_seconds",
        "gauge",
        "Unix time the last step completed: its age is how long nothing trained.",
        per_rank=True,
    ),
    MetricName(
        "fsdp_train_skipped_steps_total", "counter", "Updates skipped for a non-finite gradient."
    ),
    MetricName(
        "fsdp_train_rollbacks_total", "counter", "Rollbacks to the last checkpoint (divergence)."
    ),
    MetricName(
        "fsdp_checkpoint_staged_seconds",
        "gauge",
        "Seconds training was blocked by the last checkpoint save (state copied to host).",
    ),
    MetricName(
        "fsdp_checkpoint_durable_seconds",
        "gauge",
        "Seconds from the last save's start until it was durable on shared storage.",
    ),
    MetricName("fsdp_checkpoint_saves_total", "counter", "Checkpoint saves that became durable."),
    MetricName("fsdp_checkpoint_failures_total", "counter", "Checkpoint saves that failed."),
    MetricName(
        "fsdp_checkpoint_last_durable_step", "gauge", "Step of the newest durable checkpoint."
    ),
    MetricName("fsdp_run_restarts", "gauge", "Starts of this run after its first (all attempts)."),
    MetricName(
        "fsdp_run_goodput_ratio",
        "gauge",
        "Share of wall time since the first start not lost to restarts, 0..1.",
    ),
    MetricName(
        "fsdp_run_state", "enum", "What the run is doing (one state label is 1).", per_rank=True
    ),
)


def trainer_metric_names() -> frozenset[str]:
    """Every series name the trainer serves (counters with their `_total` suffix)."""
    return frozenset(m.name for m in TRAINER_METRICS)
