"""The image build pulls nothing from Docker Hub.

CodeBuild runs from shared AWS addresses, and anonymous Docker Hub pulls from them hit
`toomanyrequests`: the build fails and with it `pulumi up`. Every image the
build can pull is collected here from docker/buildspec.yml and docker/Dockerfile, `${VAR}`s
resolved with the values infra sets, and resolved the way Docker resolves a name: a first path
component without '.' or ':' that is not `localhost` is not a registry, so the name is on
Docker Hub (github.com/distribution/reference, normalize.go `splitDockerDomain`).
Implicit pulls count too: a `# syntax=` directive pulls its frontend image, and a buildx
`docker-container`/`kubernetes` builder without `image=` runs `moby/buildkit:buildx-stable-1`
(docker/buildx driver/bkimage/bkimage.go `DefaultImage`).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

from infra.config.image import DEFAULT_BASE_IMAGE
from infra.image.trainer_image import CACHE_TAG
from tests.docker.test_dockerfile import instructions

REPO = Path(__file__).resolve().parents[2]
BUILDSPEC = REPO / "docker" / "buildspec.yml"
DOCKERFILE = REPO / "docker" / "Dockerfile"

DOCKER_HUB_HOSTS = {"docker.io", "index.docker.io", "registry-1.docker.io"}
BUILDX_DEFAULT_BUILDKIT_IMAGE = "moby/buildkit:buildx-stable-1"

PROJECT_VALUES = {
    # What infra/image/trainer_image.py sets on the CodeBuild project and per build.
    "REPOSITORY_URI": "123456789012.dkr.ecr.us-west-2.amazonaws.com/fsdp-eks-dev/trainer",
    "BASE_IMAGE": DEFAULT_BASE_IMAGE,
    "CACHE_TAG": CACHE_TAG,
    "IMAGE_TAG": "src-0123456789abcdef01234567",
}

_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
_SYNTAX_DIRECTIVE = re.compile(r"^\s*#\s*syntax\s*=\s*(\S+)", re.IGNORECASE | re.MULTILINE)


def registry_of(reference: str) -> str:
    """The registry host Docker pulls `reference` from (docker.io for a bare name)."""
    first, slash, _ = reference.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost"):
        return "docker.io"
    return first


def on_docker_hub(reference: str) -> bool:
    return registry_of(reference).lower() in DOCKER_HUB_HOSTS


def resolve(text: str, values: dict[str, str]) -> str:
    return _VARIABLE.sub(lambda m: values.get(m.group(1), m.group(0)), text)


def dockerfile_images(text: str) -> list[str]:
    """Images a Dockerfile pulls: its syntax frontend, FROM bases and `--from=` sources."""
    images = _SYNTAX_DIRECTIVE.findall(text)
    steps = instructions(text)
    defaults = dict(
        arguments.split("=", 1)
        for keyword, arguments in steps
        if keyword == "ARG" and "=" in arguments
    )
    stages: set[str] = set()
    for keyword, arguments in steps:
        words = [w for w in arguments.split() if not w.startswith("--platform")]
        if keyword == "FROM":
            images.append(resolve(words[0], defaults))
            if len(words) >= 3 and words[1].upper() == "AS":
                stages.add(words[2].lower())
        for source in re.findall(r"--(?:mount=\S*?)?from=([^,\s]+)", arguments):
            source = resolve(source, defaults)
            if source.lower() not in stages and not source.isdigit():
                images.append(source)
    return images


def buildspec_images(spec: dict[str, object]) -> list[str]:
    """Images the buildspec's commands pull or run, `${VAR}`s resolved."""
    env = spec.get("env") or {}
    assert isinstance(env, dict)
    values = {**PROJECT_VALUES, **(env.get("variables") or {})}
    phases = spec["phases"]
    assert isinstance(phases, dict)
    text = "\n".join(c for phase in phases.values() for c in phase["commands"])
    # The build argument that stands in for a `# syntax=` line.
    images = re.findall(r"BUILDKIT_SYNTAX=([^\s\"']+)", resolve(text, values))
    if "BUILDKIT_SYNTAX" in values:
        images.append(values["BUILDKIT_SYNTAX"])
    for line in resolve(text.replace("\\\n", " "), values).splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = line.split()
        images += _command_images(words)
    return images


def _command_images(words: list[str]) -> list[str]:
    images: list[str] = []
    for i, word in enumerate(words):
        if word == "docker" and i + 1 < len(words):
            verb, rest = words[i + 1], words[i + 2 :]
            if verb in {"pull", "run", "create"}:
                operands = [w for w in rest if not w.startswith("-")]
                if operands:
                    images.append(operands[0])
            if verb == "buildx" and rest[:1] == ["create"]:
                options = " ".join(rest)
                image = re.search(r"image=([^\s,\"]+)", options)
                if image:
                    images.append(image.group(1))
                elif re.search(r"--driver[= ](docker-container|kubernetes)", options):
                    images.append(BUILDX_DEFAULT_BUILDKIT_IMAGE)
        for match in re.finditer(r"\b(?:ref|image)=([^\s,\"]+)", word):
            images.append(match.group(1))
    return images


def test_the_dockerfile_pulls_nothing_from_docker_hub() -> None:
    images = dockerfile_images(DOCKERFILE.read_text())
    assert DEFAULT_BASE_IMAGE in images  # the collector sees the real FROM lines
    assert [image for image in images if on_docker_hub(image)] == []


def test_the_buildspec_pulls_nothing_from_docker_hub() -> None:
    spec = yaml.safe_load(BUILDSPEC.read_text())
    images = buildspec_images(spec)
    # It sees the cache import and the smoke-test run, both from the stack's own repository.
    assert f"{PROJECT_VALUES['REPOSITORY_URI']}:{CACHE_TAG}" in images
    assert f"{PROJECT_VALUES['REPOSITORY_URI']}:{PROJECT_VALUES['IMAGE_TAG']}" in images
    assert [image for image in images if on_docker_hub(image)] == []


@pytest.mark.parametrize(
    ("reference", "hub"),
    [
        ("ubuntu:24.04", True),
        ("moby/buildkit:v0.18.0", True),
        ("docker/dockerfile:1.7", True),
        ("docker.io/library/python:3.12", True),
        ("registry-1.docker.io/moby/buildkit:v0.18.0", True),
        ("index.docker.io/library/alpine:3", True),
        ("public.ecr.aws/docker/library/python:3.12", False),
        ("nvcr.io/nvidia/pytorch:26.03-py3", False),
        ("ghcr.io/astral-sh/uv:0.13.9", False),
        ("localhost/trainer:dev", False),
        ("123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer:src-1", False),
    ],
)
def test_names_resolve_to_their_registry_as_docker_resolves_them(reference: str, hub: bool) -> None:
    assert on_docker_hub(reference) is hub


@pytest.mark.parametrize(
    "dockerfile",
    [
        "# syntax=docker/dockerfile:1.7\nFROM nvcr.io/nvidia/pytorch:26.03-py3\n",
        "#Syntax = docker.io/docker/dockerfile:1\nFROM nvcr.io/nvidia/pytorch:26.03-py3\n",
        "ARG BASE=python:3.12\nFROM ${BASE}\n",
        "FROM nvcr.io/nvidia/pytorch:26.03-py3\nCOPY --from=busybox:1.36 /bin/sh /bin/sh\n",
        "FROM nvcr.io/x/y:1 AS a\nRUN --mount=type=bind,from=alpine:3,target=/a true\n",
    ],
)
def test_the_dockerfile_check_catches_docker_hub_pulls(dockerfile: str) -> None:
    assert any(on_docker_hub(image) for image in dockerfile_images(dockerfile))


def test_stage_names_are_not_images() -> None:
    text = (
        "FROM ghcr.io/astral-sh/uv:0.13.9 AS uv\nFROM nvcr.io/x/y:1\n"
        "RUN --mount=from=uv,source=/uv,target=/u true\n"
    )
    assert dockerfile_images(text) == ["ghcr.io/astral-sh/uv:0.13.9", "nvcr.io/x/y:1"]


@pytest.mark.parametrize(
    "commands",
    [
        ['docker buildx create --driver docker-container --driver-opt "image=${BK}" --use'],
        ["docker buildx create --name b --driver docker-container --use"],
        ['docker pull "python:3.12"'],
        ["docker run --rm alpine:3 true"],
        ["docker buildx build --build-arg BUILDKIT_SYNTAX=docker/dockerfile:1 ."],
    ],
)
def test_the_buildspec_check_catches_docker_hub_pulls(commands: list[str]) -> None:
    spec = {
        "env": {"variables": {"BK": "moby/buildkit:v0.18.0"}},
        "phases": {"build": {"commands": commands}},
    }
    assert any(on_docker_hub(image) for image in buildspec_images(spec))
