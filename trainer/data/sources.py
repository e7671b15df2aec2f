"""Where the documents come from: a Hub dataset, a ``save_to_disk`` directory, or a folder of files.

Everything downstream (sharding, tokenising, packing, resuming) works on the two kinds of dataset
``datasets`` offers, so this module's only job is to turn ``--dataset`` into a train split and, if
the data has one, a validation split, failing early with an error that names the bad value.

Local data is loaded map-style when it is small enough to copy into the ``datasets`` cache: it
can then be reshuffled document by document each epoch. Hub data and large local folders are
streamed, so a run never waits for (or stores) a full copy of a corpus like C4; their per-epoch
reshuffle is of shard (file) order. Both kinds resume exactly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import datasets
from datasets import Dataset, DatasetDict, IterableDataset, IterableDatasetDict

logger = logging.getLogger(__name__)

# File suffix -> `datasets` packaged builder. Compressed variants (".jsonl.gz") load the same way.
BUILDER_BY_SUFFIX = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".txt": "text"}
_COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
# A Hub id is "name" or "owner/name"; anything else that does not exist locally is a bad path.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_VALIDATION_SPLITS = ("validation", "valid", "val")
# Local json/parquet/txt folders up to this size are copied into the Arrow cache (map-style);
# beyond it every node would spend its start-up converting, so they are streamed instead.
MAP_STYLE_MAX_BYTES = 1 << 30

AnyDataset: TypeAlias = Dataset | IterableDataset


class DataConfigError(ValueError):
    """A ``--dataset`` / ``--tokenizer`` / ``--text_column`` value the data path cannot use."""


@dataclass(frozen=True)
class Corpus:
    """The documents of one ``--dataset``: a train split and the dataset's own validation split."""

    name: str
    train: AnyDataset
    validation: AnyDataset | None


def load_corpus(
    dataset: str,
    config_name: str | None = None,
    *,
    text_column: str = "text",
    streaming: bool | None = None,
    cache_dir: str | None = None,
) -> Corpus:
    """Resolve ``--dataset`` to its train (and validation) documents.

    ``streaming=None`` streams Hub datasets and local file folders over ``MAP_STYLE_MAX_BYTES``
    and loads the rest map-style; pass a bool to force either. ``cache_dir`` is where
    ``datasets`` keeps the Arrow copy of local json/parquet/txt files (default: its usual cache,
    ``HF_DATASETS_CACHE``).
    """
    path = Path(dataset).expanduser()
    if path.exists():
        corpus = _load_local(dataset, path, streaming=streaming, cache_dir=cache_dir)
    elif not _HUB_ID.match(dataset):
        raise DataConfigError(
            f"--dataset {dataset!r}: no such file or directory (and not a Hub id like "
            "'allenai/c4'). Give a save_to_disk directory, a folder of "
            f"{'/'.join(sorted(BUILDER_BY_SUFFIX))} files, or a Hub dataset id."
        )
    else:
        corpus = _load_hub(
            dataset,
            config_name,
            streaming=True if streaming is None else streaming,
            cache_dir=cache_dir,
        )
    for split in (corpus.train, corpus.validation):
        if split is not None:
            _check_text_column(split, text_column, dataset)
    return corpus


def _load_local(
    dataset: str, path: Path, *, streaming: bool | None, cache_dir: str | None
) -> Corpus:
    if (path / "dataset_dict.json").exists() or (path / "state.json").exists():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, Dataset):
            train: AnyDataset = loaded
            validation: AnyDataset | None = None
        else:
            train, validation = _pick_splits(loaded, dataset)
        if streaming:
            train = train.to_iterable_dataset(num_shards=_arrow_shards(train))
            if validation is not None:
                validation = validation.to_iterable_dataset(num_shards=_arrow_shards(validation))
        return Corpus(name=dataset, train=train, validation=validation)

    files = [path] if path.is_file() else sorted(_visible_files(path))
    by_builder: dict[str, list[Path]] = {}
    for file in files:
        builder = _builder_for(file)
        if builder is not None:
            by_builder.setdefault(builder, []).append(file)
    if not by_builder:
        raise DataConfigError(
            f"--dataset {dataset!r} holds no data files: expected files ending in "
            f"{', '.join(sorted(BUILDER_BY_SUFFIX))} (optionally compressed)."
        )
    if len(by_builder) > 1:
        kinds = ", ".join(f"{builder}: {len(found)}" for builder, found in by_builder.items())
        raise DataConfigError(
            f"--dataset {dataset!r} mixes file formats ({kinds}); keep one format per dataset."
        )
    [(builder, found)] = by_builder.items()
    # A single file is the training data, whatever its name.
    data_files = {"train": found} if path.is_file() else _split_files(found, dataset)
    if streaming is None:
        size = sum(f.stat().st_size for split_files in data_files.values() for f in split_files)
        streaming = size > MAP_STYLE_MAX_BYTES
        if streaming:
            logger.info("data: streaming %s (%.1f GiB of files)", dataset, size / (1 << 30))
    # Blank-line separated paragraphs are the documents of plain text (EOS goes between them);
    # one document per line would cut prose into fragments, one per file can be gigabytes.
    options: dict[str, Any] = {"sample_by": "paragraph"} if builder == "text" else {}
    loaded = datasets.load_dataset(
        builder,
        data_files={split: [str(f) for f in found] for split, found in data_files.items()},
        streaming=streaming,
        cache_dir=cache_dir,
        **options,
    )
    train, validation = _pick_splits(loaded, dataset)
    return Corpus(name=dataset, train=train, validation=validation)


def _visible_files(folder: Path) -> Iterator[Path]:
    """Files under ``folder``, skipping hidden ones such as a download tool's ``.cache/``."""
    for file in folder.rglob("*"):
        if file.is_file() and not any(
            part.startswith(".") for part in file.relative_to(folder).parts
        ):
            yield file


def _builder_for(file: Path) -> str | None:
    name = file.name.lower()
    for compression in _COMPRESSION_SUFFIXES:
        name = name.removesuffix(compression)
    return BUILDER_BY_SUFFIX.get(Path(name).suffix)


def _split_files(files: Sequence[Path], dataset: str) -> dict[str, list[Path]]:
    """Files named ``val*``/``validation*`` are the validation split, ``test*`` are left out."""
    splits: dict[str, list[Path]] = {"train": [], "validation": []}
    for file in files:
        name = file.name.lower()
        if name.startswith("val"):
            splits["validation"].append(file)
        elif name.startswith("test"):
            logger.info("data: leaving test file %s out of training", file)
        else:
            splits["train"].append(file)
    if not splits["train"]:
        raise DataConfigError(
            f"--dataset {dataset!r} has no training files: every data file is named val*/test*."
        )
    return {split: found for split, found in splits.items() if found}


def _pick_splits(
    loaded: DatasetDict | IterableDatasetDict, dataset: str
) -> tuple[AnyDataset, AnyDataset | None]:
    if "train" not in loaded:
        raise DataConfigError(
            f"--dataset {dataset!r} has no 'train' split; its splits are {sorted(loaded)}."
        )
    validation = next((loaded[s] for s in _VALIDATION_SPLITS if s in loaded), None)
    return loaded["train"], validation


def _load_hub(
    dataset: str, config_name: str | None, *, streaming: bool, cache_dir: str | None
) -> Corpus:
    try:
        loaded = datasets.load_dataset(
            dataset, config_name, streaming=streaming, cache_dir=cache_dir
        )
    except (datasets.exceptions.DatasetNotFoundError, OSError) as error:
        # OSError: unreachable Hub, offline mode, missing files; the cause is in the message.
        raise DataConfigError(
            f"--dataset {dataset!r} is not a local path, and loading it from the Hugging Face "
            f"Hub failed: {error}"
        ) from error
    except ValueError as error:
        # `datasets` reports a missing/unknown config name as a ValueError listing the choices.
        raise DataConfigError(
            f"--dataset {dataset!r} --dataset_config_name {config_name!r}: {error}"
        ) from error
    if not isinstance(loaded, DatasetDict | IterableDatasetDict):
        raise DataConfigError(f"--dataset {dataset!r} did not load as a set of splits.")
    train, validation = _pick_splits(loaded, dataset)
    return Corpus(name=dataset, train=train, validation=validation)


def _arrow_shards(split: Dataset) -> int:
    """Enough shards that any sensible data-parallel size divides them (shard-level splitting)."""
    return max(1, min(len(split), 64))


def _check_text_column(split: AnyDataset, text_column: str, dataset: str) -> None:
    columns = split.column_names
    if columns is None:
        # Streamed data may not declare its columns; the first document shows them.
        first = next(iter(split.take(1)), None)
        if first is None:
            raise DataConfigError(f"--dataset {dataset!r} has an empty split: {split.split}")
        columns = list(first)
    if text_column not in columns:
        raise DataConfigError(
            f"--dataset {dataset!r} has no text column {text_column!r}; its columns are "
            f"{sorted(columns)}; name the column that holds the documents' text."
        )
