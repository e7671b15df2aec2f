"""`fsdp-eks dashboard`: the stack's dashboard written to a file, with how to import it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import load_stack_file
from infra.estimates.run_plan import plan_run
from infra.job.dashboard import stack_dashboard
from scripts.cli.main import main


def test_writes_the_plans_dashboard_and_says_how_to_import_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run.json"
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "dev", "-o", str(out)])
    assert done.value.code == 0
    assert json.loads(out.read_text()) == json.loads(
        stack_dashboard(plan_run(load_stack_file("dev")))
    )
    printed = capsys.readouterr().out
    assert f"dashboard -> {out}" in printed and "Import" in printed


def test_an_unknown_stack_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["dashboard", "no-such-stack", "-o", str(tmp_path / "x.json")])
    assert done.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("fsdp-eks dashboard: no stack 'no-such-stack'")
    assert not (tmp_path / "x.json").exists()
