"""The `image` section accepts pinned images only and names the key when it refuses one."""

import pytest
from pydantic import ValidationError

from infra.config.image import (
    DEFAULT_BASE_IMAGE,
    LOG_RETENTION_DAYS,
    ImageConfig,
)

DIGEST = "sha256:" + "ab" * 32
DLC = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.8.0-gpu-py312"


def test_defaults_build_the_image_from_a_pinned_base() -> None:
    config = ImageConfig()
    assert config.builds_image
    assert config.base_image == DEFAULT_BASE_IMAGE
    assert config.compute_type == "BUILD_GENERAL1_LARGE"
    assert config.smoke_test_level == "standard"
    assert config.log_retention_days in LOG_RETENTION_DAYS


def test_stack_file_keys_are_camel_case() -> None:
    config = ImageConfig.model_validate(
        {
            "baseImage": DLC,
            "computeType": "BUILD_GENERAL1_2XLARGE",
            "buildTimeoutMinutes": 90,
            "keepLastImages": 3,
            "smokeTestLevel": "full",
            "efaInstallerVersion": "1.50.0",
            "logRetentionDays": 7,
        }
    )
    assert config.compute_type == "BUILD_GENERAL1_2XLARGE"
    assert config.build_timeout_minutes == 90
    assert config.keep_last_images == 3
    assert config.smoke_test_level == "full"


@pytest.mark.parametrize(
    "uri",
    [
        f"123456789012.dkr.ecr.us-west-2.amazonaws.com/trainer@{DIGEST}",
        "ghcr.io/acme/trainer:2026.11.1",
        f"localhost:5000/team/trainer:v1@{DIGEST}",
    ],
)
def test_own_image_skips_the_build(uri: str) -> None:
    config = ImageConfig.model_validate({"uri": uri})
    assert config.uri == uri
    assert not config.builds_image


@pytest.mark.parametrize(
    ("key", "value", "fragment"),
    [
        ("uri", "ghcr.io/acme/trainer", "names no tag or digest"),
        ("uri", "ghcr.io/acme/trainer:latest", "':latest'"),
        ("uri", "https://ghcr.io/acme/trainer:1", "not an image reference"),
        ("baseImage", "nvcr.io/nvidia/pytorch", "names no tag or digest"),
        ("baseImage", "nvcr.io/nvidia/pytorch@sha256:abc", "not an image reference"),
        ("baseImage", "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", "is on Docker Hub"),
        ("baseImage", "docker.io/pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", "is on Docker Hub"),
        ("efaInstallerVersion", "latest", "image.efaInstallerVersion='latest'"),
        ("logRetentionDays", 10, "image.logRetentionDays=10"),
    ],
)
def test_unpinned_or_malformed_values_name_the_key(key: str, value: object, fragment: str) -> None:
    with pytest.raises(ValidationError) as error:
        ImageConfig.model_validate({key: value})
    assert fragment in str(error.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("computeType", "BUILD_GENERAL1_SMALL"),
        ("buildTimeoutMinutes", 4),
        ("buildTimeoutMinutes", 2161),
        ("keepLastImages", 0),
        ("smokeTestLevel", "thorough"),
        ("imageUri", "x/y:1"),
    ],
)
def test_out_of_range_and_unknown_keys_are_rejected(key: str, value: object) -> None:
    with pytest.raises(ValidationError) as error:
        ImageConfig.model_validate({key: value})
    assert key in str(error.value)


def test_every_field_is_described() -> None:
    missing = [name for name, field in ImageConfig.model_fields.items() if not field.description]
    assert missing == []
