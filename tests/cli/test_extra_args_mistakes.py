"""`training.extraArgs` mistakes through `fsdp-eks plan`, as a user makes them (issue 28 item 12):
one line naming the key, the value and what is allowed, exit status 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.conftest import assert_one_line_mistake, run_cli

ROOT = Path(__file__).resolve().parents[2]
DEV = (ROOT / "stacks" / "Pulumi.dev.yaml").read_text()


def planned_with(tmp_path: Path, extra_args: str) -> Path:
    path = tmp_path / "Pulumi.mistake.yaml"
    path.write_text(
        DEV.replace("    maxSteps: 200\n", f"    maxSteps: 200\n    extraArgs: {extra_args}\n")
    )
    return path


def test_a_word_for_a_number_names_the_key_the_value_and_the_type(
    tmp_path: Path, no_pulumi: None
) -> None:
    result = run_cli("plan", str(planned_with(tmp_path, "{loss_chunk_tokens: lots}")))
    assert_one_line_mistake(
        result, "training.extraArgs.loss_chunk_tokens 'lots'", "allowed: an integer"
    )
    assert "unexpected" not in result.err


@pytest.mark.parametrize(
    ("extra_args", "fragments"),
    [
        ("{lr: 0.1}", ("training.extraArgs.lr is set from its own stack key", "training.lr")),
        ("{max_steps: 9}", ("training.extraArgs.max_steps", "allowed: training.maxSteps")),
        ("{preflight: warn}", ("training.extraArgs.preflight", "allowed: job.preflight")),
        # No stack key: the program renders it from the instance type, which a message must say.
        ("{expect_gpu: H100}",
         ("training.extraArgs.expect_gpu is no setting", "from gpuNodes.instanceType")),
        ("{device: tpu}", ("training.extraArgs.device 'tpu'", "allowed: auto, cuda, cpu")),
        ("{cpu_offload_now: 1}", ("training.extraArgs.cpu_offload_now is not a trainer flag",)),
    ],
)  # fmt: skip
def test_extra_args_that_another_key_sets_name_that_key(
    extra_args: str, fragments: tuple[str, ...], tmp_path: Path, no_pulumi: None
) -> None:
    result = run_cli("plan", str(planned_with(tmp_path, extra_args)))
    assert_one_line_mistake(result, *fragments)
    if "expect_gpu" in extra_args:
        assert "its own stack key" not in result.err


def test_a_stack_value_the_trainer_refuses_is_named_by_its_key(
    tmp_path: Path, no_pulumi: None
) -> None:
    """The trainer's own rule, run on the rendered command (no extraArgs at all)."""
    path = tmp_path / "Pulumi.mistake.yaml"
    path.write_text(DEV.replace("    maxSteps: 200\n", "    maxSteps: 200\n    minLr: 0.5\n"))
    assert_one_line_mistake(
        run_cli("plan", str(path)),
        "training.minLr 0.5: the trainer refuses it: --min_lr must be in [0, --lr=",
        "(--lr is training.lr)",
    )
