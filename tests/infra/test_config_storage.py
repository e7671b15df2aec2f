"""The `storage` section: safe defaults (retain), S3/FSx rules enforced with errors naming keys."""

import pytest
from pydantic import BaseModel, ValidationError

from infra.config.storage import BucketConfig, FsxConfig, StorageConfig


def _all_fields_described(model: type[BaseModel]) -> list[str]:
    missing = []
    for name, field in model.model_fields.items():
        if not field.description:
            missing.append(f"{model.__name__}.{name}")
    return missing


def test_every_field_has_a_description():
    for model in (StorageConfig, BucketConfig, FsxConfig):
        assert _all_fields_described(model) == []


def test_defaults_retain_data_and_create_a_linked_file_system():
    config = StorageConfig.model_validate({})
    assert config.data_policy == "retain"
    assert config.bucket.create is True
    assert config.fsx.creates_file_system
    assert config.fsx.auto_export and config.fsx.auto_import
    assert config.fsx.storage_capacity_gib == 1200
    assert config.fsx.mount_path == "/fsx"


def test_camel_case_keys_from_a_stack_file():
    config = StorageConfig.model_validate(
        {
            "bucket": {"create": False, "name": "team-datasets"},
            "fsx": {
                "storageCapacityGiB": 4800,
                "perUnitStorageThroughput": 500,
                "dataRepositoryPrefix": "runs/",
                "installCsiDriver": False,
            },
            "dataPolicy": "delete",
        }
    )
    assert config.bucket.name == "team-datasets"
    assert config.fsx.storage_capacity_gib == 4800
    assert config.fsx.per_unit_storage_throughput == 500
    assert config.fsx.data_repository_prefix == "runs/"
    assert config.fsx.install_csi_driver is False
    assert config.data_policy == "delete"


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"bucket": {"create": False}}, "storage.bucket.name"),
        ({"bucket": {"name": "Bad_Name"}}, "storage.bucket.name"),
        ({"bucket": {"name": "ab"}}, "storage.bucket.name"),
        ({"fsx": {"storageCapacityGiB": 2000}}, "storage.fsx.storageCapacityGiB"),
        ({"fsx": {"storageCapacityGiB": 0}}, "storage.fsx.storageCapacityGiB"),
        ({"fsx": {"perUnitStorageThroughput": 200}}, "perUnitStorageThroughput"),
        ({"fsx": {"dataRepositoryPrefix": "s3://x/y"}}, "storage.fsx.dataRepositoryPrefix"),
        ({"fsx": {"mountPath": "fsx"}}, "storage.fsx path"),
        ({"fsx": {"mountPath": "/"}}, "storage.fsx.mountPath"),
        ({"fsx": {"mountPath": "/dev/shm"}}, "storage.fsx.mountPath"),
        ({"fsx": {"mountPath": "/proc"}}, "storage.fsx.mountPath"),
        ({"fsx": {"existingClaimName": "Claim_1"}}, "storage.fsx.existingClaimName"),
        ({"fsx": {"enabled": False, "existingClaimName": "c"}}, "existingClaimName"),
        ({"dataPolicy": "keep"}, "dataPolicy"),
        ({"fsx": {"sizeGiB": 1200}}, "sizeGiB"),
    ],
)
def test_bad_values_are_rejected_naming_the_key(data, key):
    with pytest.raises(ValidationError) as error:
        StorageConfig.model_validate(data)
    assert key in str(error.value)


@pytest.mark.parametrize("gib", [1200, 2400, 4800, 9600])
def test_persistent_2_sizes_are_accepted(gib):
    assert FsxConfig.model_validate({"storageCapacityGiB": gib}).storage_capacity_gib == gib


def test_existing_claim_means_no_file_system_is_created():
    fsx = FsxConfig.model_validate({"existingClaimName": "shared-fsx"})
    assert fsx.enabled and not fsx.creates_file_system
    assert not FsxConfig.model_validate({"enabled": False}).creates_file_system


def test_sections_are_frozen():
    config = StorageConfig.model_validate({})
    with pytest.raises(ValidationError):
        config.data_policy = "delete"  # type: ignore[misc]


def test_claim_name_is_the_stack_convention_or_the_existing_claim():
    assert StorageConfig.model_validate({}).claim_name("llama31-8b-p5") == "llama31-8b-p5-fsx"
    existing = StorageConfig.model_validate({"fsx": {"existingClaimName": "team-lustre"}})
    assert existing.claim_name("dev") == "team-lustre"
    assert StorageConfig.model_validate({"fsx": {"enabled": False}}).claim_name("dev") is None


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("1.9.0", "is not an EKS add-on version (v<driver release>-eksbuild.<build>)"),
        ("v1.9.0", "is not an EKS add-on version"),
        ("v1.50.0-eksbuild.1", "carries driver v1.50.0, which is not a release"),
    ],
)
def test_the_csi_add_on_version_must_be_one_eks_can_offer(version, message):
    """Issue 11: a mistyped add-on version fails at plan time, not when EKS refuses the add-on
    after the cluster is up. The driver releases come from the driver's own matrix
    (infra/facts/eks_versions.py FSX_CSI_DRIVER_RELEASES)."""
    with pytest.raises(ValidationError) as caught:
        FsxConfig.model_validate({"csiDriverVersion": version})
    text = str(caught.value)
    assert f"storage.fsx.csiDriverVersion {version!r} {message}" in text
    assert "allowed: v1.0.0..v1.9.0 with an EKS build, e.g. 'v1.9.0-eksbuild.1'" in text
    accepted = FsxConfig.model_validate({"csiDriverVersion": "v1.9.0-eksbuild.1"})
    assert accepted.csi_driver_version == "v1.9.0-eksbuild.1"
    assert FsxConfig.model_validate({}).csi_driver_version is None
