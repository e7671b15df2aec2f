"""What the Pulumi CLI knows about this project's stacks: which one is selected, which are
deployed, their outputs, their state. The CLI is asked (not the Automation API, which runs it
twice for outputs: `pulumi/automation/_local_workspace.py` `stack_outputs`), from the project
root, so it reads this project's backend and stacks."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from scripts.cli.support import tools
from scripts.cli.support.errors import CommandFailedError
from scripts.cli.support.tools import ROOT, run_tool


def selected_stack() -> str | None:
    """The stack `pulumi stack select` chose, as `pulumi` itself would use it; None without the
    Pulumi CLI or a selection."""
    pulumi = tools.find_tool("pulumi")
    if pulumi is None:
        return None
    done = subprocess.run(
        [pulumi, "stack", "--show-name", "--non-interactive"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    name = done.stdout.strip()
    return name if done.returncode == 0 and name else None


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text or "null")
    except json.JSONDecodeError:
        raise CommandFailedError(f"{what} did not print JSON: {text[:200]!r}") from None


def stack_outputs(stack: str) -> dict[str, Any]:
    """`pulumi stack output --json` of `stack` (secrets stay hidden)."""
    text = run_tool(
        "pulumi",
        "stack",
        "output",
        "--json",
        "--stack",
        stack,
        what=f"pulumi stack output -s {stack}",
    )
    outputs = _json(text, "pulumi stack output")
    if not isinstance(outputs, dict):
        raise CommandFailedError(f"stack {stack!r} outputs are not a JSON object: {text[:200]!r}")
    return outputs


def stack_list() -> dict[str, dict[str, Any]]:
    """This project's stacks as `pulumi stack ls --json` lists them, by their short name.

    Fields (pulumi `pkg/cmd/pulumi/stack/stack_list.go` `stackSummaryJSON`): `name`, `current`,
    `lastUpdate` (absent while an update runs), `updateInProgress`, `resourceCount` (absent or
    0 for a stack never deployed or destroyed), `url`. A Cloud backend qualifies names
    (`org/project/stack`); the last part is the stack file's name.
    """
    entries = _json(run_tool("pulumi", "stack", "ls", "--json", what="pulumi stack ls"), "pulumi")
    if not isinstance(entries, list):
        raise CommandFailedError("pulumi stack ls --json did not print a list")
    return {str(entry.get("name", "")).rsplit("/", 1)[-1]: entry for entry in entries}


def stack_export(stack: str) -> dict[str, Any]:
    """The stack's state (`pulumi stack export`): what `pulumi destroy` would act on."""
    text = run_tool(
        "pulumi", "stack", "export", "--stack", stack, what=f"pulumi stack export -s {stack}"
    )
    state = _json(text, "pulumi stack export")
    if not isinstance(state, dict):
        raise CommandFailedError(f"pulumi stack export -s {stack} did not print a JSON object")
    return state
