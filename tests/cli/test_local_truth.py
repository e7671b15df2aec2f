"""What the local rehearsal, `plot` and a mistyped path say, tried as a new user would (issue 28
item 14): which stack values the rehearsal replaced, figures that do not clobber each other,
torch's own lines kept out of the terminal, and a missing path named as the path it is."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from scripts.cli import local as local_run
from tests.cli.conftest import assert_one_line_mistake, run_cli, write_metrics

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_rehearsal_says_which_stack_values_it_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    """The dev stack's lr 3e-4, min lr 1e-5 and weight decay 0.2 became 3e-3, 3e-4 and 0
    without a word; its accumulation (1) is the rehearsal's, so it is not listed."""
    monkeypatch.setattr(
        local_run, "run_agents", lambda plan, **_: local_run.Launch(code=5, planned_exit=False)
    )
    result = run_cli("local", "dev", "--out", str(tmp_path), "--device", "cpu", "--quiet")
    assert result.code == 1, result
    replaced = [line for line in result.lines if line.startswith("Replaced")]
    assert replaced == [
        "Replaced for a model this small (the cluster runs the stack's): training.lr 0.0003 -> "
        "0.003, training.minLr 1e-05 -> 0.0003, training.weightDecay 0.2 -> 0"
    ]


def test_torch_s_info_lines_and_the_spawn_header_stay_in_the_log() -> None:
    shown, log = io.StringIO(), io.StringIO()
    output = local_run.AgentOutput(log=log, shown=shown, prefix="")
    lines = [
        "2026-11-27 18:53:41 I [preflight.py:194] preflight: every check passed\n",
        "[1] 2026-11-27 18:54:23,663 - root - INFO - Initializing dist.ProcessGroup in "
        "checkpoint background process on port 34169\n",
        "[0] 2026-11-27 18:54:24,751 - root - INFO - Checkpoint background process is running...\n",
        "2026-11-27 18:54:52 W [faults.py:94] --fail_at_step 5: exiting abruptly\n",
        "Process SpawnProcess-1:\n",
        "Traceback (most recent call last):\n",
        "KeyboardInterrupt\n",
    ]
    output.feed(lines)
    output.release(planned=True, log_path=Path("node-0/agent.log"))
    assert shown.getvalue().splitlines() == [
        "2026-11-27 18:53:41 I [preflight.py:194] preflight: every check passed",
        "2026-11-27 18:54:52 W [faults.py:94] --fail_at_step 5: exiting abruptly",
        "torchrun reported the planned exit (3 lines, kept in node-0/agent.log)",
    ]
    assert log.getvalue() == "".join(lines)


def test_a_rerun_keeps_the_figures_of_the_run_before(tmp_path: Path) -> None:
    made = local_run.fresh_run_root(tmp_path, "dev")
    (made / "loss.png").write_bytes(PNG + b"local")
    (made / "metrics.png").write_bytes(PNG + b"plot")
    again = local_run.fresh_run_root(tmp_path, "dev")
    assert sorted(p.name for p in again.iterdir()) == [
        local_run.RUN_MARKER,
        "previous-loss.png",
        "previous-metrics.png",
    ]
    assert (again / "previous-loss.png").read_bytes() == PNG + b"local"
    third = local_run.fresh_run_root(tmp_path, "dev")  # only the last run's are kept
    assert sorted(p.name for p in third.iterdir()) == [local_run.RUN_MARKER]


def test_plot_s_default_figure_is_not_the_rehearsal_s(tmp_path: Path) -> None:
    run = tmp_path / "dev"
    run.mkdir()
    write_metrics(run / "metrics.jsonl")
    (run / "loss.png").write_bytes(PNG + b"the rehearsal's figure")
    result = run_cli("plot", str(run / "metrics.jsonl"))
    assert result.code == 0, result
    assert result.lines[-1] == f"wrote {run / 'metrics.png'}"
    assert (run / "metrics.png").read_bytes()[:8] == PNG
    assert (run / "loss.png").read_bytes() == PNG + b"the rehearsal's figure"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["plot", "./run/metrics.jsonl"],
            "fsdp-eks plot: no metrics file ./run/metrics.jsonl: no such file (`fsdp-eks local "
            "<stack>` writes .local-run/<stack>/metrics.jsonl; a deployed run: fsdp-eks plot -s "
            "STACK)",
        ),
        (
            ["plot", "metrics.jsonl"],
            "fsdp-eks plot: no metrics file metrics.jsonl: no such file (`fsdp-eks local "
            "<stack>` writes .local-run/<stack>/metrics.jsonl; a deployed run: fsdp-eks plot -s "
            "STACK)",
        ),
        (
            ["plan", "./exp/Pulumi.exp.yaml"],
            "fsdp-eks plan: no stack file ./exp/Pulumi.exp.yaml: no such file; a stack is a "
            "stack file's path or a name under stacks/: dev, llama2-7b-p4d, llama31-8b-p5, "
            "llama32-1b-g5, llama32-1b-g5-trainjob, mixtral-8x7b-p5, team-cluster, "
            "team-cluster-queued",
        ),
        (
            ["plan", "exp.yaml"],
            "fsdp-eks plan: no stack file exp.yaml: no such file; a stack is a stack file's "
            "path or a name under stacks/: dev, llama2-7b-p4d, llama31-8b-p5, llama32-1b-g5, "
            "llama32-1b-g5-trainjob, mixtral-8x7b-p5, team-cluster, team-cluster-queued",
        ),
    ],
)
def test_a_missing_path_is_named_as_the_path_it_is(
    args: list[str], line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli(*args)
    assert_one_line_mistake(result)
    assert result.err.strip() == line
    assert result.out == ""
