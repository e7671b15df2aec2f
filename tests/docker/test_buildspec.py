"""docker/buildspec.yml: valid for the parts of CodeBuild's format we use, and wired to infra."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
import yaml

from infra.image.trainer_image import BUILD_ENVIRONMENT_KEYS, PROJECT_ENVIRONMENT_KEYS
from tests.crd_schemas import validate as validate_against_schema

REPO = Path(__file__).resolve().parents[2]
BUILDSPEC = REPO / "docker" / "buildspec.yml"

_PHASE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["commands"],
    "properties": {
        "run-as": {"type": "string"},
        "on-failure": {"enum": ["ABORT", "CONTINUE"]},
        "runtime-versions": {"type": "object"},
        "commands": {"type": "array", "minItems": 1, "items": {"type": "string", "minLength": 1}},
        "finally": {"type": "array", "items": {"type": "string", "minLength": 1}},
    },
}
SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "CodeBuild buildspec 0.2 (the subset this project uses)",
    "type": "object",
    "additionalProperties": False,
    "required": ["version", "phases"],
    "properties": {
        "version": {"const": 0.2},
        "run-as": {"type": "string"},
        "env": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "shell": {"enum": ["bash", "/bin/sh"]},
                "variables": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "propertyNames": {"pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                },
                "exported-variables": {
                    "type": "array",
                    "uniqueItems": True,
                    "items": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                },
            },
        },
        "phases": {
            "type": "object",
            "additionalProperties": False,
            "minProperties": 1,
            "properties": {
                name: _PHASE for name in ("install", "pre_build", "build", "post_build")
            },
        },
    },
}

CODEBUILD_PROVIDED = {"AWS_REGION", "CODEBUILD_BUILD_SUCCEEDING", "BASH_REMATCH"}


def load() -> dict[str, Any]:
    data = yaml.safe_load(BUILDSPEC.read_text())
    assert isinstance(data, dict)
    return data


def commands(spec: dict[str, Any]) -> list[str]:
    return [c for phase in spec["phases"].values() for c in phase["commands"]]


def test_buildspec_matches_the_schema() -> None:
    validate_against_schema(load(), SCHEMA)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda s: s.update(version=0.1),
        lambda s: s["phases"]["build"].pop("commands"),
        lambda s: s["phases"].update(bild={"commands": ["true"]}),
        lambda s: s["env"].update({"exported-variables": ["IMAGE-DIGEST"]}),
        lambda s: s["env"]["variables"].update(DOCKER_BUILDKIT=1),
        lambda s: s["phases"]["build"].update({"on-failure": "IGNORE"}),
    ],
)
def test_schema_rejects_what_codebuild_would(mutate: Any) -> None:
    spec = copy.deepcopy(load())
    mutate(spec)
    with pytest.raises(jsonschema.ValidationError):
        validate_against_schema(spec, SCHEMA)


def test_every_command_is_valid_bash() -> None:
    for command in commands(load()):
        result = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert result.returncode == 0, f"{command!r}: {result.stderr}"


def test_every_variable_read_is_set_somewhere() -> None:
    spec = load()
    text = "\n".join(commands(spec))
    read = set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", text))
    assigned = set(re.findall(r"^\s*([A-Z_][A-Z0-9_]*)=", text, flags=re.MULTILINE))
    defined = (
        assigned
        | set(spec["env"]["variables"])
        | set(PROJECT_ENVIRONMENT_KEYS)
        | set(BUILD_ENVIRONMENT_KEYS)
        | CODEBUILD_PROVIDED
    )
    assert read - defined == set()
    # ...and every variable infra sets is used.
    assert set(PROJECT_ENVIRONMENT_KEYS) | set(BUILD_ENVIRONMENT_KEYS) <= read


def test_exported_digest_is_assigned_after_the_push() -> None:
    spec = load()
    assert spec["env"]["exported-variables"] == ["IMAGE_DIGEST", "IMAGE_URI"]
    post = "\n".join(spec["phases"]["post_build"]["commands"])
    assert re.search(r"^\s*IMAGE_DIGEST=", post, flags=re.MULTILINE)
    assert 'IMAGE_URI="${REPOSITORY_URI}@${IMAGE_DIGEST}"' in post


def test_build_uses_the_inline_cache_then_smoke_tests_then_pushes() -> None:
    """The daemon's own BuildKit (docker driver) exports only inline cache, so the image
    carries it and is also tagged CACHE_TAG, which the next build imports."""
    spec = load()
    build = spec["phases"]["build"]["commands"]
    joined = "\n".join(build)
    assert "--builder default" in joined
    assert '--cache-from "type=registry,ref=${REPOSITORY_URI}:${CACHE_TAG}"' in joined
    assert '--cache-to "type=inline"' in joined
    assert '--tag "${REPOSITORY_URI}:${CACHE_TAG}"' in joined
    assert "--file docker/Dockerfile" in joined
    order = [
        next(i for i, c in enumerate(build) if needle in c)
        for needle in (
            "docker buildx build",
            "smoke_test.py",
            'docker push "${REPOSITORY_URI}:${IMAGE_TAG}"',
            'docker push "${REPOSITORY_URI}:${CACHE_TAG}"',
        )
    ]
    assert order == sorted(order)
    # A cache tag that cannot be written must not fail the build.
    cache_push = next(c for c in build if 'docker push "${REPOSITORY_URI}:${CACHE_TAG}"' in c)
    assert "||" in cache_push
    smoke = next(c for c in build if "smoke_test.py" in c)
    assert '--level "${SMOKE_TEST_LEVEL}" --image' in smoke
    assert all(p.get("on-failure") == "ABORT" for p in spec["phases"].values())


def test_ecr_login_precedes_the_build() -> None:
    pre_build = "\n".join(load()["phases"]["pre_build"]["commands"])
    assert "aws ecr get-login-password" in pre_build
    assert 'docker login --username AWS --password-stdin "${REGISTRY}"' in pre_build


def test_build_tools_fetched_at_build_time_are_pinned() -> None:
    variables = load()["env"]["variables"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+", variables["BUILDX_FALLBACK_VERSION"])
    joined = "\n".join(commands(load()))
    # No builder container (its BuildKit image would come from Docker Hub).
    assert "docker buildx create" not in joined
