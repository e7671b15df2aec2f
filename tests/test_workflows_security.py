"""The workflows' security: zizmor finds nothing we have not accepted with a reason, every
action is pinned by commit, pull-request previews cannot get deploy rights, and the deploy job
outlives a first `pulumi up`.

zizmor (PyPI `zizmor`, dev group) runs `--offline`: its online audits (impostor commits,
known-vulnerable action versions) need the GitHub API, which the test suite never calls.
Its exit codes (docs/usage.md "Exit codes", zizmorcore/zizmor): 0 no findings, 1 error,
2 bad arguments, 3 no inputs collected, 11-14 findings whose highest severity is
informational/low/medium/high; `--format json` keeps those codes (only SARIF drops them).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = ROOT / ".github/workflows"
ZIZMOR = Path(sys.executable).with_name("zizmor")
FINDINGS_EXIT_CODES = {11, 12, 13, 14}

# (audit, workflow file, job or None for the whole workflow) -> why the finding is accepted.
# Run with the auditor persona (zizmor's most sensitive) so that every accepted point is
# written down here; an entry that no longer matches a finding fails the test too.
ALLOWED: dict[tuple[str, str, str | None], str] = {
    ("concurrency-limits", "deploy.yml", None): (
        "A workflow-level group would cancel a pending deploy when a later push arrives, and "
        "that push may change other stacks: the earlier stack would never be deployed. The "
        "`up` job has its own group per stack with cancel-in-progress false instead, since "
        "cancelling a running `pulumi up` leaves the stack locked and half-applied."
    ),
    ("secrets-outside-env", "preview.yml", "changes"): (
        "Reads PULUMI_ACCESS_TOKEN only to test whether it is set (the job chooses between a "
        "cloud preview and the offline plan); the value goes nowhere else."
    ),
    ("secrets-outside-env", "preview.yml", "preview"): (
        "An environment would change the job's OIDC subject from `repo:OWNER/REPO:pull_request` "
        "to `...:environment:NAME` (GitHub docs, OpenID Connect, 'Filtering for pull_request "
        "events': the pull_request subject is issued only to jobs without an environment), "
        "and the read-only preview role trusts exactly that subject. Its secrets are the Pulumi "
        "token and passphrase, which GitHub withholds from fork PRs."
    ),
}


def run_zizmor(*paths: Path) -> list[dict[str, Any]]:
    """zizmor's findings as JSON, with ignore comments and config files disregarded so that
    ALLOWED is the only place a finding can be accepted."""
    assert ZIZMOR.exists(), f"{ZIZMOR} is missing: run `python3 scripts/dev.py setup`"
    command = [str(ZIZMOR), "--offline", "--no-config", "--no-ignores", "--persona=auditor"]
    result = subprocess.run(
        [*command, "--format=json", *map(str, paths)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode in {0, *FINDINGS_EXIT_CODES}, result.stderr
    findings: list[dict[str, Any]] = json.loads(result.stdout)
    assert bool(findings) == (result.returncode != 0), (result.returncode, findings)
    return findings


def finding_key(finding: dict[str, Any]) -> tuple[str, str, str | None]:
    """(audit, file name, job) of a finding's primary location."""
    primary = next(loc for loc in finding["locations"] if loc["symbolic"]["kind"] == "Primary")
    symbolic = primary["symbolic"]
    path = Path(symbolic["key"]["Local"]["verbatim_path"]).name
    route = [next(iter(part.values())) for part in symbolic["route"]["route"]]
    job = route[1] if len(route) > 1 and route[0] == "jobs" else None
    return finding["ident"], path, job


def describe(finding: dict[str, Any]) -> str:
    primary = finding["locations"][0]
    row = primary["concrete"]["location"]["start_point"]["row"] + 1
    return (
        f"{finding_key(finding)} line {row}: {finding['desc']} "
        f"({primary['symbolic']['annotation']}) {finding['url']}"
    )


def test_zizmor_finds_nothing_outside_the_allow_list() -> None:
    """The workflows and .github/dependabot.yml (zizmor collects both from the folder)."""
    findings = run_zizmor(ROOT / ".github")
    unexpected = [describe(f) for f in findings if finding_key(f) not in ALLOWED]
    assert not unexpected, "\n".join(unexpected)
    stale = set(ALLOWED) - {finding_key(f) for f in findings}
    assert not stale, f"allow-list entries no finding needs any more: {sorted(stale, key=str)}"


def test_every_allowed_finding_says_why() -> None:
    for key, reason in ALLOWED.items():
        assert len(reason.split()) >= 10, key


def test_zizmor_reports_an_action_pinned_by_tag(tmp_path: Path) -> None:
    """The harness sees findings at all: the tests workflow with checkout back on a tag."""
    text = (WORKFLOW_DIR / "tests.yml").read_text()
    pinned = re.search(r"actions/checkout@[0-9a-f]{40} # \S+", text)
    assert pinned is not None
    unpinned = tmp_path / "tests.yml"
    unpinned.write_text(text.replace(pinned.group(0), "actions/checkout@v6"))
    keys = [finding_key(f) for f in run_zizmor(unpinned)]
    assert ("unpinned-uses", "tests.yml", "test") in keys


USES = re.compile(r"^\s*(?:- )?uses:\s*(\S+)(.*)$")
PINNED = re.compile(r"(?P<action>[\w.-]+/[\w./-]+)@(?P<sha>[0-9a-f]{40})")
TAG_COMMENT = re.compile(r"\s+# (?P<tag>v\d+\.\d+\.\d+)\s*$")


def test_every_action_is_pinned_by_commit_with_its_release_tag() -> None:
    """A tag can be moved to other code; a commit cannot. The comment names the release the
    commit was resolved from (`git rev-parse <tag>^{commit}` in the action's repository),
    so that an update is a reviewable diff of both."""
    pins: dict[str, set[tuple[str, str]]] = {}
    for path in sorted(WORKFLOW_DIR.glob("*.yml")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = USES.match(line)
            if not match:
                continue
            where = f"{path.name}:{number}: {line.strip()}"
            pinned, comment = PINNED.fullmatch(match.group(1)), TAG_COMMENT.fullmatch(match[2])
            assert pinned is not None, f"not pinned by a full commit SHA: {where}"
            assert comment is not None, f"no `# vX.Y.Z` release comment: {where}"
            pins.setdefault(pinned["action"], set()).add((pinned["sha"], comment["tag"]))
    assert {"actions/checkout", "pulumi/actions", "aws-actions/configure-aws-credentials"} <= set(
        pins
    )
    mixed = {action: versions for action, versions in pins.items() if len(versions) > 1}
    assert not mixed, f"one action, several pins: {mixed}"


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((WORKFLOW_DIR / name).read_text())
    return document


def role_of(job: dict[str, Any]) -> str:
    (step,) = [
        s
        for s in job["steps"]
        if s.get("uses", "").startswith("aws-actions/configure-aws-credentials@")
    ]
    role: str = step["with"]["role-to-assume"]
    return role


def test_previews_cannot_assume_the_deploy_role() -> None:
    """GitHub's OIDC subject is `repo:OWNER/REPO:pull_request` for a pull-request job without
    an environment and `repo:OWNER/REPO:environment:NAME` for a job with one (GitHub docs,
    "OpenID Connect", filtering for pull_request events / a specific environment). The two
    roles trust those two subjects, so each job must assume its own role variable and the
    preview job must not name an environment."""
    preview = load("preview.yml")["jobs"]
    deploy = load("deploy.yml")["jobs"]
    assert role_of(preview["preview"]) == "${{ vars.AWS_PREVIEW_ROLE_ARN }}"
    assert "environment" not in preview["preview"]
    detect = next(s for s in preview["changes"]["steps"] if s.get("id") == "credentials")
    assert detect["env"]["ROLE_ARN"] == "${{ vars.AWS_PREVIEW_ROLE_ARN }}"
    assert role_of(deploy["up"]) == "${{ vars.AWS_DEPLOY_ROLE_ARN }}"
    assert deploy["up"]["environment"] == "deploy"
    # Only those two jobs may ask for an OIDC token at all, and the deploy role variable
    # appears nowhere but in the protected job.
    with_oidc = {
        (path.name, name)
        for path in sorted(WORKFLOW_DIR.glob("*.yml"))
        for name, job in load(path.name)["jobs"].items()
        if (job.get("permissions") or {}).get("id-token") == "write"
    }
    assert with_oidc == {("preview.yml", "preview"), ("deploy.yml", "up")}
    for path in sorted(WORKFLOW_DIR.glob("*.yml")):
        text = path.read_text()
        assert "vars.AWS_ROLE_ARN" not in text, path.name
        if path.name != "deploy.yml":
            assert "AWS_DEPLOY_ROLE_ARN" not in text, path.name


GITHUB_HOSTED_JOB_LIMIT_MINUTES = 360
"""GitHub terminates a job on a hosted runner after 6 hours (github/docs
content/actions/reference/limits.md, "Job execution time")."""

SETUP_MINUTES = 10
"""Checkout, `uv sync` of the infra group, the Pulumi provider plugins' download."""

EKS_CONTROL_PLANE_MINUTES = 15
NODE_GROUPS_MINUTES = 10
FSX_LUSTRE_MINUTES = 20
"""Typical creation times of the platform's slow resources on a first `up` (estimates; the
program does not bound them itself, the providers' own create timeouts are far longer)."""


def _minutes(pulumi_duration: str) -> int:
    """Minutes in a Pulumi custom-timeout string such as "60m" or "1h"."""
    match = re.fullmatch(r"(\d+)([mh])", pulumi_duration)
    assert match, pulumi_duration
    return int(match[1]) * (60 if match[2] == "h" else 1)


def test_the_deploy_job_outlasts_a_first_up() -> None:
    """Issue 9: a job killed mid-`up` leaves the stack locked with half its resources. The
    job's timeout must cover every wait of a first `up` summed as if none overlapped, and the
    AWS session must last as long (configure-aws-credentials defaults to one hour: its
    src/index.ts DEFAULT_ROLE_DURATION = 3600; STS allows up to 12 hours)."""
    from infra.config import load_stack_file
    from infra.image.build import QUEUE_ALLOWANCE_MINUTES
    from infra.launch.training_job import create_timeout
    from infra.platform.addons import RELEASE_TIMEOUT_SECONDS

    stacks = [load_stack_file(path) for path in sorted((ROOT / "stacks").glob("Pulumi.*.yaml"))]
    build_minutes = max(stack.image.build_timeout_minutes for stack in stacks)
    start_minutes = max(_minutes(create_timeout(s.job.start_timeout_seconds)) for s in stacks)
    platform = (
        EKS_CONTROL_PLANE_MINUTES
        + NODE_GROUPS_MINUTES
        + FSX_LUSTRE_MINUTES
        + RELEASE_TIMEOUT_SECONDS // 60
    )
    image = build_minutes + QUEUE_ALLOWANCE_MINUTES
    first_up = SETUP_MINUTES + platform + image + start_minutes
    up = load("deploy.yml")["jobs"]["up"]
    timeout = up["timeout-minutes"]
    assert first_up < timeout <= GITHUB_HOSTED_JOB_LIMIT_MINUTES, (first_up, timeout)
    (aws,) = [s for s in up["steps"] if s.get("uses", "").startswith("aws-actions/configure-aws-")]
    session = aws["with"]["role-duration-seconds"]
    assert timeout * 60 <= session <= 12 * 3600, (timeout, session)


def test_dependabot_keeps_the_pinned_actions_current() -> None:
    """Pins by commit never move by themselves: Dependabot's github-actions updates move the
    SHA and its tag comment together. check-jsonschema ships Dependabot's schema (offline)."""
    config = ROOT / ".github/dependabot.yml"
    result = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema=vendor.dependabot", config],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    updates = yaml.safe_load(config.read_text())["updates"]
    assert [u["package-ecosystem"] for u in updates] == ["github-actions"]
