"""This rank's documents as token lists: split by rank, reshuffled per epoch, EOS-terminated.

Tokenising is lazy (``IterableDataset.map``), so a corpus of any size costs nothing up front, and
everything here is stateless given (seed, epoch): the loaders resume by handing ``datasets`` its
own iteration state back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasets import Dataset, IterableDataset
from datasets.distributed import split_dataset_by_node
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trainer.data.sources import AnyDataset, Corpus, DataConfigError

# Share of documents held out for validation when the dataset has no validation split.
DEFAULT_HELDOUT_FRACTION = 0.01
# A resumed map-style epoch re-reads at most 1/RESUME_SHARDS of this rank's part to find its place.
RESUME_SHARDS = 64
MAP_BATCH_DOCUMENTS = 64
"""Documents tokenised per call. `datasets`' default (1000) makes each call a burst that
blocks the read-ahead thread for about a second (a 1B model's step is ~0.1 s on an H100),
longer than the two-batch read-ahead covers; 64 documents are ~1/16 of that, and the
tokenizer's batching gains little beyond a few dozen texts. Measured with
`scripts/bench/loader_stall.py` (docs/benchmarks.md)."""


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
class DocumentPlan:
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
        self,
        split: AnyDataset,
        *,
        heldout: bool | None,
        epoch: int | None,
        every_rank_reads_all: bool = False,
    ) -> IterableDataset:
        """This rank's tokenised documents of ``split``, as an ``IterableDataset``.

        ``heldout`` keeps only (True) or drops (False) the held-out slice; None keeps all.
        ``epoch`` None keeps the source order (validation); otherwise the order is a reshuffle
        from (seed, epoch): of this rank's part for local data, of the shard order (the same on
        every rank, so parts stay disjoint) for streamed data.
        ``every_rank_reads_all`` skips the split by rank (validation smaller than the world).
        """
        if isinstance(split, Dataset):
            if not every_rank_reads_all:
                if len(split) <= self.dp_rank:
                    raise DataConfigError(
                        f"--dataset {self.corpus.name!r}: data-parallel rank {self.dp_rank} of "
                        f"{self.dp_world_size} gets no documents ({len(split)} in the split)."
                    )
                split = split_dataset_by_node(
                    split, rank=self.dp_rank, world_size=self.dp_world_size
                )
            if epoch is not None:
                # Within this rank's part, so the permutation costs 8 bytes per document / world.
                order = np.random.default_rng((self.seed, epoch))
                split = split.shuffle(generator=order, keep_in_memory=True)
            # Shards only so that a resume skips whole shards instead of re-reading rows.
            docs = split.to_iterable_dataset(num_shards=max(1, min(len(split), RESUME_SHARDS)))
        else:
            if epoch is not None:
                # buffer_size=1: shard order only. A larger buffer mixes better, but datasets
                # cannot save its content, so a resumed run would see different batches.
                split = split.shuffle(seed=self.seed, buffer_size=1, max_buffer_input_shards=1)
            docs = split
            if not every_rank_reads_all:
                docs = split_dataset_by_node(
                    split, rank=self.dp_rank, world_size=self.dp_world_size
                )
        # One batched map both selects and tokenises: chaining filter and map would make
        # datasets build a key string per document of every batch, a third of the read time.
        tokens = docs.map(
            self._tokenizer_for(heldout),
            batched=True,
            batch_size=MAP_BATCH_DOCUMENTS,
            remove_columns=docs.column_names or [self.text_column],
        )
        if epoch is not None:
            # datasets then reshuffles the shard order per epoch: for streamed data that is the
            # reshuffle; for local data it comes on top of the row permutation above.
            tokens.set_epoch(epoch)
        return tokens

    def _tokenizer_for(
        self, heldout: bool | None
    ) -> Callable[[dict[str, list[Any]]], dict[str, list[list[int]]]]:
        """Tokenise a batch of documents, dropping empty ones and those on the other side of
        the held-out split (``heldout`` as in ``documents``); each ends with EOS."""
        tokenizer, column, fraction = self.tokenizer, self.text_column, self.heldout_fraction
        eos = tokenizer.eos_token_id

        def tokenize(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
            texts = [
                text
                for text in batch[column]
                if isinstance(text, str)
                and text.strip()
                and (heldout is None or is_heldout(text, fraction) == heldout)
            ]
            if not texts:
                return {"input_ids": []}
            # add_special_tokens keeps the tokenizer's own convention (e.g. Llama's BOS per
            # text); verbose=False: long documents are fine here, the packer cuts them.
            ids = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
            return {"input_ids": [doc if doc[-1:] == [eos] else [*doc, eos] for doc in ids]}

        return tokenize
