"""The `storage` section: the S3 bucket for data and checkpoints and the FSx for Lustre volume.

Checkpoints are the expensive output of a run, so the defaults keep them: `dataPolicy: retain`
leaves the bucket and the file system in the account when the stack is destroyed. Deleting
them is a deliberate choice written into the stack file, never an accident of `pulumi destroy`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from infra.config.base import ConfigSection
from infra.facts.eks_versions import check_fsx_csi_addon_version

# S3's naming rules for general purpose buckets (3-63 chars, lowercase letters, digits, dots
# and hyphens, starting and ending with a letter or digit).
_BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# PERSISTENT_2 accepts 1.2 TiB, or any multiple of 2.4 TiB (Amazon FSx for Lustre user guide).
_FSX_SMALLEST_GIB = 1200
_FSX_INCREMENT_GIB = 2400
_SYSTEM_DIRS = ("/dev", "/proc", "/sys")
# PVC/claim names are DNS-1123 subdomains.
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


def claim_name_for(stack: str) -> str:
    """The FSx claim's name for a stack: stable, per stack, a valid Kubernetes name.

    Stable, because users `kubectl exec` into pods and look for it, and the validation kit
    mounts it; per stack, because several experiments may share one namespace.
    """
    slug = re.sub(r"[^a-z0-9-]+", "-", stack.lower()).strip("-")[:50].strip("-")
    return f"{slug or 'stack'}-fsx"


class BucketConfig(ConfigSection):
    """Where datasets, checkpoints and logs live in S3."""

    create: bool = Field(
        default=True,
        description=(
            "Create the bucket with this stack (encrypted, versioned, public access blocked, "
            "TLS only). false: use the existing bucket `name`, which the stack never modifies."
        ),
    )
    name: str | None = Field(
        default=None,
        description=(
            "Bucket name. Required when `create` is false; optional otherwise (Pulumi then "
            "derives a unique name from the stack)."
        ),
    )

    @field_validator("name")
    @classmethod
    def _valid_bucket_name(cls, name: str | None) -> str | None:
        if name is not None and (not _BUCKET_NAME.match(name) or ".." in name):
            raise ValueError(
                f"storage.bucket.name {name!r} is not a valid S3 bucket name: use 3-63 "
                "lowercase letters, digits, dots or hyphens, starting and ending with a "
                "letter or digit"
            )
        return name

    @model_validator(mode="after")
    def _existing_bucket_needs_name(self) -> BucketConfig:
        if not self.create and self.name is None:
            raise ValueError(
                "storage.bucket.name is required when storage.bucket.create is false "
                "(the existing bucket to use)"
            )
        return self


class FsxConfig(ConfigSection):
    """The shared FSx for Lustre volume every training pod mounts (datasets, checkpoints)."""

    enabled: bool = Field(
        default=True,
        description=(
            "Mount a Lustre volume into the training pods. With `existingClaimName` unset the "
            "stack creates a PERSISTENT_2 file system in the GPU subnet, linked to the bucket."
        ),
    )
    existing_claim_name: str | None = Field(
        default=None,
        description=(
            "A PersistentVolumeClaim that already exists in the job's namespace (e.g. on a "
            "shared cluster): mount it instead of creating a file system."
        ),
    )
    storage_capacity_gib: int = Field(
        default=_FSX_SMALLEST_GIB,
        alias="storageCapacityGiB",
        description="File system size in GiB: 1200, or a multiple of 2400 (PERSISTENT_2).",
    )
    per_unit_storage_throughput: Literal[125, 250, 500, 1000] = Field(
        default=125,
        description=(
            "Throughput in MB/s per TiB of storage (PERSISTENT_2: 125, 250, 500 or 1000). "
            "Raise it when large checkpoints take too long to write."
        ),
    )
    data_compression: Literal["NONE", "LZ4"] = Field(
        default="LZ4",
        description="Lustre data compression; LZ4 saves space on text datasets at little cost.",
    )
    file_system_path: str = Field(
        default="/",
        description="Directory inside Lustre where the bucket (prefix) appears.",
    )
    data_repository_prefix: str = Field(
        default="",
        description=(
            "Bucket prefix linked to `fileSystemPath` ('' links the whole bucket). Objects "
            "under it are imported lazily; files written under the path are exported back."
        ),
    )
    auto_import: bool = Field(
        default=True,
        description="Import new, changed and deleted S3 objects into Lustre automatically.",
    )
    auto_export: bool = Field(
        default=True,
        description=(
            "Export new, changed and deleted files (e.g. checkpoints) to S3 automatically, so "
            "they outlive the file system."
        ),
    )
    mount_path: str = Field(
        default="/fsx",
        description="Where the training pods mount the volume.",
    )
    install_csi_driver: bool = Field(
        default=True,
        description=(
            "Install the `aws-fsx-csi-driver` EKS add-on (with a Pod Identity role). Set false "
            "on an existing cluster that already runs the driver: the stack never touches it."
        ),
    )
    csi_driver_version: str | None = Field(
        default=None,
        description=(
            "EKS add-on version of the FSx CSI driver (e.g. 'v1.9.0-eksbuild.1': a released "
            "driver, infra/facts/eks_versions.py, plus EKS's build); unset: the default version "
            "EKS publishes for the cluster's Kubernetes version."
        ),
    )

    @field_validator("csi_driver_version")
    @classmethod
    def _offered_addon_version(cls, version: str | None) -> str | None:
        return None if version is None else check_fsx_csi_addon_version(version)

    @field_validator("storage_capacity_gib")
    @classmethod
    def _valid_capacity(cls, gib: int) -> int:
        if gib != _FSX_SMALLEST_GIB and (gib <= 0 or gib % _FSX_INCREMENT_GIB):
            raise ValueError(
                f"storage.fsx.storageCapacityGiB {gib} is not a PERSISTENT_2 size: use "
                f"{_FSX_SMALLEST_GIB} or a multiple of {_FSX_INCREMENT_GIB}"
            )
        return gib

    @field_validator("file_system_path", "mount_path")
    @classmethod
    def _absolute_path(cls, path: str) -> str:
        if not path.startswith("/") or "//" in path or ".." in path.split("/"):
            raise ValueError(f"storage.fsx path {path!r} must be an absolute, normalised path")
        return path

    @field_validator("mount_path")
    @classmethod
    def _mountable(cls, path: str) -> str:
        # "/" would hide the image; /dev, /proc and /sys are the kernel's (/dev/shm is the
        # job's memory volume).
        if path == "/" or any(path == top or path.startswith(f"{top}/") for top in _SYSTEM_DIRS):
            raise ValueError(
                f"storage.fsx.mountPath {path!r} would hide a directory the container needs; "
                "use a directory of its own, e.g. /fsx"
            )
        return path

    @field_validator("data_repository_prefix")
    @classmethod
    def _relative_prefix(cls, prefix: str) -> str:
        if prefix.startswith("/") or prefix.startswith("s3://"):
            raise ValueError(
                f"storage.fsx.dataRepositoryPrefix {prefix!r} must be a key prefix inside the "
                "bucket (no leading '/' or 's3://'), e.g. 'fsx/'"
            )
        return prefix

    @field_validator("existing_claim_name")
    @classmethod
    def _valid_claim_name(cls, name: str | None) -> str | None:
        if name is not None and not _DNS1123.match(name):
            raise ValueError(
                f"storage.fsx.existingClaimName {name!r} is not a valid Kubernetes name "
                "(lowercase letters, digits, '-' and '.')"
            )
        return name

    @model_validator(mode="after")
    def _claim_needs_fsx(self) -> FsxConfig:
        if self.existing_claim_name is not None and not self.enabled:
            raise ValueError(
                "storage.fsx.existingClaimName is set but storage.fsx.enabled is false: "
                "enable fsx to mount the claim, or remove existingClaimName"
            )
        return self

    @property
    def creates_file_system(self) -> bool:
        """Whether this stack owns a file system (rather than none, or someone else's claim)."""
        return self.enabled and self.existing_claim_name is None


class StorageConfig(ConfigSection):
    """Storage for one training run: an S3 bucket, optionally fronted by FSx for Lustre."""

    bucket: BucketConfig = Field(
        default_factory=BucketConfig,
        description="The S3 bucket for datasets, checkpoints and logs.",
    )
    fsx: FsxConfig = Field(
        default_factory=FsxConfig,
        description="The FSx for Lustre volume mounted into every training pod.",
    )
    data_policy: Literal["retain", "delete"] = Field(
        default="retain",
        description=(
            "What `pulumi destroy` does to the bucket and file system the stack created: "
            "'retain' leaves them (and the checkpoints) in the account; 'delete' removes them, "
            "emptying the bucket first."
        ),
    )

    def claim_name(self, stack: str) -> str | None:
        """The claim the job mounts in stack `stack`; None when it mounts no Lustre volume."""
        if not self.fsx.enabled:
            return None
        return self.fsx.existing_claim_name or claim_name_for(stack)
