"""Tokenisation comes in small bursts the read-ahead can hide (issue 14, hazard 4).

Counted, not timed: every call of the tokenizer that the loader's lazy `datasets.map` makes is
recorded with the number of documents it tokenises. `scripts/bench_loader.py` measures what
that does to the stall share (docs/benchmarks.md); here its smoke run checks it works.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from transformers import PreTrainedTokenizerFast

from scripts import bench_loader
from trainer.data import build_train_loader, load_tokenizer
from trainer.data.documents import MAP_BATCH_DOCUMENTS, RESUME_SHARDS
from trainer.tiny_assets import TinyAssets


def test_no_tokenizer_call_takes_more_than_the_map_batch(
    tiny_assets: TinyAssets, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Enough documents that each of the loader's resume shards (trainer.data.documents
    # RESUME_SHARDS) holds more than a map batch: the calls are then cut by the map batch.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    words = bench_loader.WORDS
    with (corpus / "train.jsonl").open("w") as out:
        for index in range(RESUME_SHARDS * 3 * MAP_BATCH_DOCUMENTS):
            text = " ".join(words[(index + k) % len(words)] for k in range(8))
            out.write(json.dumps({"text": text}) + "\n")
    tokenizer = load_tokenizer(str(tiny_assets.tokenizer_dir))
    sizes: list[int] = []
    real = PreTrainedTokenizerFast.__call__

    def counted(self: Any, text: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(text) if isinstance(text, list) else 1)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerFast, "__call__", counted)
    loader = build_train_loader(
        dataset=str(corpus),
        dataset_config_name=None,
        tokenizer=tokenizer,
        seq_len=64,
        batch_size=4,
        dp_rank=0,
        dp_world_size=1,
        seed=0,
        cache_dir=str(tmp_path / "cache"),
    )
    batches = iter(loader)
    for _ in range(20):
        next(batches)
    assert sizes, "the loader never called the tokenizer"
    assert max(sizes) == MAP_BATCH_DOCUMENTS < 1000  # datasets' own default batch


def test_the_loader_benchmark_runs_and_reports_each_map_batch(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--steps", "3", "--documents", "200", "--step_ms", "1", "--seq_len", "256"]
    assert bench_loader.main([*argv, "--map_batch", "1000", "--map_batch", "64"]) == 0
    out = capsys.readouterr().out
    result = json.loads(out.strip().splitlines()[-1])["loader_stall_share"]
    assert set(result) == {"step_ms", "num_workers", "1000", "64"}
    assert all(0 <= result[size] < 1 for size in ("1000", "64"))
    assert "map batch    64 documents:" in out
