"""What the plan says, tried as a new user would (issue 28 items 11 and 13): a setting the
program would drop, time or bill wrongly is said, in the plan's own lines, as typed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import Ran, assert_one_line_mistake, run_cli

ROOT = Path(__file__).resolve().parents[2]
DEV = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()


def write(tmp_path: Path, text: str, name: str = "exp") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(text)
    return path


def plan(stack: Path) -> Ran:
    return run_cli("plan", "--no-cache", str(stack))


def plan_line(result: Ran, label: str) -> str:
    """The summary line that starts with `label` (e.g. `Time:`), stripped."""
    return next(line.strip() for line in result.lines if line.strip().startswith(label))


def warnings_of(result: Ran) -> list[str]:
    return [line.strip() for line in result.lines if line.strip().startswith("Warning: ")]


@pytest.mark.parametrize("namespace", ["fsdp", "fsdp:eks", "training"])
def test_a_section_in_a_namespace_nothing_reads_is_an_error(
    namespace: str, tmp_path: Path, no_pulumi: None
) -> None:
    """`fsdp:training:` is too far from `fsdp-eks` to look misspelt, yet no provider reads it:
    the plan showed the defaults (5000 steps) without a word."""
    text = DEV.replace("  fsdp-eks:training:", f"  {namespace}:training:", 1)
    stack = write(tmp_path, text)
    result = plan(stack)
    assert_one_line_mistake(
        result,
        f"{namespace}:training is in namespace {namespace!r}, which the program does not read",
        "allowed: fsdp-eks:training",
    )
    assert result.out == ""


def test_provider_sections_stay_the_providers(tmp_path: Path, no_pulumi: None) -> None:
    """`kubernetes:cluster` is the Kubernetes provider's own key, not a misspelt section."""
    stack = write(tmp_path, DEV + "  kubernetes:cluster: some-context\n")
    assert plan(stack).code == 0
