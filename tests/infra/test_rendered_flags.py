"""Every shipped stack renders the trainer command and run id it rendered before.

The run id is a hash of the rendered trainer flags (`infra.job.flags.run_id`): a change in
how a flag is rendered makes the next `pulumi up` start a fresh run instead of resuming, and
a change in the arguments' order updates the deployed PyTorchJob. The golden file
(`golden/rendered_flags.json`) records them; a deliberate change rewrites it with

    python -m tests.infra.test_rendered_flags --update
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.config import stack_names
from infra.job.flags import run_id, run_paths, torchrun_command
from infra.job.stack_checks import plan_stack_file

GOLDEN = Path(__file__).resolve().parent / "golden" / "rendered_flags.json"


def rendered(stack: str) -> dict[str, Any]:
    plan = plan_stack_file(stack)
    return {"run_id": run_id(plan), "command": torchrun_command(plan, run_paths(plan))}


def test_the_golden_file_covers_every_shipped_stack() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == stack_names()


@pytest.mark.parametrize("stack", stack_names())
def test_every_shipped_stack_renders_the_same_command_and_run_id(stack: str) -> None:
    assert rendered(stack) == json.loads(GOLDEN.read_text())[stack], (
        f"{stack}: the rendered trainer command or run id changed (a deployed run would start "
        "again); if that is meant, run `python -m tests.infra.test_rendered_flags --update`"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.infra.test_rendered_flags --update")
    GOLDEN.write_text(
        json.dumps({stack: rendered(stack) for stack in stack_names()}, indent=1) + "\n"
    )
