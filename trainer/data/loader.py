"""Building the loaders from the trainer's flags: ``build_train_loader``, ``build_val_loader``.

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

from trainer.data.documents import DEFAULT_HELDOUT_FRACTION, DocumentPlan, load_tokenizer
from trainer.data.packing import TrainLoader, ValLoader
from trainer.data.sources import DataConfigError, load_corpus

logger = logging.getLogger(__name__)


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
        dataset,
        dataset_config_name,
        text_column=text_column,
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
