"""The node exporters a run installs, pinned, and the metric names each emits.

Dashboards and alert rules are written against these names (`metric_names(exporter)`); each
name carries the upstream file that defines it at the pinned version. `dcgm`: dcgm-exporter with
our own counters CSV (`DCGM_COUNTERS`); `efa`: EFA hw_counters written by a shell loop to
node_exporter's textfile collector (`EFA_COUNTERS`). Why: docs/design/facts.md#exporter_metrics
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Exporter = Literal["dcgm", "efa"]
EXPORTERS: tuple[Exporter, ...] = ("dcgm", "efa")


@dataclass(frozen=True)
class UpstreamFile:
    """A file of a public repository at one pinned ref: where a name is defined."""

    repository: str
    path: str
    ref: str
    """A tag, with the commit it pointed at when read (tags can move)."""

    def cite(self) -> str:
        return f"{self.repository} {self.path} @ {self.ref}"


@dataclass(frozen=True)
class ExportedMetric:
    """One metric an exporter emits: its Prometheus name and type, and where it is defined."""

    name: str
    kind: Literal["gauge", "counter", "label"]
    help: str
    source: UpstreamFile


# --- NVIDIA dcgm-exporter ------------------------------------------------------------------

DCGM_EXPORTER_CHART_REPOSITORY = "https://nvidia.github.io/dcgm-exporter/helm-charts"
DCGM_EXPORTER_CHART_VERSION = "4.8.2"
"""dcgm-exporter Helm chart (`deployment/Chart.yaml` at tag 4.5.3-4.8.2: version 4.8.2)."""
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3-4.8.2-distroless"
"""The image tag the chart's `deployment/values.yaml` pins at tag 4.5.3-4.8.2 (DCGM 4.5.3)."""
DCGM_EXPORTER_PORT = 9400
"""The chart's `service.port`; its container port is named `metrics` (daemonset.yaml)."""

_DCGM_TAG = "4.5.3-4.8.2 (commit 691c92762eb551313c825f6efe4ceeee20982801)"
_DCGM_COUNTERS_CSV = UpstreamFile("NVIDIA/dcgm-exporter", "etc/default-counters.csv", _DCGM_TAG)
_DCGM_EXP_CONST = UpstreamFile("NVIDIA/dcgm-exporter", "internal/pkg/counters/const.go", _DCGM_TAG)

DCGM_COUNTERS: tuple[ExportedMetric, ...] = (
    # Each row is a line of default-counters.csv at the tag (active or commented there); the
    # exporter names the metric after the field. No DCGM_FI_PROF_* row: those need SYS_ADMIN.
    ExportedMetric("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", _DCGM_COUNTERS_CSV),
    ExportedMetric(
        "DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", _DCGM_COUNTERS_CSV
    ),
    ExportedMetric(
        "DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _DCGM_COUNTERS_CSV
    ),
    ExportedMetric(
        "DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _DCGM_COUNTERS_CSV
    ),
    ExportedMetric("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", _DCGM_COUNTERS_CSV),
    ExportedMetric(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", _DCGM_COUNTERS_CSV),
    ExportedMetric(
        "DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", _DCGM_COUNTERS_CSV
    ),
    ExportedMetric(
        "DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", _DCGM_COUNTERS_CSV
    ),
    ExportedMetric(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_POWER_VIOLATION",
        "counter",
        "Throttling duration due to power constraints (in ns).",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        "counter",
        "Throttling duration due to thermal constraints (in ns).",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "counter",
        "Number of remapped rows for uncorrectable errors",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gauge",
        "Whether remapping of rows has failed",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "counter",
        "Total number of PCIe retries.",
        _DCGM_COUNTERS_CSV,
    ),
    ExportedMetric(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes.",
        _DCGM_COUNTERS_CSV,
    ),
    # The exporter's own fields (const.go): XIDs counted per window with an `xid` label, and
    # DCGM's health watches per GPU (0 means healthy).
    ExportedMetric(
        "DCGM_EXP_XID_ERRORS_COUNT", "counter", "reported XIDs during last window", _DCGM_EXP_CONST
    ),
    ExportedMetric(
        "DCGM_EXP_GPU_HEALTH_STATUS", "counter", "DCGM reported health status", _DCGM_EXP_CONST
    ),
    # A label on every other metric (`DCGM_FI_DRIVER_VERSION="..."`), not a series of its own.
    ExportedMetric("DCGM_FI_DRIVER_VERSION", "label", "Driver Version", _DCGM_COUNTERS_CSV),
)


def dcgm_counters_csv() -> str:
    """The counters CSV the exporter reads (the chart's `customMetrics`): field, type, help."""
    lines = ["# DCGM FIELD, Prometheus metric type, help message (fsdp-eks)"]
    lines += [f"{m.name}, {m.kind}, {m.help}" for m in DCGM_COUNTERS]
    return "\n".join(lines) + "\n"


# --- EFA counters through node_exporter's textfile collector -------------------------------

NODE_EXPORTER_IMAGE = "quay.io/prometheus/node-exporter:v1.12.1"
"""node_exporter v1.12.1 (commit 6044da783597cc3b57aef7580ddcdcff58a4ee99): busybox-based
(its Dockerfile), so the same image runs the shell loop that writes the textfile."""
EFA_EXPORTER_PORT = 9100
"""node_exporter's default listen port (`--web.listen-address=:9100`)."""

_EFA_DRIVER_STATS = UpstreamFile(
    "amzn/amzn-drivers",
    "kernel/linux/efa/src/efa_verbs.c",
    "efa_linux_3.1.0 (commit 64788ef7c182a9383445942b5f5f77fe1d25a290)",
)

EFA_COUNTERS: tuple[tuple[str, str], ...] = (
    # The driver's EFA_DEFINE_PORT_STATS names (efa_verbs.c), read from ports/1/hw_counters.
    # The retransmit and remote-event counters exist on newer devices and drivers only; a file
    # that is absent is skipped, so the series is absent rather than zero.
    ("tx_bytes", "Bytes transmitted by the EFA device."),
    ("rx_bytes", "Bytes received by the EFA device."),
    ("tx_pkts", "Packets transmitted by the EFA device."),
    ("rx_pkts", "Packets received by the EFA device."),
    ("rx_drops", "Received packets the EFA device dropped."),
    ("rdma_read_bytes", "Bytes read by RDMA read requests."),
    ("rdma_write_bytes", "Bytes written by RDMA write requests."),
    ("rdma_read_wr_err", "RDMA read work requests that failed."),
    ("rdma_write_wr_err", "RDMA write work requests that failed."),
    ("retrans_bytes", "Bytes retransmitted by the EFA device."),
    ("retrans_pkts", "Packets retransmitted by the EFA device."),
    ("retrans_timeout_events", "Retransmission timeouts."),
    ("unresponsive_remote_events", "Times a remote peer stopped responding."),
    ("impaired_remote_conn_events", "Times a connection to a remote peer was impaired."),
)


def efa_metric_name(counter: str) -> str:
    """`efa_<counter>_total`: every EFA hw counter is monotonic, hence a `_total` counter."""
    return f"efa_{counter}_total"


EFA_METRICS: tuple[ExportedMetric, ...] = tuple(
    ExportedMetric(efa_metric_name(counter), "counter", text, _EFA_DRIVER_STATS)
    for counter, text in EFA_COUNTERS
)
EFA_LABELS = ("device", "port")
"""Labels of every EFA series: the rdma device (`efa_0`...) and its port (always 1 for EFA)."""


def exporter_metrics(exporter: Exporter) -> tuple[ExportedMetric, ...]:
    """What one exporter emits, with the upstream file that defines each name."""
    return {"dcgm": DCGM_COUNTERS, "efa": EFA_METRICS}[exporter]


def metric_names(exporter: Exporter) -> frozenset[str]:
    """The series names an exporter emits (labels left out): what a query may name."""
    return frozenset(m.name for m in exporter_metrics(exporter) if m.kind != "label")
