"""Every shipped stack registers the resources it registered before: the same URNs.

A URN is the resource's identity in a deployed stack's state: a component type token, a
resource name or a parent that changes under a restructuring makes the next `pulumi up`
delete the resource and create another (a new EKS cluster, an emptied FSx file system). The
golden file (`golden/urns.json`) records them; a deliberate change rewrites it with

    python -m tests.infra.test_urns --update

and the diff in review shows what a deployed stack would replace.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from infra.config import read_stack_file, stack_names
from infra.offline import evaluate
from infra.program import main as program

GOLDEN = Path(__file__).resolve().parent / "golden" / "urns.json"


def registered_urns(stack: str) -> list[str]:
    stack_file = read_stack_file(stack)
    result = evaluate(
        program,
        config=stack_file.config,
        secret_keys=stack_file.secret_keys,
        stack=stack_file.stack_name,
    )
    return sorted(resource.urn for resource in result.resources)


def test_the_golden_file_covers_every_shipped_stack() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == stack_names()


@pytest.mark.parametrize("stack", stack_names())
def test_every_shipped_stack_registers_the_same_urns(stack: str) -> None:
    expected = json.loads(GOLDEN.read_text())[stack]
    registered = registered_urns(stack)
    gone = sorted(set(expected) - set(registered))
    new = sorted(set(registered) - set(expected))
    assert not gone and not new, (
        f"{stack}: a deployed stack would delete {gone} and create {new}; if that is meant, "
        "run `python -m tests.infra.test_urns --update` and say so in the change"
    )


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python -m tests.infra.test_urns --update")
    GOLDEN.write_text(
        json.dumps({stack: registered_urns(stack) for stack in stack_names()}, indent=1) + "\n"
    )
