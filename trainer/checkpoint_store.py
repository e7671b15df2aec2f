"""Where checkpoints live: a shared filesystem (FSx for Lustre, a local disk) or an S3 prefix.

Both keep the layout ``scripts/cli/checkpoints.py`` lists (``step-N/`` with DCP files, per-rank
``train_state/`` and a ``COMPLETE`` marker written last) and one guarantee: a checkpoint that
``complete_steps`` returns is one ``load`` can read. The filesystem commits by an atomic
``rename``; S3 (through ``s3torchconnector``) by the marker, S3 being strongly consistent.
Why and sources: docs/design/trainer.md#checkpoint_store
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch.distributed.checkpoint import (
    FileSystemReader,
    FileSystemWriter,
    StorageReader,
    StorageWriter,
)
from torch.distributed.checkpoint.filesystem import FileSystemBase

from trainer.log import get_logger

if TYPE_CHECKING:
    from s3torchconnector._s3client import S3Client

logger = get_logger("checkpoint")

COMPLETE_MARKER = "COMPLETE"
TRAIN_STATE_DIR = "train_state"
S3_SCHEME = "s3://"
_STEP_DIR = re.compile(r"^step-(\d+)$")
_TEMP_PREFIX = ".tmp-step-"
_DELETING_PREFIX = ".deleting-step-"
_UNREADABLE_SUFFIX = ".unreadable-"
_COPY_CHUNK = 8 * 1024 * 1024


def step_dir_name(step: int) -> str:
    return f"step-{step}"


def step_of(location: str) -> int | None:
    """N for a location whose last component is ``step-N``, else None."""
    match = _STEP_DIR.match(location.rstrip("/").rsplit("/", 1)[-1])
    return int(match.group(1)) if match else None


def set_aside_name(location: str) -> str:
    """``.../step-20`` -> ``step-20.unreadable-<unix time>``: listed by an ``ls`` next to the
    checkpoints, matched by neither ``step_of`` nor the stray-save cleanup."""
    return f"{location.rstrip('/').rsplit('/', 1)[-1]}{_UNREADABLE_SUFFIX}{int(time.time())}"


def train_state_name(rank: int) -> str:
    return f"{TRAIN_STATE_DIR}/rank-{rank:05d}.pt"


def is_s3_uri(location: str | os.PathLike[str]) -> bool:
    return str(location).startswith(S3_SCHEME)


class CheckpointStore(Protocol):
    """What the checkpoint manager needs from a place to keep checkpoints.

    Locations are strings: a directory path, or an ``s3://`` URI of a ``step-N`` prefix.
    ``begin`` and ``publish`` run on rank 0 only; the rest on any rank.
    """

    root: str

    def complete_steps(self, *, warn_incomplete: bool = False) -> list[tuple[int, str]]:
        """Complete checkpoints, oldest first."""
        ...

    def is_complete(self, location: str) -> bool: ...

    def save_location(self, step: int) -> str:
        """Where every rank writes the save of ``step`` (no I/O: all ranks compute it)."""
        ...

    def final_location(self, step: int) -> str:
        """Where the checkpoint of ``step`` is once published."""
        ...

    def begin(self, step: int) -> None:
        """Clear what an earlier save of ``step`` left, before any rank writes."""
        ...

    def write_train_state(self, location: str, rank: int, state: dict[str, Any]) -> None: ...

    def read_train_state(self, location: str, rank: int) -> dict[str, Any]: ...

    def missing_train_states(self, location: str, world_size: int) -> list[int]: ...

    def publish(self, step: int, location: str, record: dict[str, Any]) -> str:
        """Mark the save at ``location`` complete; return the checkpoint's final location."""
        ...

    def read_marker(self, location: str) -> dict[str, Any]: ...

    def prune(self, keep_last: int) -> None:
        """Delete all but the newest ``keep_last`` complete checkpoints (0 keeps all), and
        what crashed saves left behind."""
        ...

    def set_aside(self, location: str) -> str:
        """Move a checkpoint that fails to load out of the ``step-N`` namespace (kept for a
        person to look at, never deleted here); returns where it went."""
        ...

    def writer(self, location: str) -> StorageWriter: ...

    def reader(self, location: str) -> StorageReader: ...


def open_store(root: str | os.PathLike[str]) -> CheckpointStore:
    """The store for a checkpoint directory or an ``s3://bucket/prefix`` URI."""
    if is_s3_uri(root):
        return S3Store(str(root))
    return FileSystemStore(Path(root))


def split_location(location: str | os.PathLike[str]) -> tuple[CheckpointStore, str]:
    """(store of the parent, location) for a single ``step-N`` checkpoint."""
    text = str(location).rstrip("/")
    parent = text.rsplit("/", 1)[0] if "/" in text else "."
    return open_store(parent), text


# --- write failures that name their cause


def os_error_behind(error: BaseException) -> OSError | None:
    """The OSError a failed write hides, if any: a full disk in the middle of a
    ``torch.save`` record surfaces as ``RuntimeError: [enforce fail at
    inline_container.cc:672] . unexpected pos ...``, raised by the zip writer's
    ``write_end_of_file`` while the ENOSPC is handled (torch ``serialization.py``
    ``_open_zipfile_writer_buffer.__exit__``), so the OSError is only its context."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class DelegatingFileSystem(FileSystemBase):
    """A DCP file system (the local one, or s3torchconnector's) that hands every call to
    ``inner``; subclasses change what they need. Picklable: it travels to DCP's upload
    process with the writer."""

    def __init__(self, inner: FileSystemBase) -> None:
        self.inner = inner

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        with self.inner.create_stream(path, mode) as stream:
            yield stream

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str | os.PathLike[str]:
        return self.inner.concat_path(path, suffix)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.inner.rename(path, new_path)

    def init_path(self, path: str | os.PathLike[str]) -> str | os.PathLike[str]:
        return self.inner.init_path(path)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        self.inner.mkdir(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return True

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return self.inner.exists(path)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.inner.rm_file(path)


class NamedWriteErrors(DelegatingFileSystem):
    """A write that fails inside torch's serializer raises the OSError behind it (ENOSPC
    naming the file), not the serializer's own ``unexpected pos`` line. Done where the write
    happens: DCP sends a failure to the trainer by pickle, which drops ``__context__``."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        try:
            with self.inner.create_stream(path, mode) as stream:
                yield stream
        except RuntimeError as error:
            cause = os_error_behind(error)
            if cause is None:
                raise
            raise OSError(cause.errno, cause.strerror, cause.filename or str(path)) from error


def named_write_errors(writer: StorageWriter) -> StorageWriter:
    """``writer`` (a ``FileSystemWriter``: both stores' are), its failures named."""
    assert isinstance(writer, FileSystemWriter), type(writer)
    writer.fs = NamedWriteErrors(writer.fs)  # type: ignore[assignment]
    return writer


# --- a filesystem every rank mounts


def _fsync_dir(path: Path) -> None:
    # Makes a rename durable on local disks; harmless (and cheap) on network filesystems.
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    """Delete a dir by first renaming it out of the ``step-N`` namespace, so a crash in the
    middle of a long ``rmtree`` can never leave a half-deleted dir that looks complete."""
    doomed = path.with_name(f"{_DELETING_PREFIX}{path.name}-{time.time_ns()}")
    path.rename(doomed)
    shutil.rmtree(doomed)


class FileSystemStore:
    """Checkpoints as directories; published by an atomic rename."""

    def __init__(self, root: Path) -> None:
        self.path = root
        self.root = str(root)

    def is_complete(self, location: str) -> bool:
        path = Path(location)
        return _STEP_DIR.match(path.name) is not None and (path / COMPLETE_MARKER).is_file()

    def complete_steps(self, *, warn_incomplete: bool = False) -> list[tuple[int, str]]:
        if not self.path.is_dir():
            return []
        found: list[tuple[int, str]] = []
        for entry in self.path.iterdir():
            match = _STEP_DIR.match(entry.name)
            if match is None or not entry.is_dir():
                continue
            if self.is_complete(str(entry)):
                found.append((int(match.group(1)), str(entry)))
            elif warn_incomplete:
                logger.warning("checkpoint: ignoring %s: no %s marker", entry, COMPLETE_MARKER)
        return sorted(found)

    def save_location(self, step: int) -> str:
        return str(self.path / f"{_TEMP_PREFIX}{step}")

    def final_location(self, step: int) -> str:
        return str(self.path / step_dir_name(step))

    def begin(self, step: int) -> None:
        # A crash during an earlier save of this step may have left files from another world
        # size behind; they must not mix with this save's.
        temp = Path(self.save_location(step))
        if temp.exists():
            shutil.rmtree(temp)
        temp.mkdir(parents=True)

    def write_train_state(self, location: str, rank: int, state: dict[str, Any]) -> None:
        target = Path(location) / train_state_name(rank)
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())

    def read_train_state(self, location: str, rank: int) -> dict[str, Any]:
        # Written by this project's own save(); it may hold numpy RNG arrays, which the
        # weights_only unpickler rejects.
        with (Path(location) / train_state_name(rank)).open("rb") as f:
            state: dict[str, Any] = torch.load(f, map_location="cpu", weights_only=False)
        return state

    def missing_train_states(self, location: str, world_size: int) -> list[int]:
        return [
            r for r in range(world_size) if not (Path(location) / train_state_name(r)).is_file()
        ]

    def publish(self, step: int, location: str, record: dict[str, Any]) -> str:
        temp, final = Path(location), self.path / step_dir_name(step)
        with (temp / COMPLETE_MARKER).open("w", encoding="utf-8") as f:
            json.dump(record, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        if final.exists():  # saving the same step twice: the newer save wins
            _remove_tree(final)
        temp.rename(final)
        _fsync_dir(self.path)
        return str(final)

    def read_marker(self, location: str) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(
            (Path(location) / COMPLETE_MARKER).read_text(encoding="utf-8")
        )
        return record

    def prune(self, keep_last: int) -> None:
        # Runs after a save was published, when no other save is in flight: any temp dir left
        # is a crashed save's.
        for entry in self.path.iterdir():
            if entry.name.startswith((_TEMP_PREFIX, _DELETING_PREFIX)) and entry.is_dir():
                logger.info("checkpoint: removing stray %s", entry)
                shutil.rmtree(entry)
        if keep_last == 0:
            return
        for _step, location in self.complete_steps()[:-keep_last]:
            logger.info("checkpoint: pruning %s (keep_last=%d)", location, keep_last)
            _remove_tree(Path(location))

    def set_aside(self, location: str) -> str:
        target = self.path / set_aside_name(location)
        Path(location).rename(target)
        _fsync_dir(self.path)
        return str(target)

    def writer(self, location: str) -> StorageWriter:
        return named_write_errors(FileSystemWriter(location))

    def reader(self, location: str) -> StorageReader:
        return FileSystemReader(location)


# --- an S3 prefix


def split_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b/`` -> ``("bucket", "a/b")``."""
    bucket, _, key = uri.removeprefix(S3_SCHEME).partition("/")
    if not bucket:
        raise ValueError(f"{uri!r} is not an s3://bucket/prefix URI")
    return bucket, key.strip("/")


def s3_region() -> str:
    """The bucket's region: the pod's AWS_REGION (rendered by the job), as boto3 reads it."""
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ValueError(
            "checkpoints in S3 need the bucket's region: set AWS_REGION (the job renders it)"
        )
    return region


def s3_client_config() -> Any:
    from s3torchconnector import S3ClientConfig

    # A custom endpoint (moto, MinIO) is addressed path-style; AWS itself virtual-hosted.
    return S3ClientConfig(force_path_style=bool(os.environ.get("AWS_ENDPOINT_URL")))


@dataclass(frozen=True)
class _Key:
    bucket: str
    key: str


class S3Store:
    """Checkpoints as ``step-N/`` prefixes; published by writing the marker object."""

    def __init__(self, root: str) -> None:
        self.bucket, self.prefix = split_s3_uri(root)
        self.root = f"{S3_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")
        self._client: S3Client | None = None

    @property
    def client(self) -> S3Client:
        if self._client is None:  # made on first use: a listing-free run never needs it
            from s3torchconnector._s3client import S3Client

            self._client = S3Client(s3_region(), s3client_config=s3_client_config())
        return self._client

    def _key(self, location: str, name: str = "") -> _Key:
        bucket, key = split_s3_uri(location)
        if bucket != self.bucket:
            raise ValueError(f"{location} is not in bucket {self.bucket}")
        return _Key(bucket, f"{key}/{name}" if name else key)

    def _keys_under(self, prefix: str) -> Iterator[str]:
        for page in self.client.list_objects(self.bucket, prefix):
            for info in page.object_info:
                yield info.key

    def _exists(self, key: str) -> bool:
        from s3torchconnectorclient import S3Exception

        try:
            self.client.head_object(self.bucket, key)
        except S3Exception as exc:
            if "not found" in str(exc).lower() or "NoSuchKey" in str(exc):
                return False
            raise
        return True

    def _put(self, key: str, payload: bytes) -> None:
        with self.client.put_object(self.bucket, key) as stream:
            stream.write(payload)

    def _get(self, key: str) -> bytes:
        data: bytes = self.client.get_object(self.bucket, key).read()
        return data

    def upload(self, local: Path, name: str) -> None:
        """Copy a local file to ``<root>/<name>`` (multipart for large files: the CRT client
        splits the stream into parts)."""
        with (
            local.open("rb") as source,
            self.client.put_object(self.bucket, f"{self.prefix}/{name}".lstrip("/")) as stream,
        ):
            shutil.copyfileobj(source, stream, _COPY_CHUNK)

    def download(self, name: str) -> bytes | None:
        """``<root>/<name>``'s bytes, or None when there is no such object."""
        key = f"{self.prefix}/{name}".lstrip("/")
        return self._get(key) if self._exists(key) else None

    def _step_location(self, step: int) -> str:
        return f"{self.root}/{step_dir_name(step)}"

    def save_location(self, step: int) -> str:
        return self._step_location(step)

    def final_location(self, step: int) -> str:
        return self._step_location(step)

    def is_complete(self, location: str) -> bool:
        return step_of(location) is not None and self._exists(
            self._key(location.rstrip("/"), COMPLETE_MARKER).key
        )

    def complete_steps(self, *, warn_incomplete: bool = False) -> list[tuple[int, str]]:
        base = f"{self.prefix}/" if self.prefix else ""
        found: list[tuple[int, str]] = []
        for page in self.client.list_objects(self.bucket, base, delimiter="/"):
            for common in page.common_prefixes:
                step = step_of(common)
                if step is None:
                    continue
                location = self._step_location(step)
                if self._exists(f"{common.rstrip('/')}/{COMPLETE_MARKER}"):
                    found.append((step, location))
                elif warn_incomplete:
                    logger.warning(
                        "checkpoint: ignoring %s: no %s marker", location, COMPLETE_MARKER
                    )
        return sorted(found)

    def _remove(self, location: str) -> None:
        """Marker first: from then on the prefix is an incomplete save, never a checkpoint."""
        prefix = self._key(location).key + "/"
        marker = prefix + COMPLETE_MARKER
        if self._exists(marker):
            self.client.delete_object(self.bucket, marker)
        for key in list(self._keys_under(prefix)):
            self.client.delete_object(self.bucket, key)

    def begin(self, step: int) -> None:
        # A crashed save's leftovers, or the same step saved again: marker first, as always.
        self._remove(self._step_location(step))

    def write_train_state(self, location: str, rank: int, state: dict[str, Any]) -> None:
        buffer = io.BytesIO()
        torch.save(state, buffer)
        self._put(self._key(location, train_state_name(rank)).key, buffer.getvalue())

    def read_train_state(self, location: str, rank: int) -> dict[str, Any]:
        payload = self._get(self._key(location, train_state_name(rank)).key)
        state: dict[str, Any] = torch.load(
            io.BytesIO(payload), map_location="cpu", weights_only=False
        )
        return state

    def missing_train_states(self, location: str, world_size: int) -> list[int]:
        present = set(self._keys_under(self._key(location, TRAIN_STATE_DIR).key + "/"))
        return [
            r
            for r in range(world_size)
            if self._key(location, train_state_name(r)).key not in present
        ]

    def publish(self, step: int, location: str, record: dict[str, Any]) -> str:
        payload = json.dumps(record, indent=2, sort_keys=True).encode()
        self._put(self._key(location, COMPLETE_MARKER).key, payload)
        return location

    def read_marker(self, location: str) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self._get(self._key(location, COMPLETE_MARKER).key))
        return record

    def prune(self, keep_last: int) -> None:
        # An incomplete step-N/ other than the newest step is a crashed save's: no save is in
        # flight when this runs (the manager publishes before pruning).
        complete = self.complete_steps()
        newest = complete[-1][0] if complete else -1
        base = f"{self.prefix}/" if self.prefix else ""
        done = {step for step, _ in complete}
        for page in self.client.list_objects(self.bucket, base, delimiter="/"):
            for common in page.common_prefixes:
                step = step_of(common)
                if step is not None and step not in done and step < newest:
                    logger.info("checkpoint: removing stray %s", self._step_location(step))
                    self._remove(self._step_location(step))
        if keep_last == 0:
            return
        for _step, location in complete[:-keep_last]:
            logger.info("checkpoint: pruning %s (keep_last=%d)", location, keep_last)
            self._remove(location)

    def set_aside(self, location: str) -> str:
        # No rename in S3: server-side copies to a prefix outside the step-N namespace, then
        # the removal, marker first. A crash in between leaves the checkpoint where it was.
        target = f"{self.root}/{set_aside_name(location)}"
        source = self._key(location).key + "/"
        destination = self._key(target).key + "/"
        for key in list(self._keys_under(source)):
            self.client.copy_object(
                self.bucket, key, self.bucket, destination + key.removeprefix(source)
            )
        self._remove(location)
        return target

    def writer(self, location: str) -> StorageWriter:
        from s3torchconnector.dcp import S3StorageWriter

        writer: StorageWriter = S3StorageWriter(
            s3_region(), location, s3client_config=s3_client_config()
        )
        return named_write_errors(writer)

    def reader(self, location: str) -> StorageReader:
        from s3torchconnector.dcp import S3StorageReader

        reader: StorageReader = S3StorageReader(
            s3_region(), location, s3client_config=s3_client_config()
        )
        return reader
