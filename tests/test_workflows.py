"""The GitHub workflows: valid against GitHub's schema, and wired the way the README promises
(tests on every PR, preview with OIDC + policy pack per changed stack, the offline plan when
there are no credentials, `pulumi up` on merge for marked stacks). Plus the stack bookkeeping
they call (scripts/tooling/ci_stacks.py), tested against a real git repository.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.tooling import ci_stacks

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((ROOT / ".github/workflows").glob("*.yml"))


def load(name: str) -> dict[str, Any]:
    document = yaml.safe_load((ROOT / ".github/workflows" / name).read_text())
    # PyYAML reads the key `on` as the boolean True (YAML 1.1).
    document["on"] = document.pop(True)
    return document


def steps(workflow: dict[str, Any], job: str) -> list[dict[str, Any]]:
    return workflow["jobs"][job]["steps"]


def step_using(workflow: dict[str, Any], job: str, action: str) -> dict[str, Any]:
    (step,) = [s for s in steps(workflow, job) if s.get("uses", "").startswith(action + "@")]
    return step


def all_steps() -> list[dict[str, Any]]:
    return [
        step
        for path in WORKFLOWS
        for job in yaml.safe_load(path.read_text())["jobs"].values()
        for step in job.get("steps", [])
    ]


def check_schema(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
        + [str(p) for p in paths],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_the_workflows_exist() -> None:
    assert [p.name for p in WORKFLOWS] == ["deploy.yml", "preview.yml", "tests.yml"]


def test_workflows_validate_against_githubs_schema(tmp_path: Path) -> None:
    """check-jsonschema ships the workflow schema, so this runs offline."""
    result = check_schema(*WORKFLOWS)
    assert result.returncode == 0, result.stdout + result.stderr
    broken = tmp_path / "broken.yml"
    broken.write_text(
        (ROOT / ".github/workflows/tests.yml").read_text().replace("runs-on:", "runs_on:")
    )
    assert check_schema(broken).returncode == 1


def _shell(script: str) -> str:
    return re.sub(r"\$\{\{.*?\}\}", "EXPR", script)


def test_every_run_step_is_valid_bash() -> None:
    bash = shutil.which("bash")
    assert bash is not None
    for step in all_steps():
        if "run" in step:
            result = subprocess.run(
                [bash, "-n"], input=_shell(step["run"]), capture_output=True, text=True
            )
            assert result.returncode == 0, (step.get("name"), result.stderr)


def test_no_expression_is_pasted_into_a_shell_script() -> None:
    """Values reach scripts through `env:` only: a stack file name or an input pasted into the
    script text could inject commands (GitHub's script-injection guidance)."""
    for step in all_steps():
        assert "${{" not in step.get("run", ""), step.get("name")


def test_every_script_the_workflows_run_exists() -> None:
    scripts = {
        m for step in all_steps() for m in re.findall(r"scripts/[\w/]+\.py", step.get("run", ""))
    }
    assert {"scripts/dev.py", "scripts/tooling/ci_stacks.py"} <= scripts
    for script in scripts:
        assert (ROOT / script).is_file(), script


def test_pull_requests_run_the_readme_test_command_with_a_cache() -> None:
    workflow = load("tests.yml")
    assert "pull_request" in workflow["on"] and workflow["on"]["push"]["branches"] == ["main"]
    run_steps = [s["run"] for s in steps(workflow, "test") if "run" in s]
    assert run_steps == ["python3 scripts/dev.py test"]
    assert "python3 scripts/dev.py test" in (ROOT / ".ci/run").read_text()
    setup = step_using(workflow, "test", "actions/setup-python")
    assert setup["with"]["cache"] == "pip" and "uv.lock" in setup["with"]["cache-dependency-path"]
    cache = step_using(workflow, "test", "actions/cache")
    assert cache["with"]["path"] == ".venv-dev" and "uv.lock" in cache["with"]["key"]
    assert "steps.python.outputs.python-version" in cache["with"]["key"]


def test_preview_uses_oidc_the_pulumi_action_and_the_policy_pack() -> None:
    workflow = load("preview.yml")
    assert workflow["on"]["pull_request"]["paths"] == ["stacks/Pulumi.*.yaml"]
    job = workflow["jobs"]["preview"]
    assert job["permissions"]["id-token"] == "write"
    assert job["permissions"]["pull-requests"] == "write"
    assert job["strategy"]["matrix"]["include"] == "${{ fromJSON(needs.changes.outputs.stacks) }}"
    aws = step_using(workflow, "preview", "aws-actions/configure-aws-credentials")
    assert aws["with"]["role-to-assume"] == "${{ vars.AWS_PREVIEW_ROLE_ARN }}"
    assert aws["with"]["aws-region"] == "${{ matrix.region }}"
    pulumi = step_using(workflow, "preview", "pulumi/actions")
    assert pulumi["with"]["command"] == "preview"
    assert pulumi["with"]["diff"] is True and pulumi["with"]["comment-on-pr"] is True
    assert pulumi["with"]["policyPacks"] == "infra/policy"
    assert pulumi["with"]["policyPackConfigs"].endswith("policy-config.json")
    assert pulumi["with"]["cloud-url"] == "${{ vars.PULUMI_BACKEND_URL }}"
    assert job["env"]["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    order = [s.get("name") or s["uses"].split("@")[0] for s in steps(workflow, "preview")]
    assert order.index("Python environment") < order.index("pulumi/actions")
    assert order.index("Policy pack config from the stack file") < order.index("pulumi/actions")


def test_without_credentials_the_offline_plan_runs_instead() -> None:
    workflow = load("preview.yml")
    preview_if = workflow["jobs"]["preview"]["if"]
    offline_if = workflow["jobs"]["offline-plan"]["if"]
    assert "needs.changes.outputs.credentials == 'true'" in preview_if
    assert "needs.changes.outputs.credentials != 'true'" in offline_if
    assert "id-token" not in workflow["jobs"]["offline-plan"]["permissions"]
    detect = next(s for s in steps(workflow, "changes") if s.get("id") == "credentials")
    # Forks: the head repository differs and secrets are empty, so no credentials.
    assert "head.repo.full_name == github.repository" in detect["env"]["SAME_REPO"]
    plan = next(s for s in steps(workflow, "offline-plan") if s.get("id") == "plan")
    assert plan["env"]["STACK"] == "${{ matrix.stack }}"
    assert 'uv run --frozen fsdp-eks plan "$STACK"' in plan["run"]
    assert 'scripts/tooling/ci_stacks.py guardrails "$STACK"' in plan["run"]
    assert "GITHUB_STEP_SUMMARY" in plan["run"]
    last = steps(workflow, "offline-plan")[-1]
    assert last["if"] == "steps.plan.outputs.status != '0'" and "exit 1" in last["run"]


def test_credentials_detection_script_decides_as_documented(tmp_path: Path) -> None:
    workflow = load("preview.yml")
    detect = next(s for s in steps(workflow, "changes") if s.get("id") == "credentials")
    bash = shutil.which("bash")
    assert bash is not None

    def available(**env: str) -> str:
        output = tmp_path / "out"
        output.write_text("")
        base = {"ROLE_ARN": "", "PULUMI_ACCESS_TOKEN": "", "BACKEND_URL": "", "SAME_REPO": ""}
        subprocess.run(
            [bash, "-c", detect["run"]],
            env={**base, **env, "GITHUB_OUTPUT": str(output), "PATH": "/usr/bin:/bin"},
            check=True,
            capture_output=True,
        )
        return output.read_text().strip()

    role = "arn:aws:iam::123456789012:role/ci"
    assert available(SAME_REPO="true", ROLE_ARN=role, PULUMI_ACCESS_TOKEN="t") == "available=true"
    assert available(SAME_REPO="true", ROLE_ARN=role, BACKEND_URL="s3://b") == "available=true"
    assert available(SAME_REPO="false", ROLE_ARN=role, PULUMI_ACCESS_TOKEN="t") == (
        "available=false"
    )
    assert available(SAME_REPO="true", PULUMI_ACCESS_TOKEN="t") == "available=false"
    assert available(SAME_REPO="true", ROLE_ARN=role) == "available=false"


def test_merges_deploy_only_marked_stacks_or_a_named_one() -> None:
    workflow = load("deploy.yml")
    assert workflow["on"]["push"]["branches"] == ["main"]
    assert workflow["on"]["workflow_dispatch"]["inputs"]["stack"]["required"] is True
    select = steps(workflow, "select")[-1]["run"]
    assert "ci_stacks.py deploy" in select and "ci_stacks.py matrix" in select
    up = workflow["jobs"]["up"]
    assert up["environment"] == "deploy" and up["permissions"]["id-token"] == "write"
    assert up["concurrency"]["cancel-in-progress"] is False
    pulumi = step_using(workflow, "up", "pulumi/actions")
    assert pulumi["with"]["command"] == "up"
    assert pulumi["with"]["policyPacks"] == "infra/policy"


# --- scripts/tooling/ci_stacks.py
# ---------------------------------------------------------------------


def write_stack(directory: Path, name: str, region: str | None = "us-east-2") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "fsdp-eks:gpuNodes": {"instanceType": "g5.8xlarge", "count": 2},
        "fsdp-eks:job": {"maxRunHours": 4},
        "fsdp-eks:cost": {"maxUsdPerRun": 50},
        "fsdp-eks:model": {"preset": "llama3.2-1b", "numLayers": 2},  # fits an A10G's 24 GiB
    }
    if region:
        config["aws:region"] = region
    path = directory / f"Pulumi.{name}.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def test_stack_names_come_from_stack_file_paths_only() -> None:
    assert ci_stacks.stack_of("stacks/Pulumi.llama3-8b-p5.yaml") == "llama3-8b-p5"
    assert ci_stacks.stack_of("stacks/Pulumi.dev.yml") == "dev"
    assert ci_stacks.stack_of("stacks/auto-deploy.txt") is None
    assert ci_stacks.stack_of("Pulumi.yaml") is None
    assert ci_stacks.stack_of("infra/stacks/Pulumi.dev.yaml") is None


def test_changed_stacks_skips_deleted_files_and_sorts(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    write_stack(stacks, "b")
    write_stack(stacks, "a")
    paths = ["stacks/Pulumi.b.yaml", "stacks/Pulumi.a.yaml", "stacks/Pulumi.gone.yaml", "x.py"]
    assert ci_stacks.changed_stacks(paths, stacks) == ["a", "b"]


def test_matrix_entries_carry_file_and_region(tmp_path: Path) -> None:
    stacks = tmp_path / "stacks"
    write_stack(stacks, "east", "us-east-1")
    write_stack(stacks, "plain", None)
    assert ci_stacks.matrix(["east", "plain"], stacks) == [
        {"stack": "east", "file": "stacks/Pulumi.east.yaml", "region": "us-east-1"},
        {"stack": "plain", "file": "stacks/Pulumi.plain.yaml", "region": "us-west-2"},
    ]


def test_auto_deploy_file_parsing(tmp_path: Path) -> None:
    marker = tmp_path / "auto-deploy.txt"
    assert ci_stacks.marked_for_deploy(marker) == []
    marker.write_text("# header\nllama3-8b-p5  # nightly\n\n dev \n")
    assert ci_stacks.marked_for_deploy(marker) == ["llama3-8b-p5", "dev"]
    marker.write_text("rm -rf /\n")
    with pytest.raises(ValueError, match="'rm -rf /' is not a stack name"):
        ci_stacks.marked_for_deploy(marker)


def test_the_committed_auto_deploy_file_names_existing_stacks() -> None:
    for stack in ci_stacks.marked_for_deploy():
        assert ci_stacks.stack_file(stack).exists(), stack


def git(repo: Path, *args: str) -> str:
    result = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout.strip()


def test_changed_files_against_a_real_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_stack(repo / "stacks", "old")
    (repo / "README.md").write_text("x\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "pr")
    write_stack(repo / "stacks", "new")
    (repo / "stacks/Pulumi.old.yaml").unlink()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    head = git(repo, "rev-parse", "HEAD")
    assert ci_stacks.changed_files(base, head, repo) == ["stacks/Pulumi.new.yaml"]
    # A push that created the branch: everything in it is new.
    assert ci_stacks.changed_files("0" * 40, head, repo) == ["README.md", "stacks/Pulumi.new.yaml"]


def test_policy_config_command_prints_the_pack_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_stack(tmp_path, "exp")
    assert ci_stacks.main(["policy-config", str(path)]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["cost-ceiling"]["maxUsdPerRun"] == 50
    assert config["cost-ceiling"]["instanceType"] == "g5.8xlarge"


def test_matrix_command_rejects_unknown_stacks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as error:
        ci_stacks.main(["matrix", "no-such-stack"])
    assert error.value.code == 2
    assert "no stack file for no-such-stack" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("plan_rc", "guardrails_rc", "status"), [(0, 0, "0"), (1, 0, "1"), (0, 1, "1")]
)
def test_offline_plan_step_reports_both_results_and_fails_on_either(
    tmp_path: Path, plan_rc: int, guardrails_rc: int, status: str
) -> None:
    """The step's shell, run with a stand-in `uv` that plays the plan and the guardrails."""
    workflow = load("preview.yml")
    step = next(s for s in steps(workflow, "offline-plan") if s.get("id") == "plan")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(
        "#!/bin/sh\n"
        'case "$*" in\n'
        f'  *"fsdp-eks plan"*) echo "PLAN OF $5"; exit {plan_rc};;\n'
        f'  *guardrails*) echo "GUARDRAILS OF $6"; exit {guardrails_rc};;\n'
        "esac\n"
        "exit 99\n"
    )
    uv.chmod(0o755)
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run(
        [bash, "-e", "-c", step["run"]],
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "STACK": "exp",
            "RUNNER_TEMP": str(tmp_path),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_OUTPUT": str(output),
        },
        check=True,
    )
    assert output.read_text() == f"status={status}\n"
    text = summary.read_text()
    assert "### Offline plan: `exp`" in text
    assert "PLAN OF exp" in text and "GUARDRAILS OF exp" in text
