"""What the run's metrics cost, and whether `observability.enabled: auto` collects them.

Amazon Managed Service for Prometheus bills the samples it ingests, the bytes it stores and the
hours a managed collector exists (`infra.facts.prices.AMP_PRICES`). Samples follow from the
series every GPU node serves (the trainer's per rank, DCGM's per GPU, EFA's per device, the
scrape's own per target: `series_per_node`) and the scrape interval. The collector bills
while it exists, run or no run, so its hours are standing cost; ingestion and storage follow
the run's hours. On an existing cluster's own Prometheus nothing is billed to the stack.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infra.config.observability import AUTO_SHARE_OF_GPU_COST
from infra.facts.exporter_metrics import EFA_COUNTERS, metric_names
from infra.facts.prices import (
    AMP_BYTES_PER_SAMPLE,
    AMP_PRICES,
    AMP_RETENTION_DAYS,
    PRICE_REGION,
    SOURCES,
)
from trainer.telemetry_names import RUN_STATES, TRAINER_METRICS

if TYPE_CHECKING:
    from infra.config import StackConfig

SCRAPE_SERIES_PER_TARGET = 5
"""Series Prometheus adds to every target it scrapes (`up`, `scrape_duration_seconds`,
`scrape_samples_scraped`, `scrape_samples_post_metric_relabeling`, `scrape_series_added`)."""
TARGETS_PER_NODE = 3
"""The trainer pod, the DCGM exporter and (on EFA nodes) the EFA exporter."""
_DAYS_PER_MONTH = 365 / 12


def trainer_series_per_rank() -> int:
    """The trainer's series per rank: each metric once, its run-state enum once per state."""
    enums = sum(1 for m in TRAINER_METRICS if m.kind == "enum")
    return len(TRAINER_METRICS) - enums + enums * len(RUN_STATES)


def series_per_node(config: StackConfig) -> int:
    """Series one GPU node serves: an upper bound (every rank's trainer series, every DCGM
    field on every GPU, every EFA counter on every device)."""
    nodes = config.gpu_nodes
    efa_devices = nodes.efa_interface_count
    targets = TARGETS_PER_NODE if efa_devices else TARGETS_PER_NODE - 1
    return (
        trainer_series_per_rank() * config.gpus_per_node
        + len(metric_names("dcgm")) * config.instance.gpus
        + len(EFA_COUNTERS) * efa_devices
        + SCRAPE_SERIES_PER_TARGET * targets
    )


@dataclass(frozen=True)
class MetricsPlan:
    """Whether the run's metrics are collected, where, and what they cost."""

    enabled: bool
    reason: str
    """Why `enabled` is what it is (the stack's word, or how `auto` resolved)."""
    destination: str
    """`managed-prometheus` (AMP, created or by ARN), `cluster-prometheus`, or `none`."""
    creates_workspace: bool
    series: int
    """Series the GPU nodes serve together while the job runs."""
    samples_per_hour: float
    usd_per_run_hour: float
    """Ingestion, storage of what was ingested (for the retention) and the collector's hour."""
    collector_usd_per_hour: float
    """The managed collector, billed while it exists: standing cost (0 without one)."""
    usd_per_run: float | None
    """At the run's expected hours; None when those are unknown."""
    gpu_share: float | None
    """usd_per_run_hour as a share of the GPU nodes' $/hour; None when unpriced."""
    confirmed: bool

    def summary(self) -> str:
        """One line for the plan: on/off and why, what it costs (or would)."""
        if self.destination == "none":
            return f"off: {self.reason}"
        verb = "" if self.enabled else "would cost "
        share = f" ({100 * self.gpu_share:.2f}% of the GPU cost)" if self.gpu_share else ""
        run = f", ~${self.usd_per_run:,.2f} per run" if self.usd_per_run is not None else ""
        where = {
            "managed-prometheus": "Amazon Managed Service for Prometheus"
            + (" (workspace created)" if self.creates_workspace else " (existing workspace)"),
            "cluster-prometheus": "the cluster's Prometheus (PodMonitors)",
        }[self.destination]
        sources = f"list prices, {PRICE_REGION}" + ("" if self.confirmed else " (unconfirmed)")
        return (
            f"{'on' if self.enabled else 'off'} ({self.reason}) -> {where}: {self.series:,} "
            f"series, {self.samples_per_hour:,.0f} samples/h; {verb}${self.usd_per_run_hour:.4f}"
            f"/run-hour{share}{run}, collector ${24 * self.collector_usd_per_hour:.2f}/day "
            f"standing; {sources}"
        )

    def as_outputs(self) -> dict[str, object]:
        return {
            "enabled": self.enabled,
            "destination": self.destination,
            "series": self.series,
            "samplesPerHour": self.samples_per_hour,
            "usdPerRunHour": self.usd_per_run_hour,
            "usdPerRun": self.usd_per_run,
            "collectorUsdPerHour": self.collector_usd_per_hour,
            "summary": self.summary(),
        }


def plan_metrics(
    config: StackConfig, *, gpu_usd_per_hour: float | None, expected_hours: float | None
) -> MetricsPlan:
    """Price the run's metrics and resolve `observability.enabled`."""
    obs = config.observability
    existing = config.cluster.mode == "existing"
    if obs.cluster_prometheus is None and obs.workspace_arn is None and existing:
        reason = "an existing cluster, and no observability.workspaceArn or clusterPrometheus"
        return MetricsPlan(
            enabled=False,
            reason=reason,
            destination="none",
            creates_workspace=False,
            series=0,
            samples_per_hour=0.0,
            usd_per_run_hour=0.0,
            collector_usd_per_hour=0.0,
            usd_per_run=None,
            gpu_share=None,
            confirmed=True,
        )
    series = series_per_node(config) * config.gpu_nodes.count
    samples_per_hour = series * 3600 / obs.scrape_interval_seconds
    managed = obs.destination == "managed-prometheus"
    if managed:
        ingest = samples_per_hour / 1e7 * AMP_PRICES["samples-ingested"].usd
        stored_gb = samples_per_hour * AMP_BYTES_PER_SAMPLE / 2**30
        storage = stored_gb * AMP_PRICES["storage"].usd * AMP_RETENTION_DAYS / _DAYS_PER_MONTH
        collector = AMP_PRICES["collector"].usd
    else:
        ingest = storage = collector = 0.0  # the cluster's Prometheus is its operators'
    per_run_hour = round(ingest + storage + collector, 6)
    share = per_run_hour / gpu_usd_per_hour if gpu_usd_per_hour else None
    if obs.enabled == "auto":
        enabled = share is not None and share < AUTO_SHARE_OF_GPU_COST
        reason = (
            f"auto: {'under' if enabled else 'not under'} "
            f"{100 * AUTO_SHARE_OF_GPU_COST:g}% of the GPU cost"
        )
    else:
        enabled = bool(obs.enabled)
        reason = f"observability.enabled {str(obs.enabled).lower()}"
    return MetricsPlan(
        enabled=enabled,
        reason=reason,
        destination=obs.destination,
        creates_workspace=managed and obs.workspace_arn is None,
        series=series,
        samples_per_hour=samples_per_hour,
        usd_per_run_hour=per_run_hour,
        collector_usd_per_hour=collector,
        usd_per_run=round(per_run_hour * expected_hours, 2) if expected_hours else None,
        gpu_share=share,
        confirmed=not managed or SOURCES["aws-amp-pricing"].confirmed,
    )
