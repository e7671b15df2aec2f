"""Tiny, offline training assets: a learnable corpus and a tokenizer trained on it.

Tests and local smoke runs must never touch the network, yet they need a real text corpus and a
real Hugging Face tokenizer to exercise the whole data path (tokenise, pack, shard, resume). The
corpus is templated text with counting and arithmetic patterns: regular enough that a ~1M-parameter
model's loss falls clearly within ~100 steps, varied enough that it cannot simply memorise it.

Run as ``python -m trainer.tiny_assets OUT_DIR`` to write the assets for a manual run.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]

TRAIN_FILES = ("train-00000.jsonl", "train-00001.jsonl")
VALIDATION_FILE = "validation.jsonl"
VALIDATION_FRACTION = 0.1
# Written last, so a directory without it is a half-written one from an interrupted run.
COMPLETE_MARKER = ".complete"

_NAMES = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy")
_ITEMS = ("apples", "pears", "books", "coins", "stones", "shells", "cards", "cups")
_DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_COLOURS = ("red", "green", "blue", "yellow", "black", "white")
_ANIMALS = ("cat", "dog", "fox", "owl", "bee", "cow")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _counting(rng: random.Random) -> str:
    start, step = rng.randint(0, 60), rng.choice((1, 1, 2, 5, 10))
    length = rng.randint(5, 12)
    numbers = " ".join(str(start + i * step) for i in range(length))
    return f"count from {start} in steps of {step} : {numbers} ."


def _arithmetic(rng: random.Random) -> str:
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    if rng.random() < 0.5:
        return f"{a} plus {b} is {a + b} ."
    big, small = max(a, b), min(a, b)
    return f"{big} minus {small} is {big - small} ."


def _story(rng: random.Random) -> str:
    giver, taker = rng.sample(_NAMES, 2)
    item = rng.choice(_ITEMS)
    have, gift = rng.randint(1, 20), rng.randint(1, 20)
    return (
        f"{taker} has {have} {item} . {giver} gives {taker} {gift} {item} . "
        f"now {taker} has {have + gift} {item} ."
    )


def _days(rng: random.Random) -> str:
    first = rng.randrange(len(_DAYS))
    span = rng.randint(3, 7)
    days = " ".join(_DAYS[(first + i) % len(_DAYS)] for i in range(span))
    return f"after {_DAYS[first]} come the days {days} ."


def _alphabet(rng: random.Random) -> str:
    first = rng.randrange(len(_LETTERS) - 6)
    run = " ".join(_LETTERS[first : first + rng.randint(4, 8)])
    return f"the letters go {run} ."


def _description(rng: random.Random) -> str:
    count = rng.randint(2, 9)
    return f"there are {count} {rng.choice(_COLOURS)} {rng.choice(_ANIMALS)}s in the field ."


_SENTENCE_TEMPLATES: tuple[Callable[[random.Random], str], ...] = (
    _counting,
    _arithmetic,
    _story,
    _days,
    _alphabet,
    _description,
)


def _documents(num_docs: int, seed: int) -> Iterator[str]:
    """Each document numbers itself, so tests can tell documents apart after decoding."""
    rng = random.Random(seed)
    for index in range(num_docs):
        sentences = [rng.choice(_SENTENCE_TEMPLATES)(rng) for _ in range(rng.randint(2, 6))]
        yield f"document {index} . " + " ".join(sentences)


@dataclass(frozen=True)
class TinyAssets:
    """Where the tiny corpus and tokenizer live; both load with the trainer's own data path."""

    corpus_dir: Path
    tokenizer_dir: Path


def write_tiny_corpus(directory: Path, *, num_docs: int = 2000, seed: int = 0) -> Path:
    """Write ``num_docs`` templated documents as jsonl with a "text" column.

    The last tenth goes to ``validation.jsonl`` (the trainer picks it up as the validation split);
    the rest is split over two train files so multi-file loading is exercised too.
    """
    if num_docs < 10:
        raise ValueError(f"num_docs must be at least 10 (train and validation), got {num_docs}")
    directory.mkdir(parents=True, exist_ok=True)
    docs = list(_documents(num_docs, seed))
    num_val = max(1, int(num_docs * VALIDATION_FRACTION))
    train, validation = docs[:-num_val], docs[-num_val:]
    half = len(train) // 2
    for name, part in (
        (TRAIN_FILES[0], train[:half]),
        (TRAIN_FILES[1], train[half:]),
        (VALIDATION_FILE, validation),
    ):
        with (directory / name).open("w", encoding="utf-8") as out:
            out.writelines(json.dumps({"text": text}) + "\n" for text in part)
    return directory


def _corpus_texts(corpus_dir: Path) -> Iterator[str]:
    for path in sorted(corpus_dir.glob("*.jsonl")):
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                yield json.loads(line)["text"]


def train_tiny_tokenizer(corpus_dir: Path, out_dir: Path, *, vocab_size: int = 512) -> Path:
    """Train a byte-level BPE tokenizer on the corpus and save it with ``save_pretrained``.

    Byte-level, so any text round-trips (no unknown characters), and Llama-like: it prepends
    ``<s>`` to every encoded text and leaves ``</s>`` to the packer, which puts it between
    documents.
    """
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus_texts(corpus_dir), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B",
        special_tokens=[(BOS_TOKEN, bos_id)],
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=1_000_000,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    wrapped.save_pretrained(str(out_dir))
    return out_dir


def ensure_tiny_assets(root: Path) -> TinyAssets:
    """Create the corpus and tokenizer under ``root`` unless a complete set is already there.

    Built in a temporary sibling directory and renamed into place, so an interrupted run never
    leaves a half-written set that a later call would trust.
    """
    assets = TinyAssets(corpus_dir=root / "corpus", tokenizer_dir=root / "tokenizer")
    if (root / COMPLETE_MARKER).exists():
        return assets
    root.mkdir(parents=True, exist_ok=True)
    # Concurrent callers (parallel test workers sharing a root) build the set once.
    with FileLock(str(root / ".lock")):
        if (root / COMPLETE_MARKER).exists():
            return assets
        staging = Path(tempfile.mkdtemp(prefix=".tiny-assets-", dir=root))
        try:
            write_tiny_corpus(staging / "corpus")
            train_tiny_tokenizer(staging / "corpus", staging / "tokenizer")
            for name in ("corpus", "tokenizer"):
                if (root / name).exists():
                    shutil.rmtree(root / name)
                (staging / name).rename(root / name)
            (root / COMPLETE_MARKER).touch()
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    logger.info("wrote tiny corpus to %s and tokenizer to %s", *vars(assets).values())
    return assets


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.tiny_assets",
        description="Write the tiny offline corpus and tokenizer used by tests and smoke runs.",
        allow_abbrev=False,
    )
    parser.add_argument("out_dir", type=Path, help="directory to write corpus/ and tokenizer/ into")
    args = parser.parse_args(argv)
    assets = ensure_tiny_assets(args.out_dir)
    print(f"--dataset {assets.corpus_dir} --tokenizer {assets.tokenizer_dir}")  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main())
