"""The build source archive: exactly what the image needs, nothing secret, reproducible."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest

from infra.image_source import (
    SOURCE_FILES,
    build_fingerprint,
    collect_source_files,
    write_source_archive,
)

REPO = Path(__file__).resolve().parents[2]

SECRETS = (
    ".git/config",
    ".env",
    ".env.production",
    "stacks/Pulumi.dev.yaml",
    "Pulumi.prod.yaml",
    "trainer/.env",
    "trainer/sub/Pulumi.secret.yaml",
    "trainer/deploy.pem",
    "trainer/id_rsa",
    "trainer/__pycache__/models.cpython-311.pyc",
    "trainer/models.pyc",
    ".venv/lib/site.py",
    "infra/__main__.py",
    "scripts/dev.py",
    "runs/step-1/model.safetensors",
)


def make_repo(root: Path) -> Path:
    for name in SOURCE_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"content of {name}\n")
    for name in ("trainer/__init__.py", "trainer/data/loader.py", "trainer/vocab.json"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"# {name}\n")
    for name in SECRETS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("SECRET=1\n")
    return root


def test_archive_holds_the_allowlist_and_no_secret(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    archive = write_source_archive(root, tmp_path / "out")
    expected = sorted(
        [*SOURCE_FILES, "trainer/__init__.py", "trainer/data/loader.py", "trainer/vocab.json"]
    )
    assert list(archive.files) == expected
    with zipfile.ZipFile(archive.path) as zipped:
        assert sorted(zipped.namelist()) == expected
        for secret in SECRETS:
            assert secret not in zipped.namelist()
        assert all(b"SECRET" not in zipped.read(name) for name in zipped.namelist())


def test_the_real_repository_archive_has_what_the_dockerfile_copies(tmp_path: Path) -> None:
    archive = write_source_archive(REPO, tmp_path)
    files = set(archive.files)
    copied = []
    for line in (REPO / "docker/Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            copied += [w for w in words[1:-1] if not w.startswith("--")]
    assert copied, "no COPY found in docker/Dockerfile"
    for source in copied:
        assert source in files or any(f.startswith(source.rstrip("/") + "/") for f in files), (
            f"Dockerfile copies {source!r}, which the build source archive lacks"
        )
    assert {"docker/Dockerfile", "docker/buildspec.yml"} <= files
    assert not any(f.startswith(("infra/", "stacks/", "tests/", ".git/")) for f in files)
    assert not any(Path(f).name.startswith(".env") or f.endswith(".pyc") for f in files)


def test_archive_bytes_and_hash_are_reproducible(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    first = write_source_archive(root, tmp_path / "a")
    os.utime(root / "trainer/__init__.py", (1_000_000_000, 1_000_000_000))
    second = write_source_archive(root, tmp_path / "b")
    assert first.sha256 == second.sha256
    assert first.path.read_bytes() == second.path.read_bytes()
    with zipfile.ZipFile(first.path) as zipped:
        assert {info.date_time for info in zipped.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_hash_follows_content_and_the_executable_bit(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    base = write_source_archive(root, tmp_path / "out").sha256
    (root / "trainer/data/loader.py").write_text("# changed\n")
    edited = write_source_archive(root, tmp_path / "out").sha256
    (root / "trainer/data/loader.py").chmod(0o755)
    executable = write_source_archive(root, tmp_path / "out").sha256
    assert len({base, edited, executable}) == 3
    with zipfile.ZipFile(tmp_path / "out" / f"image-source-{executable[:16]}.zip") as zipped:
        mode = zipped.getinfo("trainer/data/loader.py").external_attr >> 16
        assert mode & 0o777 == 0o755


def test_a_missing_source_file_is_named(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    (root / "uv.lock").unlink()
    with pytest.raises(FileNotFoundError, match=re.escape("'uv.lock'")):
        collect_source_files(root)


def test_a_secret_looking_source_file_is_refused(tmp_path: Path) -> None:
    root = make_repo(tmp_path / "repo")
    with pytest.raises(ValueError, match=re.escape("'stacks/Pulumi.dev.yaml'")):
        collect_source_files(root, files=["stacks/Pulumi.dev.yaml"])


def test_fingerprint_changes_with_any_build_setting() -> None:
    settings = {"BASE_IMAGE": "nvcr.io/nvidia/pytorch:26.03-py3", "SMOKE_TEST_LEVEL": "standard"}
    same = build_fingerprint("abc", dict(reversed(list(settings.items()))))
    assert build_fingerprint("abc", settings) == same
    assert build_fingerprint("abd", settings) != same
    assert build_fingerprint("abc", {**settings, "SMOKE_TEST_LEVEL": "full"}) != same
