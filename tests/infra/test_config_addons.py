"""The `addons` section: exact pins, the EFA plugin floor for P6, known operator releases."""

import hashlib
import re

import pytest
from pydantic import ValidationError

from infra.config.addons import (
    TRAINING_OPERATOR_RELEASES,
    AddonsConfig,
    EfaDevicePluginConfig,
    NvidiaDevicePluginConfig,
    TrainingOperatorConfig,
)


def test_every_field_has_a_description():
    models = (AddonsConfig, EfaDevicePluginConfig, NvidiaDevicePluginConfig, TrainingOperatorConfig)
    missing = [
        f"{model.__name__}.{name}"
        for model in models
        for name, field in model.model_fields.items()
        if not field.description
    ]
    assert missing == []


def test_defaults_install_everything_with_exact_pins():
    config = AddonsConfig.model_validate({})
    assert config.nvidia_device_plugin.install
    assert config.efa_device_plugin.install
    assert config.training_operator.install
    assert config.nvidia_device_plugin.version == "0.18.2"
    assert config.efa_device_plugin.version == "v0.5.30"
    # v1.9.4: cleanPodPolicy respected past backoffLimit, images on GHCR.
    assert config.training_operator.version == "v1.9.4"
    assert config.training_operator.resolved_image == (
        "ghcr.io/kubeflow/training-v1/training-operator:v1-93c5489"
    )
    assert config.training_operator.namespace == "kubeflow"


def test_every_known_operator_release_is_v1_9_with_a_pinned_image_commit_and_digest():
    for version, release in TRAINING_OPERATOR_RELEASES.items():
        assert version.startswith("v1.9.")
        assert ":" in release.image and not release.image.endswith(":latest")
        # A full commit id, not a tag or branch that could move.
        assert re.fullmatch(r"[0-9a-f]{40}", release.commit), version
        assert re.fullmatch(r"[0-9a-f]{64}", release.crd_sha256), version


def test_the_pinned_crd_is_the_schema_the_job_is_validated_against():
    """kubeflow/trainer at 6f74c7f6 (`git rev-parse v1.9.0^{commit}`) holds the CRD whose
    sha256 the release records; the shared copy of the published v1.9.0 CRD, which the job
    tests validate rendered PyTorchJobs against, must be that same file."""
    from tests.infra.conftest import CRD_PATH

    if not CRD_PATH.exists():
        pytest.skip(f"{CRD_PATH} is not present (shared/ lives outside the repository)")
    digest = hashlib.sha256(CRD_PATH.read_bytes()).hexdigest()
    assert digest == TRAINING_OPERATOR_RELEASES["v1.9.0"].crd_sha256


def test_camel_case_keys_and_install_switches():
    config = AddonsConfig.model_validate(
        {
            "nvidiaDevicePlugin": {"install": False},
            "efaDevicePlugin": {"version": "v0.5.18"},
            "trainingOperator": {"image": "123.dkr.ecr.us-west-2.amazonaws.com/to:v1"},
        }
    )
    assert config.nvidia_device_plugin.install is False
    assert config.efa_device_plugin.version == "v0.5.18"
    assert config.training_operator.resolved_image.endswith("/to:v1")


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"nvidiaDevicePlugin": {"version": "latest"}}, "addons.nvidiaDevicePlugin.version"),
        ({"nvidiaDevicePlugin": {"version": "~0.18"}}, "addons.nvidiaDevicePlugin.version"),
        ({"efaDevicePlugin": {"version": "v0.5.7"}}, "addons.efaDevicePlugin.version"),
        ({"efaDevicePlugin": {"version": "0.5.x"}}, "addons.efaDevicePlugin.version"),
        ({"trainingOperator": {"version": "v1.8.1"}}, "addons.trainingOperator.version"),
        ({"trainingOperator": {"namespace": "Kubeflow"}}, "addons.trainingOperator.namespace"),
        ({"mpiOperator": {"install": True}}, "mpiOperator"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(data, key):
    with pytest.raises(ValidationError) as error:
        AddonsConfig.model_validate(data)
    assert key in str(error.value)


def test_operator_error_lists_the_allowed_releases():
    with pytest.raises(ValidationError) as error:
        TrainingOperatorConfig.model_validate({"version": "v2.0.0"})
    assert "v1.9.0" in str(error.value)
