"""The trainer's data path: ``--dataset`` and ``--tokenizer`` in, packed token batches out.

``sources`` resolves where documents come from, ``documents`` turns them into this rank's token
lists, ``packing`` cuts those into resumable batches of exactly ``seq_len`` tokens, and
``loader`` builds it all from the trainer's flags.
"""

from trainer.data.documents import DEFAULT_HELDOUT_FRACTION, is_heldout, load_tokenizer
from trainer.data.loader import build_train_loader, build_val_loader
from trainer.data.packing import Batch, TrainLoader, ValLoader
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
