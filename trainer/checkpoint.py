"""Crash-safe, resumable, optionally asynchronous checkpoints with torch.distributed.checkpoint.

The collective protocol around a store (trainer.checkpoint_store): every rank writes, DCP's
coordinator gathers the writes, and only then does rank 0 publish the checkpoint (the
``COMPLETE`` marker, written last), so resume never picks one a crash cut short. Async saves
stage into reused host buffers and upload from a separate process (trainer.checkpoint_upload);
at most one save is in flight. All ranks call ``save``, ``load`` and ``wait`` (collective).
Why and sources: docs/design/trainer.md#checkpoint
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import random
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, StorageWriter
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from trainer.cadence import Every
from trainer.checkpoint_store import (
    COMPLETE_MARKER,
    CheckpointStore,
    open_store,
    split_location,
    step_of,
)
from trainer.checkpoint_upload import (
    StagingBuffers,
    UploadPlanner,
    describe_failure,
    on_device,
    stop_upload_process,
    stop_upload_process_at_exit,
)
from trainer.distributed import DEFAULT_TIMEOUT
from trainer.float8 import plain_float8_weights
from trainer.log import get_logger
from trainer.optim import load_schedule_position

logger = get_logger("checkpoint")

__all__ = [
    "COMPLETE_MARKER",
    "CheckpointError",
    "CheckpointManager",
    "SaveFaults",
    "SaveRecord",
    "UnreadableCheckpointError",
    "checkpoint_state",
    "find_latest",
]


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or does not fit the run that tries to load it."""


class UnreadableCheckpointError(CheckpointError):
    """A complete checkpoint whose files fail to load (truncated, corrupt, unreadable)."""


class SaveFaults(Protocol):
    """Where tests inject faults into a save (trainer.faults.FaultInjector)."""

    def inside_save(self, step: int) -> None:
        """Called after this rank's train_state is written, before its shards."""

    def storage_writer(self, step: int, writer: StorageWriter) -> StorageWriter:
        """The writer to write this rank's shards with."""


# --- process-group helpers (no-ops without a process group) --------------------------------------


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _world_size() -> int:
    return dist.get_world_size() if _distributed() else 1


@contextlib.contextmanager
def _quiet_single_process_dcp() -> Iterator[None]:
    """DCP warns on every save/load without a process group, even when asked for one
    explicitly (``no_dist=True``); a single-process run is a supported mode here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        yield


def run_on_rank0(action: Callable[[], None], what: str) -> None:
    """Run ``action`` on rank 0 only, and make its failure every rank's failure.

    Doubles as a barrier: no rank returns before rank 0 is done. Without the broadcast a failure
    on rank 0 would leave the other ranks waiting in their next collective until the timeout.
    """
    error: str | None = None
    cause: Exception | None = None
    if _rank() == 0:
        try:
            action()
        except Exception as exc:  # every rank raises below
            error, cause = f"{type(exc).__name__}: {exc}", exc
    if _distributed():
        shared: list[str | None] = [error]
        dist.broadcast_object_list(shared, src=0)
        error = shared[0]
    if error is not None:
        raise CheckpointError(f"{what} failed on rank 0: {error}") from cause


def _failure(error: BaseException) -> str:
    return describe_failure(error, rank=_rank())


def _all_ranks(failure: str | None, group: Any = None) -> list[str | None]:
    """Every rank's failure (None: none), on every rank, so all of them take the same
    branch."""
    if not _distributed():
        return [failure]
    failures: list[str | None] = [None] * _world_size()
    dist.all_gather_object(failures, failure, group=group)
    return failures


def _any_rank_failed(failure: str | None) -> str | None:
    """The first rank's failure, on every rank."""
    return next((text for text in _all_ranks(failure) if text is not None), None)


# --- locations


def is_complete(path: str | Path) -> bool:
    """A checkpoint is complete when it has the final ``step-N`` name and the marker."""
    store, location = split_location(path)
    return store.is_complete(location)


def find_latest(path: str | Path) -> str | None:
    """The checkpoint to resume from, for ``--resume_from_checkpoint``: ``path`` itself when it
    is a complete ``step-N`` checkpoint, else the newest complete one inside it, else None.
    ``path`` is a directory or an ``s3://`` URI."""
    if step_of(str(path)) is not None and is_complete(path):
        return str(path).rstrip("/")
    found = open_store(path).complete_steps(warn_incomplete=True)
    return found[-1][1] if found else None


# --- per-rank train state


def capture_rng_state() -> dict[str, Any]:
    """Every RNG a training step may draw from (dropout, data shuffles, sampling), for
    ``train_state``: restoring them makes a resumed run draw the same numbers as an uninterrupted
    one."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()  # this rank's current device only
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of :func:`capture_rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def checkpoint_state(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    lr_scheduler: LRScheduler | None,
) -> dict[str, Any]:
    """What a checkpoint holds, as DCP saves it and loads into it (in place): the one place
    both build it.

    ``get_state_dict`` yields DTensor shards under FSDP2 and plain tensors otherwise, with FQNs
    free of wrapper prefixes (compile, activation checkpointing). Weights gathered in float8
    are handed to DCP as the plain tensors under torchao's wrapper (trainer.float8
    ``plain_float8_weights`` says why), so the checkpoint is the same as a bf16 run's."""
    state: dict[str, Any] = {}
    if optimizer is not None:
        state["model"], state["optimizer"] = get_state_dict(model, optimizer)
    else:
        state["model"] = get_model_state_dict(model)
    state = plain_float8_weights(state)
    if lr_scheduler is not None:
        state["lr_scheduler"] = lr_scheduler.state_dict()
    return state


# --- the manager


@dataclass(frozen=True)
class SaveRecord:
    """What one save cost: for the log and the metrics file (rank 0)."""

    step: int
    location: str
    staged_s: float
    """How long the save held the training loop (the whole write when synchronous)."""
    durable_s: float | None
    """From the save's start to the marker written (None: the save failed)."""
    staged_bytes: int
    new_buffers: int
    """Host staging buffers this save allocated (the first save's; 0 after it)."""
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "checkpoint", **self.__dict__}


@dataclass
class _InFlight:
    """An asynchronous save whose upload (or, on rank 0, whose publishing) may still run."""

    step: int
    location: str
    started: float
    staged_s: float
    staged_bytes: int
    new_buffers: int
    upload: Future[Any]
    publisher: threading.Thread | None = None
    error: str | None = None


class CheckpointManager:
    """Saves ``step-N`` checkpoints into ``checkpoint_dir`` (a directory or an ``s3://`` URI)
    and keeps the newest ``keep_last`` (0 keeps all; the newest complete one is never deleted).
    """

    def __init__(
        self,
        checkpoint_dir: str | Path,
        *,
        keep_last: int,
        async_save: bool = False,
        every: int = 0,
    ) -> None:
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        self.store: CheckpointStore = open_store(checkpoint_dir)
        self.checkpoint_dir = self.store.root
        self.keep_last = keep_last
        self.due = Every(every)
        """Whether a periodic save is due after a step (every `every` steps; 0: never)."""
        self.async_save = async_save
        self._in_flight: _InFlight | None = None
        self._finished: list[SaveRecord] = []
        self._stager: StagingBuffers | None = None
        self._background_group: dist.ProcessGroup | None = None
        if async_save and _distributed():
            # Collective: every rank builds its manager at the same point of start-up.
            self._background_group = dist.new_group(backend="gloo", timeout=DEFAULT_TIMEOUT)

    @property
    def staging(self) -> StagingBuffers | None:
        """The host staging buffers (made at the first asynchronous save)."""
        return self._stager

    def latest(self) -> str | None:
        """Newest complete checkpoint, or None. Not collective: every rank sees the same store
        (a shared filesystem or S3), so all get the same answer once no save is in flight."""
        found = self.store.complete_steps(warn_incomplete=True)
        return found[-1][1] if found else None

    def save(
        self,
        step: int,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: LRScheduler | None,
        train_state: dict[str, Any],
        blocking: bool = False,
        faults: SaveFaults | None = None,
    ) -> str:
        """Write checkpoint ``step-{step}``; collective, every rank calls it.

        Asynchronous when the manager is and ``blocking`` is not: it returns once the state is
        staged, and the checkpoint is complete only after rank 0 publishes it. A blocking save
        (the stop and the final one) is written by this process, so it needs nothing from the
        upload process, which the SIGTERM of a stop may have ended.
        ``train_state`` is this rank's own small state (data position, RNG states from
        :func:`capture_rng_state`); ``load`` gives each rank back what that rank saved.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self.wait()
        started = time.perf_counter()
        location = self.store.save_location(step)
        run_on_rank0(lambda: self.store.begin(step), f"preparing {location}")
        try:
            self.store.write_train_state(location, _rank(), train_state)
        except Exception as exc:  # this rank's own write: its disk, its credentials
            raise CheckpointError(f"writing {location} failed: {_failure(exc)}") from exc
        if faults is not None:
            faults.inside_save(step)
        state = checkpoint_state(model, optimizer, lr_scheduler)
        writer = self.store.writer(location)
        if faults is not None:
            writer = faults.storage_writer(step, writer)
        if not self.async_save or blocking:
            self._save_in_process(step, location, state, writer, started)
            return self.store.final_location(step)
        upload = self._upload(state, writer)
        assert self._stager is not None
        flight = _InFlight(
            step=step,
            location=location,
            started=started,
            staged_s=time.perf_counter() - started,
            staged_bytes=self._stager.staged_bytes,
            new_buffers=self._stager.new_buffers,
            upload=upload,
        )
        if _rank() == 0:
            flight.publisher = threading.Thread(
                target=self._publish_when_uploaded, args=(flight,), name="checkpoint-publish"
            )
            flight.publisher.start()
        self._in_flight = flight
        logger.info(
            "checkpoint: step %d staged in %.2fs (%.2f GB, %d new staging buffer(s)); "
            "uploading to %s from a separate process",
            step,
            flight.staged_s,
            flight.staged_bytes / 1e9,
            flight.new_buffers,
            location,
        )
        return self.store.final_location(step)

    def _save_in_process(
        self, step: int, location: str, state: dict[str, Any], writer: StorageWriter, started: float
    ) -> None:
        try:
            with _quiet_single_process_dcp():
                dcp.save(state, storage_writer=writer, no_dist=not _distributed())
        except (Exception, CheckpointException) as exc:
            raise CheckpointError(f"writing {location} failed: {_failure(exc)}") from exc
        run_on_rank0(lambda: self._publish(step, location), f"publishing {location}")
        elapsed = time.perf_counter() - started
        final = self.store.final_location(step)
        logger.info("checkpoint: step %d durable at %s after %.1fs", step, final, elapsed)
        self._finished.append(SaveRecord(step, final, elapsed, elapsed, 0, 0))

    def _upload(self, state: dict[str, Any], writer: StorageWriter) -> Future[Any]:
        """Stage ``state`` into the reused host buffers and start writing them elsewhere."""
        separate_process = _distributed()  # torch's process executor needs a process group
        if self._stager is None:
            self._stager = StagingBuffers(pinned=on_device(state), shared=separate_process)
        kind = AsyncCheckpointerType.THREAD
        if separate_process:
            kind = AsyncCheckpointerType.PROCESS
            stop_upload_process_at_exit()
        with _quiet_single_process_dcp():
            upload = dcp.async_save(
                state,
                storage_writer=writer,
                planner=UploadPlanner(),
                process_group=self._background_group,
                async_checkpointer_type=kind,
                async_stager=self._stager,
                no_dist=not separate_process,
            )
        # A Future of the upload: staging is synchronous, so no AsyncSaveResponse.
        assert isinstance(upload, Future), type(upload)
        return upload

    def in_flight(self) -> bool:
        """Whether a save's upload or publishing still runs (not collective, no waiting)."""
        flight = self._in_flight
        if flight is None:
            return False
        publishing = flight.publisher is not None and flight.publisher.is_alive()
        return not flight.upload.done() or publishing

    def pop_finished(self) -> list[SaveRecord]:
        """Saves that became durable (or failed) since the last call; rank 0 has them all."""
        finished, self._finished = self._finished, []
        return finished

    def wait(self) -> bool:
        """Block until the save in flight (if any) is complete and published; collective.
        False when it was lost with its upload process (see below), else True.

        A write that failed on any rank (a full disk, an S3 error) fails on every rank: DCP
        gathers the writes' results to the coordinator and broadcasts the outcome as a
        ``CheckpointException``; it raises a ``CheckpointError``. An upload process that died
        (killed, or out of memory) fails its own rank's upload, and the others' through their
        collectives with it, or not at all when they had finished: so the outcome is agreed
        on by every rank before anyone acts on it. Such a save is lost, not a reason to stop:
        every rank ends its upload process, and the next save starts new ones. A failed
        publish on rank 0 is broadcast too, so all ranks raise the same error together.
        """
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return True
        failure: str | None = None
        try:
            flight.upload.result()
        except CheckpointException as exc:
            failure = f"write: {_failure(exc)}"
        except Exception as exc:  # the upload process or the pipe to it
            failure = f"process: {_failure(exc)}"
        failures = _all_ranks(failure, self._background_group)
        if flight.publisher is not None:
            flight.publisher.join()
        written = [f.removeprefix("write: ") for f in failures if f and f.startswith("write: ")]
        if written:
            raise CheckpointError(f"writing {flight.location} failed: {written[0]}")
        lost = [f.removeprefix("process: ") for f in failures if f]
        if lost:
            logger.warning(
                "checkpoint: step %d lost with its upload process (%s); the next save starts "
                "a new one",
                flight.step,
                lost[0],
            )
            stop_upload_process()
            return False

        def published() -> None:
            if flight.error is not None:
                raise CheckpointError(flight.error)

        run_on_rank0(published, f"publishing {flight.location}")
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` for the save in flight to become durable, without any
        collective (for a rank about to exit while others may be stuck). True when nothing is
        left in flight."""
        flight = self._in_flight
        if flight is None:
            return True
        deadline = time.monotonic() + timeout_s
        try:
            flight.upload.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            return False  # still uploading (an Exception too: caught before the failures)
        except (Exception, CheckpointException):
            return True  # failed: nothing will become durable; the publisher logged why
        if flight.publisher is not None:
            flight.publisher.join(max(0.0, deadline - time.monotonic()))
        return not self.in_flight()

    def close(self) -> None:
        """Release the staging buffers and end the upload process (after ``wait``)."""
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._background_group is not None:
            stop_upload_process()

    def _publish_when_uploaded(self, flight: _InFlight) -> None:
        """Rank 0's publisher thread: the marker goes in as soon as every rank's writes are."""
        try:
            flight.upload.result()
        except (Exception, CheckpointException) as exc:  # reported by wait(), on every rank
            flight.error = f"writing {flight.location} failed: {_failure(exc)}"
        else:
            try:
                self._publish(flight.step, flight.location)
            except Exception as exc:  # reported by wait(), on every rank
                flight.error = f"publishing {flight.location} failed: {type(exc).__name__}: {exc}"
        final = self.store.final_location(flight.step)
        durable_s = None if flight.error else time.perf_counter() - flight.started
        self._finished.append(
            SaveRecord(
                flight.step,
                final,
                flight.staged_s,
                durable_s,
                flight.staged_bytes,
                flight.new_buffers,
                flight.error,
            )
        )
        if flight.error is not None:
            logger.error("checkpoint: step %d not saved: %s", flight.step, flight.error)
            return
        logger.info(
            "checkpoint: step %d durable at %s after %.1fs (staged in %.2fs)",
            flight.step,
            final,
            durable_s,
            flight.staged_s,
        )

    def _publish(self, step: int, location: str) -> None:
        """Rank 0, after DCP's coordinator has written ``.metadata``: that happens only once
        every rank's writes (and so every rank's train_state, written before them) landed."""
        world_size = _world_size()
        missing = self.store.missing_train_states(location, world_size)
        if missing:
            raise CheckpointError(
                f"train_state missing in {location} for ranks {missing}: is "
                f"{self.checkpoint_dir} storage every node sees (FSx or S3)?"
            )
        final = self.store.publish(
            step,
            location,
            {
                "step": step,
                "world_size": world_size,
                "saved_at_unix": time.time(),
                "torch_version": torch.__version__,
            },
        )
        newer = [s for s, _ in self.store.complete_steps() if s > step]
        if newer:
            logger.warning(
                "checkpoint: %s also holds later steps %s (from an earlier run?); a resume "
                "from it will pick step %d, not %d",
                self.checkpoint_dir,
                newer,
                newer[-1],
                step,
            )
        try:
            self.store.prune(self.keep_last)
        except Exception:  # a full disk must not kill a run whose checkpoint just landed
            logger.exception(
                "checkpoint: pruning %s failed after saving %s", self.store.root, final
            )

    def set_aside(self, location: str) -> str:
        """Move an unreadable checkpoint out of the way (not deleted); collective. Returns
        where it went."""
        store, path = split_location(location)
        moved: list[str] = [""]

        def move() -> None:
            moved[0] = store.set_aside(path)

        run_on_rank0(move, f"setting {path} aside")
        if _distributed():
            dist.broadcast_object_list(moved, src=0)
        return moved[0]

    def load(
        self,
        path: str | Path,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: LRScheduler | None,
        allow_world_size_change: bool = False,
    ) -> tuple[int, dict[str, Any]]:
        """Load a complete checkpoint in place; collective. Returns (step, this rank's
        train_state).

        Model and optimizer state reshard to the current mesh, but the per-rank train_state
        (which part of the data each rank has read) only fits the world size that wrote it:
        a different world size is an error unless ``allow_world_size_change``, which returns an
        empty train_state (the data then starts from its beginning). Files that fail to read
        on any rank are a ``UnreadableCheckpointError`` on every rank.
        """
        store, location = split_location(path)
        if step_of(location) is None or not store.is_complete(location):
            raise CheckpointError(
                f"{location} is not a complete checkpoint (expected a step-N dir with a "
                f"{COMPLETE_MARKER} marker); use find_latest() to pick one"
            )
        started = time.perf_counter()
        record: dict[str, Any] = {}
        failure: str | None = None
        try:
            record = store.read_marker(location)
            step, saved_world_size = int(record["step"]), int(record["world_size"])
        except Exception as exc:
            failure = _failure(exc)
        failure = _any_rank_failed(failure)
        if failure is not None:
            raise UnreadableCheckpointError(f"{location} cannot be loaded: {failure}")
        # Checked before anything is loaded, so a refused resume leaves the model untouched.
        same_world = self._check_world_size(location, saved_world_size, allow_world_size_change)
        # The current (sharded) state dicts are the templates DCP loads into, in place.
        state = checkpoint_state(model, optimizer, lr_scheduler)
        train_state: dict[str, Any] = {}
        try:
            with _quiet_single_process_dcp():
                dcp.load(state, storage_reader=store.reader(location), no_dist=not _distributed())
            if same_world:
                train_state = store.read_train_state(location, _rank())
        except (Exception, CheckpointException) as exc:
            failure = _failure(exc)
        failure = _any_rank_failed(failure)
        if failure is not None:
            raise UnreadableCheckpointError(f"{location} cannot be loaded: {failure}")
        if optimizer is not None:
            # Hyperparameters (weight decay, betas, lr) come from this run's flags; only the
            # moments and step counts come from the checkpoint. Loading would restore the
            # saved ones, so a changed flag on resume would be silently ignored.
            hyperparameters = [
                {k: v for k, v in group.items() if k != "params"}
                for group in optimizer.param_groups
            ]
            set_state_dict(
                model,
                optimizer,
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
            for group, current in zip(optimizer.param_groups, hyperparameters, strict=True):
                group.update(current)
        else:
            set_model_state_dict(model, state["model"])
        if isinstance(lr_scheduler, LambdaLR):
            load_schedule_position(lr_scheduler, state["lr_scheduler"])
        elif lr_scheduler is not None:
            lr_scheduler.load_state_dict(state["lr_scheduler"])
        logger.info(
            "checkpoint: loaded %s (step %d) in %.1fs",
            location,
            step,
            time.perf_counter() - started,
        )
        return step, train_state

    @staticmethod
    def _check_world_size(location: str, saved_world_size: int, allow_change: bool) -> bool:
        world_size = _world_size()
        if saved_world_size == world_size:
            return True
        message = (
            f"checkpoint {location} was written by {saved_world_size} ranks but this run has "
            f"{world_size}: the per-rank data position and RNG state cannot be mapped"
        )
        if not allow_change:
            raise CheckpointError(
                f"{message} (run with --allow_world_size_change 1 to resume anyway, the data "
                "starting again from its beginning)"
            )
        logger.warning("%s; every rank starts its train_state afresh", message)
        return False
