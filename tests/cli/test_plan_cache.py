"""The plan cache: a second plan of an unchanged stack prints exactly what the first printed
without evaluating, and a change to anything the plan follows from evaluates again."""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest

import scripts.cli.plan as plan_command
from scripts.cli.support import plan_cache
from tests.cli.conftest import run_cli

STACKS = Path(__file__).resolve().parents[2] / "stacks"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("FSDP_EKS_CACHE", str(folder))
    return folder


@pytest.fixture
def evaluations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The stacks actually evaluated (not read back from the cache)."""
    seen: list[str] = []
    real = plan_command.plan_output

    def counted(name: str, *, verbose: bool) -> plan_cache.CachedPlan:
        seen.append(name)
        return real(name, verbose=verbose)

    monkeypatch.setattr(plan_command, "plan_output", counted)
    return seen


def test_an_unchanged_stack_is_shown_again_without_evaluating(
    cache: Path, evaluations: list[str], tmp_path: Path
) -> None:
    stack = tmp_path / "Pulumi.dev.yaml"
    shutil.copy(STACKS / "Pulumi.dev.yaml", stack)
    first = run_cli("plan", str(stack))
    second = run_cli("plan", str(stack))
    assert first.code == second.code == 0
    assert second.out == first.out and second.err == first.err
    assert evaluations == [str(stack)]
    assert len(list(cache.glob("plan/*.json"))) == 1

    stack.write_text(stack.read_text().replace("maxSteps: 200", "maxSteps: 120"))
    assert "maxSteps: 120" in stack.read_text()
    third = run_cli("plan", str(stack))
    assert evaluations == [str(stack), str(stack)]
    assert "120 steps" in third.out and third.out != first.out

    assert run_cli("plan", "--no-cache", str(stack)).out == third.out
    assert evaluations == [str(stack)] * 3


def test_a_refused_stack_is_kept_with_its_exit_status(
    cache: Path, evaluations: list[str], tmp_path: Path
) -> None:
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text("config:\n  fsdp-eks:gpuNodes:\n    instanceType: g5.xlarge\n    cuont: 1\n")
    first, second = run_cli("plan", str(stack)), run_cli("plan", str(stack))
    assert first.code == second.code == 2
    assert second.err == first.err and "gpuNodes.cuont" in first.err
    assert len(evaluations) == 1


INPUTS = ("infra/program.py", "trainer/presets.py", "docker/Dockerfile", "scripts/cli/plan.py",
          "uv.lock", "pyproject.toml", "Pulumi.yaml", ".dockerignore")  # fmt: skip


def test_the_key_follows_every_input(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "repo"
    for name in INPUTS:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    stack = root / "Pulumi.x.yaml"
    stack.write_text("config: {}\n")
    monkeypatch.setattr(plan_cache, "ROOT", root)
    installed = ["pulumi-3.200.0.dist-info", "pulumi_aws-7.10.0.dist-info"]
    monkeypatch.setattr(plan_cache, "_installed", lambda: list(installed))

    def key(**options: bool) -> str:
        return plan_cache.plan_key(stack, str(stack), verbose=options.get("verbose", False))

    base = key()
    assert key() == base
    assert key(verbose=True) != base
    for name in INPUTS:
        before = (root / name).read_text()
        (root / name).write_text(before + "\n# changed")
        assert key() != base, name
        (root / name).write_text(before)
        (root / name).chmod(0o755)  # an executable bit feeds the image tag
        assert key() != base, name
        (root / name).chmod(0o644)
    assert key() == base
    monkeypatch.setenv("PULUMI_CONFIG_FSDP_EKS_TRAINING", "{}")  # read ahead of the stack's
    assert key() != base
    monkeypatch.delenv("PULUMI_CONFIG_FSDP_EKS_TRAINING")
    monkeypatch.setenv("PULUMI_CONFIG", '{"fsdp-eks:job": "{}"}')
    assert key() != base
    monkeypatch.delenv("PULUMI_CONFIG")
    sys.path.insert(0, str(tmp_path / "elsewhere"))  # PYTHONPATH, an editable install
    try:
        assert key() != base
    finally:
        sys.path.remove(str(tmp_path / "elsewhere"))
    assert key() == base
    (root / "infra" / "new_module.py").write_text("")
    assert key() != base
    (root / "infra" / "new_module.py").unlink()
    (root / "infra" / "__pycache__").mkdir()
    (root / "infra" / "__pycache__" / "program.cpython-312.pyc").write_bytes(b"\0")
    assert key() == base  # bytecode follows the sources
    installed[1] = "pulumi_aws-7.11.0.dist-info"
    assert key() != base
    installed[1] = "pulumi_aws-7.10.0.dist-info"
    stack.write_text("config: {}\n# a comment\n")
    assert key() != base


def test_the_cache_can_be_turned_off(
    monkeypatch: pytest.MonkeyPatch, evaluations: list[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("FSDP_EKS_CACHE", "off")
    assert plan_cache.cache_dir() is None
    run_cli("plan", "dev")
    run_cli("plan", "dev")
    assert evaluations == ["dev", "dev"]


def test_an_unwritable_cache_is_skipped(
    monkeypatch: pytest.MonkeyPatch, evaluations: list[str], tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("FSDP_EKS_CACHE", str(blocker))
    result = run_cli("plan", "dev")
    assert result.code == 0 and "Stack dev" in result.out


def test_the_keys_root_files_are_the_image_builds() -> None:
    """Every file the image tag hashes (`infra.image.source`) is an input of the key."""
    from infra.image.source import SOURCE_FILES, SOURCE_TREES

    for name in SOURCE_FILES:
        assert name in plan_cache.FILES or name.startswith(
            tuple(f"{folder}/" for folder in plan_cache.SOURCES)
        ), name
    assert set(SOURCE_TREES) <= set(plan_cache.SOURCES)


def test_a_kept_verbose_plan_says_when_it_was_evaluated(
    cache: Path, evaluations: list[str], tmp_path: Path
) -> None:
    stack = tmp_path / "Pulumi.dev.yaml"
    shutil.copy(STACKS / "Pulumi.dev.yaml", stack)
    fresh = run_cli("plan", "-v", str(stack))
    kept = run_cli("plan", "-v", str(stack))
    assert fresh.code == kept.code == 0 and evaluations == [str(stack)]
    timing = next(line for line in fresh.lines if "evaluated offline in" in line)
    assert re.fullmatch(r"Resources \(\d+\), evaluated offline in [\d.]+s:", timing), timing
    replayed = next(line for line in kept.lines if "evaluated offline in" in line)
    assert re.fullmatch(
        re.escape(timing[:-1]) + r" at \d{4}-\d\d-\d\d \d\d:\d\d UTC, shown from the plan cache:",
        replayed,
    ), replayed
    assert kept.out.replace(replayed, timing) == fresh.out  # the rest as printed


def test_a_kept_plan_shows_the_path_it_was_asked_by(
    cache: Path, evaluations: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header names the stack file as the user gave it: the same file asked for by another
    relative path is another entry, not the first one's header."""
    (tmp_path / "a" / "b").mkdir(parents=True)
    shutil.copy(STACKS / "Pulumi.dev.yaml", tmp_path / "a" / "b" / "Pulumi.dev.yaml")
    monkeypatch.chdir(tmp_path)
    first = run_cli("plan", "a/b/Pulumi.dev.yaml")
    monkeypatch.chdir(tmp_path / "a")
    second = run_cli("plan", "b/Pulumi.dev.yaml")
    assert first.code == second.code == 0
    assert first.lines[0] == "Stack dev (a/b/Pulumi.dev.yaml)"
    assert second.lines[0] == "Stack dev (b/Pulumi.dev.yaml)"
