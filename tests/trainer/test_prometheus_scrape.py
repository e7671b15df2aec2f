"""A real Prometheus scrapes a real 2-rank torchrun run and sees the trainer's series move.

Debian's `prometheus` (2.42; `.ci/run` installs it) runs on loopback with a static target: the
port local rank 0 serves for both ranks (trainer.telemetry, multiprocess mode). The run trains
toward a step count it never reaches, so it is alive for as long as the test looks; every wait
polls Prometheus's HTTP API against a deadline, and the run is stopped at the end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.tiers import require_slow_tier
from tests.trainer.torchrun_util import REPO_ROOT, free_port, tiny_args, torchrun
from trainer.telemetry_names import TRAINER_METRICS
from trainer.tiny_assets import TinyAssets

pytestmark = pytest.mark.slow

PROMETHEUS = "/usr/bin/prometheus"
DEADLINE_S = 240.0
"""Bound on each wait: the run's start-up (imports, two ranks on two shared cores) included."""
RUN_ID = "prom-test-1a2b3c4d"
NOT_IN_THIS_RUN = {
    "fsdp_train_mfu_ratio",
    "fsdp_checkpoint_staged_seconds",
    "fsdp_checkpoint_durable_seconds",
    "fsdp_checkpoint_last_durable_step",
}


def _prometheus_or_skip() -> str:
    found = shutil.which("prometheus") or (PROMETHEUS if Path(PROMETHEUS).exists() else None)
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("CI must run the real-Prometheus test: install Debian's `prometheus`")
        pytest.skip("prometheus is not installed (apt-get install prometheus)")
    return found


def _descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc): torchrun starts each worker in a session
    of its own, so killing torchrun's process group leaves the workers training."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The field after the parenthesised command name: state, then the parent's pid.
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _stop(process: subprocess.Popen[Any]) -> None:
    """The process, its group and every process below it: nothing of the run outlives it."""
    below = _descendants(process.pid)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=60)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """A Prometheus on loopback scraping `127.0.0.1:<trainer port>` every 250 ms."""
    binary = _prometheus_or_skip()
    trainer_port, web_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
        "scrape_configs:\n  - job_name: trainer\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{trainer_port}']\n"
    )
    process = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("w"),
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{web_port}"
    try:
        wait_for(lambda: _ready(api), "Prometheus ready", process)
        yield api, trainer_port
    finally:
        _stop(process)


def _ready(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/-/ready", timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def query(api: str, promql: str) -> list[dict[str, Any]]:
    url = f"{api}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def wait_for(
    condition: Callable[[], Any],
    what: str,
    *processes: subprocess.Popen[Any],
    explain: Callable[[], str] = lambda: "",
) -> Any:
    """Poll until `condition()` is truthy; fail at the deadline or when a process ended."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        ended = [p.args for p in processes if p.poll() is not None]
        assert not ended, f"waiting for {what}: a process ended ({ended}) {explain()}"
        time.sleep(0.25)
    pytest.fail(f"no {what} within {DEADLINE_S:.0f} s {explain()}")


def by_rank(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["metric"]["rank"]: r for r in results}


def test_prometheus_sees_every_series_with_labels_and_the_step_moves(
    tiny_assets: TinyAssets, tmp_path: Path, prometheus: tuple[str, int]
) -> None:
    api, trainer_port = prometheus
    args = tiny_args(
        tiny_assets,
        max_steps=1_000_000,  # never reached: the run trains until the test stops it
        checkpoint_dir=tmp_path / "checkpoints" / RUN_ID,
        checkpoint_freq=0,
        metrics_file=tmp_path / "metrics.jsonl",
        metrics_port=trainer_port,
        watchdog_factor=0,
    )
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets_cache"),
        "PYTHONPATH": str(REPO_ROOT),
        "FSDP_EKS_STACK": "prom-test",
        "NODE_NAME": "test-node",
    }
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "trainer.log"
    require_slow_tier("torchrun with 2 trainer processes")
    run = subprocess.Popen(
        [*torchrun(2), "-m", "trainer", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        # Both ranks' steps, through the one port local rank 0 serves.
        def both_ranks_stepped() -> dict[str, dict[str, Any]] | None:
            steps = by_rank(query(api, "fsdp_train_step >= 1"))
            return steps if set(steps) == {"0", "1"} else None

        first = wait_for(both_ranks_stepped, "step >= 1 on ranks 0 and 1", run)
        for rank, result in first.items():
            labels = result["metric"]
            assert (labels["stack"], labels["run"], labels["node"], labels["rank"]) == (
                "prom-test",
                RUN_ID,
                "test-node",
                rank,
            )
        step_0 = float(first["0"]["value"][1])
        stamp_0 = float(
            query(api, 'fsdp_train_last_step_timestamp_seconds{rank="0"}')[0]["value"][1]
        )

        # A later scrape sees a later step, completed later.
        wait_for(
            lambda: query(api, f'fsdp_train_step{{rank="0"}} > {step_0}'), "the step moving", run
        )
        wait_for(
            lambda: query(api, f'fsdp_train_last_step_timestamp_seconds{{rank="0"}} > {stamp_0}'),
            "the last step's time moving",
            run,
        )
        # Run-wide figures once (rank 0), per-rank ones from both; both ranks are training.
        wait_for(lambda: query(api, "fsdp_train_loss"), "the loss", run)

        def wrong_series() -> list[str]:
            """Asked of one moment's data; a scrape that ran past its timeout on this busy
            machine marks every series stale until the next one, so it is asked again."""
            wrong = []
            for row in TRAINER_METRICS:
                if row.kind == "counter" or row.name in NOT_IN_THIS_RUN:
                    continue  # counted events, saves and MFU (no peak for a CPU) do not occur
                ranks = set(by_rank(query(api, row.name)))
                if ranks != ({"0", "1"} if row.per_rank else {"0"}):
                    wrong.append(f"{row.name} from ranks {sorted(ranks)}")
            training = set(by_rank(query(api, 'fsdp_run_state{state="training"} == 1')))
            if training != {"0", "1"}:
                wrong.append(f"training on ranks {sorted(training)}")
            if not query(api, 'up{job="trainer"} == 1'):
                wrong.append("the target not up")
            return wrong

        seen: list[list[str]] = []

        def all_right() -> bool:
            seen.append(wrong_series())
            return not seen[-1]

        wait_for(
            all_right,
            "every series from its ranks, both ranks training, the target up",
            run,
            explain=lambda: f"last asked: {seen[-1]}",
        )
    finally:
        _stop(run)
        output = log.read_text(errors="replace")
    assert "metrics: serving /metrics on port" in output, output[-3000:]
