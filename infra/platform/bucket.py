"""The guards every bucket of this project gets: private, owner-enforced, versioned, encrypted.

pulumi-aws 7 configures each of these as its own resource next to `aws.s3.Bucket`; the data
bucket and the image-source bucket need the same four, so they are made in one place.
"""

from __future__ import annotations

from typing import NamedTuple

import pulumi
import pulumi_aws as aws


class BucketGuards(NamedTuple):
    """The four guard resources of one bucket."""

    public_access: aws.s3.BucketPublicAccessBlock
    ownership: aws.s3.BucketOwnershipControls
    encryption: aws.s3.BucketServerSideEncryptionConfiguration
    versioning: aws.s3.BucketVersioning


def guard_bucket(
    prefix: str,
    bucket: aws.s3.Bucket,
    opts: pulumi.ResourceOptions,
    *,
    bucket_key: bool = False,
) -> BucketGuards:
    """Block public access, enforce bucket ownership (no ACLs), encrypt (SSE-S3), version.

    Resources are named `<prefix>-public-access`, `-ownership`, `-encryption`, `-versioning`.
    Anything that must not touch the bucket before it is private (objects, policies) should
    depend on the returned resources.
    """
    encryption_default: aws.s3.BucketServerSideEncryptionConfigurationRuleArgsDict = {
        "apply_server_side_encryption_by_default": {"sse_algorithm": "AES256"},
    }
    if bucket_key:
        encryption_default["bucket_key_enabled"] = True
    return BucketGuards(
        public_access=aws.s3.BucketPublicAccessBlock(
            f"{prefix}-public-access",
            bucket=bucket.id,
            block_public_acls=True,
            block_public_policy=True,
            ignore_public_acls=True,
            restrict_public_buckets=True,
            opts=opts,
        ),
        ownership=aws.s3.BucketOwnershipControls(
            f"{prefix}-ownership",
            bucket=bucket.id,
            rule={"object_ownership": "BucketOwnerEnforced"},
            opts=opts,
        ),
        encryption=aws.s3.BucketServerSideEncryptionConfiguration(
            f"{prefix}-encryption",
            bucket=bucket.id,
            rules=[encryption_default],
            opts=opts,
        ),
        versioning=aws.s3.BucketVersioning(
            f"{prefix}-versioning",
            bucket=bucket.id,
            versioning_configuration={"status": "Enabled"},
            opts=opts,
        ),
    )
