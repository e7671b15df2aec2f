"""The run's own S3 access (no FSx): what the role allows, against the rules S3 and Pod Identity
apply, which the mock runtime cannot show."""

from __future__ import annotations

from typing import Any

from infra.platform.iam import pod_identity_trust
from infra.platform.run_access import OBJECT_ACTIONS, permissions, service_account_name

BUCKET_ARN = "arn:aws:s3:::fsdp-eks-dev-data"
PREFIX = "checkpoints/dev-1a2b3c4d"


def _grants(policy: dict[str, Any], action: str, resource: str) -> list[dict[str, Any]]:
    return [
        st
        for st in policy["Statement"]
        if st["Effect"] == "Allow"
        and action in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])
        and st["Resource"] == resource
    ]


def head_of_a_missing_key(policy: dict[str, Any]) -> int:
    """The status S3 gives HeadObject of a key that does not exist: 404 to a caller allowed
    s3:ListBucket on the bucket, 403 to anyone else (Amazon S3 API Reference, HeadObject,
    "Permissions"). A HEAD request carries no `s3:prefix`, so a ListBucket grant conditioned
    on it does not apply to the request."""
    usable = [st for st in _grants(policy, "s3:ListBucket", BUCKET_ARN) if "Condition" not in st]
    return 404 if usable else 403


def test_a_missing_key_is_a_404_so_dcp_can_save() -> None:
    """torch DCP asks whether `.metadata` exists before and after every save (filesystem.py
    `_metadata_exists`, `finish`); s3torchconnector's `exists` treats anything but "not found"
    as an error, so a 403 there would fail every save at its first step."""
    assert head_of_a_missing_key(permissions(BUCKET_ARN, PREFIX)) == 404
    # The model of the rule tells the broken variant apart: a prefix-conditioned listing.
    scoped = permissions(BUCKET_ARN, PREFIX)
    listing = next(st for st in scoped["Statement"] if st["Action"] == "s3:ListBucket")
    listing["Condition"] = {"StringLike": {"s3:prefix": [f"{PREFIX}/*"]}}
    assert head_of_a_missing_key(scoped) == 403


def test_objects_are_reachable_under_the_runs_prefix_only() -> None:
    policy = permissions(BUCKET_ARN, f"/{PREFIX}/")
    objects = [st for st in policy["Statement"] if st["Resource"] != BUCKET_ARN]
    assert len(objects) == 1
    assert objects[0]["Resource"] == f"{BUCKET_ARN}/{PREFIX}/*"
    assert set(objects[0]["Action"]) == set(OBJECT_ACTIONS)
    # Listing keys is all it may do at the bucket level: no bucket policy, no deletes there.
    (bucket_level,) = [st for st in policy["Statement"] if st["Resource"] == BUCKET_ARN]
    assert bucket_level["Action"] == "s3:ListBucket"
    assert not any("*" in str(st["Action"]) for st in policy["Statement"])


def test_only_this_jobs_account_on_this_cluster_may_assume_the_role() -> None:
    account = service_account_name("dev")
    (statement,) = pod_identity_trust("exp-cluster", "training", account)["Statement"]
    assert statement["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(statement["Action"]) == ["sts:AssumeRole", "sts:TagSession"]
    assert statement["Condition"]["StringEquals"] == {
        "aws:RequestTag/eks-cluster-name": "exp-cluster",
        "aws:RequestTag/kubernetes-namespace": "training",
        "aws:RequestTag/kubernetes-service-account": "dev-trainer",
    }
