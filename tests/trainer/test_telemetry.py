"""The trainer's Prometheus exporter in-process: values, counters, states, labels, serving."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tests.trainer.torchrun_util import free_port
from trainer.config import parse_args
from trainer.telemetry import (
    RunLabels,
    Telemetry,
    launch_metrics_dir,
    remove_stale_dirs,
    start_telemetry,
)
from trainer.telemetry_names import DEFAULT_METRICS_PORT, LABELS, RUN_STATES, TRAINER_METRICS

LABELS_RANK0 = {"stack": "llama-p5", "run": "llama-p5-1a2b3c4d", "node": "ip-10-0-1-1", "rank": "0"}


def exporter(rank: int = 0) -> tuple[Telemetry, CollectorRegistry, dict[str, str]]:
    registry = CollectorRegistry()
    labels = RunLabels(stack="llama-p5", run="llama-p5-1a2b3c4d", node="ip-10-0-1-1", rank=rank)
    return Telemetry(labels, registry=registry), registry, {**LABELS_RANK0, "rank": str(rank)}


def train_record(step: int, **values: Any) -> dict[str, Any]:
    record = {
        "kind": "train",
        "step": step,
        "loss": 2.5,
        "lr": 3e-4,
        "grad_norm": 0.75,
        "tokens_per_sec": 12345.0,
        "mfu": 0.41,
        "step_time_s": 0.5,
        "skipped_updates": 0,
    }
    return {**record, **values}


def value(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


def test_a_logging_step_sets_the_run_figures_on_rank_0() -> None:
    telemetry, registry, labels = exporter()
    for step in (1, 2):
        telemetry.data_waited(0.1)
        telemetry.step_completed(step, now=1000.0 + step)
    telemetry.write(train_record(2))
    assert value(registry, "fsdp_train_step", labels) == 2
    assert value(registry, "fsdp_train_last_step_timestamp_seconds", labels) == 1002.0
    assert value(registry, "fsdp_train_loss", labels) == 2.5
    assert value(registry, "fsdp_train_tokens_per_second", labels) == 12345.0
    assert value(registry, "fsdp_train_mfu_ratio", labels) == 0.41
    assert value(registry, "fsdp_train_grad_norm", labels) == 0.75
    assert value(registry, "fsdp_train_learning_rate", labels) == 3e-4
    assert value(registry, "fsdp_train_step_duration_seconds", labels) == 0.5
    # Two steps waited 0.1 s each: the mean per step since the last log.
    assert value(registry, "fsdp_train_data_wait_seconds", labels) == pytest.approx(0.1)


def test_other_ranks_serve_only_what_they_measure_themselves() -> None:
    telemetry, registry, labels = exporter(rank=3)
    telemetry.step_completed(1, now=5.0)
    telemetry.write(train_record(1))
    telemetry.write({"kind": "rollback", "step": 1})
    assert value(registry, "fsdp_train_step", labels) == 1
    assert value(registry, "fsdp_train_step_duration_seconds", labels) == 0.5
    assert value(registry, "fsdp_train_loss", labels) is None
    assert value(registry, "fsdp_train_rollbacks_total", labels) is None
    per_rank = {row.name for row in TRAINER_METRICS if row.per_rank}
    assert per_rank == {
        "fsdp_train_step",
        "fsdp_train_step_duration_seconds",
        "fsdp_train_data_wait_seconds",
        "fsdp_train_last_step_timestamp_seconds",
        "fsdp_run_state",
    }


def test_no_mfu_series_without_a_known_peak() -> None:
    telemetry, registry, labels = exporter()
    telemetry.write(train_record(1, mfu=None))
    assert value(registry, "fsdp_train_mfu_ratio", labels) is None


def test_counters_count_skips_rollbacks_saves_and_failures() -> None:
    telemetry, registry, labels = exporter()
    # The record carries the run's cumulative skip count: the counter follows it.
    telemetry.write(train_record(10, skipped_updates=2))
    telemetry.write(train_record(20, skipped_updates=2))
    telemetry.write(train_record(30, skipped_updates=5))
    assert value(registry, "fsdp_train_skipped_steps_total", labels) == 5
    telemetry.write({"kind": "rollback", "step": 30, "to_step": 20})
    telemetry.write({"kind": "rollback", "step": 40, "to_step": 20})
    assert value(registry, "fsdp_train_rollbacks_total", labels) == 2
    saved = {"kind": "checkpoint", "step": 20, "staged_s": 1.5, "durable_s": 12.0}
    telemetry.write(saved)
    telemetry.write({**saved, "step": 40, "staged_s": 1.25, "durable_s": None, "error": "ENOSPC"})
    assert value(registry, "fsdp_checkpoint_saves_total", labels) == 1
    assert value(registry, "fsdp_checkpoint_failures_total", labels) == 1
    assert value(registry, "fsdp_checkpoint_staged_seconds", labels) == 1.25
    assert value(registry, "fsdp_checkpoint_durable_seconds", labels) == 12.0
    assert value(registry, "fsdp_checkpoint_last_durable_step", labels) == 20


def test_a_start_record_sets_restarts_goodput_and_the_target() -> None:
    telemetry, registry, labels = exporter()
    start = {"attempt": 3, "goodput": 0.875}
    telemetry.write(
        {"kind": "run", "step": 40, "start": start, "config": {"optim": {"max_steps": 100}}}
    )
    assert value(registry, "fsdp_run_restarts", labels) == 2
    assert value(registry, "fsdp_run_goodput_ratio", labels) == 0.875
    assert value(registry, "fsdp_train_max_steps", labels) == 100
    assert value(registry, "fsdp_train_step", labels) == 40


def states(registry: CollectorRegistry, labels: dict[str, str]) -> list[str]:
    return [
        state
        for state in RUN_STATES
        if value(registry, "fsdp_run_state", {**labels, "state": state}) == 1
    ]


def test_state_transitions() -> None:
    telemetry, registry, labels = exporter()
    assert states(registry, labels) == ["starting"]
    telemetry.set_state("training")
    resume = telemetry.set_state("checkpointing")
    assert states(registry, labels) == ["checkpointing"]
    telemetry.set_state(resume)
    assert states(registry, labels) == ["training"]
    # A stop record, then the end of the process: still stopping, not failed.
    telemetry.write({"kind": "stop", "step": 7, "signal": "SIGTERM"})
    telemetry.close()
    assert states(registry, labels) == ["stopping"]
    with pytest.raises(ValueError, match="run state 'paused' is not one of starting"):
        telemetry.set_state("paused")


def test_a_process_that_ends_without_finishing_has_failed() -> None:
    telemetry, registry, labels = exporter()
    telemetry.set_state("rolling_back")
    telemetry.close()
    assert states(registry, labels) == ["failed"]
    finished, registry, labels = exporter()
    finished.set_state("finished")
    finished.close()
    assert states(registry, labels) == ["finished"]
    hung, registry, labels = exporter()
    hung.write({"kind": "hang", "step": 3, "reason": "no step for 600 s"})
    assert states(registry, labels) == ["failed"]


def test_every_series_of_the_table_is_served_with_its_labels() -> None:
    telemetry, registry, _labels = exporter()
    telemetry.step_completed(1)
    telemetry.write({"kind": "run", "step": 0, "start": {"attempt": 1, "goodput": 1.0}})
    telemetry.write(train_record(1, skipped_updates=1))
    telemetry.write({"kind": "rollback", "step": 1})
    telemetry.write({"kind": "checkpoint", "step": 1, "staged_s": 1.0, "durable_s": 2.0})
    telemetry.write({"kind": "checkpoint", "step": 2, "staged_s": 1.0, "durable_s": None})
    telemetry.write({"kind": "run", "step": 0, "config": {"optim": {"max_steps": 9}}})
    served: dict[str, set[str]] = {}
    for family in registry.collect():
        for sample in family.samples:
            if not sample.name.endswith("_created"):
                served.setdefault(sample.name, set()).update(sample.labels)
    assert set(served) == {row.name for row in TRAINER_METRICS}
    for name, label_names in served.items():
        extra = {"state"} if name == "fsdp_run_state" else set()
        assert label_names == set(LABELS) | extra, name


def test_labels_come_from_the_pod_and_the_run_directory() -> None:
    env = {"FSDP_EKS_STACK": "llama-p5", "NODE_NAME": "ip-10-0-1-1"}
    labels = RunLabels.of_process(
        rank=5, checkpoint_dir="s3://bucket/checkpoints/llama-p5-1a2b3c4d/", env=env
    )
    assert labels.values() == ("llama-p5", "llama-p5-1a2b3c4d", "ip-10-0-1-1", "5")
    fsx = RunLabels.of_process(rank=0, checkpoint_dir="/fsx/checkpoints/run-9", env=env)
    assert fsx.run == "run-9"
    bare = RunLabels.of_process(rank=0, checkpoint_dir=None, env={"FSDP_EKS_RUN_ID": "r1"})
    assert (bare.stack, bare.run, bare.node) == ("unset", "r1", socket.gethostname())


def test_local_ranks_of_one_launch_share_a_directory_and_a_restart_gets_a_new_one() -> None:
    env = {"TORCHELASTIC_RUN_ID": "job", "TORCHELASTIC_RESTART_COUNT": "0"}
    first = launch_metrics_dir(env)
    assert launch_metrics_dir(env) == first
    assert launch_metrics_dir({**env, "TORCHELASTIC_RESTART_COUNT": "1"}) != first


def test_local_rank_0_serves_over_http() -> None:
    port = free_port()
    telemetry = start_telemetry(port=port, rank=0, local_rank=0, checkpoint_dir="/fsx/c/run-1")
    try:
        telemetry.step_completed(4)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    finally:
        telemetry.close()
    assert 'fsdp_train_step{node="' in text
    assert 'run="run-1",stack="unset"} 4.0' in text
    assert 'fsdp_run_state{node="' in text


def test_a_port_in_use_is_one_warning_and_the_run_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING):
            telemetry = start_telemetry(port=port, rank=0, local_rank=0, checkpoint_dir=None)
        telemetry.step_completed(1)  # still records
        telemetry.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"cannot serve on port {port}" in warnings[0], warnings


def test_metrics_off_is_one_warning_and_nothing_served(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        telemetry = start_telemetry(port=0, rank=0, local_rank=0, checkpoint_dir=None)
    telemetry.step_completed(1)
    assert telemetry._server is None
    telemetry.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["metrics: --metrics_port 0, no Prometheus metrics are served"]


def test_a_bad_metrics_port_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(["--metrics_port", "70000"])
    assert exited.value.code == 2
    assert "--metrics_port must be in [0, 65535], got 70000" in capsys.readouterr().err
    assert parse_args([]).logging.metrics_port == DEFAULT_METRICS_PORT


def test_the_serving_rank_removes_directories_no_process_writes(tmp_path: Path) -> None:
    """An earlier restart of this agent, and any launcher that exited, leave files nobody
    reads; another live launcher's directory (a second run on this machine) stays."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = os.getpid()
    current = tmp_path / f"agent-{live}-restart-2"
    kept = [current, tmp_path / f"agent-{os.getppid()}-restart-0", tmp_path / "unrelated"]
    stale = [tmp_path / f"agent-{live}-restart-1", tmp_path / f"process-{dead.pid}"]
    for directory in kept + stale:
        directory.mkdir()
    assert sorted(remove_stale_dirs(current)) == sorted(stale)
    assert sorted(p for p in tmp_path.iterdir()) == sorted(kept)
