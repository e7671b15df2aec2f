"""The build source archive: exactly what the image needs, nothing secret, reproducible."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from infra.image import source as image_source
from infra.image.source import (
    SOURCE_FILES,
    build_fingerprint,
    collect_source_files,
    locked_group_closure,
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


MINI_LOCK = """\
version = 1
revision = 3
requires-python = ">=3.11"

[[package]]
name = "proj"
version = "0.1.0"
source = { editable = "." }

[package.dev-dependencies]
infra = [{ name = "pulumi" }]
trainer = [{ name = "torch" }, { name = "tqdm", extra = ["notebook"] }]

[[package]]
name = "pulumi"
version = "3.0.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "torch"
version = "2.13.0"
source = { registry = "https://pypi.org/simple" }
dependencies = [{ name = "sympy" }]

[[package]]
name = "sympy"
version = "1.14.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "tqdm"
version = "4.70.1"
source = { registry = "https://pypi.org/simple" }

[package.optional-dependencies]
notebook = [{ name = "ipywidgets" }]

[[package]]
name = "ipywidgets"
version = "8.0.0"
source = { registry = "https://pypi.org/simple" }
"""


def make_repo(root: Path) -> Path:
    for name in SOURCE_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"content of {name}\n")
    (root / "uv.lock").write_text(MINI_LOCK)
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


def test_trainer_closure_follows_dependencies_and_extras_only() -> None:
    names = [p["name"] for p in locked_group_closure(MINI_LOCK)]
    assert names == ["ipywidgets", "sympy", "torch", "tqdm"]
    with pytest.raises(ValueError, match="no dependency group 'gpu'"):
        locked_group_closure(MINI_LOCK, "gpu")


@pytest.mark.parametrize(
    ("edit", "rebuilds"),
    [
        (lambda root: _replace(root / "uv.lock", '"3.0.0"', '"3.1.0"'), False),  # pulumi bump
        (lambda root: (root / "pyproject.toml").write_text("[tool.ruff]\n"), False),
        (lambda root: _replace(root / "uv.lock", '"1.14.0"', '"1.15.0"'), True),  # sympy bump
        (lambda root: _replace(root / "uv.lock", '"8.0.0"', '"8.1.0"'), True),  # extra's dep
        (lambda root: (root / "trainer/__init__.py").write_text("# new\n"), True),
        (lambda root: (root / "docker/Dockerfile").write_text("FROM x:1\n"), True),
    ],
)
def test_image_hash_changes_only_with_what_the_image_holds(
    tmp_path: Path, edit: object, rebuilds: bool
) -> None:
    root = make_repo(tmp_path / "repo")
    before = write_source_archive(root, tmp_path / "out")
    edit(root)  # type: ignore[operator]
    after = write_source_archive(root, tmp_path / "out")
    assert after.sha256 != before.sha256  # the uploaded archive always follows the files
    assert (after.image_sha256 != before.image_sha256) is rebuilds


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_real_lock_closure_is_what_uv_exports_for_the_image() -> None:
    uv = Path(sys.executable).with_name("uv")
    assert uv.exists(), "uv is installed into the dev environment by scripts/dev.py"
    exported = subprocess.run(
        [
            *(str(uv), "export", "--frozen", "--only-group", "trainer", "--no-emit-project"),
            *("--no-hashes", "--no-header", "--no-annotate"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    from_uv = {line.split("==")[0] for line in exported.splitlines() if "==" in line}
    ours = {p["name"] for p in locked_group_closure((REPO / "uv.lock").read_text())}
    assert ours == from_uv
    assert {"torch", "transformers", "datasets"} <= ours
    assert not ours & {"pulumi", "pulumi-aws", "boto3", "moto", "ruff"}


def test_the_lock_is_parsed_once_per_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each plan hashes the image's sources; parsing uv.lock again each time cost 40% of an
    evaluation. A changed lock is a new text, so it is parsed afresh."""
    parses: list[int] = []
    real_loads = image_source.tomllib.loads

    def counting_loads(text: str) -> dict[str, Any]:
        parses.append(len(text))
        return real_loads(text)

    monkeypatch.setattr(image_source.tomllib, "loads", counting_loads)
    lock = MINI_LOCK + "\n# parsed-once probe\n"
    first = locked_group_closure(lock)
    first[0]["name"] = "changed by a caller"
    assert locked_group_closure(lock)[0]["name"] == "ipywidgets"
    assert len(parses) == 1
    locked_group_closure(lock + "\n")
    assert len(parses) == 2
