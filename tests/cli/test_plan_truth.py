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


def test_fp32_is_timed_at_the_fp32_peak(tmp_path: Path, no_pulumi: None) -> None:
    """`bf16: false` was timed and priced at the A10G's 70 TFLOP/s bf16 peak; fp32 matmuls run
    on CUDA cores at 31.2 (infra/facts/instances.py GPU_PEAK_FP32_FLOPS)."""
    bf16 = plan(write(tmp_path, DEV, "bf16"))
    fp32 = plan(
        write(
            tmp_path, DEV.replace("    warmup: 20\n", "    warmup: 20\n    bf16: false\n"), "fp32"
        )
    )
    assert bf16.code == fp32.code == 0, fp32
    assert "(bf16, assumed" in plan_line(bf16, "Time:") and "of 70 TFLOP/s" in plan_line(
        bf16, "Time:"
    )
    time = plan_line(fp32, "Time:")
    assert "(fp32, assumed" in time and "of 31.2 TFLOP/s" in time, time
    assert "fp32 matmuls" in plan_line(fp32, "Model:")


def test_gpus_left_idle_on_a_node_are_said_with_the_bill(tmp_path: Path, no_pulumi: None) -> None:
    text = (
        DEV.replace("instanceType: g5.xlarge", "instanceType: g5.48xlarge")
        .replace("    maxRunHours: 2\n", "    maxRunHours: 2\n    gpusPerNode: 3\n")
        .replace("maxUsdPerRun: 5", "maxUsdPerRun: 50")
    )
    result = plan(write(tmp_path, text))
    assert result.code == 0, result
    assert "-> 3 trainer processes" in plan_line(result, "Nodes:")
    assert (
        "Warning: job.gpusPerNode 3 runs 3 trainer processes on each g5.48xlarge, which has 8 "
        "GPUs: every node bills all 8 ($16.29/hour a node, $16.29/hour for 1 node, as the cost "
        "line shows) while 5 per node sit idle; leave job.gpusPerNode out to use them all, or "
        "choose a gpuNodes.instanceType with 3 GPUs"
    ) in warnings_of(result)


@pytest.mark.parametrize("every", [200, 500])
def test_a_checkpoint_cadence_beyond_the_last_step_is_said(
    every: int, tmp_path: Path, no_pulumi: None
) -> None:
    text = DEV.replace("checkpointEvery: 50", f"checkpointEvery: {every}")
    result = plan(write(tmp_path, text))
    assert result.code == 0, result
    assert plan_line(result, "Saves:").startswith("Saves:  S3 (")
    assert (
        f"Warning: training.checkpointEvery {every} is not below training.maxSteps 200: the run "
        "saves only at its end (step 200), so a stop or a failure before then starts it again "
        "from step 0; set training.checkpointEvery below 200 (0 says 'only at the end' on "
        "purpose, without this warning)"
    ) in warnings_of(result)
    quiet = plan(write(tmp_path, DEV.replace("checkpointEvery: 50", "checkpointEvery: 0"), "zero"))
    assert not [w for w in warnings_of(quiet) if "checkpointEvery" in w]
