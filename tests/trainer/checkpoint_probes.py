"""DCP file systems that watch or hold up a checkpoint's writes, for tests.

They wrap the writer's real file system (`FileSystemWriter.fs`, which s3torchconnector's
`S3StorageWriter` shares), so the write path under test stays DCP's own. Importable without
pytest: they travel by pickle to the process that runs the upload.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemWriter, StorageWriter

from trainer.faults import NoSpaceLeft


class RecordingFileSystem(NoSpaceLeft):
    """Appends `<pid> <path>` to `log` for every file opened for writing, and holds each such
    write until `gate` exists (when given)."""

    def __init__(self, inner: Any, log: str, gate: str | None = None) -> None:
        super().__init__(inner)
        self.log = log
        self.gate = gate

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        if "w" in mode:
            with Path(self.log).open("a", encoding="utf-8") as log:
                log.write(f"{os.getpid()} {path}\n")
            while self.gate is not None and not Path(self.gate).exists():
                time.sleep(0.05)
        with self.inner.create_stream(path, mode) as stream:
            yield stream


class Probe:
    """`SaveFaults` for `CheckpointManager.save`: records (and optionally gates) the writes."""

    def __init__(self, log: Path, gate: Path | None = None) -> None:
        self.log, self.gate = str(log), str(gate) if gate is not None else None

    def inside_save(self, step: int) -> None:
        pass

    def storage_writer(self, step: int, writer: StorageWriter) -> StorageWriter:
        assert isinstance(writer, FileSystemWriter)
        writer.fs = RecordingFileSystem(writer.fs, self.log, self.gate)  # type: ignore[assignment]
        return writer

    def writers(self) -> dict[str, int]:
        """Path written -> the pid that opened it."""
        lines = Path(self.log).read_text(encoding="utf-8").splitlines()
        return {path: int(pid) for pid, path in (line.split(" ", 1) for line in lines)}
