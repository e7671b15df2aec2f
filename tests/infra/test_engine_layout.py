"""The project layout a real `pulumi up` needs, by the engine's own rules (no Pulumi CLI here).

The mock runtime never starts a plugin, so these tests port the rules (pulumi/pulumi at
1b5949891b3c) that decide where the dynamic provider runs, which `.venv` it uses and what it
imports, and apply them to this repository (the `main: infra/` failure: pulumi/pulumi#7061).
The four rules, line by line: docs/design/tests.md#test_engine_layout
"""

from __future__ import annotations

import os
import runpy
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest
import yaml

from infra.offline import evaluate

REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_FILE = yaml.safe_load((REPO_ROOT / "Pulumi.yaml").read_text())
RUNTIME_OPTIONS: dict[str, Any] = PROJECT_FILE["runtime"].get("options", {})


def get_pwd_main(root: Path, main: str | None) -> tuple[Path, str]:
    """pulumi `pkg/engine/project.go` getPwdMain: the directory the program and every plugin
    run in, and the entry point the language host is given (`.` for a directory)."""
    if not main:
        return root, "."
    target = Path(os.path.normpath(main if Path(main).is_absolute() else root / main))
    if not target.exists():
        raise FileNotFoundError(f"project 'main' could not be read: {target}")
    if target.is_dir():
        return target, "."
    return target.parent, target.name


def plugin_environment(options: dict[str, Any]) -> dict[str, str]:
    """provider_plugin.go NewProvider: each runtime option `k: v` as PULUMI_RUNTIME_<K>=v."""
    return {f"PULUMI_RUNTIME_{key.upper()}": str(value) for key, value in options.items()}


def launcher_virtualenv(pwd: Path, environment: dict[str, str]) -> Path | None:
    """`pulumi-resource-pulumi-python`: the virtualenv whose python runs the dynamic provider,
    or None where it falls back to `python3` on PATH (no virtualenv, no toolchain)."""
    venv = environment.get("PULUMI_RUNTIME_VIRTUALENV", "")
    if not venv and environment.get("PULUMI_RUNTIME_TOOLCHAIN") == "uv":
        venv = ".venv"
    if not venv:
        return None
    venv = venv.removesuffix("/")  # ${PULUMI_RUNTIME_VIRTUALENV%/}
    return Path(venv) if venv.startswith("/") else pwd / venv  # $PWD/$PULUMI_RUNTIME_VIRTUALENV


def _searchup(start: Path, name: str) -> Path | None:
    """sdk/python/toolchain searchup: the nearest directory at or above `start` holding `name`."""
    for directory in (start, *start.parents):
        if (directory / name).exists():
            return directory
    return None


def uv_virtualenv(
    root: Path, program_dir: Path, options: dict[str, Any], environ: dict[str, str] | None = None
) -> Path:
    """toolchain.go ResolveToolchain + uv.go newUv: the environment the uv toolchain syncs and
    runs the program in (`toolchain: uv`, or auto-detected from a uv.lock above the program).
    Without the `virtualenv` option, an ambient UV_PROJECT_ENVIRONMENT wins (uv.go newUv)."""
    assert options.get("toolchain", "uv") == "uv" and _searchup(program_dir, "uv.lock")
    if virtualenv := options.get("virtualenv"):
        return Path(os.path.normpath(root / virtualenv))  # relative to Root, not the program
    project_dir = (
        _searchup(program_dir, "uv.lock") or _searchup(program_dir, "pyproject.toml") or root
    )
    if ambient := (environ or {}).get("UV_PROJECT_ENVIRONMENT"):
        return Path(ambient) if ambient.startswith("/") else project_dir / ambient
    return project_dir / ".venv"


def test_the_engine_runs_the_root_entry_point_and_starts_plugins_in_the_root() -> None:
    pwd, main = get_pwd_main(REPO_ROOT, PROJECT_FILE.get("main"))
    assert pwd == REPO_ROOT, f"resource plugins would start in {pwd}, not the project root"
    # pulumi-language-python-exec: os.chdir(--pwd), then runpy.run_path(PROGRAM): for "." the
    # directory's __main__.py.
    assert main == "." and (pwd / "__main__.py").is_file()


def test_the_dynamic_provider_launcher_finds_the_environment_uv_creates() -> None:
    pwd, _ = get_pwd_main(REPO_ROOT, PROJECT_FILE.get("main"))
    launched = launcher_virtualenv(pwd, plugin_environment(RUNTIME_OPTIONS))
    synced = uv_virtualenv(REPO_ROOT, pwd, RUNTIME_OPTIONS)
    assert synced == REPO_ROOT / ".venv"
    assert launched == synced, (
        f"the dynamic provider's launcher looks for {launched}, but uv creates {synced}"
    )


def test_an_ambient_uv_project_environment_does_not_split_program_and_provider() -> None:
    """A user with UV_PROJECT_ENVIRONMENT set: the program must still run in the environment
    the dynamic-provider launcher uses ($PWD/.venv), so Pulumi.yaml names it (`virtualenv`)."""
    pwd, _ = get_pwd_main(REPO_ROOT, PROJECT_FILE.get("main"))
    ambient = {"UV_PROJECT_ENVIRONMENT": "/opt/elsewhere"}
    program_env = uv_virtualenv(REPO_ROOT, pwd, RUNTIME_OPTIONS, ambient)
    provider_env = launcher_virtualenv(pwd, plugin_environment(RUNTIME_OPTIONS))
    assert program_env == provider_env == REPO_ROOT / ".venv"


def test_the_policy_pack_runs_in_the_same_environment() -> None:
    """A policy pack is a plugin with its own PulumiPolicy.yaml, run in its own directory
    (pulumi-language-python main.go RunPlugin: `cmd.Dir = req.Info.ProgramDirectory`, line
    1639; plugin.go ExecPlugin passes the pack directory as root and program directory); its
    uv.lock above selects the uv toolchain with its `virtualenv`, taken relative to that root."""
    pack = REPO_ROOT / "infra" / "policy"
    options = yaml.safe_load((pack / "PulumiPolicy.yaml").read_text())["runtime"]["options"]
    assert uv_virtualenv(pack, pack, options) == REPO_ROOT / ".venv"


SERIALIZE = (
    "from pulumi.dynamic.dynamic import serialize_provider\n"
    "from infra.image.build import ImageBuildProvider\n"
    "print(serialize_provider(ImageBuildProvider()))\n"
)
# What pulumi/dynamic/__main__.py get_provider does with the resource's __provider property.
DESERIALIZE = (
    "import base64, sys, dill\n"
    "provider = dill.loads(base64.b64decode(sys.stdin.read()))\n"
    "module = sys.modules[type(provider).__module__]\n"
    "print(type(provider).__module__, type(provider).__qualname__, module.__file__)\n"
)


def provider_process() -> Callable[..., str]:
    """A runner for Python code in the process the engine starts a dynamic provider in: the
    launcher's python, in the directory getPwdMain gives, with the launcher's environment and
    no PYTHONPATH (`-c` puts the working directory first on sys.path, as `-m pulumi.dynamic`).
    Skips when the environment the launcher would use does not exist here."""
    pwd, _ = get_pwd_main(REPO_ROOT, PROJECT_FILE.get("main"))
    environment = plugin_environment(RUNTIME_OPTIONS)
    venv = launcher_virtualenv(pwd, environment)
    assert venv == REPO_ROOT / ".venv", f"the launcher would look for {venv}"
    python = venv / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no environment at {venv}: create it with `uv sync` or scripts/dev.py")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= environment | {"PATH": f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"}

    def run(code: str, stdin: str = "") -> str:
        done = subprocess.run(
            [str(python), "-u", "-c", code],
            cwd=pwd,
            env=env,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    return run


def test_the_provider_process_unpickles_the_image_build_provider() -> None:
    """Both sides as separate processes, started as the engine starts them: the program in the
    directory getPwdMain gives (pulumi-language-python-exec chdirs to --pwd), the provider as
    `provider_process` starts it."""
    run = provider_process()
    payload = run(SERIALIZE)
    module, name, path = run(DESERIALIZE, stdin=payload).split()
    assert (module, name) == ("infra.image.build", "ImageBuildProvider")
    assert Path(path) == REPO_ROOT / "infra" / "image" / "build.py"


def test_the_entry_point_reports_a_bad_stack_as_one_run_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The entry point as the language host runs it (pulumi-language-python-exec: chdir to
    --pwd, `runpy.run_path(PROGRAM, run_name="__main__")`, lines 149 and 188; a RunError is
    logged as its message alone, any other exception with a traceback)."""
    pwd, main = get_pwd_main(REPO_ROOT, PROJECT_FILE.get("main"))
    monkeypatch.chdir(pwd)

    def entry_point() -> None:
        runpy.run_path(main, run_name="__main__")

    good = {
        "gpuNodes": {"instanceType": "p5.48xlarge", "count": 1},
        "job": {"maxRunHours": 1},
        "training": {"maxSteps": 50},
        "storage": {"fsx": {"enabled": False}},
    }
    assert evaluate(entry_point, config=good, stack="exp").of_type(
        "kubernetes:kubeflow.org/v1:PyTorchJob"
    )
    with pytest.raises(pulumi.RunError) as caught:  # every stack must name its gpuNodes
        evaluate(entry_point, config={"job": good["job"]}, stack="exp")
    message = str(caught.value)
    assert message.startswith("stack 'exp': gpuNodes is required and missing"), message
    assert "gpuNodes is required and missing" in message and "Traceback" not in message
