"""The project's two front-door commands, usable on a machine with nothing but Python 3.11+.

    python3 scripts/dev.py local   # the main job: a stack's training run, scaled to this machine
    python3 scripts/dev.py test    # lint, type check and the whole test suite
    python3 scripts/dev.py test --fast   # the same without training runs and tests of seconds

Both first make `.venv-dev/` from the project's own files: pip (new enough for PEP 735
dependency groups) installs the group the command needs, every version pinned by the
constraints that `uv export` derives from the committed `uv.lock`. The install is
skipped when pyproject.toml and uv.lock are unchanged since the last one.

`.venv/` is the deploy path's: `pulumi install` syncs it to the `infra` group alone (uv's sync
is exact: it removes what the group lacks), and the Pulumi program, its dynamic providers and
the policy pack run there (Pulumi.yaml). Two directories, so that neither removes the other's
packages; `test` and `setup` sync `.venv` too, with uv as `pulumi install` would.
Only the standard library is used here, because nothing else exists yet when it runs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-dev"
"""The development environment (trainer, infra, tests), apart from Pulumi's `.venv`."""
DEPLOY_VENV = ROOT / ".venv"
"""Pulumi's environment (Pulumi.yaml `virtualenv`): the infra group alone."""
GROUPS = {
    "local": ("torch (CPU), transformers, datasets, matplotlib and the fsdp-eks command", "2-3"),
    "dev": (
        "the trainer, Pulumi and its AWS/EKS/Kubernetes providers, boto3, the test and lint "
        "tools, and checkov in an environment of its own",
        "4-6",
    ),
}
"""What each group brings, and how long its first install took on 2 CPU cores."""
MIN_PIP = "pip>=25.1"  # first pip with `--group` (PEP 735)
UV = "uv>=0.5"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    """Run a command from the repository root; a failure ends this script with its code."""
    result = subprocess.run([str(c) for c in cmd], cwd=ROOT, env=env, check=False)
    if result.returncode != 0:
        sys.exit(result.returncode)


def lock_digest() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "uv.lock"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def uv_export(python: Path, output: Path, *selection: str) -> None:
    """Write the exact versions uv.lock pins for the selected groups as a pip requirements file."""
    run(
        python,
        "-m",
        "uv",
        "export",
        "--frozen",
        "--quiet",
        *selection,
        "--no-hashes",
        "--no-emit-project",
        "--no-header",
        "--output-file",
        output,
    )


def ensure_venv(group: str) -> Path:
    """Create or refresh .venv-dev so that it holds `group`, pinned to the lock file."""
    python = venv_python()
    if not python.exists():
        print(f"[dev] creating {VENV.relative_to(ROOT)} with {sys.executable}", flush=True)
        venv.create(VENV, with_pip=True)
    stamp = VENV / f".installed-{group}"
    digest = lock_digest()
    if stamp.exists() and stamp.read_text() == digest:
        return python
    what, minutes = GROUPS.get(group, (group, "a few"))
    print(
        f"[dev] installing {what} into {VENV.relative_to(ROOT)} (dependency group '{group}', "
        f"pinned by uv.lock): about {minutes} minutes the first time, quiet until done",
        flush=True,
    )
    run(python, "-m", "pip", "install", "--quiet", MIN_PIP, UV)
    constraints = VENV / "constraints.txt"
    # The group being installed (plus the default infra group), not --all-groups: uv
    # refuses that once pyproject declares conflicting groups (checkov vs infra).
    uv_export(python, constraints, "--group", group)
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--group",
        f"pyproject.toml:{group}",
        "--constraint",
        constraints,
        "--editable",
        ".",
    )
    if group == "dev":
        ensure_checkov_env(python)
    stamp.write_text(digest)
    return python


def ensure_checkov_env(python: Path) -> None:
    """checkov's pins conflict with pulumi's (pyproject.toml, group `checkov`), so it lives in
    its own environment, .venv-dev/checkov, pinned by the same uv.lock; the tests run its binary."""
    env = VENV / "checkov"
    env_python = env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    if not env_python.exists():
        venv.create(env, with_pip=True)
    requirements = VENV / "checkov-requirements.txt"
    uv_export(python, requirements, "--only-group", "checkov")
    run(env_python, "-m", "pip", "install", "--quiet", "--requirement", requirements)


PARALLEL = ["--dist", "loadfile", "--no-loadscope-reorder"]
"""pytest-xdist: each test file on one worker, so that a file's module-scoped runs (the
trainer's reference runs) are made once. Files go out in the order tests/conftest.py gives,
the longest first; xdist's own reorder (by number of tests) sent the few-test torchrun files
last, and one worker ran them alone."""


def worker_count(*, fast: bool) -> str:
    """One pytest-xdist worker per core for the fast tier; one more for the whole suite, whose
    multi-process tests leave cores idle while their processes start, wait and exit. On 2
    cores: the whole suite 9:27 with 3 workers, 10:07 with 2; the fast tier 1:22 with 3,
    about 1:02 with 2 (docs/benchmarks.md "Test suite")."""
    if fast:
        return "auto"
    usable = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    cores = len(usable) if usable else (os.cpu_count() or 1)
    return str(cores + 1)


FAST_TIER = ["-m", "not slow and not long"]
"""`test --fast`: every test but the multi-process runs (`slow`) and the single-process tests of
a second or more (`long`; each module a test imports keeps a fast one), tests/tiers.py."""


BYTECODE_OFF = "PYTHONDONTWRITEBYTECODE"
"""Lifted for the tests: pytest caches its assert-rewritten test modules only where bytecode
may be written (`_pytest/assertion/rewrite.py` `exec_module`: `sys.dont_write_bytecode`).
Without the cache each worker rewrites ~136 test files at every collection: 20 s, not 14."""


def command_test(python: Path, pytest_args: list[str], *, fast: bool = False) -> None:
    run(python, "-m", "ruff", "check", ".")
    run(python, "-m", "ruff", "format", "--check", ".")
    run(python, "-m", "mypy")
    # Arguments that choose the workers themselves (`-n 0` runs serially) replace the default.
    chosen = any(arg.startswith(("-n", "--numprocesses", "no:xdist")) for arg in pytest_args)
    workers = [] if chosen else ["-n", worker_count(fast=fast), *PARALLEL]
    tier = FAST_TIER if fast else []
    env = {k: v for k, v in os.environ.items() if k != BYTECODE_OFF}
    run(python, "-m", "pytest", *workers, *tier, *pytest_args, env=env)


def ensure_deploy_env(python: Path) -> None:
    """Sync Pulumi's `.venv` as `pulumi install` does (uv's exact `uv sync` of the project and
    its default group, infra, into UV_PROJECT_ENVIRONMENT: pulumi `sdk/python/toolchain/uv.go`
    `InstallDependencies`), `--frozen` besides so that the lock is used as committed; the tests
    then start a process the way the engine starts the program's dynamic providers
    (tests/infra/test_engine_layout.py). A no-op when it is in sync already."""
    uv = python.parent / ("uv.exe" if os.name == "nt" else "uv")
    print(f"[dev] syncing {DEPLOY_VENV.relative_to(ROOT)} (the infra group, as pulumi install)")
    run(
        uv,
        "sync",
        "--frozen",
        "--quiet",
        env={**os.environ, "UV_PROJECT_ENVIRONMENT": str(DEPLOY_VENV)},
    )


def command_local(python: Path, local_args: list[str]) -> None:
    """`fsdp-eks local` (the command the install put into the environment)."""
    run(python, "-m", "scripts.cli.main", "local", *local_args)


def main() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - this runs before any venv exists
        sys.exit(f"Python 3.11+ is required, this is {sys.version.split()[0]}")
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("command", choices=["local", "test", "setup"], help="what to run")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="passed on to the command")
    options = parser.parse_args()
    if options.command == "local":
        command_local(ensure_venv("local"), options.args)
    elif options.command == "test":
        python = ensure_venv("dev")
        ensure_deploy_env(python)
        fast = "--fast" in options.args
        command_test(python, [a for a in options.args if a != "--fast"], fast=fast)
    else:
        ensure_deploy_env(ensure_venv("dev"))
        command = VENV.relative_to(ROOT) / "bin" / "fsdp-eks"
        print(
            f"[dev] ready: `source {VENV.relative_to(ROOT)}/bin/activate` puts fsdp-eks on your "
            f"PATH (or type {command}); `fsdp-eks doctor` checks the rest of this machine"
        )


if __name__ == "__main__":
    main()
