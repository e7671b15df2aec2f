"""The programs the commands run (pulumi, kubectl, aws, tensorboard), found where the user's
environment put them: beside the running interpreter first (a virtual environment's `bin/`,
where `.venv-dev/bin/tensorboard` lives even when that environment is not activated), then
PATH."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from scripts.cli.support.errors import ToolFailedError, ToolMissingError

ROOT = Path(__file__).resolve().parents[3]

INSTALL = {
    "pulumi": "install the Pulumi CLI (https://www.pulumi.com/docs/install/)",
    "kubectl": "install kubectl (https://kubernetes.io/docs/tasks/tools/)",
    "aws": "install the AWS CLI v2 (https://docs.aws.amazon.com/cli/)",
    "tensorboard": "run `python3 scripts/dev.py setup`, whose .venv-dev has TensorBoard",
    "uv": "run `python3 scripts/dev.py setup` (it installs uv into .venv-dev)",
}


def find_tool(name: str) -> str | None:
    """The program's path: beside `sys.executable`, else on PATH; None when neither has it."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name)


def require_tool(name: str) -> str:
    found = find_tool(name)
    if found is None:
        raise ToolMissingError(f"{name} is not installed: {INSTALL.get(name, 'install it')}")
    return found


def run_tool(
    name: str,
    *args: str,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    what: str | None = None,
) -> str:
    """Run `name args...` and return its stdout; a failure is one line with its last error."""
    command: Sequence[str] = [require_tool(name), *args]
    done = subprocess.run(
        command, cwd=cwd, env=env, input=stdin, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"exit status {done.returncode}"
        label = what or " ".join([name, *args[:1]])
        raise ToolFailedError(f"{label} failed: {reason}")
    return done.stdout
