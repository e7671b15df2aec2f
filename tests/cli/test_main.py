"""`fsdp-eks`, the one command: every command's help, success paths against the offline runtime
and moto's S3 server, and each user mistake as one line with exit status 2, run through the
console script's own entry point as a user types it (and a few through the installed script
itself, in a subprocess)."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from scripts.cli.main import COMMANDS
from tests.cli.conftest import (
    JOB_NAME,
    NAMESPACE,
    assert_one_line_failure,
    assert_one_line_mistake,
    calls,
    run_cli,
    set_answers,
    write_metrics,
)
from tests.infra.kube_fake import ClusterApiServer, user_kubeconfig
from tests.s3_server import moto_server_endpoint, s3_environment

ROOT = Path(__file__).resolve().parents[2]
RUN = "s3://cli-bucket/checkpoints/exp-1234"


def test_the_console_script_is_declared() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {"fsdp-eks": "scripts.cli.main:main"}
    installed = {
        ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
    }
    assert installed.get("fsdp-eks") == "scripts.cli.main:main"  # dev.py's editable install


def test_the_top_level_help_lists_every_command() -> None:
    result = run_cli("--help")
    assert result.code == 0
    for name in COMMANDS:
        assert f"  {name} " in result.out


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_shows_its_own_help(name: str) -> None:
    """Usage lines and examples say `fsdp-eks <verb>`, never a script path."""
    result = run_cli(name, "--help")
    assert result.code == 0, result
    assert result.out.startswith(f"Usage: fsdp-eks {name} "), result.out
    assert "python scripts" not in result.out and "scripts/" not in result.out
    examples = [line.strip() for line in result.out.splitlines() if "fsdp-eks " in line]
    assert all(line.startswith(("Usage: fsdp-eks", "fsdp-eks")) for line in examples), examples


def test_plan_takes_the_stack_positionally_or_with_s_and_several(no_pulumi: None) -> None:
    by_name = run_cli("plan", "dev")
    assert by_name.code == 0, by_name
    assert "Stack dev (stacks/Pulumi.dev.yaml)" in by_name.out
    assert "GPUs:" in by_name.out and "Guardrails:" in by_name.out
    both = run_cli("plan", "-s", "dev", "-s", "team-cluster")
    assert both.code == 0, both
    assert "Stack dev " in both.out and "Stack team-cluster " in both.out  # not only the last


def test_plan_all_plans_every_stack(no_pulumi: None) -> None:
    from infra.config import stack_names

    result = run_cli("plan", "--all")
    assert result.code == 0, result
    for name in stack_names():
        assert f"Stack {name} (stacks/Pulumi.{name}.yaml)" in result.out


def test_the_programs_warnings_are_labelled_lines_in_the_plan(no_pulumi: None) -> None:
    """What `pulumi.log.warn` says during the evaluation is a `Warning:` line of the plan, and
    nothing unlabelled reaches the terminal before it."""
    result = run_cli("plan", "llama32-1b-g5")
    assert result.code == 0, result
    assert result.err == ""
    warnings = [line for line in result.lines if "cluster.adminRoleArn is not set" in line]
    assert len(warnings) == 1 and warnings[0].startswith("  Warning: cluster.adminRoleArn")


def test_an_unknown_stack_is_one_line_with_the_stacks(no_pulumi: None) -> None:
    assert_one_line_mistake(run_cli("plan", "nope"), "no stack 'nope'", "stacks: dev, ")


def test_no_stack_and_none_selected_is_one_line(no_pulumi: None) -> None:
    assert_one_line_mistake(run_cli("plan"), "name a stack (stacks: dev, ", "pulumi stack select")


def test_a_command_of_one_stack_refuses_two(no_pulumi: None) -> None:
    assert_one_line_mistake(run_cli("validate", "dev", "-s", "team-cluster"), "takes one stack")


def test_a_command_of_one_stack_refuses_s_given_twice(no_pulumi: None) -> None:
    """`-s` twice is two stacks, never the last one silently (as click keeps a plain option)."""
    assert_one_line_mistake(
        run_cli("status", "-s", "dev", "-s", "team-cluster"),
        "takes one stack, got 2: dev, team-cluster",
    )


def test_an_unknown_flag_is_one_line_naming_it() -> None:
    assert_one_line_mistake(run_cli("plan", "dev", "--colour"), "--colour", "fsdp-eks plan --help")


def test_a_config_in_a_misspelt_namespace_is_refused(tmp_path: Path, no_pulumi: None) -> None:
    stack = tmp_path / "Pulumi.typo.yaml"
    stack.write_text("config:\n  fsdp_eks:gpuNodes:\n    instanceType: g5.xlarge\n")
    result = run_cli("local", str(stack), "--out", str(tmp_path / "out"), "--quiet")
    assert result.code == 2, result
    assert "fsdp_eks:gpuNodes is in namespace 'fsdp_eks'" in result.err
    assert "Traceback" not in result.err


def test_logs_need_no_kubectl(monkeypatch: pytest.MonkeyPatch, cluster: ClusterApiServer) -> None:
    """The commands reach the cluster through the Python client: no kubectl installed is
    fine (it only appears in the hints they print)."""
    monkeypatch.setattr("scripts.cli.support.tools.find_tool", lambda name: None)
    shown = run_cli("logs", "--job", JOB_NAME, "-n", NAMESPACE, "--context", "lab", "--no-follow")
    assert shown.code == 0, shown
    assert shown.out.count("Loss:") == 2


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")


def test_no_aws_credentials_is_one_line(no_credentials: None, no_pulumi: None) -> None:
    assert_one_line_mistake(
        run_cli("checkpoints", "--s3-uri", RUN), "no AWS credentials: run `aws configure`"
    )


def test_aws_out_of_reach_is_a_failure_not_a_mistake(
    monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    """Nothing answers at the endpoint (botocore's EndpointConnectionError, a BotoCoreError):
    one line, exit 1; missing credentials stay a mistake (exit 2, above)."""
    for key, value in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "testing",
                       "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                       "AWS_MAX_ATTEMPTS": "1"}.items():  # fmt: skip
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    assert_one_line_failure(run_cli("checkpoints", "--s3-uri", RUN), "AWS could not be reached")


def test_an_aws_refusal_is_a_failure(bucket: Any, no_pulumi: None) -> None:
    """AWS answered with an error (a ClientError: no such bucket here, AccessDenied alike)."""
    assert_one_line_failure(
        run_cli("checkpoints", "--s3-uri", "s3://no-such-bucket/run"), "AWS refused: NoSuchBucket"
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
        run_cli("plan", "dev"),
        "needs pulumi (the `infra` dependency group)",
        "python3 scripts/dev.py setup",
    )


def test_debug_shows_the_traceback_instead(no_credentials: None, no_pulumi: None) -> None:
    with pytest.raises(Exception) as raised:
        run_cli("--debug", "checkpoints", "--s3-uri", RUN)
    assert type(raised.value).__name__ == "NoCredentialsError"


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with moto_server_endpoint() as endpoint:
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


def test_checkpoints_list_and_a_parallel_download(
    bucket: Any, tmp_path: Path, no_pulumi: None
) -> None:
    listed = run_cli("checkpoints", "--s3-uri", RUN, "--json")
    assert listed.code == 0, listed
    assert [c["name"] for c in json.loads(listed.out)] == ["step-10"]
    fetched = run_cli("checkpoints", "--s3-uri", RUN, "--download", "latest", "--to", str(tmp_path))
    assert fetched.code == 0, fetched
    assert "step-10: 13 files" in fetched.out
    assert (tmp_path / "step-10" / "__11_0.distcp").stat().st_size == 1011


def test_tensorboard_fetches_the_events_and_names_the_missing_server(
    bucket: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_pulumi: None
) -> None:
    fetched = run_cli("tensorboard", "--s3-uri", RUN, "--dest", str(tmp_path), "--no-serve")
    assert fetched.code == 0, fetched
    assert "2 event files" in fetched.out
    assert (tmp_path / "events.out.tfevents.1.host").read_bytes() == b"e" * 300
    assert_one_line_mistake(
        run_cli("tensorboard", "--s3-uri", RUN, "--dest", str(tmp_path)),
        "tensorboard is not installed",
    )


def test_tools_beside_the_interpreter_are_found_before_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`.venv-dev/bin/tensorboard` is found by `.venv-dev/bin/fsdp-eks` without activating the
    environment (PATH without it)."""
    from scripts.cli.support.tools import find_tool

    monkeypatch.setenv("PATH", str(tmp_path))
    beside = Path(sys.executable).parent / "tensorboard"
    assert beside.exists(), "the dev environment installs TensorBoard"
    assert find_tool("tensorboard") == str(beside)


def test_status_and_logs_through_the_stack_selected_in_pulumi(
    fake_cli: Path, cluster: ClusterApiServer
) -> None:
    """No stack: the one `pulumi stack select` chose (the stand-in answers), as `pulumi` does."""
    set_answers(fake_cli, selected="llama31-8b-p5")
    shown = run_cli("status", "--context", "lab")
    assert shown.code == 0, shown
    assert f"job {JOB_NAME} ({NAMESPACE}): Running" in shown.out
    followed = run_cli("logs", "--loss", "--no-follow", "--context", "lab")
    assert followed.code == 0, followed
    assert followed.out.count("Loss:") == 2
    # The stand-in knows only the selected stack, as Pulumi would: the outputs read are its.
    set_answers(fake_cli, deployed=["llama31-8b-p5"])
    assert run_cli("status", "--context", "lab").code == 0
    other = run_cli("status", "llama32-1b-g5", "--context", "lab")
    assert other.code == 1 and other.out == "", other
    assert "no stack named 'llama32-1b-g5' found" in other.err
    assert ["pulumi", "stack", "output", "--json", "--stack", "llama32-1b-g5"] in [
        call[:6] for call in calls(fake_cli)
    ], calls(fake_cli)


def test_validate_renders_its_check_jobs_offline(no_pulumi: None) -> None:
    rendered = run_cli("validate", "llama31-8b-p5", "--render-only")
    assert rendered.code == 0, rendered
    kinds = [doc["kind"] for doc in yaml.safe_load_all(rendered.out) if doc]
    assert "PyTorchJob" in kinds and "Job" in kinds


def test_validate_reaches_the_stacks_cluster_and_its_failure_is_one_line(
    fake_cli: Path, cluster: ClusterApiServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """validate goes through the one cluster client (`--context` here; the stack's own
    kubeconfig otherwise, as the other commands), and a cluster out of reach is one line,
    exit 1 (a failure, not the user's mistake)."""
    set_answers(fake_cli, outputs={"jobName": JOB_NAME, "image": "img@sha256:0"})
    cluster.nodes = []
    checked = run_cli("validate", "llama31-8b-p5", "--context", "lab", "--skip", "nccl",
                      "--skip", "nvidia-smi")  # fmt: skip
    assert checked.code == 1, checked  # no GPU node is ready: the node check fails
    assert "FAIL  nodes" in checked.out
    last = cluster.requests[-1]
    assert (last.method, last.path, last.query) == (
        "GET", "/api/v1/nodes", {"labelSelector": "node.kubernetes.io/instance-type=p5.48xlarge"}
    )  # fmt: skip
    closed = user_kubeconfig(tmp_path / "closed.yaml", "http://127.0.0.1:9")
    monkeypatch.setenv("KUBECONFIG", str(closed))
    assert_one_line_failure(
        run_cli("validate", "llama31-8b-p5", "--context", "lab", "--skip", "nccl",
                "--skip", "nvidia-smi"),
        "list nodes: no answer from the Kubernetes API server http://127.0.0.1:9",
    )  # fmt: skip


def test_validate_reports_a_check_pod_without_a_log_instead_of_stopping(
    fake_cli: Path, cluster: ClusterApiServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A check pod that never started has no log (the API server answers 400 BadRequest): the
    check fails in the report, the other results are still shown, and validate exits 1
    (checks failed); what it applied is deleted."""
    set_answers(fake_cli, outputs={"jobName": JOB_NAME, "image": "img@sha256:0"})
    cluster.outcomes["Job"] = "Failed"
    checked = run_cli("validate", "llama31-8b-p5", "--context", "lab", "--skip", "nccl",
                      "--skip", "nodes", "--timeout", "5")  # fmt: skip
    assert checked.code == 1, checked
    assert "FAIL  nvidia-smi" in checked.out
    assert "ended Failed" in checked.out
    warned = [r.getMessage() for r in caplog.records if r.getMessage().startswith("no log from")]
    applied = [r for r in cluster.requests if r.method == "PATCH"]
    check_pods = [
        p for p in cluster.pods if p not in (f"{JOB_NAME}-worker-0", f"{JOB_NAME}-worker-1")
    ]
    assert len(warned) == len(check_pods) > 0 and "waiting to start" in warned[0], warned
    assert all(r.query["fieldManager"] == "fsdp-eks-validate" for r in applied)
    deleted = [r.path for r in cluster.requests if r.method == "DELETE"]
    assert sorted(deleted) == sorted(r.path for r in applied) and not cluster.objects


def test_plot_of_a_local_metrics_file(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    write_metrics(metrics)
    plotted = run_cli("plot", str(metrics), "--out", str(tmp_path / "loss.png"))
    assert plotted.code == 0, plotted
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trainer_flags_lists_the_trainers_flags_and_names_a_typo() -> None:
    listed = run_cli("trainer-flags")
    assert listed.code == 0 and "--loss_chunk_tokens" in listed.out
    one = run_cli("trainer-flags", "loss_chunk_tokens", "activation_checkpointing")
    assert one.code == 0, one
    assert one.out.startswith("--loss_chunk_tokens\n")  # no stack key renders it
    assert "--activation_checkpointing {off,full,op,selective} (set by stack key " in one.out
    assert "training.activationCheckpointing)" in one.out
    assert_one_line_mistake(
        run_cli("trainer-flags", "loss_chunk_token"), "did you mean loss_chunk_tokens"
    )
    dashed = run_cli("trainer-flags", "--lr")  # as the flag is written in training.extraArgs
    assert dashed.code == 0 and dashed.out.startswith("--lr (set by stack key training.lr)")
    assert "--expect_gpu (rendered from gpuNodes.instanceType: its GPU model)" in listed.out
    assert_one_line_mistake(run_cli("trainer-flags", "--lrr"), "not a trainer flag: lrr")
    assert listed.out.startswith("usage: torchrun [...] -m trainer ")  # not `python -m trainer`


def test_the_installed_script_as_a_user_types_it() -> None:
    """The console script itself, in a process of its own: exit status and every line."""
    script = Path(sys.executable).parent / "fsdp-eks"
    done = subprocess.run(
        [str(script), "plan", "nope"], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "fsdp-eks plan: no stack 'nope': no file "
        f"{ROOT / 'stacks' / 'Pulumi.nope.yaml'}; stacks: dev, llama2-7b-p4d, llama31-8b-p5, "
        "llama32-1b-g5, llama32-1b-g5-trainjob, mixtral-8x7b-p5, team-cluster, "
        "team-cluster-queued"
    ]


def test_shell_completion_offers_the_stacks_as_the_readme_sets_it_up() -> None:
    """`eval "$(_FSDP_EKS_COMPLETE=bash_source fsdp-eks)"` makes bash call the script with
    `bash_complete` and the words typed so far (click's `BashComplete`)."""
    script = Path(sys.executable).parent / "fsdp-eks"
    env = {**os.environ, "_FSDP_EKS_COMPLETE": "bash_complete", "COMP_CWORD": "2"}
    typed = {
        "fsdp-eks plan llama3": [
            "plain,llama31-8b-p5", "plain,llama32-1b-g5", "plain,llama32-1b-g5-trainjob"
        ],
        "fsdp-eks stop -s te": ["plain,team-cluster", "plain,team-cluster-queued"],
    }  # fmt: skip
    for words, offered in typed.items():
        env["COMP_WORDS"] = words
        env["COMP_CWORD"] = str(len(words.split()) - 1)
        done = subprocess.run(
            [str(script)], capture_output=True, text=True, check=False, cwd=ROOT, env=env
        )
        assert (done.returncode, done.stdout.splitlines(), done.stderr) == (0, offered, ""), words


def test_a_machine_without_the_pulumi_cli_is_told_how_to_get_it(tmp_path: Path) -> None:
    """The console script with a PATH that has no `pulumi` (nor does the venv): one line."""
    script = Path(sys.executable).parent / "fsdp-eks"
    assert not (script.parent / "pulumi").exists()
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty folder: no tool at all
    done = subprocess.run(
        [str(script), "down", "dev"], capture_output=True, text=True, check=False, cwd=ROOT, env=env
    )
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("fsdp-eks down: pulumi is not installed: "), line
