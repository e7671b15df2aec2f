"""`fsdp-eks status`'s live figures against the real Prometheus server (Debian's `prometheus`)
scraping a tiny exporter served by prometheus_client with the trainer's and DCGM's names."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from scripts.cli.support.live_metrics import (
    URL_ENV,
    LiveFigures,
    PlanPace,
    format_live,
    http_query,
    live_figures,
    live_text,
)
from tests.prometheus_tools import require_binary

LABELS = {"stack": "dev", "run": "dev-abc123", "node": "n1", "rank": "0"}
LAST_STEP_AGO_S = 1000.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def exporter() -> int:
    """A registry with the series `status` reads, served over HTTP; its port."""
    registry = CollectorRegistry()

    def gauge(name: str, value: float, **labels: str) -> None:
        metric = Gauge(name, name, list(labels), registry=registry)
        metric.labels(**labels).set(value)

    gauge("fsdp_train_step", 1200, **LABELS)
    gauge("fsdp_train_max_steps", 3500, **LABELS)
    gauge("fsdp_train_tokens_per_second", 180_000, **LABELS)
    gauge("fsdp_train_mfu_ratio", 0.33, **LABELS)
    gauge("fsdp_train_last_step_timestamp_seconds", time.time() - LAST_STEP_AGO_S, **LABELS)
    util = Gauge("DCGM_FI_DEV_GPU_UTIL", "util", ["node", "gpu"], registry=registry)
    util.labels(node="n1", gpu="0").set(90)
    util.labels(node="n1", gpu="1").set(94)
    util.labels(node="other-teams-node", gpu="0").set(5)  # not the run's: left out
    server, _ = start_http_server(0, addr="127.0.0.1", registry=registry)
    return int(server.server_port)


@pytest.fixture(scope="module")
def prometheus(exporter: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = require_binary("prometheus")
    folder: Path = tmp_path_factory.mktemp("prometheus")
    config = folder / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: run\n    static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        query = http_query(url)
        for _ in range(120):  # until the first scrapes landed (readiness, not a timing claim)
            try:
                if query("count(DCGM_FI_DEV_GPU_UTIL) == 3 and on () count(fsdp_train_step)"):
                    break
            except Exception:  # not listening yet
                pass
            time.sleep(0.5)
        else:
            pytest.fail("prometheus never scraped the exporter")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_live_figures_are_the_runs_as_prometheus_sees_them(prometheus: str) -> None:
    figures = live_figures(http_query(prometheus), stack="dev")
    assert figures is not None
    assert (figures.run, figures.step, figures.max_steps) == ("dev-abc123", 1200, 3500)
    assert figures.tokens_per_second == 180_000 and figures.mfu == pytest.approx(0.33)
    assert figures.gpu_utilisation_pct == pytest.approx(92)  # the run's node's GPUs only
    assert figures.last_step_age_s is not None
    assert LAST_STEP_AGO_S <= figures.last_step_age_s < LAST_STEP_AGO_S + 600


def test_a_stack_without_series_says_so(prometheus: str) -> None:
    assert live_figures(http_query(prometheus), stack="another") is None


def test_status_prints_one_line_against_the_plan(
    prometheus: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(URL_ENV, prometheus)
    line = live_text({}, stack="dev", region=None, plan=PlanPace(191_344, 0.35))
    assert line.startswith("  live (dev-abc123): step 1,200/3,500, ")
    assert "tokens/s 180,000 (plan 191,344)" in line and "MFU 33.0% (plan 35.0%)" in line
    assert line.endswith("GPU utilisation 92%") and "\n" not in line


def test_an_unreachable_source_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(URL_ENV, f"http://127.0.0.1:{free_port()}")
    line = live_text({}, stack="dev", region=None, plan=PlanPace(None, None))
    assert line.startswith("  live: metrics source not reachable (") and "\n" not in line


def test_no_source_named_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(URL_ENV, raising=False)
    line = live_text({}, stack="dev", region="us-west-2", plan=PlanPace(None, None))
    assert line.startswith("  live: no metrics source (set FSDP_EKS_PROMETHEUS_URL")


def test_missing_figures_print_as_dashes() -> None:
    figures = LiveFigures("r", None, None, None, None, None, None)
    assert format_live(figures, PlanPace(None, None)) == (
        "  live (r): step -; tokens/s -; MFU -; GPU utilisation -"
    )
