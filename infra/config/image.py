"""The `image` section: which container image the training job runs, and how it is built.

Two ways in. Most stacks leave `uri` unset: `pulumi up` then builds the trainer image in
CodeBuild from this repository (only when its sources changed) and pins the job to the
image's digest, so a run can never pick up a stale `:latest`. Teams that already publish an
image set `uri`, and the whole build pipeline (ECR repository, bucket, CodeBuild) is skipped.

The defaults pin everything the build pulls from outside the repository (base image, EFA
installer), because an image rebuilt from the same commit should be the same image.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from infra.config.base import ConfigSection

DEFAULT_BASE_IMAGE = "nvcr.io/nvidia/pytorch:26.03-py3"
"""NGC PyTorch (Ubuntu 24.04, Python 3.12, CUDA 13.2, NCCL 2.29): torch, CUDA and NCCL built
and tested together by NVIDIA. It lacks EFA's libfabric, which the Dockerfile adds."""

DEFAULT_EFA_INSTALLER_VERSION = "1.51.0"
"""EFA installer 1.51.0: libfabric 2.7.0amzn2.0 and the aws-ofi-nccl plugin 1.22.0."""

ComputeType = Literal[
    "BUILD_GENERAL1_MEDIUM",
    "BUILD_GENERAL1_LARGE",
    "BUILD_GENERAL1_XLARGE",
    "BUILD_GENERAL1_2XLARGE",
]
"""CodeBuild Linux x86_64 sizes big enough for a 20+ GB CUDA image (SMALL has 64 GB disk and
3 GB memory, too little to unpack a CUDA PyTorch base)."""

SmokeTestLevel = Literal["quick", "standard", "full"]

LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1827, 3653)
"""The only values CloudWatch Logs accepts for a log group's retention."""

# registry[:port]/path[:tag][@sha256:digest] — enough to reject "latest-ish" typos and URLs.
_IMAGE_REFERENCE = re.compile(
    r"^(?P<name>[a-z0-9]+(?:[._-][a-z0-9]+)*(?::[0-9]+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)+)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
_VERSION = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+$")


def _check_image_reference(key: str, value: str) -> str:
    match = _IMAGE_REFERENCE.match(value)
    if match is None:
        raise ValueError(
            f"image.{key}={value!r} is not an image reference; expected "
            "registry/repository:tag or registry/repository@sha256:<64 hex digits>"
        )
    if match["tag"] is None and match["digest"] is None:
        raise ValueError(
            f"image.{key}={value!r} names no tag or digest; pin it (e.g. ':26.03-py3' or "
            "'@sha256:...') so that every run and every rebuild uses the same image"
        )
    if match["tag"] == "latest" and match["digest"] is None:
        raise ValueError(
            f"image.{key}={value!r} uses ':latest', which moves under a running experiment; "
            "use a version tag or a digest"
        )
    return value


class ImageConfig(ConfigSection):
    """`fsdp-eks:image`: the trainer image, either your own (`uri`) or built by `pulumi up`."""

    uri: str | None = Field(
        default=None,
        description=(
            "An image you publish yourself (registry/repo:tag or registry/repo@sha256:...), used "
            "as is; setting it skips the ECR repository, source bucket and CodeBuild build. "
            "The image must contain the trainer package (`python -m trainer`) and `sh` (an "
            "init container creates the run's directories with it), and run as uid 10001 (as "
            "this repository's image does) or root: the run's directories on the shared volume "
            "are handed to uid 10001. A digest is recommended: a tag can move between runs. "
            "Default: build this repository's image."
        ),
    )
    base_image: str = Field(
        default=DEFAULT_BASE_IMAGE,
        description=(
            "CUDA PyTorch base image the build starts FROM (pinned tag or digest), e.g. an NGC "
            "PyTorch tag or an AWS Deep Learning Container. The base's own torch is kept; the "
            "other trainer dependencies are installed at the versions in uv.lock, and EFA "
            "(libfabric + aws-ofi-nccl) is added when the base lacks /opt/amazon/efa."
        ),
    )
    efa_installer_version: str = Field(
        default=DEFAULT_EFA_INSTALLER_VERSION,
        description=(
            "AWS EFA installer version (x.y.z) added to bases without EFA; it pins libfabric and "
            "the aws-ofi-nccl NCCL plugin together."
        ),
    )
    compute_type: ComputeType = Field(
        default="BUILD_GENERAL1_LARGE",
        description=(
            "CodeBuild compute size for the image build (MEDIUM 4 vCPU/7 GB, LARGE 8 vCPU/15 GB, "
            "XLARGE 36 vCPU/72 GB, 2XLARGE 72 vCPU/145 GB); bigger is faster and costs more."
        ),
    )
    build_timeout_minutes: int = Field(
        default=60,
        ge=5,
        le=2160,
        description=(
            "Minutes CodeBuild lets one build run before stopping it (5-2160); `pulumi up` "
            "waits at most this long plus the queue time for the image."
        ),
    )
    keep_last_images: int = Field(
        default=10,
        ge=1,
        le=1000,
        description=(
            "How many tagged images the ECR lifecycle policy keeps; older ones (and untagged "
            "build-cache leftovers after a day) are expired. Keep enough to re-run past stacks."
        ),
    )
    smoke_test_level: SmokeTestLevel = Field(
        default="standard",
        description=(
            "Checks run inside the built image before it is pushed: quick (imports), standard "
            "(+ CUDA/NCCL/EFA libraries present, model configs build), full (+ forward/backward "
            "pass of a tiny model). The build host has no GPU, so GPU-only checks are skipped."
        ),
    )
    log_retention_days: int = Field(
        default=30,
        description=(
            "Days CloudWatch keeps the image build's logs; one of "
            + ", ".join(map(str, LOG_RETENTION_DAYS))
        ),
    )

    @field_validator("uri")
    @classmethod
    def _uri_is_pinned(cls, value: str | None) -> str | None:
        return None if value is None else _check_image_reference("uri", value)

    @field_validator("base_image")
    @classmethod
    def _base_image_is_pinned(cls, value: str) -> str:
        _check_image_reference("baseImage", value)
        # CodeBuild pulls the base anonymously from shared AWS addresses; Docker Hub answers
        # those with `toomanyrequests` and the build (and `pulumi up`) fails. A first path
        # component without '.' or ':' (and not localhost) is not a registry: Docker Hub
        # (github.com/distribution/reference normalize.go splitDockerDomain).
        first = value.split("/", 1)[0]
        is_host = "." in first or ":" in first or first == "localhost"
        if not is_host or first in ("docker.io", "index.docker.io", "registry-1.docker.io"):
            raise ValueError(
                f"image.baseImage={value!r} is on Docker Hub, which CodeBuild would pull "
                "anonymously from shared addresses (rate-limited: toomanyrequests); use an NGC "
                "tag (nvcr.io/...), an AWS Deep Learning Container (<account>.dkr.ecr.<region>"
                ".amazonaws.com/...), ECR Public (public.ecr.aws/...) or a copy in your own ECR"
            )
        return value

    @field_validator("efa_installer_version")
    @classmethod
    def _efa_version_is_exact(cls, value: str) -> str:
        if not _VERSION.match(value):
            raise ValueError(
                f"image.efaInstallerVersion={value!r} must be an exact version x.y.z "
                "(e.g. '1.51.0'); 'latest' would change the image without a change here"
            )
        return value

    @field_validator("log_retention_days")
    @classmethod
    def _retention_is_allowed(cls, value: int) -> int:
        if value not in LOG_RETENTION_DAYS:
            raise ValueError(
                f"image.logRetentionDays={value} is not a CloudWatch retention; allowed: "
                + ", ".join(map(str, LOG_RETENTION_DAYS))
            )
        return value

    @property
    def builds_image(self) -> bool:
        """Whether `pulumi up` builds the image (no `uri` of the user's own)."""
        return self.uri is None
