"""The trainer's data path: ``--dataset`` and ``--tokenizer`` in, packed token batches out.

``sources`` resolves where documents come from; ``loader`` turns them into per-rank, resumable
batches of exactly ``seq_len`` tokens.
"""

from trainer.data.loader import (
    DEFAULT_HELDOUT_FRACTION,
    Batch,
    TrainLoader,
    ValLoader,
    build_train_loader,
    build_val_loader,
    is_heldout,
    load_tokenizer,
)
from trainer.data.sources import Corpus, DataConfigError, load_corpus

__all__ = [
    "DEFAULT_HELDOUT_FRACTION",
    "Batch",
    "Corpus",
    "DataConfigError",
    "TrainLoader",
    "ValLoader",
    "build_train_loader",
    "build_val_loader",
    "is_heldout",
    "load_corpus",
    "load_tokenizer",
]
