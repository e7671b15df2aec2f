"""Every `fsdp-eks` command the docs show parses: the subcommand exists and the
script behind it accepts the flags, as the CLI would hand them over, without running it.

Commands come from fenced code blocks and inline code of README.md and docs/*.md; `<stack>`
placeholders become a real stack name, and templates (`<subcommand>`, `...`) are left out.
Parsing stops at the script's own `ArgumentParser.parse_args`: a flag a script does not know
fails there, as it would for a user.
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import scripts.cli.main
from scripts.cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


class ParsedError(Exception):
    """Raised after a script's parser accepted the arguments."""


def documented_commands() -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S)
        lines = [line for block in blocks for line in block.splitlines()]
        lines += re.findall(r"`(fsdp-eks [^`]+)`", text)
        for line in lines:
            command = line.split("  #", 1)[0].split(" # ", 1)[0].split(" > ", 1)[0].strip()
            if command.startswith("fsdp-eks ") and "..." not in command and "<sub" not in command:
                found.append((path.name, command.replace("<stack>", "dev")))
    return sorted(set(found))


COMMANDS = documented_commands()


def test_the_docs_show_every_subcommand() -> None:
    shown = {shlex.split(command)[1] for _, command in COMMANDS}
    assert {"plan", "status", "logs", "checkpoints", "validate", "plot", "tensorboard"} <= shown


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[c for _, c in COMMANDS])
def test_a_documented_command_parses(
    doc: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)
        raise ParsedError

    def run_script(module: str, argv: Any, *, debug: bool) -> None:
        try:
            importlib.import_module(f"scripts.cli.{module}").main(list(argv))
        except ParsedError:
            raise SystemExit(0) from None

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(scripts.cli.main, "run_script", run_script)
    monkeypatch.setattr(scripts.cli.main, "selected_stack", lambda: None)
    result = CliRunner().invoke(cli, shlex.split(command)[1:])
    assert result.exit_code == 0, f"{doc}: {command}\n{result.output}"
