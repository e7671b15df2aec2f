"""The AWS regions a stack's `aws:region` may name.

From botocore's endpoint data (`botocore/data/endpoints.json`, botocore 1.44.5, read
2026-11-26): the standard partition, China and GovCloud. The isolated partitions (ISO, ISOB,
ISOE, ISOF, EUSC) are left out: EKS with GPU instances is not what they are used for, and their
regions are not reachable from a public machine. A test compares this table with the installed
botocore's data, so a new region shows up as a failing test rather than a refused stack.
"""

from __future__ import annotations

REGIONS_BY_PARTITION: dict[str, tuple[str, ...]] = {
    "aws": (
        "af-south-1",
        "ap-east-1",
        "ap-east-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-6",
        "ap-southeast-7",
        "ca-central-1",
        "ca-west-1",
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "il-central-1",
        "me-central-1",
        "me-south-1",
        "mx-central-1",
        "sa-east-1",
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
    ),
    "aws-cn": ("cn-north-1", "cn-northwest-1"),
    "aws-us-gov": ("us-gov-east-1", "us-gov-west-1"),
}
REGIONS = frozenset(region for regions in REGIONS_BY_PARTITION.values() for region in regions)
