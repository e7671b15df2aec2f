"""Getting a save off the training loop: host buffers staged once, the write in another process.

torch's ``dcp.async_save`` left to itself stages a fresh pageable copy at every save and writes
from a thread of the training process (~10 s staging for 6 GB, overlapping steps ~20x slower on
a GPU). Here ``StagingBuffers`` is torch's ``DefaultStager`` (``checkpoint/staging.py``), made
once and reused, and the write runs in torch's ``AsyncCheckpointerType.PROCESS`` daemon
(``_async_process_executor.py``), which defers a stop's SIGTERM (``defer_stop_signals``) so the
upload in flight lands. Why and sources: docs/design/trainer.md#checkpoint_upload
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import multiprocessing
import signal
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.tensor import DTensor

from trainer.checkpoint_store import os_error_behind


class StagingBuffers(DefaultStager):
    """torch's ``DefaultStager``, staging synchronously into host buffers it keeps, and
    counting what each save had to allocate (evidence that only the first one does)."""

    def __init__(self, *, pinned: bool, shared: bool) -> None:
        super().__init__(
            StagingOptions(
                use_pinned_memory=pinned,
                use_shared_memory=shared,
                use_async_staging=False,
                use_non_blocking_copy=pinned,
            )
        )
        self.pinned = pinned
        self._storages: frozenset[int] = frozenset()
        self.new_buffers = 0
        """Host storages the last ``stage`` allocated (the others it reused)."""
        self.staged_bytes = 0
        """Bytes the last ``stage`` copied."""

    def stage(self, state_dict: STATE_DICT_TYPE, **kwargs: Any) -> Any:
        staged = super().stage(state_dict, **kwargs)
        storages = {
            tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
            for tensor in local_tensors(staged)
        }
        self.new_buffers = len(storages.keys() - self._storages)
        self.staged_bytes = sum(storages.values())
        self._storages = frozenset(storages)
        return staged


class UploadPlanner(DefaultSavePlanner):
    """DCP's default save planner, which also keeps torch's upload process quiet.

    The planner travels by pickle with every save request to the upload process, where it is
    the first object of the trainer's to be unpickled (``_async_process_executor.py``
    ``_checkpointing_subprocess``: ``parent_conn.recv()``). torch's daemon logs each request
    on the root logger at INFO, and a failed save with every rank's whole traceback
    (``logger.py`` ``_init_logger``, ``_async_process_executor.py``); the trainer reports each
    save's outcome itself, in one line, so there the root logger's own records are dropped
    (other loggers' records still reach the log)."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if multiprocessing.parent_process() is not None:
            root = logging.getLogger()
            if _drop_root_records not in root.filters:
                root.addFilter(_drop_root_records)
            defer_stop_signals()


STOP_RECEIVED = threading.Event()
"""Set in the upload process once a stop's SIGTERM reached it (its write goes on)."""


def _record_stop(_signum: int, _frame: Any) -> None:
    STOP_RECEIVED.set()


def defer_stop_signals() -> None:
    """In the upload process, before its first write: SIGTERM is recorded, not fatal, so a
    write in flight when torchrun signals the worker's process group still lands. Runs on
    the daemon's main thread (the request is unpickled there), where Python allows it."""
    if signal.getsignal(signal.SIGTERM) is not _record_stop:
        signal.signal(signal.SIGTERM, _record_stop)


def _drop_root_records(record: logging.LogRecord) -> bool:
    return record.name != "root"


def local_tensors(state: Any) -> Iterator[torch.Tensor]:
    """Every tensor of a state dict (nested dicts, lists and tuples), a DTensor as its shard."""
    stack = [state]
    while stack:
        obj = stack.pop()
        if isinstance(obj, DTensor):
            yield obj.to_local()
        elif isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)


def on_device(state: Any) -> bool:
    """Whether any tensor of ``state`` lives on an accelerator (pinned staging pays off)."""
    return any(tensor.device.type != "cpu" for tensor in local_tensors(state))


def stop_upload_process(timeout_s: float = 10.0) -> None:
    """End torch's upload daemon, if this process started one; the next save spawns another.

    torch offers no call for it: the daemon is meant to live as long as the trainer
    (``_async_process_executor.py``, ``_ProcessBasedAsyncCheckpointExecutor.execute_save``),
    and its ``_AsyncCheckpointProcess.__del__`` asks it to stop, waits 5 s, then sends a
    SIGTERM, which the daemon only records (``defer_stop_signals``). So this asks, waits, and
    kills a daemon that does not stop. Also run at a normal interpreter exit, before
    multiprocessing's own exit handler (``multiprocessing/util.py`` ``_exit_function``). (The
    trainer itself ends with ``os._exit``; the daemon then sees its pipe close and exits.)
    """
    from torch.distributed.checkpoint import _async_process_executor as executor

    daemon = getattr(executor, "_CHECKPOINT_PROCESS", None)
    if daemon is None:
        return
    executor._CHECKPOINT_PROCESS = None
    process = daemon._save_process
    with contextlib.suppress(OSError):  # a daemon already gone has closed its pipe
        # The TERMINATE request (what __del__ sends first): the daemon leaves its loop.
        daemon._send(executor._CheckpointSaveProcessControlOpts.TERMINATE)
    process.join(timeout_s)
    if process.is_alive():
        process.kill()
        process.join()


_exit_hook_installed = False


def stop_upload_process_at_exit() -> None:
    """Register ``stop_upload_process`` to run at a normal interpreter exit (once). atexit
    runs the newest handler first, so it precedes multiprocessing's, registered at import."""
    global _exit_hook_installed
    if not _exit_hook_installed:
        atexit.register(stop_upload_process)
        _exit_hook_installed = True


def describe_failure(error: BaseException, *, rank: int) -> str:
    """One line for a failed save or load on this rank (``rank``): the first failing rank's
    exception, whose text names the file or object and the cause (``[Errno 28] No space left
    on device: '...'``).

    DCP gathers every rank's failure into a ``CheckpointException`` (a ``BaseException``,
    ``torch/distributed/checkpoint/api.py``) whose text is every rank's whole traceback."""
    if isinstance(error, CheckpointException) and error.failures:
        cause, _trace = error.failures[min(error.failures)]
        others = len(error.failures) - 1
        also = f" (and {others} other rank{'s' * (others > 1)})" if others else ""
        return f"rank {min(error.failures)}{also}: {_exception_text(cause)}"
    return f"rank {rank}: {_exception_text(error)}"


def _exception_text(error: BaseException) -> str:
    # A torch.save on this process's own disk (a train_state) that met a full disk mid-record.
    error = os_error_behind(error) or error
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
