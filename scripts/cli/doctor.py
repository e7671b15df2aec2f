"""`fsdp-eks doctor`: what this machine has for planning, rehearsing, deploying and watching a
run, in one go: the tools, their versions, the AWS identity, the selected stack and the
project's environments."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from scripts.cli.support import tools
from scripts.cli.support.tools import INSTALL, ROOT

MIN_PULUMI = (3, 145)
"""The first Pulumi whose Python dynamic providers run in the uv toolchain's environment
(README, "Deploying for real")."""
DEV_VENV = ROOT / ".venv-dev"
DEPLOY_VENV = ROOT / ".venv"


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    needed_for: str


def _version_of(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if done.returncode == 0 and text else None


def _numbers(text: str) -> tuple[int, ...]:
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part) for part in found.groups() if part) if found else ()


def tool_checks() -> list[Check]:
    checks = []
    pulumi = tools.find_tool("pulumi")
    version = _version_of([pulumi, "version"]) if pulumi else None
    ok = version is not None and _numbers(version)[:2] >= MIN_PULUMI
    detail = (f"{version} at {pulumi}" if version else INSTALL["pulumi"]) + (
        "" if ok or not version else f" (needs {MIN_PULUMI[0]}.{MIN_PULUMI[1]} or newer)"
    )
    checks.append(Check("pulumi", ok, detail, "pulumi up / preview, ls, down"))
    uv = tools.find_tool("uv")
    checks.append(
        Check("uv", uv is not None, uv or INSTALL["uv"], "pulumi install (the uv toolchain)")
    )
    aws = tools.find_tool("aws")
    version = _version_of([aws, "--version"]) if aws else None
    ok = version is not None and version.startswith("aws-cli/2")
    detail = (version or INSTALL["aws"]) + ("" if ok or not version else " (needs v2)")
    checks.append(Check("aws", ok, detail, "cluster access (aws eks get-token)"))
    checks.append(kubernetes_client_check())
    kubectl = tools.find_tool("kubectl")
    version = _version_of([kubectl, "version", "--client"]) if kubectl else None
    # Optional: the commands reach clusters through the Python client; kubectl is only what
    # the hints they print (`kubectl describe ...`) are written for.
    detail = version or f"not installed (optional, for the printed hints: {INSTALL['kubectl']})"
    checks.append(Check("kubectl", True, detail, ""))
    return checks


def kubernetes_client_check() -> Check:
    """The Kubernetes Python client every cluster verb goes through (`infra.job.kube_client`)."""
    try:
        from importlib.metadata import version

        found = f"kubernetes {version('kubernetes')} (Python client)"
    except ImportError:
        found = None
    return Check(
        "kubernetes client",
        found is not None,
        found or "missing: `python3 scripts/dev.py setup` (the infra group)",
        "status, logs, stop, start, validate",
    )


def credentials_check() -> Check:
    """Who AWS says we are (STS GetCallerIdentity needs no permission)."""
    try:
        import boto3

        identity = boto3.session.Session().client("sts").get_caller_identity()
    except ModuleNotFoundError:
        return Check("AWS identity", False, "boto3 missing: `python3 scripts/dev.py setup`", "")
    except Exception as error:
        from scripts.cli.support.errors import explain

        line = explain(error) or f"{type(error).__name__}: {error}"
        return Check("AWS identity", False, line, "pulumi up, status, checkpoints")
    return Check("AWS identity", True, str(identity.get("Arn")), "pulumi up, status, checkpoints")


def stack_check() -> Check:
    from scripts.cli.support.pulumi import selected_stack

    name = selected_stack()
    return Check(
        "selected stack",
        name is not None,
        name or "none: `pulumi stack select STACK` (or name the stack in each command)",
        "commands run without a stack",
    )


def environment_checks() -> list[Check]:
    """The project's environments: .venv-dev (`scripts/dev.py`: which groups), .venv (Pulumi's,
    the infra group alone), and the Python running this."""
    # The checkout's own, else the one running this (a second checkout may share it).
    dev_venv = next(
        (v for v in (DEV_VENV, Path(sys.prefix)) if any(v.glob(".installed-*"))), DEV_VENV
    )
    groups = sorted(p.name.removeprefix(".installed-") for p in dev_venv.glob(".installed-*"))
    deploy = (DEPLOY_VENV / "bin" / "python").exists() or (DEPLOY_VENV / "Scripts").exists()
    return [
        Check(
            "python",
            sys.version_info >= (3, 11),
            f"{sys.version.split()[0]} ({sys.executable})",
            "everything",
        ),
        Check(
            ".venv-dev",
            bool(groups),
            f"groups: {', '.join(groups)}" if groups else "missing: `python3 scripts/dev.py setup`",
            "local runs, tests, this command",
        ),
        Check(
            ".venv",
            deploy,
            "present (Pulumi's: the infra group)" if deploy else "missing: `pulumi install`",
            "pulumi up / preview",
        ),
    ]


@click.command()
def doctor() -> int:
    """What this machine has for a run, in one go: Pulumi CLI and its version, uv, the AWS
    CLI v2, the Kubernetes client (kubectl optional), the AWS identity, the selected stack,
    and the project's environments.

    Exit status 0 when everything is there, 1 when something is missing (each line says what
    it is needed for and how to get it).
    """
    checks = [*environment_checks(), *tool_checks(), credentials_check(), stack_check()]
    width = max(len(check.name) for check in checks)
    for check in checks:
        mark = "ok" if check.ok else "--"
        needed = f"  [for {check.needed_for}]" if check.needed_for and not check.ok else ""
        click.echo(f"{mark}  {check.name.ljust(width)}  {check.detail}{needed}")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    click.echo(f"    region from the environment: {region or 'none (each stack sets aws:region)'}")
    return 0 if all(check.ok for check in checks) else 1
