"""`dev.py test` keeps pytest's rewritten test modules between runs, whatever the shell says."""

from __future__ import annotations

from pathlib import Path

import pytest

import scripts.dev


def test_the_tests_may_write_bytecode_where_the_shell_forbids_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Docker images and CI runners often set PYTHONDONTWRITEBYTECODE; pytest then rewrites
    every test file in every worker at each collection (scripts/dev.py `BYTECODE_OFF`). The
    lint and type checks keep the caller's environment."""
    calls: list[tuple[tuple[str | Path, ...], dict[str, str] | None]] = []
    monkeypatch.setattr(scripts.dev, "run", lambda *cmd, env=None: calls.append((cmd, env)))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setenv("FSDP_EKS_SOMETHING", "kept")
    scripts.dev.command_test(Path("python"), ["-k", "x"], fast=True)
    [(pytest_cmd, pytest_env)] = [(c, e) for c, e in calls if c[1:3] == ("-m", "pytest")]
    assert pytest_cmd[-2:] == ("-k", "x") and "not slow and not long" in pytest_cmd
    assert pytest_env is not None and "PYTHONDONTWRITEBYTECODE" not in pytest_env
    assert pytest_env["FSDP_EKS_SOMETHING"] == "kept"
    assert all(env is None for cmd, env in calls if cmd[1:3] != ("-m", "pytest"))


@pytest.mark.parametrize(("fast", "workers"), [(True, "auto"), (False, "3")])
def test_the_whole_suite_runs_one_worker_more_than_the_cores(
    monkeypatch: pytest.MonkeyPatch, fast: bool, workers: str
) -> None:
    """Its multi-process tests leave cores idle while they start and wait; the fast tier has
    no such tests, and an extra worker only adds a collection. `-n` given by hand wins."""
    calls: list[tuple[str | Path, ...]] = []
    monkeypatch.setattr(scripts.dev, "run", lambda *cmd, env=None: calls.append(cmd))
    monkeypatch.setattr(scripts.dev.os, "sched_getaffinity", lambda _pid: {0, 1}, raising=False)
    scripts.dev.command_test(Path("python"), [], fast=fast)
    scripts.dev.command_test(Path("python"), ["-n", "0"], fast=fast)
    chosen, given = [c for c in calls if c[1:3] == ("-m", "pytest")]
    assert chosen[3:7] == ("-n", workers, "--dist", "loadfile")
    assert "--no-loadscope-reorder" in chosen
    assert given[3:] == (*([*scripts.dev.FAST_TIER] if fast else []), "-n", "0")
