"""The offline plan: every stack prints as a tree with cost and its PyTorchJob, no secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from infra.config.files import SECRET_PLACEHOLDER
from scripts.cli import plan


def test_plan_of_every_stack(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--all", "--verbose"]) == 0
    out = capsys.readouterr().out
    stacks = plan.all_stacks()
    assert out.count("\nPyTorchJob:\n---\n") == len(stacks)
    for path in stacks:
        name = path.name.removeprefix("Pulumi.").removesuffix(".yaml")
        assert f"Stack {name} (stacks/{path.name})" in out
    assert SECRET_PLACEHOLDER not in out
    assert out.count("\nGuardrails:\n  all passed\n") == len(stacks)


def test_plan_of_a_stack_breaking_a_guardrail_names_it_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Valid for the config model (EFA may be turned off by choice), refused by the guardrails.
    stack = tmp_path / "Pulumi.noefa.yaml"
    stack.write_text(
        yaml.safe_dump(
            {"config": {"fsdp-eks:gpuNodes": {"instanceType": "p5.48xlarge", "count": 2,
                                              "efa": False},
                        "fsdp-eks:job": {"maxRunHours": 1},
                        "fsdp-eks:training": {"maxSteps": 50},
                        "fsdp-eks:cost": {"maxUsdPerRun": 1000}}}
        )
    )  # fmt: skip
    assert plan.main([str(stack)]) == 1
    out = capsys.readouterr().out
    assert f"Stack noefa ({stack})" in out
    guardrails = out.split("\nGuardrails:\n", 1)[1].split("\n\n", 1)[0]
    assert "efa-on-efa-instances" in guardrails
    assert "all passed" not in guardrails


def test_the_default_plan_is_the_short_summary_a_reviewer_reads(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan.main(["llama31-8b-p5"]) == 0
    out = capsys.readouterr().out
    summary, guardrails = out.split("\nGuardrails:\n")
    assert "Where:  us-west-2b (gpuNodes.availabilityZone)" in summary
    assert "Memory: fits, ~" in summary and "of 80 GiB per GPU" in summary
    assert "Time:   ~11.5 h (range 9.7-16.2 h)" in summary and "deadline 12 h" in summary
    assert "~$2,563.13 expected (~11.5 h), $2,641.92 per run at most (12 h)" in summary
    assert "a start that never completes $192.64 at most (3 nodes granted of 4" in summary
    assert "Standing: $29.68/day (~$903/month) until `pulumi destroy`: EKS control plane" in (
        summary
    )
    assert guardrails.startswith("  all passed\n")
    assert "apiVersion: kubeflow.org/v1" not in out and "└─" not in out
    assert len(out.splitlines()) < 20


def test_plan_shows_tree_cost_and_the_job_as_applied(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--verbose", "llama31-8b-p5"]) == 0
    out = capsys.readouterr().out
    assert "Cost:   4 x p5.48xlarge (on-demand): $220.16/hour, ~$2,563.13 expected" in out
    assert "Batch:  2 per GPU x 32 GPUs x 4 accumulation = 256 sequences (2,097,152 tokens)" in out
    assert "└─ fsdp-eks:job:TrainingJob job" in out
    assert "kubernetes:kubeflow.org/v1:PyTorchJob job-pytorchjob  name=llama31-8b-p5" in out
    assert "kubernetes:core/v1:Secret job-hf-token  (contents hidden)" in out
    manifest = yaml.safe_load(out.split("\nPyTorchJob:\n---\n", 1)[1])
    assert manifest["kind"] == "PyTorchJob"
    worker = manifest["spec"]["pytorchReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 4  # whole numbers, not the wire format's 4.0
    container = worker["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == 32
    assert "--max_context_width" in container["args"]


def test_the_plan_says_which_az_the_gpu_nodes_get_and_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan.main(["dev"]) == 0
    out = capsys.readouterr().out
    assert "Where:  us-west-2a, the first AZ that offers g5.xlarge" in out


def test_plan_accepts_a_stack_file_path(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main([str(plan.STACKS_DIR / "Pulumi.dev.yaml")]) == 0
    assert "Stack dev (stacks/Pulumi.dev.yaml)" in capsys.readouterr().out


def test_plan_of_a_bad_stack_prints_its_problems_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"config": {"fsdp-eks:gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
                        "fsdp-eks:training": {"contextWidth": 200000}}}
        )
    )  # fmt: skip
    assert plan.main([str(bad)]) == 2
    captured = capsys.readouterr()
    assert "Pulumi.bad.yaml is invalid" in captured.err
    assert "training.contextWidth 200000 is longer than" in captured.err
    # All at once: the rule between sections does not hide what the run plan finds (the
    # default ceiling of $100 for four p5s and no run length).
    assert "cost.maxUsdPerRun 100 needs a run length to check against" in captured.err
    assert "PyTorchJob" not in captured.out


def test_plan_timing_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan.main(["--time", "--repeats", "2", "dev"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("first plan in this process (imports included): ")
    rows = lines[2:]
    assert rows[0] == "| stack | resources | median s | max s |"
    name, resources, median, worst = (cell.strip() for cell in rows[2].strip("|").split("|"))
    assert name == "dev" and int(resources) > 50
    # The budget is 3 s per plan (docs/benchmarks.md); 10x headroom for a loaded CI runner.
    assert float(median) <= float(worst) < 30


def test_an_unknown_stack_is_one_line_listing_the_stacks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert plan.main(["nonexistent"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("plan: no stack file ") and "stacks: dev, " in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
