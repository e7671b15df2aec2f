"""The offline plan's result, kept until anything it reads changes.

An evaluation costs seconds of imports; a hit, hundredths. The key hashes everything the output
follows from (stack file, program sources, environment config, `sys.path`, installed
distributions, options, the UTC day). `FSDP_EKS_CACHE` names the folder; `off` turns it off.
What the key holds, and why: docs/design/cli.md#plan_cache
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import sysconfig
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from scripts.cli.support.tools import ROOT

SOURCES = ("infra", "trainer", "docker", "scripts/cli")
"""Folders whose every file the plan may follow from."""
FILES = ("Pulumi.yaml", "pyproject.toml", "uv.lock", ".dockerignore")
"""Single files at the root the plan follows from (the image's build source among them)."""
SKIPPED_PARTS = {"__pycache__", ".mypy_cache", ".ruff_cache"}
KEPT_ENTRIES = 200
"""Plans kept; older ones are removed when a new one is written."""
FORMAT = 2
"""Bumped when what an entry holds changes."""


@dataclass(frozen=True)
class CachedPlan:
    """What one plan printed and how it ended."""

    stdout: str
    stderr: str
    status: int
    evaluated_at: datetime | None = None
    """When it was evaluated, for a plan read back from the cache."""


def cache_dir() -> Path | None:
    """Where plans are kept, or None when the cache is off."""
    setting = os.environ.get("FSDP_EKS_CACHE", "")
    if setting.lower() == "off":
        return None
    if setting:
        return Path(setting) / "plan"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "fsdp-eks" / "plan"


def _source_files() -> list[Path]:
    files = [ROOT / name for name in FILES if (ROOT / name).is_file()]
    for folder in SOURCES:
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and not SKIPPED_PARTS.intersection(path.parts):
                files.append(path)
    return sorted(files)


def _installed() -> list[str]:
    """`name-version.dist-info` of every distribution the running interpreter can import."""
    folders = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    found: list[str] = []
    for folder in sorted(folders):
        try:
            found += [p.name for p in Path(folder).iterdir() if p.name.endswith(".dist-info")]
        except OSError:
            continue
    return sorted(found)


def _pulumi_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name.startswith("PULUMI_CONFIG")}


def plan_key(stack_file: Path, shown_as: str, *, verbose: bool) -> str:
    """The hash a plan of `stack_file` is kept under; any change to its inputs changes it."""
    digest = hashlib.sha256()

    def add(label: str, data: bytes) -> None:
        digest.update(f"{label}\0{len(data)}\0".encode())
        digest.update(data)

    add("format", str(FORMAT).encode())
    add("stack", stack_file.read_bytes())
    add("shown-as", shown_as.encode())
    add("options", json.dumps({"verbose": verbose}).encode())
    add("day", datetime.now(UTC).date().isoformat().encode())
    add("python", f"{sys.executable}\0{sys.version}".encode())
    add("installed", "\n".join(_installed()).encode())
    add("environment", json.dumps(_pulumi_environment(), sort_keys=True).encode())
    add("sys.path", "\n".join(sys.path).encode())
    for path in _source_files():
        name = path.relative_to(ROOT).as_posix()
        add(f"{name} mode", f"{path.stat().st_mode:o}".encode())
        add(name, path.read_bytes())
    return digest.hexdigest()


def load(key: str) -> CachedPlan | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        data = json.loads((folder / f"{key}.json").read_text(encoding="utf-8"))
        return CachedPlan(
            str(data["stdout"]),
            str(data["stderr"]),
            int(data["status"]),
            datetime.fromisoformat(str(data["evaluated_at"])),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent or unreadable: evaluate


def store(key: str, plan: CachedPlan) -> None:
    """Keep a plan (written by rename, so a reader never sees half of one); a cache that cannot
    be written is skipped, never an error."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{key}.{os.getpid()}.tmp"
        partial.write_text(
            json.dumps(
                {
                    "stdout": plan.stdout,
                    "stderr": plan.stderr,
                    "status": plan.status,
                    "evaluated_at": datetime.now(UTC).isoformat(),
                }
            ),
            encoding="utf-8",
        )
        partial.replace(folder / f"{key}.json")
        entries = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in entries[KEPT_ENTRIES:]:
            old.unlink(missing_ok=True)
    except OSError:
        return
