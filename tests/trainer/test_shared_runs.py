"""The reference run and tiny assets are made once for all pytest-xdist workers of a session."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from tests.trainer.conftest import session_shared_dir


class _Basetemp:
    """A TempPathFactory's one call here, pointed at a throwaway tree."""

    def __init__(self, basetemp: Path) -> None:
        self.basetemp = basetemp

    def getbasetemp(self) -> Path:
        return self.basetemp


def test_workers_of_one_session_share_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A worker's basetemp is popen-gwN under the session's; both workers get the same folder.
    shared = set()
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        factory = cast(pytest.TempPathFactory, _Basetemp(tmp_path / f"popen-{worker}"))
        shared.add(session_shared_dir(factory, "reference"))
    assert shared == {tmp_path / "reference"}
    assert (tmp_path / "reference").is_dir()


def test_without_workers_the_directory_is_the_sessions_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = cast(pytest.TempPathFactory, _Basetemp(tmp_path / "pytest-7"))
    (tmp_path / "pytest-7").mkdir()
    # Never the parent: concurrent sessions of one user share that.
    assert session_shared_dir(factory, "reference") == tmp_path / "pytest-7" / "reference"
