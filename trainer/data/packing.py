"""Packing token streams into batches: the resumable train loader and the fixed validation set.

Documents' tokens are concatenated and cut into rows of exactly ``seq_len``: no padding, and the
tail of one document starts the next row rather than being dropped.
"""

from __future__ import annotations

import atexit
import copy
import logging
import queue
import threading
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from datasets import Dataset, IterableDataset

from trainer.data.documents import DocumentPlan
from trainer.data.sources import DataConfigError

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
STATE_VERSION = 1
# How long close() waits for the read-ahead thread to finish the batch it is reading.
SHUTDOWN_TIMEOUT_S = 30.0


class _TokenBuffer:
    """Concatenated document tokens, cut from the front into rows of exactly ``seq_len``."""

    def __init__(self, seq_len: int, tokens: Iterable[int] = ()) -> None:
        self._seq_len = seq_len
        self._tokens = list(tokens)
        self._start = 0  # an offset, so cutting many rows off a long document stays linear

    def extend(self, ids: list[int]) -> None:
        del self._tokens[: self._start]
        self._start = 0
        self._tokens.extend(ids)

    def rows(self) -> Iterator[list[int]]:
        while len(self._tokens) - self._start >= self._seq_len:
            row = self._tokens[self._start : self._start + self._seq_len]
            self._start += self._seq_len
            yield row

    def leftover(self) -> list[int]:
        return self._tokens[self._start :]


def _to_batch(rows: list[list[int]]) -> Batch:
    input_ids = torch.tensor(rows, dtype=torch.long)
    # HF causal LMs shift labels themselves; a copy so in-place masking never touches inputs.
    return {"input_ids": input_ids, "labels": input_ids.clone()}


class TrainLoader:
    """Endless ``[batch_size, seq_len]`` token batches for one data-parallel rank.

    ``state_dict()`` after k batches, loaded into a fresh loader with the same arguments, makes
    it yield batch k+1 next. One iterator at a time: a new ``iter()`` continues after the last
    batch the previous one delivered.

    With ``num_workers > 0`` a background thread reads and tokenises that many batches ahead
    (the tokenizer and Arrow release the GIL, so this overlaps with the training step); each
    batch travels with the state after it, so read-ahead never leaks into a checkpoint.
    """

    def __init__(self, plan: DocumentPlan, *, batch_size: int, num_workers: int = 0) -> None:
        self._plan = plan
        self.batch_size = batch_size
        self.seq_len = plan.seq_len
        self.num_workers = num_workers
        self._epoch = 0
        self._docs_in_epoch = 0
        self._buffer = _TokenBuffer(plan.seq_len)
        self._pending_dataset_state: dict[str, Any] | None = None
        # The IterableDataset being read: its state is the position within the epoch.
        self._live: IterableDataset | None = None
        # Read-ahead only: the state after the last batch handed out, and the reader thread.
        self._delivered: dict[str, Any] | None = None
        self._producer: threading.Thread | None = None
        self._stop = threading.Event()
        if num_workers > 0:
            # A daemon thread still reading at interpreter shutdown can abort the process (it
            # may hold stderr's lock); stopping it first makes exit clean.
            atexit.register(_close_if_alive, weakref.ref(self))

    @property
    def epoch(self) -> int:
        """The epoch the last delivered batch was completed in."""
        return int(self._delivered["epoch"]) if self._delivered is not None else self._epoch

    def __iter__(self) -> Iterator[Batch]:
        self._rewind()
        if self.num_workers > 0:
            return self._read_ahead()
        return self._batches()

    def _rewind(self) -> None:
        """Put the reading position right after the last batch delivered."""
        if self._delivered is not None:
            self.load_state_dict(self._delivered)
        elif self._live is not None:
            self._pending_dataset_state, self._live = self._live.state_dict(), None

    def _batches(self) -> Iterator[Batch]:
        rows: list[list[int]] = []
        for row in self._rows():
            rows.append(row)
            if len(rows) == self.batch_size:
                yield _to_batch(rows)
                rows = []

    def _read_ahead(self) -> Iterator[Batch]:
        ready: queue.Queue[tuple[Batch, dict[str, Any]] | BaseException] = queue.Queue(
            maxsize=self.num_workers
        )
        stop = self._stop = threading.Event()

        def produce() -> None:
            try:
                for batch in self._batches():
                    if not _put_unless_stopped(ready, (batch, self._snapshot()), stop):
                        return
            except BaseException as error:  # re-raised in the training loop's thread
                _put_unless_stopped(ready, error, stop)

        self._delivered = self._snapshot()
        self._producer = threading.Thread(
            target=produce, name=f"data-rank{self._plan.dp_rank}", daemon=True
        )
        self._producer.start()
        try:
            while True:
                item = ready.get()
                if isinstance(item, BaseException):
                    raise item
                batch, self._delivered = item
                yield batch
        finally:
            stop.set()  # the reader ends at its next hand-over; joined before any reuse

    def close(self) -> None:
        """Stop the read-ahead thread, if any; also run at interpreter exit."""
        self._stop_producer(timeout_s=SHUTDOWN_TIMEOUT_S)

    def _stop_producer(self, timeout_s: float | None = None) -> None:
        if self._producer is not None:
            self._stop.set()
            self._producer.join(timeout_s)
            self._producer = None

    def _rows(self) -> Iterator[list[int]]:
        plan = self._plan
        heldout = False if plan.holds_out else None
        while True:
            docs = plan.documents(plan.corpus.train, heldout=heldout, epoch=self._epoch)
            if self._pending_dataset_state is not None:
                docs.load_state_dict(self._pending_dataset_state)
                self._pending_dataset_state = None
            for example in docs:
                self._live = docs
                self._docs_in_epoch += 1
                self._buffer.extend(example["input_ids"])
                yield from self._buffer.rows()
            if self._docs_in_epoch == 0:
                raise DataConfigError(
                    f"--dataset {plan.corpus.name!r}: data-parallel rank {plan.dp_rank} of "
                    f"{plan.dp_world_size} found no training documents in epoch {self._epoch}."
                )
            logger.info("data: rank %d finished epoch %d", plan.dp_rank, self._epoch)
            self._epoch += 1
            self._docs_in_epoch = 0
            self._live = None

    def state_dict(self) -> dict[str, Any]:
        """Small and picklable: datasets' position, leftover tokens, epoch, and their context."""
        if self._delivered is not None:
            return copy.deepcopy(self._delivered)
        return self._snapshot()

    def _snapshot(self) -> dict[str, Any]:
        dataset_state = (
            self._live.state_dict() if self._live is not None else self._pending_dataset_state
        )
        return {
            "version": STATE_VERSION,
            "dataset": self._plan.corpus.name,
            "dp_rank": self._plan.dp_rank,
            "dp_world_size": self._plan.dp_world_size,
            "seed": self._plan.seed,
            "epoch": self._epoch,
            "docs_in_epoch": self._docs_in_epoch,
            "dataset_state": dataset_state,
            "leftover_tokens": self._buffer.leftover(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; a state from a different data layout starts a fresh epoch."""
        if state.get("version") != STATE_VERSION:
            raise DataConfigError(
                f"data loader state has version {state.get('version')!r}; this trainer reads "
                f"version {STATE_VERSION}."
            )
        self._stop_producer()
        self._delivered = None
        self._live = None
        layout = {
            "dataset": self._plan.corpus.name,
            "dp_rank": self._plan.dp_rank,
            "dp_world_size": self._plan.dp_world_size,
            "seed": self._plan.seed,
        }
        changed = {key: (state[key], now) for key, now in layout.items() if state[key] != now}
        if changed:
            # The saved position means nothing in another layout; a new epoch at least avoids
            # replaying the part of the current one this rank has already trained on.
            logger.warning(
                "data: loader state was saved with a different %s; starting a new epoch",
                ", ".join(f"{key} ({old!r} -> {now!r})" for key, (old, now) in changed.items()),
            )
            self._epoch = int(state["epoch"]) + 1 if "dataset" not in changed else 0
            self._docs_in_epoch = 0
            self._pending_dataset_state = None
            self._buffer = _TokenBuffer(self.seq_len)
            return
        self._epoch = int(state["epoch"])
        self._docs_in_epoch = int(state["docs_in_epoch"])
        self._pending_dataset_state = state["dataset_state"]
        self._buffer = _TokenBuffer(self.seq_len, state["leftover_tokens"])


def _close_if_alive(loader: weakref.ref[TrainLoader]) -> None:
    alive = loader()
    if alive is not None:
        alive.close()


def _put_unless_stopped(
    ready: queue.Queue[Any], item: object, stop: threading.Event, poll_s: float = 0.1
) -> bool:
    """Block until ``item`` is queued or ``stop`` is set (the consumer went away)."""
    while not stop.is_set():
        try:
            ready.put(item, timeout=poll_s)
            return True
        except queue.Full:
            continue
    return False


class ValLoader:
    """Exactly ``max_batches`` validation batches for one rank, the same ones on every pass.

    Every rank yields the same number of batches (repeating its part of small validation data),
    because a sharded model's forward pass is a collective that all ranks must join.
    """

    def __init__(self, plan: DocumentPlan, *, batch_size: int, max_batches: int) -> None:
        self._plan = plan
        self.batch_size = batch_size
        self.max_batches = max(0, max_batches)
        self._cached: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.max_batches

    def __iter__(self) -> Iterator[Batch]:
        if self._cached is None:
            self._cached = list(self._generate())
        for input_ids in self._cached:
            yield {"input_ids": input_ids, "labels": input_ids.clone()}

    def _generate(self) -> Iterator[torch.Tensor]:
        plan = self._plan
        if plan.corpus.validation is not None:
            split, heldout = plan.corpus.validation, None
            # A validation set smaller than the world is read whole by every rank: the same
            # loss on each, rather than ranks without any validation data.
            small = isinstance(split, Dataset) and len(split) < plan.dp_world_size
        else:
            split, heldout, small = plan.corpus.train, True, False
        buffer = _TokenBuffer(plan.seq_len)
        rows: list[list[int]] = []
        produced = passes = 0
        while produced < self.max_batches:
            docs_seen = 0
            docs = plan.documents(split, heldout=heldout, epoch=None, every_rank_reads_all=small)
            for example in docs:
                docs_seen += 1
                buffer.extend(example["input_ids"])
                for row in buffer.rows():
                    rows.append(row)
                    if len(rows) == self.batch_size:
                        yield torch.tensor(rows, dtype=torch.long)
                        rows, produced = [], produced + 1
                        if produced == self.max_batches:
                            return
            if docs_seen == 0:
                source = "validation split" if heldout is None else "held-out slice"
                raise DataConfigError(
                    f"--dataset {plan.corpus.name!r}: data-parallel rank {plan.dp_rank} of "
                    f"{plan.dp_world_size} found no documents in the {source}."
                )
            passes += 1
            if passes == 1:
                logger.warning(
                    "data: rank %d's validation data gave %d of %d batches; repeating it",
                    plan.dp_rank,
                    produced,
                    self.max_batches,
                )
