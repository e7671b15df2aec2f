"""Mistakes in a stack file, written the way people write them: each ends in one line and exit
status 2 that names the file and line or the key, in `fsdp-eks plan` and `fsdp-eks local` alike
(and, where the engine hands the program the values, in the program too)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from infra.config import StackConfigError, parse_stack_config
from tests.cli.conftest import assert_one_line_mistake, run_cli

ROOT = Path(__file__).resolve().parents[2]
DEV = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()


def commands(stack: Path, tmp_path: Path) -> list[list[str]]:
    return [["plan", str(stack)], ["local", str(stack), "--out", str(tmp_path / "out"), "--quiet"]]


def write(tmp_path: Path, text: str, name: str = "mistake") -> Path:
    path = tmp_path / f"Pulumi.{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("command", ["plan", "local"])
def test_a_yaml_syntax_error_names_the_file_line_and_column(
    command: str, tmp_path: Path, no_pulumi: None
) -> None:
    broken = DEV.replace("    maxSteps:", "    maxSteps: [", 1)
    stack = write(tmp_path, broken)
    line = next(i for i, text in enumerate(broken.splitlines(), 1) if "maxSteps: [" in text)
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    result = run_cli(*args)
    assert_one_line_mistake(result, f"{stack}:")
    location = result.err.split(f"{stack}:", 1)[1]
    found_line = int(location.split(":", 1)[0])
    assert line <= found_line <= line + 2, result.err  # where the parser noticed the bracket
    assert "ScannerError" not in result.err and "<unicode string>" not in result.err
    assert not (tmp_path / "out" / "mistake").exists()


@pytest.mark.parametrize("command", ["plan", "local"])
def test_a_tab_gets_its_own_hint(command: str, tmp_path: Path, no_pulumi: None) -> None:
    stack = write(tmp_path, DEV.replace("    maxSteps:", "\tmaxSteps:", 1))
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(run_cli(*args), f"{stack}:", "tab", "spaces")


@pytest.mark.parametrize("command", ["plan", "local"])
def test_a_duplicated_section_is_refused_naming_both_lines(
    command: str, tmp_path: Path, no_pulumi: None
) -> None:
    """A second `fsdp-eks:training:` would replace the first without a word (maxSteps 1000
    became 5000): refused, naming the lines of both."""
    text = DEV + "  fsdp-eks:training:\n    maxSteps: 5000\n"
    stack = write(tmp_path, text)
    first = next(
        i for i, t in enumerate(text.splitlines(), 1) if t.startswith("  fsdp-eks:training")
    )
    second = len(text.splitlines()) - 1
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(
        run_cli(*args),
        f"{stack}:{second}:",
        f"'fsdp-eks:training' is given twice (lines {first} and {second})",
    )


@pytest.mark.parametrize("command", ["plan", "local"])
def test_an_unknown_region_suggests_the_one_meant(
    command: str, tmp_path: Path, no_pulumi: None
) -> None:
    stack = write(tmp_path, DEV + "  aws:region: us-west2\n")
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(
        run_cli(*args), "aws:region 'us-west2' is not an AWS region (did you mean 'us-west-2'?)"
    )


def test_the_offline_plan_follows_the_stacks_region(tmp_path: Path, no_pulumi: None) -> None:
    """An eu-west-1 stack is planned in eu-west-1: its AZs, subnets and ARNs, not us-west-2's."""
    stack = write(tmp_path, DEV + "  aws:region: eu-west-1\n", name="ireland")
    result = run_cli("plan", str(stack), "--verbose")
    assert result.code == 0, result
    assert "Where:  eu-west-1a, the first AZ that offers g5.xlarge" in result.out
    kept = "list prices are kept for us-east-1,"  # the cost line names the priced regions
    assert "us-west-2" not in "\n".join(
        line for line in result.lines if kept not in line and "us-east-2," not in line
    )
    assert "--region eu-west-1" in result.out  # the kubeconfig command among the outputs


@pytest.mark.parametrize("command", ["plan", "local"])
def test_a_key_in_the_wrong_section_names_the_section_it_belongs_to(
    command: str, tmp_path: Path, no_pulumi: None
) -> None:
    document = yaml.safe_load(DEV)
    document["config"]["fsdp-eks:training"]["maxRunHours"] = 3
    stack = write(tmp_path, yaml.safe_dump(document))
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(
        run_cli(*args), "training.maxRunHours", "belongs in another section", "job.maxRunHours"
    )


def test_the_program_refuses_a_region_and_a_misplaced_key_in_the_same_words() -> None:
    """The Pulumi program gets the values from the engine (which parsed the YAML itself) and
    runs the same parser: the region and section mistakes are its one-line errors too."""
    values = {
        "aws:region": "us-west2",
        "fsdp-eks:gpuNodes": {"instanceType": "g5.xlarge", "count": 1},
        "fsdp-eks:training": {"maxRunHours": 3},
    }
    with pytest.raises(StackConfigError) as refused:
        parse_stack_config(values, stack_name="exp")
    problems = refused.value.problems
    assert any("another section" in p and "job.maxRunHours" in p for p in problems), problems
    with pytest.raises(StackConfigError, match="did you mean 'us-west-2'"):
        parse_stack_config({**values, "fsdp-eks:training": {}}, stack_name="exp")


def unreadable(path: Path) -> Path:
    """A stack file this process cannot read: mode 000, or where that does not stop it (root
    reads any file), a name for a file whose read fails (`/proc/self/mem` at offset 0 is
    unmapped: EIO)."""
    path.write_text(DEV)
    path.chmod(0)
    if os.access(path, os.R_OK):
        path.unlink()
        path.symlink_to("/proc/self/mem")
    return path


@pytest.mark.parametrize("command", ["plan", "local"])
@pytest.mark.parametrize("cache", ["off", "on"])
def test_an_unreadable_stack_file_is_one_line_naming_it(
    command: str, cache: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    """With the plan cache on too: the cache's key must not read the file before the stack
    file's own check can say what is wrong with it."""
    if cache == "on":
        monkeypatch.setenv("FSDP_EKS_CACHE", str(tmp_path / "cache"))
    stack = unreadable(tmp_path / "Pulumi.locked.yaml")
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(run_cli(*args), f"{stack}: cannot be read: ")


@pytest.mark.parametrize("command", ["plan", "local"])
def test_a_stack_file_that_is_not_utf8_is_one_line_naming_it(
    command: str, tmp_path: Path, no_pulumi: None
) -> None:
    stack = tmp_path / "Pulumi.latin1.yaml"
    stack.write_bytes(DEV.replace("# ", "# caf\u00e9 ", 1).encode("latin-1"))
    args = next(c for c in commands(stack, tmp_path) if c[0] == command)
    assert_one_line_mistake(run_cli(*args), f"{stack}: not UTF-8 text (byte ", "is 0xe9")
