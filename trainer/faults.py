"""Faults injected on purpose (`--*_at_step`, `--nan_batches`, ...), kept out of the loop.

The training loop calls one object at fixed points: on each micro-batch's loss
(`loss_scale`), after each step (`after_step`) and inside each save (`inside_save`,
`storage_writer`, through the checkpoint manager). With no fault configured every call is a
comparison of integers: no device work, no sync.

Step faults fire in a run's first attempt only: once it loaded a checkpoint (a resume or a
rollback), `on_load` disarms them, so that rerunning the same command resumes and finishes.
`--nan_batches` follows the data instead (batch numbers of the rank's stream, which a
checkpoint carries), as a corrupt patch of data would.

Every fault hits the last rank: with one node interrupted, one GPU stuck or one disk full,
the others have to find out through the collectives, which is what the faults test.
"""

from __future__ import annotations

import errno
import io
import math
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter, StorageWriter
from torch.distributed.checkpoint.filesystem import FileSystemBase

from trainer.config import InjectedFaultConfig, parse_batch_ranges
from trainer.log import get_logger
from trainer.preemption import StopRequests

logger = get_logger("faults")

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
        if self._fires(self.cfg.stall_at_step, step) and self.targeted:
            self._stall(step)
        if self._fires(self.cfg.fail_at_step, step):
            settle()
            logger.warning("--fail_at_step %d: exiting abruptly", step)
            sys.stderr.flush()
            os._exit(FAULT_EXIT_CODE)

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
        return writer


class _FullStream(io.RawIOBase):
    """The real stream (the file is opened, the S3 upload started), but nothing fits."""

    def __init__(self, stream: io.IOBase, path: str) -> None:
        super().__init__()
        self._stream = stream
        self._path = path

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._stream.tell()

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._path)


class NoSpaceLeft(FileSystemBase):
    """A DCP file system (the local one, or s3torchconnector's) whose writes fail as on a
    full disk. Picklable: it travels to DCP's upload process with the writer."""

    def __init__(self, inner: FileSystemBase) -> None:
        self.inner = inner

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with self.inner.create_stream(path, mode) as stream:
            yield _FullStream(stream, str(path)) if "w" in mode else stream

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str | os.PathLike[str]:
        return self.inner.concat_path(path, suffix)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.inner.rename(path, new_path)

    def init_path(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        return self.inner.init_path(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        self.inner.mkdir(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.inner.exists(path)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.inner.rm_file(path)
