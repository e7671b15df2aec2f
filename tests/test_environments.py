"""The two environments do not fight: the deploy path's `.venv` holds the infra
group alone, the development environment lives beside it.

`pulumi install` runs `uv sync` for the uv toolchain (pulumi `sdk/python/toolchain/uv.go`,
`InstallDependencies`), and uv's sync is exact by default (it removes packages the selected
groups do not hold: uv docs, "Locking and syncing", exact syncing), so one directory for both
would lose torch and pytest to every `pulumi install`. What `uv sync` installs with no group
flag is the project's `default-groups` (pyproject.toml `[tool.uv]`), which `uv export` with no
group flag resolves the same way from the committed lock.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import yaml

from scripts.dev import VENV

ROOT = Path(__file__).resolve().parent.parent


def _names(requirements: str) -> set[str]:
    return {
        line.split("==")[0].strip().lower()
        for line in requirements.splitlines()
        if line and not line.startswith((" ", "#", "-"))
    }


def test_the_deploy_environment_holds_only_the_infra_group() -> None:
    uv = Path(sys.executable).parent / "uv"
    done = subprocess.run(
        [str(uv), "export", "--frozen", "--no-hashes", "--no-emit-project"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    installed = _names(done.stdout)
    assert {"pulumi", "pulumi-aws", "pulumi-kubernetes", "boto3", "click"} <= installed
    for absent in ("torch", "transformers", "datasets", "pytest", "moto", "ruff", "checkov"):
        assert absent not in installed, absent
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["tool"]["uv"]["default-groups"] == ["infra"]


def test_pulumi_and_dev_py_use_different_directories() -> None:
    project = yaml.safe_load((ROOT / "Pulumi.yaml").read_text())
    pulumi_env = ROOT / project["runtime"]["options"]["virtualenv"]
    pack = yaml.safe_load((ROOT / "infra/policy/PulumiPolicy.yaml").read_text())
    pack_env = (ROOT / "infra/policy" / pack["runtime"]["options"]["virtualenv"]).resolve()
    assert pulumi_env == pack_env == ROOT / ".venv"
    assert pulumi_env != VENV and VENV.parent == ROOT
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert f"{VENV.name}/" in ignored and ".venv/" in ignored
    # The tests run in the development environment, not in Pulumi's.
    assert Path(sys.prefix).resolve() == VENV.resolve()
