"""The run's other outputs in S3: the metrics file, TensorBoard events and the final export.

A stack without FSx has no storage its pods share, so ``--checkpoint_dir`` is an S3 prefix and
so are these. None of them suits writing into S3 directly: the metrics file is appended line by
line (S3 objects cannot be appended to), TensorBoard's writer appends to its event file, and the
export is written by ``transformers`` into a directory. So rank 0 writes each locally, under
``--staging_dir``, and this mirror copies what changed to its S3 target: after every checkpoint,
every ``SYNC_INTERVAL_S`` when logging, and at the end. A restarted run first fetches the
metrics file back, so it continues the file (restart accounting reads its earlier records).
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainer.checkpoint_store import S3Store, is_s3_uri
from trainer.log import get_logger

logger = get_logger("outputs")

SYNC_INTERVAL_S = 300.0
"""How stale the S3 copy of the metrics and TensorBoard files may get between checkpoints."""


def default_staging_dir() -> Path:
    """Where outputs bound for S3 wait when ``--staging_dir`` is not given."""
    return Path(tempfile.gettempdir()) / "fsdp-eks-outputs"


@dataclass
class _Target:
    local: Path
    """A file or a directory under the staging dir."""
    remote: str
    """Its S3 URI: the object, or the prefix the directory's files go under."""
    uploaded: dict[Path, tuple[int, int]] = field(default_factory=dict)
    """(size, mtime_ns) of each file as last uploaded: unchanged files are not sent again."""


class OutputMirror:
    """Maps S3 outputs to local staging paths and keeps the S3 copies current (rank 0)."""

    def __init__(self, staging_dir: str | Path) -> None:
        self.staging_dir = Path(staging_dir)
        self._targets: list[_Target] = []
        self._last_sync = time.monotonic()

    def local_path(self, target: str | None, name: str) -> str | None:
        """Where to write ``target``: itself when local (or None), else a staging path that
        ``sync`` copies to it."""
        if target is None or not is_s3_uri(target):
            return target
        local = self.staging_dir / name
        self._targets.append(_Target(local=local, remote=target.rstrip("/")))
        return str(local)

    def restore_file(self, target: str | None) -> None:
        """Fetch a mirrored file's S3 copy into its staging path, if there is one (a restart
        continues the metrics file rather than starting a new one)."""
        for entry in self._targets:
            if entry.remote != (target or "").rstrip("/"):
                continue
            parent, _, name = entry.remote.rpartition("/")
            payload = S3Store(parent).download(name)
            entry.local.parent.mkdir(parents=True, exist_ok=True)
            if payload is not None:
                entry.local.write_bytes(payload)
                logger.info("outputs: continuing %s (%d bytes)", entry.remote, len(payload))
            elif entry.local.exists():
                entry.local.unlink()  # a stale copy from an earlier run on this node

    def sync_if_due(self) -> None:
        if time.monotonic() - self._last_sync >= SYNC_INTERVAL_S:
            self.sync()

    def sync(self) -> None:
        """Upload every mirrored file that changed since its last upload. A failure is logged,
        not raised: the next sync retries, and a run should not die for its metrics copy."""
        self._last_sync = time.monotonic()
        for entry in self._targets:
            try:
                self._sync_one(entry)
            except Exception:
                logger.exception("outputs: copying %s to %s failed", entry.local, entry.remote)

    def _sync_one(self, entry: _Target) -> None:
        if entry.local.is_file():
            parent, _, name = entry.remote.rpartition("/")
            files = {entry.local: (S3Store(parent), name)}
        elif entry.local.is_dir():
            store = S3Store(entry.remote)
            files = {
                path: (store, path.relative_to(entry.local).as_posix())
                for path in sorted(entry.local.rglob("*"))
                if path.is_file()
            }
        else:
            return
        for path, (store, name) in files.items():
            stat = path.stat()
            version = (stat.st_size, stat.st_mtime_ns)
            if entry.uploaded.get(path) == version:
                continue
            store.upload(path, name)
            entry.uploaded[path] = version
