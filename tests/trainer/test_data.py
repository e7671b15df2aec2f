"""The data path: exact packing, disjoint ranks, exact resume, validation, every local format.

Ranks are simulated by building one loader per ``dp_rank``; nothing here touches the network.
"""

from __future__ import annotations

import itertools
import json
import logging
import pickle
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import datasets
import pytest
import torch
from datasets import Dataset, DatasetDict, IterableDataset
from transformers import PreTrainedTokenizerFast

from trainer.config import DataConfig
from trainer.data import (
    DataConfigError,
    TrainLoader,
    build_train_loader,
    build_val_loader,
    is_heldout,
    load_corpus,
    load_tokenizer,
)
from trainer.data import sources as sources_module
from trainer.data.documents import MAP_BATCH_DOCUMENTS, RESUME_SHARDS
from trainer.tiny_assets import TinyAssets, write_tiny_corpus

DOC_ID = re.compile(r"^document (\d+) \.")


@pytest.fixture(scope="module")
def tokenizer(tiny_assets: TinyAssets):
    return load_tokenizer(str(tiny_assets.tokenizer_dir))


@pytest.fixture(scope="module")
def cache_dir(hf_datasets_cache: str) -> str:
    return hf_datasets_cache


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~40 train documents: a few hundred tokens per epoch, so epochs end within a few batches."""
    return write_tiny_corpus(tmp_path_factory.mktemp("small") / "corpus", num_docs=45, seed=7)


def _docs(count: int, start: int = 0) -> list[str]:
    return [
        f"document {i} . {i} plus {i} is {2 * i} . count from {i} : {i} {i + 1} ."
        for i in range(start, start + count)
    ]


_DATA_FIELDS = {"dataset_config_name", "text_column", "num_workers"}
"""Keyword overrides that belong to the trainer's data section, not to the loader call."""


def _split(overrides: dict, batch_field: str) -> tuple[dict, dict]:
    """(data-section fields, loader keywords) of a test's overrides; `batch_size` is the
    section's `batch_field`."""
    data = {k: overrides.pop(k) for k in list(overrides) if k in _DATA_FIELDS}
    if "batch_size" in overrides:
        data[batch_field] = overrides.pop("batch_size")
    return data, overrides


def _loader(dataset: Path | str, tokenizer, cache_dir: str, **overrides) -> TrainLoader:
    fields, overrides = _split(overrides, "train_batch_size")
    data = DataConfig(
        **{"dataset": str(dataset), "dataset_config_name": None, "train_batch_size": 4, **fields}
    )
    args = dict(tokenizer=tokenizer, seq_len=32, dp_rank=0, dp_world_size=1, seed=0)
    return build_train_loader(data, **{**args, "cache_dir": cache_dir, **overrides})


def _val(dataset: Path | str, tokenizer, cache_dir: str, **overrides):
    fields, overrides = _split(overrides, "val_batch_size")
    data = DataConfig(
        **{"dataset": str(dataset), "dataset_config_name": None, "val_batch_size": 2, **fields}
    )
    args = dict(tokenizer=tokenizer, seq_len=32, max_batches=3, dp_rank=0, dp_world_size=1)
    return build_val_loader(data, **{**args, "cache_dir": cache_dir, **overrides})


def _take(batches: Iterable[dict[str, torch.Tensor]], count: int) -> list[torch.Tensor]:
    return [batch["input_ids"] for batch in itertools.islice(batches, count)]


def _documents(tokenizer, batches: Iterable[torch.Tensor]) -> list[str]:
    """Decoded documents of a token stream that starts at a document boundary.

    The last, possibly unfinished, document is dropped.
    """
    stream = torch.cat([b.reshape(-1) for b in batches]).tolist()
    texts: list[str] = []
    current: list[int] = []
    for token in stream:
        if token == tokenizer.eos_token_id:
            texts.append(tokenizer.decode(current, skip_special_tokens=True))
            current = []
        else:
            current.append(token)
    return texts


def _doc_ids(texts: Iterable[str]) -> list[int]:
    ids = []
    for text in texts:
        match = DOC_ID.match(text)
        assert match, f"not a whole document: {text!r}"
        ids.append(int(match.group(1)))
    return ids


def _corpus_texts(corpus: Path, prefix: str) -> list[str]:
    return [
        json.loads(line)["text"]
        for path in sorted(corpus.glob(f"{prefix}*.jsonl"))
        for line in path.read_text(encoding="utf-8").splitlines()
    ]


def _epoch_batches(loader: TrainLoader) -> Iterator[tuple[int, torch.Tensor]]:
    """(epoch the batch ended in, batch) pairs."""
    for batch in loader:
        yield loader.epoch, batch["input_ids"]


def _epochs_below(loader: TrainLoader, end: int) -> list[torch.Tensor]:
    """The batches completed in epochs 0..end-1."""
    return [b for _, b in itertools.takewhile(lambda pair: pair[0] < end, _epoch_batches(loader))]


# --- shape and packing -------------------------------------------------------------------------


def test_batches_are_exactly_batch_size_by_seq_len_token_ids(tiny_assets, tokenizer, cache_dir):
    loader = _loader(tiny_assets.corpus_dir, tokenizer, cache_dir, seq_len=48, batch_size=3)
    for batch in itertools.islice(loader, 20):
        assert set(batch) == {"input_ids", "labels"}
        assert batch["input_ids"].shape == (3, 48)
        assert batch["input_ids"].dtype == torch.long
        assert torch.equal(batch["labels"], batch["input_ids"])
        assert int(batch["input_ids"].min()) >= 0
        assert int(batch["input_ids"].max()) < len(tokenizer)
        assert not (batch["input_ids"] == tokenizer.pad_token_id).any(), "packing never pads"


def test_every_document_is_whole_and_followed_by_eos(small_corpus, tokenizer, cache_dir):
    """One epoch of packed rows is exactly the epoch's documents, each + EOS, nothing dropped."""
    train_texts = _corpus_texts(small_corpus, "train")
    epoch_zero = _epochs_below(_loader(small_corpus, tokenizer, cache_dir), 1)
    texts = _documents(tokenizer, epoch_zero)
    # The epoch's last document may end in a batch that is only finished in the next epoch.
    assert len(set(texts)) == len(texts) >= len(train_texts) - 1
    assert set(texts) <= set(train_texts)
    stream = torch.cat([b.reshape(-1) for b in epoch_zero]).tolist()
    expected_tokens = sum(len(tokenizer(t)["input_ids"]) + 1 for t in train_texts)
    # Everything the epoch read went into rows, except the tail that starts the next epoch.
    assert 0 <= expected_tokens - len(stream) < 32 * 4
    assert stream[0] == tokenizer.bos_token_id


def test_long_document_spans_several_rows_without_loss(tmp_path, tokenizer, cache_dir):
    long_doc = "document 0 . " + " ".join(f"{i} plus 1 is {i + 1} ." for i in range(200))
    data = tmp_path / "long"
    data.mkdir()
    (data / "train.jsonl").write_text(json.dumps({"text": long_doc}) + "\n", encoding="utf-8")
    loader = _loader(data, tokenizer, cache_dir, seq_len=16, batch_size=2)
    expected = [*tokenizer(long_doc)["input_ids"], tokenizer.eos_token_id]
    needed = -(-len(expected) // 32) + 1
    stream = torch.cat([b.reshape(-1) for b in _take(loader, needed)]).tolist()
    assert stream[: len(expected)] == expected
    assert stream[len(expected) : 2 * len(expected)][:5] == expected[:5], "epoch 2 starts next"


# --- ranks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("world_size", "streaming"), [(2, False), (3, False), (2, True), (3, True)]
)
def test_ranks_never_see_the_same_sequence(
    tiny_assets, tokenizer, cache_dir, world_size, streaming
):
    seen: list[set[tuple[int, ...]]] = []
    for rank in range(world_size):
        loader = _loader(
            tiny_assets.corpus_dir,
            tokenizer,
            cache_dir,
            dp_rank=rank,
            dp_world_size=world_size,
            streaming=streaming,
        )
        rows = {tuple(row.tolist()) for batch in _take(loader, 25) for row in batch}
        assert len(rows) == 25 * 4
        seen.append(rows)
    for a, b in itertools.combinations(seen, 2):
        assert not a & b


def test_ranks_split_each_epoch_into_disjoint_parts(small_corpus, tokenizer, cache_dir):
    per_rank = []
    for rank in range(2):
        loader = _loader(
            small_corpus,
            tokenizer,
            cache_dir,
            dp_rank=rank,
            dp_world_size=2,
            batch_size=1,
            seq_len=8,
        )
        epoch_zero = _epochs_below(loader, 1)
        per_rank.append(set(_doc_ids(_documents(tokenizer, epoch_zero))))
    assert not per_rank[0] & per_rank[1]
    all_ids = set(_doc_ids(_corpus_texts(small_corpus, "train")))
    # A rank's last document of the epoch may end in a row that is finished in the next epoch.
    assert len(all_ids - per_rank[0] - per_rank[1]) <= 2
    assert abs(len(per_rank[0]) - len(per_rank[1])) <= 2


def test_epochs_are_reshuffled_from_the_seed(small_corpus, tokenizer, cache_dir):
    def order(seed: int) -> tuple[list[int], list[int]]:
        loader = _loader(small_corpus, tokenizer, cache_dir, seed=seed, seq_len=16)
        by_epoch: dict[int, list[torch.Tensor]] = {0: [], 1: []}
        for epoch, batch in itertools.islice(_epoch_batches(loader), 200):
            if epoch > 1:
                break
            by_epoch[epoch].append(batch)
        first = _doc_ids(_documents(tokenizer, by_epoch[0]))
        return first, _doc_ids(_documents(tokenizer, by_epoch[1])[1:])

    epoch0, epoch1 = order(seed=0)
    assert epoch0 != sorted(epoch0), "documents are shuffled"
    assert epoch1[:10] != epoch0[:10], "and reshuffled in the next epoch"
    assert order(seed=0) == (epoch0, epoch1)
    assert order(seed=1)[0] != epoch0


# --- resume ------------------------------------------------------------------------------------


def _assert_resume_is_exact(make_loader, resume_points: Iterable[int], follow: int = 6) -> None:
    reference = _take(make_loader(), max(resume_points) + follow)
    for k in resume_points:
        interrupted = make_loader()
        iterator = iter(interrupted)
        _take(iterator, k)
        state = pickle.loads(pickle.dumps(interrupted.state_dict()))
        resumed = make_loader()
        resumed.load_state_dict(state)
        again = _take(resumed, follow)
        for offset, (expected, got) in enumerate(
            zip(reference[k : k + follow], again, strict=True)
        ):
            assert torch.equal(expected, got), f"batch {k + offset} differs after resume at {k}"


def _epoch_boundary(loader: TrainLoader) -> int:
    """Index of the first batch that ends in epoch 1."""
    for index, (epoch, _) in enumerate(_epoch_batches(loader)):
        if epoch == 1:
            return index
    raise AssertionError("unreachable")


def test_resume_continues_with_the_next_batch_across_epochs(small_corpus, tokenizer, cache_dir):
    def make() -> TrainLoader:
        return _loader(small_corpus, tokenizer, cache_dir, dp_rank=1, dp_world_size=2)

    boundary = _epoch_boundary(make())
    assert boundary > 2
    _assert_resume_is_exact(make, [0, 1, 2, boundary - 1, boundary, boundary + 1, 2 * boundary])


@pytest.mark.parametrize("num_workers", [1, 3])
def test_read_ahead_gives_the_same_batches_and_exact_states(
    small_corpus, tokenizer, cache_dir, num_workers
):
    def make(workers: int) -> TrainLoader:
        return _loader(small_corpus, tokenizer, cache_dir, num_workers=workers, dp_world_size=2)

    inline, ahead = make(0), make(num_workers)
    for (e0, expected), (e1, got) in itertools.islice(
        zip(_epoch_batches(inline), _epoch_batches(ahead), strict=True), 25
    ):
        assert torch.equal(expected, got)
        assert e0 == e1
        assert ahead.state_dict() == inline.state_dict(), "read-ahead never leaks into the state"
    assert ahead.epoch >= 1
    boundary = _epoch_boundary(make(0))
    _assert_resume_is_exact(lambda: make(num_workers), [0, 3, boundary, boundary + 1])


def test_a_new_iterator_continues_after_the_last_delivered_batch(
    small_corpus, tokenizer, cache_dir
):
    reference = _take(_loader(small_corpus, tokenizer, cache_dir), 8)
    for workers in (0, 2):
        loader = _loader(small_corpus, tokenizer, cache_dir, num_workers=workers)
        got = _take(loader, 3) + _take(loader, 2) + _take(loader, 3)
        assert all(torch.equal(a, b) for a, b in zip(reference, got, strict=True)), workers


def test_close_stops_the_read_ahead_thread(small_corpus, tokenizer, cache_dir):
    loader = _loader(small_corpus, tokenizer, cache_dir, num_workers=2)
    batches = iter(loader)
    next(batches)
    reader = loader._producer
    assert reader is not None and reader.is_alive()
    loader.close()
    assert not reader.is_alive()


def test_read_ahead_errors_reach_the_training_loop(tmp_path, tokenizer, cache_dir):
    Dataset.from_dict({"text": ["", "  "]}).save_to_disk(str(tmp_path / "blank"))
    loader = _loader(tmp_path / "blank", tokenizer, cache_dir, num_workers=2)
    with pytest.raises(DataConfigError, match="found no training documents in epoch 0"):
        next(iter(loader))


@pytest.mark.parametrize("world_size", [2, 3], ids=["shard-per-rank", "every-nth-document"])
def test_resume_of_a_streamed_dataset(small_corpus, tokenizer, cache_dir, world_size):
    """Two train files: two ranks get a file each, three ranks take every third document."""

    def make() -> TrainLoader:
        return _loader(
            small_corpus,
            tokenizer,
            cache_dir,
            streaming=True,
            dp_rank=world_size - 1,
            dp_world_size=world_size,
        )

    boundary = _epoch_boundary(make())
    _assert_resume_is_exact(make, [1, boundary - 1, boundary, boundary + 2])


def test_resume_of_a_save_to_disk_dataset_with_held_out_data(tmp_path, tokenizer, cache_dir):
    Dataset.from_dict({"text": _docs(60)}).save_to_disk(str(tmp_path / "disk"))

    def make() -> TrainLoader:
        return _loader(tmp_path / "disk", tokenizer, cache_dir, heldout_fraction=0.2, seed=5)

    boundary = _epoch_boundary(make())
    _assert_resume_is_exact(make, [2, boundary, boundary + 1])


def test_state_is_small_and_picklable(tiny_assets, tokenizer, cache_dir):
    loader = _loader(tiny_assets.corpus_dir, tokenizer, cache_dir, seq_len=128)
    _take(loader, 7)
    state = loader.state_dict()
    assert len(pickle.dumps(state)) < 20_000
    assert state["epoch"] == 0
    assert len(state["leftover_tokens"]) < 128 + 400


def test_state_from_another_world_size_starts_a_new_epoch(
    small_corpus, tokenizer, cache_dir, caplog
):
    two_ranks = _loader(small_corpus, tokenizer, cache_dir, dp_world_size=2)
    _take(two_ranks, 3)
    one_rank = _loader(small_corpus, tokenizer, cache_dir)
    with caplog.at_level(logging.WARNING):
        one_rank.load_state_dict(two_ranks.state_dict())
    assert "dp_world_size (2 -> 1)" in caplog.text
    assert one_rank.epoch == 1
    assert next(iter(one_rank))["input_ids"].shape == (4, 32)


# --- validation --------------------------------------------------------------------------------


def test_validation_split_is_used_when_present(tiny_assets, tokenizer, cache_dir):
    validation_ids = set(_doc_ids(_corpus_texts(tiny_assets.corpus_dir, "validation")))
    for rank in range(2):
        val = _val(
            tiny_assets.corpus_dir,
            tokenizer,
            cache_dir,
            dp_rank=rank,
            dp_world_size=2,
            max_batches=4,
        )
        batches = [b["input_ids"] for b in val]
        assert len(batches) == 4
        texts = _documents(tokenizer, batches)
        assert texts
        assert set(_doc_ids(texts)) <= validation_ids


def test_held_out_validation_is_disjoint_from_training(tmp_path, tokenizer, cache_dir):
    data = tmp_path / "no_val"
    data.mkdir()
    texts = _docs(120)
    (data / "train.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8"
    )
    fraction = 0.2
    heldout = set(_doc_ids(t for t in texts if is_heldout(t, fraction)))
    assert 5 < len(heldout) < 60
    for rank in range(2):
        common = dict(dp_rank=rank, dp_world_size=2, heldout_fraction=fraction, seq_len=16)
        val_ids = set(
            _doc_ids(
                _documents(
                    tokenizer,
                    [
                        b["input_ids"]
                        for b in _val(data, tokenizer, cache_dir, max_batches=4, **common)
                    ],
                )
            )
        )
        assert val_ids and val_ids <= heldout
        train = _loader(data, tokenizer, cache_dir, **common)
        two_epochs = _epochs_below(train, 2)
        train_ids = set(_doc_ids(_documents(tokenizer, two_epochs)))
        assert train_ids and not train_ids & heldout


def test_validation_is_deterministic_and_equally_long_on_every_rank(
    tiny_assets, tokenizer, cache_dir
):
    """Tiny validation data repeats rather than leave one rank with fewer forward passes."""
    runs = []
    for rank in range(3):
        val = _val(
            tiny_assets.corpus_dir,
            tokenizer,
            cache_dir,
            seq_len=256,
            batch_size=4,
            max_batches=12,
            dp_rank=rank,
            dp_world_size=3,
        )
        first = [b["input_ids"] for b in val]
        assert len(first) == len(val) == 12
        assert all(torch.equal(a, b["input_ids"]) for a, b in zip(first, val, strict=True))
        rebuilt = _val(
            tiny_assets.corpus_dir,
            tokenizer,
            cache_dir,
            seq_len=256,
            batch_size=4,
            max_batches=12,
            dp_rank=rank,
            dp_world_size=3,
        )
        assert all(torch.equal(a, b["input_ids"]) for a, b in zip(first, rebuilt, strict=True))
        runs.append(first)
    assert not torch.equal(runs[0][0], runs[1][0])


def test_validation_smaller_than_the_world_is_read_by_every_rank(tmp_path, tokenizer, cache_dir):
    DatasetDict(
        train=Dataset.from_dict({"text": _docs(20)}),
        validation=Dataset.from_dict({"text": _docs(2, start=700)}),
    ).save_to_disk(str(tmp_path / "dd"))
    per_rank = [
        [
            b["input_ids"]
            for b in _val(tmp_path / "dd", tokenizer, cache_dir, dp_rank=rank, dp_world_size=4)
        ]
        for rank in range(4)
    ]
    assert set(_doc_ids(_documents(tokenizer, per_rank[3]))) == {700, 701}
    assert all(torch.equal(a, b) for a, b in zip(per_rank[0], per_rank[3], strict=True))


# --- sources -----------------------------------------------------------------------------------


def _write_parquet(directory: Path, split: str, texts: list[str]) -> None:
    directory.mkdir(exist_ok=True)
    Dataset.from_dict({"text": texts, "id": list(range(len(texts)))}).to_parquet(
        str(directory / f"{split}-00000.parquet")
    )


def test_parquet_folder_with_validation_file(tmp_path, tokenizer, cache_dir):
    _write_parquet(tmp_path / "pq", "train", _docs(30))
    _write_parquet(tmp_path / "pq", "validation", _docs(5, start=100))
    assert _doc_ids(
        _documents(tokenizer, _take(_loader(tmp_path / "pq", tokenizer, cache_dir), 15))
    )
    val_ids = _doc_ids(
        _documents(
            tokenizer,
            [b["input_ids"] for b in _val(tmp_path / "pq", tokenizer, cache_dir, max_batches=2)],
        )
    )
    assert val_ids and min(val_ids) >= 100


def test_text_folder_documents_are_paragraphs(tmp_path, tokenizer, cache_dir):
    folder = tmp_path / "txt"
    folder.mkdir()
    (folder / "book.txt").write_text("\n\n".join(_docs(20)) + "\n", encoding="utf-8")
    texts = _documents(tokenizer, _take(_loader(folder, tokenizer, cache_dir, seq_len=16), 10))
    assert texts
    assert all(t.strip() in _docs(20) for t in texts)


def test_single_jsonl_file(tmp_path, tokenizer, cache_dir):
    path = tmp_path / "val_docs.jsonl"  # a single file is training data, whatever its name
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in _docs(20)), encoding="utf-8")
    assert _doc_ids(_documents(tokenizer, _take(_loader(path, tokenizer, cache_dir), 5)))


def test_save_to_disk_dataset_dict_uses_its_validation_split(tmp_path, tokenizer, cache_dir):
    target = tmp_path / "dd"
    DatasetDict(
        train=Dataset.from_dict({"text": _docs(30)}),
        validation=Dataset.from_dict({"text": _docs(6, start=500)}),
    ).save_to_disk(str(target))
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    assert _documents(tokenizer, _take(_loader(target, tokenizer, cache_dir), 6))
    val_ids = _doc_ids(
        _documents(
            tokenizer, [b["input_ids"] for b in _val(target, tokenizer, cache_dir, max_batches=2)]
        )
    )
    assert val_ids and min(val_ids) >= 500
    after = sorted(p.relative_to(target) for p in target.rglob("*"))
    assert before == after, "loading never writes into the user's dataset directory"


def test_large_local_folders_are_streamed(monkeypatch, small_corpus, tokenizer, cache_dir):
    assert not isinstance(
        load_corpus(str(small_corpus), cache_dir=cache_dir).train, IterableDataset
    )
    monkeypatch.setattr(sources_module, "MAP_STYLE_MAX_BYTES", 1000)
    corpus = load_corpus(str(small_corpus), cache_dir=cache_dir)
    assert isinstance(corpus.train, IterableDataset)
    assert isinstance(corpus.validation, IterableDataset)
    assert _doc_ids(_documents(tokenizer, _take(_loader(small_corpus, tokenizer, cache_dir), 3)))


def test_hub_ids_are_streamed(monkeypatch, small_corpus, tokenizer, cache_dir):
    """A Hub id goes to load_dataset(..., streaming=True); served here from local files."""
    calls = []
    real_load = datasets.load_dataset
    files = {
        "train": [str(p) for p in sorted(small_corpus.glob("train*.jsonl"))],
        "validation": [str(small_corpus / "validation.jsonl")],
    }

    def fake_load(path, name=None, **kwargs):
        calls.append((path, name, kwargs["streaming"]))
        return real_load("json", data_files=files, streaming=kwargs["streaming"])

    monkeypatch.setattr(sources_module.datasets, "load_dataset", fake_load)
    loader = _loader("allenai/c4", tokenizer, cache_dir, dataset_config_name="en")
    assert _documents(tokenizer, _take(loader, 4))
    assert calls == [("allenai/c4", "en", True)]


# --- errors ------------------------------------------------------------------------------------


def test_missing_path_is_one_clear_error(tokenizer, cache_dir, tmp_path):
    missing = tmp_path / "nowhere" / "data"
    with pytest.raises(DataConfigError, match=re.escape(f"--dataset {str(missing)!r}: no such")):
        _loader(missing, tokenizer, cache_dir)


@pytest.mark.parametrize("failure", [ConnectionError("Couldn't reach it"), FileNotFoundError()])
def test_unreachable_or_unknown_hub_dataset_is_one_clear_error(
    monkeypatch, tokenizer, cache_dir, failure
):
    def fail(*args, **kwargs):
        raise failure

    monkeypatch.setattr(sources_module.datasets, "load_dataset", fail)
    with pytest.raises(DataConfigError, match="--dataset 'data/corpus' is not a local path"):
        _loader("data/corpus", tokenizer, cache_dir)


def test_missing_text_column_names_it_and_the_columns_there(tmp_path, tokenizer, cache_dir):
    Dataset.from_dict({"content": _docs(5)}).save_to_disk(str(tmp_path / "d"))
    with pytest.raises(DataConfigError, match=r"no text column 'text'.*\['content'\]"):
        _loader(tmp_path / "d", tokenizer, cache_dir)
    with pytest.raises(DataConfigError, match="no text column 'body'"):
        _loader(tmp_path / "d", tokenizer, cache_dir, text_column="body", streaming=True)


def test_folder_without_data_files_or_with_mixed_formats(tmp_path, tokenizer, cache_dir):
    (tmp_path / "empty" / ".cache").mkdir(parents=True)
    (tmp_path / "empty" / "notes.md").write_text("hi", encoding="utf-8")
    (tmp_path / "empty" / ".cache" / "hidden.jsonl").write_text('{"text": "x"}', encoding="utf-8")
    with pytest.raises(DataConfigError, match="holds no data files"):
        _loader(tmp_path / "empty", tokenizer, cache_dir)
    _write_parquet(tmp_path / "mixed", "train", _docs(5))
    (tmp_path / "mixed" / "more.txt").write_text("document 9 .", encoding="utf-8")
    with pytest.raises(DataConfigError, match="mixes file formats"):
        _loader(tmp_path / "mixed", tokenizer, cache_dir)


def test_dataset_dict_without_train_split(tmp_path, tokenizer, cache_dir):
    DatasetDict(test=Dataset.from_dict({"text": _docs(5)})).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataConfigError, match=r"no 'train' split; its splits are \['test'\]"):
        _loader(tmp_path / "dd", tokenizer, cache_dir)


def test_rank_without_documents_is_an_error(tmp_path, tokenizer, cache_dir):
    Dataset.from_dict({"text": _docs(2)}).save_to_disk(str(tmp_path / "two"))
    loader = _loader(tmp_path / "two", tokenizer, cache_dir, dp_rank=2, dp_world_size=3)
    with pytest.raises(DataConfigError, match="rank 2 of 3 gets no documents"):
        next(iter(loader))


def test_bad_tokenizer_is_one_clear_error(tmp_path):
    (tmp_path / "tok").mkdir()
    with pytest.raises(DataConfigError, match="--tokenizer"):
        load_tokenizer(str(tmp_path / "tok"))


def test_no_tokenizer_call_takes_more_than_the_map_batch(
    tmp_path: Path, tokenizer, cache_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tokenisation comes in bursts the read-ahead can hide, counted:
    every call of the tokenizer the lazy `datasets.map` makes, with its number of documents.
    `scripts/bench/loader_stall.py` measures what that does to the stall share."""
    # Enough documents that each of the loader's resume shards (RESUME_SHARDS) holds more
    # than a map batch: the calls are then cut by the map batch.
    corpus = write_tiny_corpus(
        tmp_path / "corpus", num_docs=2 * RESUME_SHARDS * MAP_BATCH_DOCUMENTS, seed=3
    )
    sizes: list[int] = []
    real = PreTrainedTokenizerFast.__call__

    def counted(self, text, *args, **kwargs):
        sizes.append(len(text) if isinstance(text, list) else 1)
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerFast, "__call__", counted)
    batches = iter(_loader(corpus, tokenizer, cache_dir, seq_len=64))
    for _ in range(20):
        next(batches)
    assert sizes, "the loader never called the tokenizer"
    assert max(sizes) == MAP_BATCH_DOCUMENTS < 1000  # datasets' own default batch
