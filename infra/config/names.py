"""Stack names and the files that hold them: the one parser of what a user types for a stack.

`dev`, `Pulumi.dev.yaml`, `stacks/Pulumi.dev.yaml` and a path to a stack file elsewhere all
name a stack; the plan, the local run, the command-line tool (its shell completion included)
and the tests resolve them here. Only the standard library: completing a stack name on a
keypress must not import pydantic.
"""

from __future__ import annotations

from pathlib import Path

STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"
PREFIX, SUFFIXES = "Pulumi.", (".yaml", ".yml")


class UnknownStackError(FileNotFoundError):
    """No stack file for a name: the message lists the stacks there are."""


def stack_names(stacks_dir: Path | None = None) -> list[str]:
    """The stacks that have a file under `stacks/`, by name."""
    directory = stacks_dir or STACKS_DIR
    return sorted(stack_name(path) for path in directory.glob(f"{PREFIX}*.yaml"))


def stack_name(stack: str | Path) -> str:
    """`dev`, `Pulumi.dev.yaml` or `.../Pulumi.dev.yaml` → `dev`."""
    name = Path(stack).name
    for suffix in SUFFIXES:
        if name.startswith(PREFIX) and name.endswith(suffix):
            return name.removeprefix(PREFIX).removesuffix(suffix)
    return name


def stack_file_path(stack: str | Path, stacks_dir: Path | None = None) -> Path:
    """The stack file of a name or path; UnknownStackError naming the stacks there are, or,
    for a path (a folder in it, or a YAML file name), naming that path: a path that does not
    exist is not looked up under `stacks/` as a name it never was."""
    candidate = Path(stack)
    directory = stacks_dir or STACKS_DIR
    if candidate.suffix in SUFFIXES and candidate.is_file():
        return candidate
    text = str(stack)
    named = directory / f"{PREFIX}{stack_name(stack)}.yaml"
    has_folder = "/" in text or "\\" in text
    if has_folder or (candidate.suffix in SUFFIXES and not text.startswith(PREFIX)):
        raise UnknownStackError(
            f"no stack file {text}: no such file; a stack is a stack file's path or a "
            f"name under stacks/: {', '.join(stack_names(directory))}"
        )
    if not named.is_file():
        raise UnknownStackError(
            f"no stack {text!r}: no file {named}; stacks: {', '.join(stack_names(directory))}"
        )
    return named
