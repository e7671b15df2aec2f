"""`fsdp-eks`, the one command: every subcommand's help, success paths against the
offline runtime and moto's S3 server, and each user mistake as one line with exit status 2.

Run in-process with Click's test runner (`click.testing.CliRunner`), which swaps stdin/stdout/
stderr and catches the exit status the way a shell sees it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml
from click.testing import CliRunner, Result

from scripts.cli.main import cli
from tests.s3_server import moto_s3_endpoint, s3_environment
from tests.test_ops_scripts import JOB_NAME, NAMESPACE, fake_cli, write_metrics

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["fake_cli"]  # the ops tests' fake kubectl and pulumi, as a fixture here
SUBCOMMANDS = ("plan", "local", "status", "logs", "checkpoints", "validate", "plot", "tensorboard")
RUN = "s3://cli-bucket/checkpoints/exp-1234"


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=True)


def assert_one_line_mistake(result: Result, *fragments: str) -> None:
    """Exit status 2, one line on stderr that says what to do, no traceback."""
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    text = result.stderr.strip()
    assert "Traceback" not in result.output and "Traceback" not in text
    assert len(text.splitlines()) == 1, text
    for fragment in fragments:
        assert fragment in text, text


@pytest.fixture
def no_pulumi(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Pulumi CLI: no selected stack to fall back on (as on a fresh machine)."""
    monkeypatch.setattr("scripts.cli.main.shutil.which", lambda name: None)


def test_the_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"fsdp-eks": "scripts.cli.main:main"}
    installed = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
    }
    assert installed.get("fsdp-eks") == "scripts.cli.main:main"  # dev.py's editable install


def test_the_top_level_help_lists_every_subcommand() -> None:
    result = invoke("--help")
    assert result.exit_code == 0
    for name in SUBCOMMANDS:
        assert f"  {name} " in result.output


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_shows_its_scripts_help(name: str) -> None:
    result = invoke(name, "--help")
    assert result.exit_code == 0, result.output
    assert "usage:" in result.output and "--help" in result.output


def test_plan_of_a_stack_offline(no_pulumi: None) -> None:
    result = invoke("plan", "-s", "dev")
    assert result.exit_code == 0, result.output
    assert "Stack dev (stacks/Pulumi.dev.yaml)" in result.output
    assert "GPUs:" in result.output and "Guardrails:" in result.output


def test_an_unknown_stack_is_one_line_with_the_stacks(no_pulumi: None) -> None:
    assert_one_line_mistake(invoke("plan", "-s", "nope"), "no stack file", "stacks: dev, ")


def test_no_stack_and_none_selected_is_one_line(no_pulumi: None) -> None:
    assert_one_line_mistake(invoke("plan"), "name a stack: fsdp-eks plan -s STACK", "dev")


def test_a_config_in_a_misspelt_namespace_is_refused(tmp_path: Path, no_pulumi: None) -> None:
    stack = tmp_path / "Pulumi.typo.yaml"
    stack.write_text("config:\n  fsdp_eks:gpuNodes:\n    instanceType: g5.xlarge\n")
    result = invoke("local", "-s", str(stack), "--out", str(tmp_path / "out"), "--quiet")
    assert result.exit_code == 2, result.output
    assert "fsdp_eks:gpuNodes is in namespace 'fsdp_eks'" in result.stderr
    assert "Traceback" not in result.stderr


def test_logs_without_kubectl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert_one_line_mistake(
        invoke("logs", "--job", "exp", "-n", "training"),
        "kubectl is not on PATH: install kubectl",
    )


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_no_aws_credentials_is_one_line(no_credentials: None) -> None:
    assert_one_line_mistake(
        invoke("checkpoints", "--s3-uri", RUN, "list"), "no AWS credentials: run `aws configure`"
    )


def test_a_command_whose_dependency_group_is_missing_says_which(
    monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    """`dev.py local` installs the trainer without Pulumi: the plan then needs the infra group."""
    real_import = importlib.import_module

    def without_pulumi(name: str, *args: Any) -> Any:
        if name == "scripts.cli.plan":
            raise ModuleNotFoundError("No module named 'pulumi'", name="pulumi")
        return real_import(name, *args)

    monkeypatch.setattr("scripts.cli.main.importlib.import_module", without_pulumi)
    assert_one_line_mistake(
        invoke("plan", "-s", "dev"), "needs pulumi (the `infra` dependency group)"
    )


def test_debug_shows_the_traceback_instead(no_credentials: None) -> None:
    result = invoke("--debug", "checkpoints", "--s3-uri", RUN, "list")
    assert result.exit_code != 0
    assert type(result.exception).__name__ == "NoCredentialsError"


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_s3_endpoint() as endpoint:
        for key, value in s3_environment(endpoint).items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        client = boto3.client("s3")
        client.create_bucket(Bucket="cli-bucket")
        prefix = RUN.removeprefix("s3://cli-bucket/")
        for key, body in {
            "step-10/COMPLETE": b"{}",
            **{f"step-10/__{rank}_0.distcp": bytes(1000 + rank) for rank in range(12)},
            "tensorboard/events.out.tfevents.1.host": b"e" * 300,
            "tensorboard/events.out.tfevents.2.host": b"f" * 200,
        }.items():
            client.put_object(Bucket="cli-bucket", Key=f"{prefix}/{key}", Body=body)
        yield client


def test_checkpoints_list_and_a_parallel_download(bucket: Any, tmp_path: Path) -> None:
    listed = invoke("checkpoints", "--s3-uri", RUN, "list", "--json")
    assert listed.exit_code == 0, listed.output
    assert [c["name"] for c in json.loads(listed.stdout)] == ["step-10"]
    fetched = invoke("checkpoints", "--s3-uri", RUN, "download", "latest", str(tmp_path))
    assert fetched.exit_code == 0, fetched.output
    assert "step-10: 13 files" in fetched.stdout
    assert (tmp_path / "step-10" / "__11_0.distcp").stat().st_size == 1011


def test_tensorboard_fetches_the_events_and_names_the_missing_server(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fetched = invoke("tensorboard", "--s3-uri", RUN, "--dest", str(tmp_path), "--no-serve")
    assert fetched.exit_code == 0, fetched.output
    assert "2 event files" in fetched.stdout
    assert (tmp_path / "events.out.tfevents.1.host").read_bytes() == b"e" * 300
    monkeypatch.setattr("scripts.cli.tensorboard_events.shutil.which", lambda name: None)
    assert_one_line_mistake(
        invoke("tensorboard", "--s3-uri", RUN, "--dest", str(tmp_path)),
        "tensorboard is not on PATH: install TensorBoard",
    )


def test_status_and_logs_through_the_stack_selected_in_pulumi(
    fake_cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `-s`: the stack `pulumi stack select` chose (the fake CLI answers), as `pulumi` does."""
    monkeypatch.setattr("scripts.cli.main.selected_stack", lambda: "llama3-8b-p5")
    shown = invoke("status")
    assert shown.exit_code == 0, shown.output
    assert f"job {JOB_NAME} ({NAMESPACE}): Running" in shown.stdout
    followed = invoke("logs", "--loss", "--no-follow")
    assert followed.exit_code == 0, followed.output
    assert followed.stdout.count("Loss:") == 2


def test_validate_renders_its_check_jobs_offline(no_pulumi: None) -> None:
    rendered = invoke("validate", "-s", "llama31-8b-p5", "--render-only")
    assert rendered.exit_code == 0, rendered.output
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.stdout) if doc]
    assert "PyTorchJob" in kinds and "Job" in kinds


def test_plot_of_a_local_metrics_file(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(metrics)
    plotted = invoke("plot", str(metrics), "--out", str(tmp_path / "loss.png"))
    assert plotted.exit_code == 0, plotted.output
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
