"""Crash-safe, resumable checkpoints with torch.distributed.checkpoint (DCP).

Layout of ``checkpoint_dir`` (a shared filesystem such as FSx for Lustre when multi-node)::

    step-100/                 a complete checkpoint: the only kind ``latest()`` returns
        .metadata, __0_0.distcp, ...       DCP: model, optimizer, LR scheduler (sharded)
        train_state/rank-00000.pt ...      per-rank state (data position, RNG), one file per rank
        COMPLETE                           JSON {step, world_size, ...}, written last
    .tmp-step-200/            a save in progress, or one a crash interrupted: never resumed from
    .deleting-step-50/        an old checkpoint being pruned

Why this protocol: a job can die at any instant (spot reclaim, OOM, a node failure). Every rank
writes into a hidden temp dir; once DCP has gathered all ranks' writes, rank 0 writes the marker
and renames the dir to ``step-N`` in one atomic ``rename``. So a ``step-N`` dir is either absent or
whole, and the marker guards against dirs made by other means (a partial copy, an ``aws s3 sync``).
No symlinks ("latest" is found by listing), which FSx/S3 data repositories handle poorly.

All ranks call ``save`` and ``load`` (they are collective). Works without a process group too
(a single-process run, or a test).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from trainer.log import get_logger
from trainer.optim import load_schedule_position

logger = get_logger("checkpoint")

COMPLETE_MARKER = "COMPLETE"
TRAIN_STATE_DIR = "train_state"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TEMP_PREFIX = ".tmp-step-"
_DELETING_PREFIX = ".deleting-step-"


class CheckpointError(RuntimeError):
    """A checkpoint could not be written, or does not fit the run that tries to load it."""


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


# --- directory protocol


def step_dir_name(step: int) -> str:
    return f"step-{step}"


def is_complete(path: Path) -> bool:
    """A checkpoint is complete when its dir has the final name and the marker inside it."""
    return _STEP_DIR.match(path.name) is not None and (path / COMPLETE_MARKER).is_file()


def complete_checkpoints(
    checkpoint_dir: Path, *, warn_incomplete: bool = False
) -> list[tuple[int, Path]]:
    """Complete ``step-N`` dirs, oldest first. Incomplete ones are skipped (and left alone by
    pruning: they were not written by this protocol, so they are not ours to delete)."""
    if not checkpoint_dir.is_dir():
        return []
    found: list[tuple[int, Path]] = []
    for entry in checkpoint_dir.iterdir():
        match = _STEP_DIR.match(entry.name)
        if match is None or not entry.is_dir():
            continue
        if is_complete(entry):
            found.append((int(match.group(1)), entry))
        elif warn_incomplete:
            logger.warning("checkpoint: ignoring %s: no %s marker", entry, COMPLETE_MARKER)
    return sorted(found)


def find_latest(path: str | Path) -> Path | None:
    """The checkpoint to resume from, for ``--resume_from_checkpoint``: ``path`` itself when it
    is a complete ``step-N`` dir, else the newest complete ``step-N`` dir inside it, else None."""
    path = Path(path)
    if is_complete(path):
        return path
    found = complete_checkpoints(path, warn_incomplete=True)
    return found[-1][1] if found else None


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable on local disks; harmless (and cheap) on network filesystems.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_marker(directory: Path, record: dict[str, Any]) -> None:
    marker = directory / COMPLETE_MARKER
    with marker.open("w", encoding="utf-8") as f:
        json.dump(record, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_marker(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((path / COMPLETE_MARKER).read_text(encoding="utf-8"))
    return record


def _remove_tree(path: Path) -> None:
    """Delete a dir by first renaming it out of the ``step-N`` namespace, so a crash in the
    middle of a long ``rmtree`` can never leave a half-deleted dir that looks complete."""
    doomed = path.with_name(f"{_DELETING_PREFIX}{path.name}-{time.time_ns()}")
    path.rename(doomed)
    shutil.rmtree(doomed)


# --- per-rank train state


def _train_state_file(directory: Path, rank: int) -> Path:
    return directory / TRAIN_STATE_DIR / f"rank-{rank:05d}.pt"


def _write_train_state(directory: Path, rank: int, train_state: dict[str, Any]) -> None:
    target = _train_state_file(directory, rank)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as f:
        torch.save(train_state, f)
        f.flush()
        os.fsync(f.fileno())


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


# --- the manager


class CheckpointManager:
    """Saves ``step-N`` checkpoints into ``checkpoint_dir`` and keeps the newest ``keep_last``.

    ``keep_last=0`` keeps every checkpoint. The newest complete checkpoint is never deleted.
    """

    def __init__(self, checkpoint_dir: str | Path, *, keep_last: int) -> None:
        if keep_last < 0:
            raise ValueError(f"keep_last must be >= 0 (0 keeps all), got {keep_last}")
        self.checkpoint_dir = Path(checkpoint_dir)
        self.keep_last = keep_last

    def latest(self) -> Path | None:
        """Newest complete checkpoint in ``checkpoint_dir``, or None. Not collective; the dir
        must be on a filesystem every rank sees, so all ranks get the same answer."""
        found = complete_checkpoints(self.checkpoint_dir, warn_incomplete=True)
        return found[-1][1] if found else None

    def save(
        self,
        step: int,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: LRScheduler | None,
        train_state: dict[str, Any],
    ) -> Path:
        """Write checkpoint ``step-{step}``; collective, every rank calls it.

        ``train_state`` is this rank's own small state (data loader position, RNG states from
        :func:`capture_rng_state`); ``load`` gives each rank back what that rank saved.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        started = time.perf_counter()
        rank, world_size = _rank(), _world_size()
        final = self.checkpoint_dir / step_dir_name(step)
        temp = self.checkpoint_dir / f"{_TEMP_PREFIX}{step}"

        def prepare() -> None:
            # A crash during an earlier save of this step may have left files from another
            # world size behind; they must not mix with this save's.
            if temp.exists():
                shutil.rmtree(temp)
            temp.mkdir(parents=True)

        run_on_rank0(prepare, f"creating {temp}")
        _write_train_state(temp, rank, train_state)
        with _quiet_single_process_dcp():
            dcp.save(
                self._state(model, optimizer, lr_scheduler),
                checkpoint_id=temp,
                no_dist=not _distributed(),
            )

        def publish() -> None:
            # DCP's rank 0 returns only after every rank's writes (and so every rank's
            # train_state file, written before them) have landed.
            missing = [r for r in range(world_size) if not _train_state_file(temp, r).is_file()]
            if missing:
                raise CheckpointError(
                    f"train_state files missing in {temp} for ranks {missing}: is "
                    f"{self.checkpoint_dir} on a filesystem every node mounts (e.g. FSx)?"
                )
            _write_marker(
                temp,
                {
                    "step": step,
                    "world_size": world_size,
                    "saved_at_unix": time.time(),
                    "torch_version": torch.__version__,
                },
            )
            if final.exists():  # saving the same step twice: the newer save wins
                _remove_tree(final)
            temp.rename(final)
            _fsync_dir(self.checkpoint_dir)

        run_on_rank0(publish, f"publishing {final}")
        if rank == 0:
            newer = [s for s, _ in complete_checkpoints(self.checkpoint_dir) if s > step]
            if newer:
                logger.warning(
                    "checkpoint: %s also holds later steps %s (from an earlier run?); a resume "
                    "from this directory will pick step %d, not %d",
                    self.checkpoint_dir,
                    newer,
                    newer[-1],
                    step,
                )
            self._prune()
        logger.info("checkpoint: saved %s in %.1fs", final, time.perf_counter() - started)
        return final

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
        empty train_state (the data then starts from its beginning).
        """
        path = Path(path)
        if not is_complete(path):
            raise CheckpointError(
                f"{path} is not a complete checkpoint (expected a step-N dir with a "
                f"{COMPLETE_MARKER} marker); use find_latest() to pick one"
            )
        started = time.perf_counter()
        record = read_marker(path)
        step, saved_world_size = int(record["step"]), int(record["world_size"])
        # Checked before anything is loaded, so a refused resume leaves the model untouched.
        same_world = self._check_world_size(path, saved_world_size, allow_world_size_change)
        # The current (sharded) state dicts are the templates DCP loads into, in place.
        state = self._state(model, optimizer, lr_scheduler)
        with _quiet_single_process_dcp():
            dcp.load(state, checkpoint_id=path, no_dist=not _distributed())
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
        train_state: dict[str, Any] = {}
        if same_world:
            # Written by this project's own save(); it may hold numpy RNG arrays, which the
            # weights_only unpickler rejects.
            with _train_state_file(path, _rank()).open("rb") as f:
                train_state = torch.load(f, map_location="cpu", weights_only=False)
        logger.info(
            "checkpoint: loaded %s (step %d) in %.1fs", path, step, time.perf_counter() - started
        )
        return step, train_state

    @staticmethod
    def _check_world_size(path: Path, saved_world_size: int, allow_change: bool) -> bool:
        world_size = _world_size()
        if saved_world_size == world_size:
            return True
        message = (
            f"checkpoint {path} was written by {saved_world_size} ranks but this run has "
            f"{world_size}: the per-rank data position and RNG state cannot be mapped"
        )
        if not allow_change:
            raise CheckpointError(
                f"{message} (run with --allow_world_size_change 1 to resume anyway, the data "
                "starting again from its beginning)"
            )
        logger.warning("%s; every rank starts its train_state afresh", message)
        return False

    @staticmethod
    def _state(
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        lr_scheduler: LRScheduler | None,
    ) -> dict[str, Any]:
        # get_state_dict yields DTensor shards under FSDP2 and plain tensors otherwise, with
        # FQNs free of wrapper prefixes (compile, activation checkpointing).
        state: dict[str, Any] = {}
        if optimizer is not None:
            state["model"], state["optimizer"] = get_state_dict(model, optimizer)
        else:
            state["model"] = get_model_state_dict(model)
        if lr_scheduler is not None:
            state["lr_scheduler"] = lr_scheduler.state_dict()
        return state

    def _prune(self) -> None:
        """Delete all but the newest ``keep_last`` complete checkpoints, and stray temp dirs.

        Runs on rank 0 after a save has been published, when no other save can be in flight, so
        any temp dir left is a crashed save's. Failures are logged, not raised: a full disk
        should not kill a run whose checkpoint has just been written.
        """
        try:
            for entry in self.checkpoint_dir.iterdir():
                if entry.name.startswith((_TEMP_PREFIX, _DELETING_PREFIX)) and entry.is_dir():
                    logger.info("checkpoint: removing stray %s", entry)
                    shutil.rmtree(entry)
            if self.keep_last == 0:
                return
            complete = complete_checkpoints(self.checkpoint_dir)
            for _step, entry in complete[: -self.keep_last]:
                logger.info("checkpoint: pruning %s (keep_last=%d)", entry, self.keep_last)
                _remove_tree(entry)
        except OSError:
            logger.exception("checkpoint: pruning %s failed", self.checkpoint_dir)
