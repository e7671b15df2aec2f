"""`fsdp-eks plan`: every stack as a summary (or a tree) with cost and its PyTorchJob, no
secrets; the guardrails' verdict; a bad stack as its problems, exit 2."""

from __future__ import annotations

from pathlib import Path

import yaml

from infra.config import load_stack_file, stack_names
from infra.config.files import SECRET_PLACEHOLDER
from tests.cli.conftest import assert_one_line_mistake, run_cli

STACKS = Path(__file__).resolve().parents[2] / "stacks"


def test_plan_of_every_stack(no_pulumi: None) -> None:
    result = run_cli("plan", "--all", "--verbose")
    assert result.code == 0, result
    out = result.out
    apis = [load_stack_file(name).job.api for name in stack_names()]
    assert out.count("\nPyTorchJob:\n---\n") == apis.count("pytorchjob")
    assert out.count("\nTrainingRuntime:\n---\n") == apis.count("trainjob") >= 1
    assert out.count("\nTrainJob:\n---\n") == apis.count("trainjob")
    for name in stack_names():
        assert f"Stack {name} (stacks/Pulumi.{name}.yaml)" in out
    assert SECRET_PLACEHOLDER not in out
    assert out.count("\nGuardrails:\n  all passed\n") == len(stack_names())


def test_plan_of_a_stack_breaking_a_guardrail_names_it_and_fails(tmp_path: Path) -> None:
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
    result = run_cli("plan", str(stack))
    assert result.code == 1, result
    assert f"Stack noefa ({stack})" in result.out
    guardrails = result.out.split("\nGuardrails:\n", 1)[1].split("\n\n", 1)[0]
    assert "efa-on-efa-instances" in guardrails
    assert "all passed" not in guardrails


def test_the_default_plan_is_the_short_summary_a_reviewer_reads() -> None:
    result = run_cli("plan", "llama31-8b-p5")
    assert result.code == 0, result
    summary, guardrails = result.out.split("\nGuardrails:\n")
    assert "Where:  us-west-2b (gpuNodes.availabilityZone)" in summary
    assert "Memory: fits, ~" in summary and "of 80 GiB per GPU" in summary
    assert "Time:   ~11.2 h (range 9.4-16.0 h)" in summary and "deadline 12 h" in summary
    flat = " ".join(line.strip() for line in summary.splitlines())  # wrapped lines joined
    assert (
        "expected ~$2,466.09 for the run (~11.2 h) + ~$36.69 for the ~10 min the nodes idle "
        "before scale-down = ~$2,502.78 at most $2,641.92 per run (12 h)"
    ) in flat
    assert "a start that never completes $192.64 at most (3 nodes granted of 4" in flat
    assert "Standing: $30.64/day (~$932/month) until `pulumi destroy`; list prices, us-west-2" in (
        summary
    )
    assert "Metrics: on (auto: under 1% of the GPU cost) -> Amazon Managed Service" in summary
    assert (
        "Grafana: in-cluster 12.3.1 (`fsdp-eks dashboard --open`); auto: a created cluster, "
        "metrics in AMP\n"
    ) in summary
    assert guardrails.startswith("  all passed\n")
    assert "apiVersion: kubeflow.org/v1" not in result.out and "└─" not in result.out
    assert len(result.lines) < 38
    assert max(len(line) for line in result.lines if "Warning:" not in line) < 220


def test_the_plan_of_a_trainjob_stack_says_how_the_job_is_submitted() -> None:
    result = run_cli("plan", "llama32-1b-g5-trainjob")
    assert result.code == 0, result
    [where] = [line for line in result.lines if line.startswith("  Where:")]
    assert where.endswith("cluster mode create; submitted as a TrainJob (Kubeflow Trainer v2)")
    assert result.out.rstrip().endswith("`--verbose` lists them, the outputs and the TrainJob)")
    assert "  Queue:  queued: Kueue (installed by this stack)" in result.out
    assert "deprecated" not in result.out  # Kueue keeps its TrainJob integration
    assert len(result.lines) < 48  # the short plan plus the queue's lines


def test_plan_shows_tree_cost_and_the_job_as_applied() -> None:
    out = run_cli("plan", "--verbose", "llama31-8b-p5").out
    assert "Cost:   4 x p5.48xlarge (on-demand): $220.16/hour; On-Demand list price" in out
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


def test_the_plan_says_which_az_the_gpu_nodes_get_and_why() -> None:
    out = run_cli("plan", "dev").out
    assert "Where:  us-west-2a, the first AZ that offers g5.xlarge" in out


def test_plan_accepts_a_stack_file_path() -> None:
    result = run_cli("plan", str(STACKS / "Pulumi.dev.yaml"))
    assert "Stack dev (stacks/Pulumi.dev.yaml)" in result.out


def test_plan_of_a_bad_stack_prints_its_problem_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"config": {"fsdp-eks:gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
                        "fsdp-eks:model": {"preset": "llama2-7b"},
                        "fsdp-eks:training": {"contextWidth": 8192},
                        "fsdp-eks:cost": {"maxUsdPerRun": None}}}
        )
    )  # fmt: skip
    result = run_cli("plan", str(bad))
    assert_one_line_mistake(result, f"{bad}: training.contextWidth 8192 is longer than")
    assert "PyTorchJob" not in result.out


def test_plan_of_a_stack_with_several_problems_lists_them_all(tmp_path: Path) -> None:
    """A rule between sections does not hide what the run plan finds: here the 200k-token
    context the model does not have, the memory it would need, and the default ceiling of
    $100 that four p5s cannot be checked against without a run length."""
    bad = tmp_path / "Pulumi.bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {"config": {"fsdp-eks:gpuNodes": {"instanceType": "p5.48xlarge", "count": 4},
                        "fsdp-eks:training": {"contextWidth": 200000}}}
        )
    )  # fmt: skip
    result = run_cli("plan", str(bad))
    assert result.code == 2, result
    assert f"{bad} is invalid (3 problems):" in result.err
    for problem in (
        "training.contextWidth 200000 is longer than",
        "the run needs ~",
        "cost.maxUsdPerRun 100 needs a run length to check against",
    ):
        assert f"  - {problem}" in result.err, result.err
    assert "PyTorchJob" not in result.out


def test_plan_timing_table() -> None:
    result = run_cli("plan", "--time", "--repeats", "2", "dev")
    assert result.code == 0, result
    rows = result.lines
    assert rows[0] == "| stack | resources | median s | max s |"
    name, resources, median, worst = (cell.strip() for cell in rows[2].strip("|").split("|"))
    assert name == "dev" and int(resources) > 50
    assert float(median) <= float(worst)
