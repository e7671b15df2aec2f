"""Token batches for training and validation: tokenise, add EOS, pack, split by rank, resume.

Documents are tokenised lazily by ``datasets`` (``IterableDataset.map``), each followed by EOS, and
concatenated into rows of exactly ``seq_len`` tokens: no padding, and the tail of one document
starts the next row rather than being dropped. Each data-parallel rank reads its own part of the
data (``split_dataset_by_node``), so no two ranks train on the same sequence.

The train loader is resumable to the batch: its state is ``datasets``' own iteration state, the
packer's leftover tokens and the epoch. Nothing in it buffers documents it cannot save, which is
why shuffling is exact (a per-epoch permutation for local data, shard order for streamed data)
rather than ``datasets``' shuffle buffer, whose content a checkpoint would lose.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trainer.data.sources import AnyDataset, Corpus, DataConfigError, load_corpus

logger = logging.getLogger(__name__)

Batch = dict[str, torch.Tensor]
# Share of documents held out for validation when the dataset has no validation split.
DEFAULT_HELDOUT_FRACTION = 0.01
STATE_VERSION = 1


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A Hub id or local directory; the packer needs its EOS token between documents."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as error:
        raise DataConfigError(
            f"--tokenizer {name_or_path!r} could not be loaded as a Hugging Face tokenizer "
            f"(a Hub id or a directory with tokenizer files): {error}"
        ) from error
    if tokenizer.eos_token_id is None:
        raise DataConfigError(
            f"--tokenizer {name_or_path!r} has no EOS token, which separates packed documents."
        )
    return tokenizer


def is_heldout(text: str, fraction: float) -> bool:
    """Whether a document belongs to the held-out validation slice.

    Decided by the text's hash, not its position: the answer is the same on every rank, in every
    epoch and shuffle, for streamed and local data alike, and duplicates land on the same side.
    """
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


@dataclass(frozen=True)
class _Plan:
    """Everything that decides which documents a rank reads and how they become tokens."""

    corpus: Corpus
    tokenizer: PreTrainedTokenizerBase
    seq_len: int
    dp_rank: int
    dp_world_size: int
    seed: int
    text_column: str
    heldout_fraction: float

    @property
    def holds_out(self) -> bool:
        """Validation comes out of the train split only when the dataset has no split of its own."""
        return self.corpus.validation is None

    def documents(
        self, split: AnyDataset, *, heldout: bool | None, epoch: int | None
    ) -> IterableDataset:
        """This rank's tokenised documents of ``split``, as an ``IterableDataset``.

        ``heldout`` keeps only (True) or drops (False) the held-out slice; None keeps all.
        ``epoch`` None keeps the source order (validation); otherwise the order is a reshuffle
        from (seed, epoch), identical on every rank so that their parts stay disjoint.
        """
        if isinstance(split, Dataset):
            if epoch is not None:
                order = np.random.default_rng((self.seed, epoch))
                split = split.shuffle(generator=order, keep_in_memory=True)
            if len(split) <= self.dp_rank:
                raise DataConfigError(
                    f"--dataset {self.corpus.name!r}: data-parallel rank {self.dp_rank} of "
                    f"{self.dp_world_size} gets no documents ({len(split)} in the split)."
                )
            part = split_dataset_by_node(split, rank=self.dp_rank, world_size=self.dp_world_size)
            docs = part.to_iterable_dataset()
        else:
            if epoch is not None:
                # buffer_size=1: shard order only. A larger buffer mixes better, but datasets
                # cannot save its content, so a resumed run would see different batches.
                split = split.shuffle(seed=self.seed, buffer_size=1, max_buffer_input_shards=1)
            docs = split_dataset_by_node(split, rank=self.dp_rank, world_size=self.dp_world_size)
        tokens = docs.filter(self._keep(heldout), batched=True).map(
            self._tokenize,
            batched=True,
            remove_columns=docs.column_names or [self.text_column],
        )
        if epoch is not None:
            tokens.set_epoch(epoch)  # streamed data: datasets reshuffles shard order per epoch
        return tokens

    def _keep(self, heldout: bool | None) -> Callable[[dict[str, list[Any]]], list[bool]]:
        fraction, column = self.heldout_fraction, self.text_column

        def keep(batch: dict[str, list[Any]]) -> list[bool]:
            return [
                isinstance(text, str)
                and bool(text.strip())
                and (heldout is None or is_heldout(text, fraction) == heldout)
                for text in batch[column]
            ]

        return keep

    def _tokenize(self, batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        eos = self.tokenizer.eos_token_id
        # add_special_tokens keeps the tokenizer's own convention (e.g. Llama's BOS per text);
        # verbose=False: long documents are fine here, the packer cuts them.
        encoded = self.tokenizer(batch[self.text_column], add_special_tokens=True, verbose=False)
        ids = encoded["input_ids"]
        return {"input_ids": [doc if doc[-1:] == [eos] else [*doc, eos] for doc in ids]}


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

    def __init__(self, plan: _Plan, *, batch_size: int, num_workers: int = 0) -> None:
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

    def _stop_producer(self) -> None:
        if self._producer is not None:
            self._stop.set()
            self._producer.join()
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

    def __init__(self, plan: _Plan, *, batch_size: int, max_batches: int) -> None:
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
        else:
            split, heldout = plan.corpus.train, True
        buffer = _TokenBuffer(plan.seq_len)
        rows: list[list[int]] = []
        produced = passes = 0
        while produced < self.max_batches:
            docs_seen = 0
            for example in plan.documents(split, heldout=heldout, epoch=None):
                docs_seen += 1
                buffer.extend(example["input_ids"])
                for row in buffer.rows():
                    rows.append(row)
                    if len(rows) == self.batch_size:
                        yield _to_batch(rows)["input_ids"]
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


def _plan(
    *,
    dataset: str,
    dataset_config_name: str | None,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    text_column: str,
    heldout_fraction: float,
    streaming: bool | None,
    cache_dir: str | None,
) -> _Plan:
    if seq_len < 1:
        raise DataConfigError(f"seq_len (--max_context_width) must be positive, got {seq_len}")
    if not 0 <= dp_rank < dp_world_size:
        raise DataConfigError(f"dp_rank {dp_rank} is outside 0..{dp_world_size - 1}")
    if not 0.0 < heldout_fraction < 1.0:
        raise DataConfigError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    corpus = load_corpus(
        dataset,
        dataset_config_name,
        text_column=text_column,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    return _Plan(
        corpus=corpus,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        text_column=text_column,
        heldout_fraction=heldout_fraction,
    )


def build_train_loader(
    *,
    dataset: str,
    dataset_config_name: str | None,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    batch_size: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    text_column: str = "text",
    num_workers: int = 0,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    streaming: bool | None = None,
    cache_dir: str | None = None,
) -> TrainLoader:
    """Endless, resumable training batches for ``dp_rank`` (see ``TrainLoader``)."""
    if batch_size < 1:
        raise DataConfigError(f"batch_size (--train_batch_size) must be positive, got {batch_size}")
    plan = _plan(
        dataset=dataset,
        dataset_config_name=dataset_config_name,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        text_column=text_column,
        heldout_fraction=heldout_fraction,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    source = "the validation split" if not plan.holds_out else f"{heldout_fraction:.2%} held out"
    logger.info(
        "data: %s for rank %d of %d, %d x %d tokens per batch, validation from %s",
        dataset,
        dp_rank,
        dp_world_size,
        batch_size,
        seq_len,
        source,
    )
    return TrainLoader(plan, batch_size=batch_size, num_workers=num_workers)


def build_val_loader(
    *,
    dataset: str,
    dataset_config_name: str | None,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    batch_size: int,
    max_batches: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int = 0,
    text_column: str = "text",
    num_workers: int = 0,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    streaming: bool | None = None,
    cache_dir: str | None = None,
) -> ValLoader:
    """``max_batches`` deterministic validation batches for ``dp_rank`` (see ``ValLoader``).

    The validation split if the dataset has one, else the held-out slice the train loader skips
    (same ``heldout_fraction`` on both sides).
    """
    if batch_size < 1:
        raise DataConfigError(f"batch_size (--val_batch_size) must be positive, got {batch_size}")
    plan = _plan(
        dataset=dataset,
        dataset_config_name=dataset_config_name,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        text_column=text_column,
        heldout_fraction=heldout_fraction,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    return ValLoader(plan, batch_size=batch_size, max_batches=max_batches)
