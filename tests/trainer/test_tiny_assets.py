"""The tiny assets are what every trainer test stands on: they must be real, offline and fast."""

from __future__ import annotations

import itertools
import json
import math
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from transformers import AutoTokenizer

from trainer import tiny_assets as assets_module
from trainer.tiny_assets import (
    TRAIN_FILES,
    VALIDATION_FILE,
    TinyAssets,
    ensure_tiny_assets,
    train_tiny_tokenizer,
    write_tiny_corpus,
)


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()]


def test_corpus_has_train_and_validation_files_of_distinct_documents(tmp_path: Path) -> None:
    corpus = write_tiny_corpus(tmp_path / "corpus", num_docs=200, seed=3)
    train = [t for name in assets_module.TRAIN_FILES for t in _texts(corpus / name)]
    validation = _texts(corpus / assets_module.VALIDATION_FILE)
    assert len(train) == 180
    assert len(validation) == 20
    assert not set(train) & set(validation)
    assert all(text.startswith("document ") for text in train + validation)


def test_corpus_is_deterministic_per_seed(tmp_path: Path) -> None:
    first = write_tiny_corpus(tmp_path / "a", num_docs=50, seed=1)
    again = write_tiny_corpus(tmp_path / "b", num_docs=50, seed=1)
    other = write_tiny_corpus(tmp_path / "c", num_docs=50, seed=2)
    name = assets_module.TRAIN_FILES[0]
    assert _texts(first / name) == _texts(again / name)
    assert _texts(first / name) != _texts(other / name)


def test_corpus_is_structured_enough_to_learn(tmp_path: Path) -> None:
    """Arithmetic in the text is right, so a model can actually learn the pattern."""
    corpus = write_tiny_corpus(tmp_path / "corpus", num_docs=300, seed=0)
    sums = 0
    for text in _texts(corpus / assets_module.TRAIN_FILES[0]):
        words = text.split()
        for i, word in enumerate(words[:-4]):
            if word == "plus":
                a, b, result = int(words[i - 1]), int(words[i + 1]), int(words[i + 3])
                assert a + b == result, text
                sums += 1
    assert sums > 20


def test_tokenizer_trains_fast_and_loads_with_auto_tokenizer(tmp_path: Path) -> None:
    corpus = write_tiny_corpus(tmp_path / "corpus")
    started = time.perf_counter()
    out = train_tiny_tokenizer(corpus, tmp_path / "tok", vocab_size=512)
    assert time.perf_counter() - started < 5.0
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert len(tokenizer) == 512
    assert tokenizer.eos_token == assets_module.EOS_TOKEN
    assert tokenizer.bos_token == assets_module.BOS_TOKEN
    assert tokenizer.pad_token == assets_module.PAD_TOKEN
    assert len({tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id}) == 3
    text = "document 7 . 12 plus 30 is 42 . ünïcode ☃"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Merges were learned: common words are single tokens, so sequences are short.
    assert tokenizer.tokenize(" alice gives bob") == ["Ġalice", "Ġgives", "Ġbob"]


def test_ensure_tiny_assets_is_idempotent_and_ignores_half_written_sets(tmp_path: Path) -> None:
    root = tmp_path / "assets"
    (root / "corpus").mkdir(parents=True)
    (root / "corpus" / "stale.jsonl").write_text("half written", encoding="utf-8")
    assets = ensure_tiny_assets(root)
    assert not (assets.corpus_dir / "stale.jsonl").exists()
    tokenizer_file = assets.tokenizer_dir / "tokenizer.json"
    written_at = tokenizer_file.stat().st_mtime_ns
    assert ensure_tiny_assets(root) == assets
    assert tokenizer_file.stat().st_mtime_ns == written_at
    assert sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) == [
        "corpus",
        "tokenizer",
    ]


def test_concurrent_callers_build_one_complete_set(tmp_path: Path) -> None:
    root = tmp_path / "shared"
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda _: ensure_tiny_assets(root), range(3)))
    assert len(set(results)) == 1
    assert (root / "tokenizer" / "tokenizer.json").exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".tiny-assets-")]


def test_session_fixture_provides_loadable_assets(tiny_assets: TinyAssets) -> None:
    corpus_files = sorted(p.name for p in tiny_assets.corpus_dir.iterdir())
    assert corpus_files == sorted([*TRAIN_FILES, VALIDATION_FILE])
    assert AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir)).eos_token_id is not None


def test_cli_writes_assets(tmp_path: Path, capsys) -> None:
    assert assets_module.main([str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert f"--dataset {tmp_path / 'out' / 'corpus'}" in printed
    assert (tmp_path / "out" / "tokenizer" / "tokenizer.json").exists()


def test_corpus_statistics_leave_a_tiny_model_much_to_learn(tiny_assets: TinyAssets) -> None:
    """Next-token structure a tiny model picks up in ~100 steps: a bigram model fitted on the
    train files predicts the validation file at ~2 nats/token, against ~4.6 for token frequencies
    alone and ln(512) = 6.2 for an untrained model."""
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_assets.tokenizer_dir))

    def documents(prefix: str) -> list[list[int]]:
        return [
            [*tokenizer(text)["input_ids"], tokenizer.eos_token_id]
            for path in sorted(tiny_assets.corpus_dir.glob(f"{prefix}*.jsonl"))
            for text in _texts(path)
        ]

    train, validation = documents("train"), documents("validation")
    unigrams = Counter(token for doc in train for token in doc)
    bigrams = Counter(pair for doc in train for pair in itertools.pairwise(doc))
    total, vocab = sum(unigrams.values()), len(tokenizer)
    pairs = [pair for doc in validation for pair in itertools.pairwise(doc)]
    unigram_nats = -sum(math.log((unigrams[b] + 1) / (total + vocab)) for _, b in pairs) / len(
        pairs
    )
    bigram_nats = -sum(
        math.log((bigrams[(a, b)] + 0.1) / (unigrams[a] + 0.1 * vocab)) for a, b in pairs
    ) / len(pairs)
    assert bigram_nats < 2.6
    assert bigram_nats < 0.6 * unigram_nats < 0.6 * math.log(vocab)
