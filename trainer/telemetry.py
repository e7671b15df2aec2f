"""The trainer's Prometheus metrics: the series of `trainer.telemetry_names`, served per pod.

Every rank writes through prometheus_client's multiprocess mode (prometheus_client 0.26
`values.py` `MultiProcessValue`) into a per-launch directory; local rank 0 serves `/metrics`.
Labels come from what the pod already says (`FSDP_EKS_STACK`, the run id, `NODE_NAME`, rank),
never new flags; values arrive as Python numbers, so no host-device sync. A port in use, or
`--metrics_port 0`, costs one warning line. Why and sources: docs/design/trainer.md#telemetry
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from trainer.log import get_logger
from trainer.metrics import MetricSink
from trainer.telemetry_names import (
    LABELS,
    NODE_ENV,
    RUN_ENV,
    RUN_STATES,
    STACK_ENV,
    STATE_LABEL,
    TRAINER_METRICS,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge

logger = get_logger("telemetry")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client's switch to multiprocess mode, read when it is first imported."""
UNSET = "unset"
"""A label whose source is missing (a run outside a pod): never empty, which Prometheus
would read as no label at all."""
FINAL_STATES = frozenset({"finished", "stopping", "failed"})


@dataclass(frozen=True)
class RunLabels:
    """The label values every series of one process carries (`telemetry_names.LABELS`)."""

    stack: str
    run: str
    node: str
    rank: int

    @classmethod
    def of_process(
        cls, *, rank: int, checkpoint_dir: str | None, env: Mapping[str, str] = os.environ
    ) -> RunLabels:
        run = env.get(RUN_ENV) or _run_id(checkpoint_dir)
        node = env.get(NODE_ENV) or socket.gethostname()
        return cls(stack=env.get(STACK_ENV) or UNSET, run=run, node=node, rank=rank)

    def values(self) -> tuple[str, str, str, str]:
        return (self.stack, self.run, self.node, str(self.rank))


def _run_id(checkpoint_dir: str | None) -> str:
    """The run directory's name: the job's run id (infra/job/flags.py `run_paths`), also for
    `s3://bucket/checkpoints/<run id>`."""
    if not checkpoint_dir:
        return UNSET
    return PurePosixPath(checkpoint_dir.rstrip("/")).name or UNSET


def launch_metrics_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The directory the local ranks of this launch share: under torchrun, one per agent (the
    workers' parent) and worker-group restart; outside it, one per process."""
    root = Path(tempfile.gettempdir()) / "fsdp-eks-metrics"
    if "TORCHELASTIC_RUN_ID" in env:
        return root / f"agent-{os.getppid()}-restart-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return root / f"process-{os.getpid()}"


def remove_stale_dirs(current: Path) -> list[Path]:
    """The directories beside `current` no process writes any more: an earlier restart of the
    same agent, or a launcher or process that has exited (their files would otherwise pile up
    in /tmp, a few sparse MiB each). Run by the process that serves `current`."""
    removed = []
    for sibling in current.parent.glob("*-*"):
        kind, _, rest = sibling.name.partition("-")
        owner = rest.partition("-restart-")[0]
        if sibling == current or kind not in ("agent", "process") or not owner.isdigit():
            continue
        earlier_restart = sibling.name.startswith(current.name.partition("-restart-")[0] + "-")
        if earlier_restart or not _alive(int(owner)):
            shutil.rmtree(sibling, ignore_errors=True)
            removed.append(sibling)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True


def prepare_process(port: int) -> None:
    """Before prometheus_client is imported (`python -m trainer`): multiprocess mode in a
    directory this launch's ranks share, unless metrics are off or the directory is set."""
    if port <= 0 or MULTIPROC_ENV in os.environ:
        return
    directory = launch_metrics_dir()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ[MULTIPROC_ENV] = str(directory)


def multiprocess_dir() -> Path | None:
    """The shared directory when this process writes in multiprocess mode, else None."""
    from prometheus_client import values

    if MULTIPROC_ENV not in os.environ or not getattr(values.ValueClass, "_multiprocess", False):
        return None
    return Path(os.environ[MULTIPROC_ENV])


class TrainerMetrics:
    """One prometheus_client object per row of the table, labelled with `LABELS`."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        from prometheus_client import Counter, Gauge

        self.registry = registry
        self.gauges: dict[str, Gauge] = {}
        self.counters: dict[str, Counter] = {}
        for row in TRAINER_METRICS:
            if row.kind == "counter":
                self.counters[row.name] = Counter(row.name, row.help, LABELS, registry=registry)
            else:
                labels = (*LABELS, STATE_LABEL) if row.kind == "enum" else LABELS
                self.gauges[row.name] = Gauge(
                    row.name, row.help, labels, registry=registry, multiprocess_mode="mostrecent"
                )


class Telemetry(MetricSink):
    """One process's series: set from the loop's hooks and from the records the trainer's
    sinks receive (`write`), so the loop itself gains only a few calls."""

    def __init__(self, labels: RunLabels, *, registry: CollectorRegistry | None = None) -> None:
        self.labels = labels
        self.metrics = TrainerMetrics(registry)
        self.state = ""
        self._server: Any = None
        self._skipped_seen = 0
        self._data_wait_s = 0.0
        self._steps_since_log = 0
        self.set_state("starting")

    # --- serving

    def serve(self, port: int, *, registry: CollectorRegistry, address: str = "0.0.0.0") -> bool:
        """Serve `registry` on `port`; a port in use is one warning, and no metrics."""
        from prometheus_client import start_http_server

        try:
            self._server, _thread = start_http_server(port, addr=address, registry=registry)
        except OSError as error:
            logger.warning(
                "metrics: cannot serve on port %d (%s); training goes on without them",
                port,
                error.strerror or error,
            )
            return False
        logger.info("metrics: serving /metrics on port %d for this node's ranks", port)
        return True

    # --- the loop's hooks (host-side only)

    def _gauge(self, name: str) -> Gauge:
        return self.metrics.gauges[name]

    def _set(self, name: str, value: float) -> None:
        self._gauge(name).labels(*self.labels.values()).set(value)

    def _inc(self, name: str, amount: float = 1.0) -> None:
        self.metrics.counters[name].labels(*self.labels.values()).inc(amount)

    @property
    def is_run_wide(self) -> bool:
        """Whether this process serves the figures of the whole run (global rank 0)."""
        return self.labels.rank == 0

    def set_state(self, state: str) -> str:
        """Make `state` the current one; returns the state before it."""
        if state not in RUN_STATES:
            raise ValueError(f"run state {state!r} is not one of {', '.join(RUN_STATES)}")
        previous, self.state = self.state, state
        gauge = self._gauge("fsdp_run_state")
        for each in RUN_STATES:
            gauge.labels(*self.labels.values(), each).set(1.0 if each == state else 0.0)
        return previous

    def step_completed(self, step: int, *, now: float | None = None) -> None:
        """After every step: its number and when it ended (a hang shows as that time's age)."""
        self._set("fsdp_train_step", step)
        self._set("fsdp_train_last_step_timestamp_seconds", time.time() if now is None else now)
        self._steps_since_log += 1

    def data_waited(self, seconds: float) -> None:
        """Time a step spent waiting for a batch (summed until the next logging step)."""
        self._data_wait_s += seconds

    # --- records (MetricSink)

    def write(self, record: dict[str, Any]) -> None:
        kind = record.get("kind")
        if kind == "train":
            self._train(record)
        elif kind == "run":
            self._run(record)
        elif kind == "stop":
            self.set_state("stopping")
        elif kind == "hang":
            self.set_state("failed")
        if not self.is_run_wide:
            return
        if kind == "checkpoint":
            self._checkpoint(record)
        elif kind == "rollback":
            self._inc("fsdp_train_rollbacks_total")

    def _train(self, record: dict[str, Any]) -> None:
        self._set("fsdp_train_step_duration_seconds", float(record["step_time_s"]))
        self._set("fsdp_train_data_wait_seconds", self._data_wait_s / max(self._steps_since_log, 1))
        self._data_wait_s, self._steps_since_log = 0.0, 0
        if not self.is_run_wide:
            return
        self._set("fsdp_train_loss", float(record["loss"]))
        self._set("fsdp_train_tokens_per_second", float(record["tokens_per_sec"]))
        self._set("fsdp_train_grad_norm", float(record["grad_norm"]))
        self._set("fsdp_train_learning_rate", float(record["lr"]))
        if record.get("mfu") is not None:  # unknown peak (CPU, an unlisted GPU): no series
            self._set("fsdp_train_mfu_ratio", float(record["mfu"]))
        skipped = int(record.get("skipped_updates", self._skipped_seen))
        if skipped > self._skipped_seen:
            self._inc("fsdp_train_skipped_steps_total", skipped - self._skipped_seen)
            self._skipped_seen = skipped

    def _run(self, record: dict[str, Any]) -> None:
        self._set("fsdp_train_step", int(record["step"]))
        if not self.is_run_wide:
            return
        max_steps = record.get("config", {}).get("optim", {}).get("max_steps")
        if max_steps is not None:
            self._set("fsdp_train_max_steps", int(max_steps))
        start = record.get("start") or {}
        if start:
            self._set("fsdp_run_restarts", int(start["attempt"]) - 1)
            self._set("fsdp_run_goodput_ratio", float(start["goodput"]))

    def _checkpoint(self, record: dict[str, Any]) -> None:
        self._set("fsdp_checkpoint_staged_seconds", float(record["staged_s"]))
        if record.get("durable_s") is None:
            self._inc("fsdp_checkpoint_failures_total")
            return
        self._inc("fsdp_checkpoint_saves_total")
        self._set("fsdp_checkpoint_durable_seconds", float(record["durable_s"]))
        self._set("fsdp_checkpoint_last_durable_step", int(record["step"]))

    def close(self) -> None:
        """The process ends: a run that did not finish or stop has failed."""
        if self.state not in FINAL_STATES:
            self.set_state("failed")
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def start_telemetry(
    *, port: int, rank: int, local_rank: int, checkpoint_dir: str | None
) -> Telemetry:
    """This process's series, served by local rank 0 for every rank of the pod.

    In multiprocess mode (`prepare_process` ran) the values go to the shared files and local
    rank 0 serves all of them; otherwise (the trainer built in a test, or metrics off) they
    stay in this process's own registry, which local rank 0 serves when a port is given.
    """
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    labels = RunLabels.of_process(rank=rank, checkpoint_dir=checkpoint_dir)
    shared = multiprocess_dir() if port > 0 else None
    own = None if shared is not None else CollectorRegistry()
    telemetry = Telemetry(labels, registry=own)
    if port <= 0:
        if local_rank == 0:
            logger.warning("metrics: --metrics_port 0, no Prometheus metrics are served")
        return telemetry
    if local_rank != 0:
        return telemetry
    served = own
    if shared is not None:
        if shared.parent == launch_metrics_dir().parent:  # ours, not a directory the user set
            remove_stale_dirs(shared)
        served = CollectorRegistry()
        MultiProcessCollector(served, path=str(shared))
    assert served is not None
    telemetry.serve(port, registry=served)
    return telemetry
