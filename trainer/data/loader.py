"""The loaders built from the trainer's data section: ``build_train_loader``, ``build_val_loader``.

Documents are tokenised lazily by ``datasets``, each followed by EOS, and packed into rows of
exactly ``seq_len`` tokens. Each data-parallel rank reads its own part of the data
(``split_dataset_by_node``), so no two ranks train on the same sequence.

The train loader is resumable to the batch: its state is ``datasets``' own iteration state, the
packer's leftover tokens and the epoch. Nothing in it buffers documents it cannot save, which is
why shuffling is exact (a per-epoch permutation for local data, shard order for streamed data)
rather than ``datasets``' shuffle buffer, whose content a checkpoint would lose.
"""

from __future__ import annotations

import logging

from transformers import PreTrainedTokenizerBase

from trainer.config import DataConfig
from trainer.data.documents import DEFAULT_HELDOUT_FRACTION, DocumentPlan, load_tokenizer
from trainer.data.packing import TrainLoader, ValLoader
from trainer.data.sources import DataConfigError, load_corpus

logger = logging.getLogger(__name__)


def _plan(
    data: DataConfig,
    *,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    heldout_fraction: float,
    streaming: bool | None,
    cache_dir: str | None,
) -> DocumentPlan:
    if seq_len < 1:
        raise DataConfigError(f"seq_len (--max_context_width) must be positive, got {seq_len}")
    if not 0 <= dp_rank < dp_world_size:
        raise DataConfigError(f"dp_rank {dp_rank} is outside 0..{dp_world_size - 1}")
    if not 0.0 < heldout_fraction < 1.0:
        raise DataConfigError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer)
    corpus = load_corpus(
        data.dataset,
        data.dataset_config_name,
        text_column=data.text_column,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    return DocumentPlan(
        corpus=corpus,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        text_column=data.text_column,
        heldout_fraction=heldout_fraction,
    )


def build_train_loader(
    data: DataConfig,
    *,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    streaming: bool | None = None,
    cache_dir: str | None = None,
) -> TrainLoader:
    """Endless, resumable training batches of `data.train_batch_size` for ``dp_rank`` (see
    ``TrainLoader``); `data` is the trainer's data section, read ahead by its `num_workers`."""
    batch_size = data.train_batch_size
    if batch_size < 1:
        raise DataConfigError(f"batch_size (--train_batch_size) must be positive, got {batch_size}")
    plan = _plan(
        data,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        heldout_fraction=heldout_fraction,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    source = "the validation split" if not plan.holds_out else f"{heldout_fraction:.2%} held out"
    logger.info(
        "data: %s for rank %d of %d, %d x %d tokens per batch, validation from %s",
        data.dataset,
        dp_rank,
        dp_world_size,
        batch_size,
        seq_len,
        source,
    )
    return TrainLoader(plan, batch_size=batch_size, num_workers=data.num_workers)


def build_val_loader(
    data: DataConfig,
    *,
    tokenizer: PreTrainedTokenizerBase | str,
    seq_len: int,
    max_batches: int,
    dp_rank: int,
    dp_world_size: int,
    seed: int = 0,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    streaming: bool | None = None,
    cache_dir: str | None = None,
) -> ValLoader:
    """``max_batches`` deterministic validation batches of `data.val_batch_size` for
    ``dp_rank`` (see ``ValLoader``).

    The validation split if the dataset has one, else the held-out slice the train loader skips
    (same ``heldout_fraction`` on both sides).
    """
    batch_size = data.val_batch_size
    if batch_size < 1:
        raise DataConfigError(f"batch_size (--val_batch_size) must be positive, got {batch_size}")
    plan = _plan(
        data,
        tokenizer=tokenizer,
        seq_len=seq_len,
        dp_rank=dp_rank,
        dp_world_size=dp_world_size,
        seed=seed,
        heldout_fraction=heldout_fraction,
        streaming=streaming,
        cache_dir=cache_dir,
    )
    return ValLoader(plan, batch_size=batch_size, max_batches=max_batches)
