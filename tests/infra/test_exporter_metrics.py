"""The exporters' metric names: the contract dashboards and alert rules are written against."""

from __future__ import annotations

import csv
import io
import re

from infra.facts.exporter_metrics import (
    DCGM_COUNTERS,
    EXPORTERS,
    dcgm_counters_csv,
    efa_metric_name,
    exporter_metrics,
    metric_names,
)

_PROMETHEUS_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


def test_every_name_is_a_prometheus_name_with_a_source() -> None:
    for exporter in EXPORTERS:
        names = [m.name for m in exporter_metrics(exporter)]
        assert len(names) == len(set(names)), exporter
        for metric in exporter_metrics(exporter):
            assert _PROMETHEUS_NAME.match(metric.name), metric.name
            assert metric.source.repository and metric.source.path and metric.source.ref


def test_dcgm_csv_lists_every_counter_in_the_exporters_format() -> None:
    # dcgm-exporter reads "field, type, help" rows and skips '#' lines (etc/default-counters.csv).
    rows = [
        [cell.strip() for cell in row]
        for row in csv.reader(io.StringIO(dcgm_counters_csv()))
        if row and not row[0].startswith("#")
    ]
    assert [row[0] for row in rows] == [m.name for m in DCGM_COUNTERS]
    assert {row[1] for row in rows} <= {"gauge", "counter", "label"}


def test_metric_names_leave_out_labels_and_cover_what_a_dashboard_needs() -> None:
    dcgm = metric_names("dcgm")
    assert "DCGM_FI_DRIVER_VERSION" not in dcgm  # a label on the others, never a series
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_EXP_GPU_HEALTH_STATUS",
    } <= dcgm
    assert not any(name.startswith("DCGM_FI_PROF_") for name in dcgm)  # needs SYS_ADMIN
    efa = metric_names("efa")
    for counter in ("tx_bytes", "rx_bytes", "rx_drops", "retrans_pkts"):
        assert efa_metric_name(counter) in efa
    assert all(name.endswith("_total") for name in efa)
