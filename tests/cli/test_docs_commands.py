"""Every `fsdp-eks` command the docs show works as shown: the ones that run offline are run (a
plan, the trainer's flags, the offline cluster-check manifests, a local loss plot, the stack
list, the doctor; the local rehearsal by tests/test_local_run.py), the ones that need a
deployed stack are parsed by the command itself, up to where it would reach AWS or a cluster.

Commands come from fenced code blocks and inline code of README.md and docs/*.md; `<stack>`
placeholders become a real stack name, and templates (`<command>`, `...`) are left out.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

from scripts.cli.local import DEFAULT_OUT, DEFAULT_STACK
from scripts.cli.main import COMMANDS as VERBS
from scripts.cli.main import cli
from scripts.cli.support.local_topology import local_metrics_file
from tests.cli.conftest import run_cli, write_metrics
from tests.test_local_run import DOCUMENTED_LOCAL_RUN

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
OFFLINE = {"plan", "local", "trainer-flags", "validate", "plot", "ls", "doctor"}
"""Verbs that can run here: no AWS account, no cluster (validate with --render-only only)."""
NO_STACK = {"ls", "doctor", "trainer-flags"}
"""Verbs that need no stack: shown bare, they are still a command line."""
SAME_RUN = {"fsdp-eks local": f"fsdp-eks local {DEFAULT_STACK}"}
"""Commands that are another command's run exactly (the default stack named): run once."""


def documented_commands() -> list[tuple[str, str]]:
    """(the docs that show it, the command), once per distinct command."""
    found: list[tuple[str, str]] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, flags=re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        lines += re.findall(r"`(fsdp-eks [^`]+)`", text)
        for line in lines:
            command = line.split("  #", 1)[0].split(" # ", 1)[0].split(" > ", 1)[0].strip()
            command = command.removeprefix("$ ")
            command = command.replace("<stack>", "dev").replace("STACK", "dev")
            if command.startswith("fsdp-eks ") and "..." not in command and "<" not in command:
                found.append((path.name, command))
    shown_in: dict[str, set[str]] = {}
    for doc, command in found:
        shown_in.setdefault(SAME_RUN.get(command, command), set()).add(doc)
    return sorted((", ".join(sorted(docs)), command) for command, docs in shown_in.items())


COMMANDS = documented_commands()


def test_the_docs_show_every_command() -> None:
    shown = {shlex.split(command)[1] for _, command in COMMANDS}
    assert set(VERBS) <= shown, set(VERBS) - shown


def runs_offline(command: str) -> bool:
    """Whether the command can run here: validate only with --render-only, plot only of a
    local metrics file (of a deployed stack it reads S3)."""
    words = shlex.split(command)
    if "--help" in words or "-h" in words:
        return True
    if len(words) == 2 and words[1] not in NO_STACK:
        return False  # the command's name in a sentence, not a command line
    if words[1] == "validate":
        return "--render-only" in words
    if words[1] == "plot":
        return any(word.endswith(".jsonl") for word in words)
    return words[1] in OFFLINE


def trains(command: str) -> bool:
    """A documented `fsdp-eks local` trains for real: tests/test_local_run.py runs it."""
    return shlex.split(command)[1] == "local"


def test_the_documented_local_run_is_the_one_the_local_run_test_trains() -> None:
    """Trained once, by the test that also interrupts, resumes and plots it (the full tier):
    a second `fsdp-eks local` this reader finds needs its own run there."""
    shown = [command for _, command in COMMANDS if trains(command)]
    assert [shlex.split(command)[1:] for command in shown] == [list(DOCUMENTED_LOCAL_RUN)]


@pytest.mark.parametrize(
    ("doc", "command"),
    [pytest.param(d, c, id=c) for d, c in COMMANDS if runs_offline(c) and not trains(c)],
)
def test_a_documented_offline_command_runs(
    doc: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    words = shlex.split(command)[1:]
    if words[0] == "plan" and "--repeats" in words:  # the same table, timed once per stack
        words[words.index("--repeats") + 1] = "1"
    if words[0] == "plot":  # the file a local run writes, where the docs say it is
        monkeypatch.chdir(tmp_path)
        metrics = next((Path(w) for w in words[1:] if w.endswith(".jsonl")), None)
        if metrics is not None:
            if metrics.parts[0] == DEFAULT_OUT.name:  # a local run's: where local writes it
                stack = metrics.parts[1]
                expected = local_metrics_file(DEFAULT_OUT, stack).relative_to(DEFAULT_OUT.parent)
                assert metrics == expected, f"{doc}: {command}: local writes {expected}"
            (tmp_path / metrics).parent.mkdir(parents=True, exist_ok=True)
            write_metrics(tmp_path / metrics)
    result = run_cli(*words)
    # doctor exits 1 here (no Pulumi CLI, no credentials): it ran and said so line by line.
    allowed = {0, 1} if words[0] == "doctor" else {0}
    assert result.code in allowed, f"{doc}: {command}\n{result.out[-2000:]}\n{result.err[-2000:]}"


@pytest.mark.parametrize(
    ("doc", "command"),
    [c for c in COMMANDS if not runs_offline(c[1])],
    ids=[c for _, c in COMMANDS if not runs_offline(c)],
)
def test_a_documented_command_that_needs_a_deployment_parses(doc: str, command: str) -> None:
    """Click parses the whole command line (every option and argument the docs show) without
    running the command's body."""
    verb, *rest = shlex.split(command)[1:]
    with click.Context(cli, info_name="fsdp-eks") as parent:
        sub = cli.get_command(parent, verb)
        assert isinstance(sub, click.Command), f"{doc}: {command}: no command {verb!r}"
        sub.make_context(verb, list(rest), parent=parent)
