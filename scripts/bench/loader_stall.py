"""How much of a GPU step's time the training loop waits for data: the loader stall share.

    python scripts/bench/loader_stall.py                     # 1000 versus 64 documents per map call
    python scripts/bench/loader_stall.py --step_ms 102 --steps 300 --map_batch 64

The trainer's own loader feeds a consumer that sleeps `--step_ms` per batch; the stall share
is the time spent in `next()`. Prints one line per setting, then a JSON line.
Method: docs/design/bench.md#loader_stall
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be",
    "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have",
    "an", "they", "you", "were", "her", "she", "there", "one", "all", "we", "their", "has",
    "been", "would", "more", "when", "training", "model", "data", "cluster", "network",
    "memory", "checkpoint", "gradient", "sequence", "token", "learning", "distributed",
    "parallel", "shard", "node", "accelerator", "throughput", "latency", "bandwidth", "storage",
    "volume",
)  # fmt: skip


def write_corpus(directory: Path, documents: int, seed: int) -> Path:
    """A jsonl corpus of `documents` web-text-sized documents."""
    rng = random.Random(seed)
    path = directory / "train.jsonl"
    with path.open("w", encoding="utf-8") as out:
        for _ in range(documents):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(200, 2000)))
            out.write(json.dumps({"text": text}) + "\n")
    return path


def stall_share(args: argparse.Namespace, corpus: Path, tokenizer: str, map_batch: int) -> float:
    """The share of the loop spent waiting for batches, with `map_batch` documents per call."""
    from trainer.config import DataConfig
    from trainer.data import build_train_loader, documents

    documents.MAP_BATCH_DOCUMENTS = map_batch
    data = DataConfig(
        dataset=str(corpus.parent),
        dataset_config_name=None,
        train_batch_size=args.batch_size,
        num_workers=args.num_workers,
    )
    loader = build_train_loader(
        data,
        tokenizer=tokenizer,
        seq_len=args.seq_len,
        dp_rank=0,
        dp_world_size=1,
        seed=0,
        cache_dir=str(corpus.parent.parent / "cache"),
    )
    batches = iter(loader)
    next(batches)  # the first batch: opening the files, not a steady-state stall
    waited = 0.0
    started = time.perf_counter()
    for _ in range(args.steps):
        asked = time.perf_counter()
        next(batches)
        waited += time.perf_counter() - asked
        time.sleep(args.step_ms / 1000)
    total = time.perf_counter() - started
    loader.close()
    return waited / total


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0], allow_abbrev=False)
    add = parser.add_argument
    add("--step_ms", type=float, default=102.0, help="The simulated GPU step.")
    add("--steps", type=int, default=600, help="Steps measured (a burst every ~240 here).")
    add("--seq_len", type=int, default=4096, help="Tokens per sequence.")
    add("--batch_size", type=int, default=4, help="Sequences per step (a 1B model on an H100).")
    add("--num_workers", type=int, default=2, help="Read-ahead depth in batches (the default).")
    add("--documents", type=int, default=6000, help="Documents in the generated corpus.")
    add(
        "--map_batch",
        type=int,
        action="append",
        default=None,
        help="Documents per map call; repeat to compare (default: 1000 and the trainer's).",
    )
    args = parser.parse_args(list(argv))
    for name in ("step_ms", "steps", "seq_len", "batch_size", "documents"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name} must be > 0, got {getattr(args, name)}")
    if args.num_workers < 1:
        parser.error("--num_workers must be >= 1: without read-ahead every burst is a stall")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from trainer.data.documents import MAP_BATCH_DOCUMENTS
    from trainer.tiny_assets import ensure_tiny_assets

    sizes = args.map_batch or [1000, MAP_BATCH_DOCUMENTS]
    results: dict[str, Any] = {"step_ms": args.step_ms, "num_workers": args.num_workers}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        tokenizer = str(ensure_tiny_assets(root / "assets").tokenizer_dir)
        (root / "corpus").mkdir()
        corpus = write_corpus(root / "corpus", args.documents, seed=0)
        for size in sizes:
            share = stall_share(args, corpus, tokenizer, size)
            print(
                f"map batch {size:>5} documents: {share:.2%} of the loop waiting for data "
                f"({args.batch_size} x {args.seq_len} tokens per {args.step_ms:g} ms step, "
                f"read-ahead {args.num_workers})",
                flush=True,
            )
            results[str(size)] = round(share, 5)
    print(json.dumps({"loader_stall_share": results}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
