"""The image build's source: exactly the files the Dockerfile needs, as a reproducible zip.

CodeBuild reads its source from S3, so `pulumi up` uploads an archive of this repository.
An allowlist decides what goes in, not a denylist: a new file at the top of the repository
(a stack with secrets in it, an `.env`, a notebook with credentials) stays out unless someone
adds it here on purpose. Secret-looking names are refused even inside allowlisted folders.

The archive is byte-for-byte reproducible (sorted entries, fixed timestamps and permissions),
and its content hash is what decides whether the image must be rebuilt: the same sources on
another laptop or in CI give the same hash, so nothing is rebuilt for a checkout alone.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import json
import os
import tomllib
import uuid
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

SOURCE_FILES = (
    "pyproject.toml",
    "uv.lock",
    ".dockerignore",
    "docker/Dockerfile",
    "docker/buildspec.yml",
    "docker/smoke_test.py",
)
"""Single files the build reads: dependency pins, the image recipe and its smoke test."""

SOURCE_TREES = ("trainer",)
"""Folders copied whole into the image (the trainer package; never `infra`, which needs pulumi)."""

EXCLUDED_NAMES = (
    ".git",
    ".venv",
    ".venv-dev",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".ipynb_checkpoints",
    ".DS_Store",
    "*.pyc",
    "*.pyo",
    ".env",
    ".env.*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "Pulumi.*.yaml",
    "credentials",
    "*.swp",
)
"""Names skipped at any depth: caches, VCS data and anything that may carry a secret."""

_ZIP_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold
_FILE_MODE = 0o644
_EXECUTABLE_MODE = 0o755


@dataclass(frozen=True)
class SourceArchive:
    """A written source archive and what identifies its content."""

    path: Path
    sha256: str
    """Hash over every entry's path, mode and bytes (not the zip container)."""
    files: tuple[str, ...]
    """Archive member names, sorted, POSIX separators."""
    image_sha256: str
    """What the image is built from: every file except the lock and pyproject, plus the
    locked `trainer` group closure. A lock change that only touches infra or dev packages
    (a pulumi or ruff bump) leaves it unchanged, so it does not cost a 20-minute rebuild."""


LOCK_FILE = "uv.lock"
PROJECT_FILE = "pyproject.toml"
IMAGE_GROUP = "trainer"
"""The dependency group the Dockerfile installs (`uv export --only-group trainer`)."""


def locked_group_closure(lock_text: str, group: str = IMAGE_GROUP) -> list[dict[str, Any]]:
    """Every uv.lock package entry the `group` can install, sorted by name and version.

    Markers are ignored on purpose: the closure may hold a package a platform would skip,
    which at worst rebuilds once too often, never once too few.
    """
    return list(json.loads(_closure_json(lock_text, group)))


@functools.lru_cache(maxsize=4)
def _closure_json(lock_text: str, group: str) -> str:
    """The closure as JSON, kept per lock text: parsing uv.lock took 40% of a plan (a
    stack's evaluation under the mock runtime), and every plan in one process reads the same."""
    packages: list[dict[str, Any]] = tomllib.loads(lock_text).get("package", [])
    projects = [p for p in packages if "editable" in p.get("source", {})]
    groups = projects[0].get("dev-dependencies", {}) if projects else {}
    if group not in groups:
        raise ValueError(f"{LOCK_FILE} has no dependency group {group!r}; found {sorted(groups)}")
    by_name: dict[str, list[dict[str, Any]]] = {}
    for package in packages:
        by_name.setdefault(package["name"], []).append(package)
    closure: dict[tuple[str, str], dict[str, Any]] = {}
    seen: set[tuple[str, str, str]] = set()
    pending: list[dict[str, Any]] = list(groups[group])
    while pending:
        spec = pending.pop()
        for package in by_name.get(spec["name"], []):
            if "version" in spec and package.get("version") != spec["version"]:
                continue
            key = (package["name"], str(package.get("version")))
            for extra in ["", *spec.get("extra", [])]:
                if (*key, extra) in seen:
                    continue
                seen.add((*key, extra))
                closure[key] = package
                extras = package.get("optional-dependencies", {})
                pending += extras.get(extra, []) if extra else package.get("dependencies", [])
    return json.dumps([closure[key] for key in sorted(closure)])


def _excluded(relative: PurePosixPath) -> bool:
    return any(
        fnmatch.fnmatchcase(part, pattern) for part in relative.parts for pattern in EXCLUDED_NAMES
    )


def collect_source_files(
    root: Path,
    *,
    files: Iterable[str] = SOURCE_FILES,
    trees: Iterable[str] = SOURCE_TREES,
) -> list[str]:
    """The relative POSIX paths of every file that belongs in the archive, sorted.

    A listed single file that is missing is an error (the build would fail an hour later in
    CodeBuild otherwise); a listed file with a secret-looking name is refused outright.
    """
    selected: set[str] = set()
    for name in files:
        relative = PurePosixPath(name)
        if _excluded(relative):
            raise ValueError(f"source file {name!r} matches an excluded name ({EXCLUDED_NAMES})")
        if not (root / relative).is_file():
            raise FileNotFoundError(f"the image build needs {name!r}, missing under {root}")
        selected.add(relative.as_posix())
    for tree in trees:
        base = root / tree
        if not base.is_dir():
            raise FileNotFoundError(f"the image build needs the folder {tree!r} under {root}")
        for path in base.rglob("*"):
            relative = PurePosixPath(path.relative_to(root).as_posix())
            if path.is_file() and not path.is_symlink() and not _excluded(relative):
                selected.add(relative.as_posix())
    return sorted(selected)


def _mode(path: Path) -> int:
    return _EXECUTABLE_MODE if path.stat().st_mode & 0o111 else _FILE_MODE


def content_hash(root: Path, names: Iterable[str]) -> str:
    """sha256 over (path, mode, length, bytes) of each file; independent of zip details."""
    digest = hashlib.sha256()
    for name in names:
        path = root / name
        data = path.read_bytes()
        digest.update(f"{name}\0{_mode(path):o}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def image_content_hash(root: Path, names: Iterable[str]) -> str:
    """The hash of what goes into the image (see `SourceArchive.image_sha256`)."""
    own = [n for n in names if n not in (LOCK_FILE, PROJECT_FILE)]
    closure = locked_group_closure((root / LOCK_FILE).read_text())
    payload = {"files": content_hash(root, own), IMAGE_GROUP: closure}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def write_source_archive(root: Path, out_dir: Path) -> SourceArchive:
    """Write `<out_dir>/image-source-<hash>.zip` (reused when already there) and describe it."""
    names = collect_source_files(root)
    sha256 = content_hash(root, names)
    image_sha256 = image_content_hash(root, names)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"image-source-{sha256[:16]}.zip"
    if not path.exists():
        # A name of its own per writer: two evaluations at once (pytest -n, two previews) must
        # not write into, or rename away, each other's half-written archive.
        partial = path.with_name(f"{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in names:
                info = zipfile.ZipInfo(name, date_time=_ZIP_EPOCH)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.create_system = 3  # Unix, so the mode bits below are honoured on extract
                info.external_attr = (0o100000 | _mode(root / name)) << 16
                archive.writestr(info, (root / name).read_bytes(), compresslevel=9)
        partial.replace(path)  # atomic: a concurrent `pulumi preview` never sees half a zip
    return SourceArchive(path=path, sha256=sha256, files=tuple(names), image_sha256=image_sha256)


def build_fingerprint(source_sha256: str, build_settings: Mapping[str, str]) -> str:
    """The identity of an image: its sources (`image_sha256`) plus every build setting.

    A new base image or EFA installer version changes the image as surely as a code change,
    so both feed the tag that decides whether to rebuild.
    """
    payload = {"source": source_sha256, "settings": dict(build_settings)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
