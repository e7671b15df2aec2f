"""Faults injected on purpose (`--*_at_step`, `--nan_batches`, ...), kept out of the loop.

The loop calls one object at fixed points (`loss_scale`, `after_step`, `inside_save`,
`storage_writer`); with no fault configured each call is an integer comparison. Step faults
fire in a run's first attempt only (`on_load` disarms them); every fault hits the last rank.
Why: docs/design/trainer.md#faults
"""

from __future__ import annotations

import errno
import io
import math
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter, StorageWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from trainer.checkpoint_store import DelegatingFileSystem
from trainer.checkpoint_upload import STOP_RECEIVED
from trainer.config import InjectedFaultConfig, parse_batch_ranges
from trainer.log import get_logger
from trainer.preemption import StopRequests

logger = get_logger("faults")

HELD_UPLOAD_WAIT_S = 300.0
"""Bound on `--stop_in_upload_at_step`'s waits (for the upload to be held, for the signal to
reach it): each ends on an event; the bound only keeps a broken run from hanging a test."""

FAULT_EXIT_CODE = 17
"""Exit code of `--fail_at_step` and `--crash_in_save_at_step`: a test (or an operator) tells
the simulated crash from a real failure (1) and from the retryable codes (>= 128)."""


class FaultInjector:
    """The faults of `--*_at_step` and `--nan_batches`, for one rank."""

    def __init__(self, cfg: InjectedFaultConfig, *, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.targeted = rank == world_size - 1
        self.first_attempt = True
        self.nan_batches = parse_batch_ranges(cfg.nan_batches)

    def on_load(self) -> None:
        """A checkpoint was loaded (a resume or a rollback): step faults stay off from now."""
        self.first_attempt = False

    def _fires(self, at_step: int, step: int) -> bool:
        return at_step > 0 and step == at_step and self.first_attempt

    # --- on the loss

    def loss_scale(self, *, step: int, batch: int, micro: int, scale: float) -> float:
        """The factor for the loss of micro-batch `micro` of `step`, data batch `batch` of this
        rank (counted from 1): NaN on a poisoned one, as after an overflow or on corrupt data,
        else `scale` unchanged."""
        if not self.targeted:
            return scale
        first = self.cfg.nan_at_step
        poisoned_step = (
            first > 0 and self.first_attempt and first <= step < first + self.cfg.nan_steps
        )
        if poisoned_step and micro == 0:
            return math.nan
        if batch in self.nan_batches:
            return math.nan
        return scale

    # --- after a step

    def after_step(self, step: int, stops: StopRequests, *, settle: Callable[[], object]) -> None:
        """After step `step`, its save and the watchdog's beat; before the stop agreement.
        `settle` waits (without a collective) for a save in flight to become durable: the
        simulated crash comes after it, so what a restart resumes from does not depend on
        how fast the upload was."""
        if not self.first_attempt:
            return
        if self._fires(self.cfg.signal_at_step, step) and self.targeted:
            # As one interrupted node's ranks: the others learn of it through the agreement.
            logger.warning("--signal_at_step %d: sending SIGTERM to this rank", step)
            stops.request()
        if self._fires(self.cfg.stop_in_upload_at_step, step) and self.targeted:
            self._stop_torchrun_during_upload(step, stops)
        if self._fires(self.cfg.stall_at_step, step) and self.targeted:
            self._stall(step)
        if self._fires(self.cfg.fail_at_step, step):
            settle()
            logger.warning("--fail_at_step %d: exiting abruptly", step)
            sys.stderr.flush()
            os._exit(FAULT_EXIT_CODE)

    def _held_upload_marker(self, step: int) -> str:
        """A file the held upload of `step` creates once it waits (named by this process)."""
        return str(Path(tempfile.gettempdir()) / f"fsdp-eks-held-upload-{os.getpid()}-{step}")

    def _stop_torchrun_during_upload(self, step: int, stops: StopRequests) -> None:
        """Once this rank's upload of `step` is held, SIGTERM to torchrun (the worker's parent),
        which sends it on to every worker's process group (torch `elastic/multiprocessing/
        subprocess_handler/subprocess_handler.py` `close`: `os.killpg`), upload processes too.
        Returns once this rank has it, so every rank agrees to stop after the next step."""
        marker = self._held_upload_marker(step)
        deadline = time.monotonic() + HELD_UPLOAD_WAIT_S
        while not Path(marker).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        logger.warning("--stop_in_upload_at_step %d: sending SIGTERM to torchrun", step)
        os.kill(os.getppid(), signal.SIGTERM)
        deadline = time.monotonic() + HELD_UPLOAD_WAIT_S
        while stops.signal_name is None and time.monotonic() < deadline:
            time.sleep(0.05)  # the handler runs on this thread, between two sleeps

    @staticmethod
    def _stall(step: int) -> None:
        """The others wait for this rank in their next collective; only the watchdog (or the
        collective timeout) ends this."""
        logger.warning("--stall_at_step %d: this rank stops making progress", step)
        threading.Event().wait()

    # --- inside a save (trainer.checkpoint.SaveFaults)

    def inside_save(self, step: int) -> None:
        """After this rank's train_state is written, before its shards: where a node lost
        mid-save dies."""
        if self._fires(self.cfg.crash_in_save_at_step, step) and self.targeted:
            logger.warning("--crash_in_save_at_step: dying inside this rank's checkpoint write")
            sys.stderr.flush()
            os._exit(FAULT_EXIT_CODE)

    def storage_writer(self, step: int, writer: StorageWriter) -> StorageWriter:
        """`writer`, with a full disk under it for the shards of `--disk_full_at_step`."""
        at_step = self.cfg.disk_full_at_step
        if at_step > 0 and step == at_step and self.targeted:
            if not isinstance(writer, FileSystemWriter):  # pragma: no cover - both stores are
                raise TypeError(f"cannot fill the disk under {type(writer).__name__}")
            writer.fs = NoSpaceLeft(writer.fs)  # type: ignore[assignment]
        if self._fires(self.cfg.stop_in_upload_at_step, step) and self.targeted:
            assert isinstance(writer, FileSystemWriter), type(writer)
            writer.fs = HeldUntilStopped(writer.fs, self._held_upload_marker(step))  # type: ignore[assignment]
        return writer


ZIP_RECORD_START = b"PK\x03\x04"
"""How a zip local file header begins: `torch.save` opens every record with one."""


class _FullStream(io.RawIOBase):
    """The real stream (the file is opened, the S3 upload started), but the disk fills up
    right after a zip header: a write that starts a `torch.save` archive lands, the next
    fails, so the failure comes from inside torch's serializer, where a full disk most
    often meets a large shard (its `unexpected pos` error, the ENOSPC only its context)."""

    def __init__(self, stream: io.IOBase, path: str) -> None:
        super().__init__()
        self._stream = stream
        self._path = path

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._stream.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._stream.seek(offset, whence)

    def write(self, data: Any) -> int:
        if bytes(memoryview(data)[:4]) == ZIP_RECORD_START:
            return self._stream.write(data)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)


class NoSpaceLeft(DelegatingFileSystem):
    """A DCP file system whose writes fail as on a full disk (`_FullStream`)."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with self.inner.create_stream(path, mode) as stream:
            yield _FullStream(stream, str(path)) if "w" in mode else stream


class HeldUntilStopped(DelegatingFileSystem):
    """A DCP file system whose first write waits, in the upload process, until a stop's
    SIGTERM reached that process (`trainer.checkpoint_upload.STOP_RECEIVED`), then writes as
    usual. It creates `marker` once it waits, so the rank knows when to send the stop."""

    def __init__(self, inner: FileSystemBase, marker: str) -> None:
        super().__init__(inner)
        self.marker = marker

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" in mode and not STOP_RECEIVED.is_set():
            Path(self.marker).touch()
            STOP_RECEIVED.wait(HELD_UPLOAD_WAIT_S)
            Path(self.marker).unlink()
        with self.inner.create_stream(path, mode) as stream:
            yield stream
