"""`TrainerImage` under Pulumi's mock runtime: the pipeline it registers, or none with `uri`."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pulumi
import pytest

from infra.config.image import ImageConfig
from infra.image.source import build_fingerprint, write_source_archive
from infra.image.trainer_image import (
    BUILDSPEC_PATH,
    CACHE_TAG,
    PROJECT_ENVIRONMENT_KEYS,
    QUEUED_TIMEOUT_MINUTES,
    TrainerImage,
    TrainerImageArgs,
    build_settings,
)
from infra.offline import Evaluation, evaluate

REPO = Path(__file__).resolve().parents[2]
DLC = "763104351884.dkr.ecr.us-west-2.amazonaws.com/pytorch-training:2.8.0-gpu-py312"


def image_program(config: dict[str, Any], archive_dir: Path, **args: Any) -> Callable[[], None]:
    def program() -> None:
        image = TrainerImage(
            "trainer-image",
            TrainerImageArgs(
                config=ImageConfig.model_validate(config),
                name_prefix=args.pop("name_prefix", "fsdp-eks-dev"),
                archive_dir=archive_dir,
                **args,
            ),
        )
        pulumi.export("image_uri", image.image_uri)

    return program


@pytest.fixture
def run(tmp_path: Path) -> Callable[..., Evaluation]:
    def run_with(config: dict[str, Any] | None = None, **args: Any) -> Evaluation:
        return evaluate(image_program(config or {}, tmp_path / "archives", **args), config={})

    return run_with


def policy_statements(result: Evaluation) -> list[dict[str, Any]]:
    policy = json.loads(result.one("aws:iam/rolePolicy:RolePolicy").inputs["policy"])
    return list(policy["Statement"])


def as_list(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else value


def test_own_image_uri_skips_the_whole_pipeline(run: Callable[..., Evaluation]) -> None:
    uri = "ghcr.io/acme/trainer@sha256:" + "ab" * 32
    result = run({"uri": uri})
    assert [r.type for r in result.resources] == ["fsdp-eks:image:TrainerImage"]
    assert result.stack_outputs["image_uri"] == uri


def test_pipeline_resources_are_children_of_the_component(run: Callable[..., Evaluation]) -> None:
    result = run()
    component = result.one("fsdp-eks:image:TrainerImage")
    types = sorted(r.type for r in result.resources if r is not component)
    assert types == sorted(
        [
            "aws:cloudwatch/logGroup:LogGroup",
            "aws:codebuild/project:Project",
            "aws:ecr/lifecyclePolicy:LifecyclePolicy",
            "aws:ecr/repository:Repository",
            "aws:iam/role:Role",
            "aws:iam/rolePolicy:RolePolicy",
            "aws:s3/bucket:Bucket",
            "aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration",
            "aws:s3/bucketObjectv2:BucketObjectv2",
            "aws:s3/bucketOwnershipControls:BucketOwnershipControls",
            "aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock",
            "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
            "aws:s3/bucketVersioning:BucketVersioning",
            "pulumi-python:dynamic/image:ImageBuild",
        ]
    )
    for resource in result.resources:
        if resource is not component:
            assert resource.parent == component.urn, resource.name
            assert resource.name.startswith("trainer-image-"), resource.name


def test_repository_scans_keeps_tags_immutable_and_expires_old_images(
    run: Callable[..., Evaluation],
) -> None:
    result = run({"keepLastImages": 7})
    repository = result.one("aws:ecr/repository:Repository")
    assert repository.inputs["name"] == "fsdp-eks-dev/trainer"
    assert repository.inputs["imageScanningConfiguration"] == {"scanOnPush": True}
    assert repository.inputs["imageTagMutability"] == "IMMUTABLE_WITH_EXCLUSION"
    assert repository.inputs["imageTagMutabilityExclusionFilters"] == [
        {"filter": CACHE_TAG, "filterType": "WILDCARD"}
    ]
    rules = json.loads(result.one("aws:ecr/lifecyclePolicy:LifecyclePolicy").inputs["policy"])
    keep = [r for r in rules["rules"] if r["selection"]["countType"] == "imageCountMoreThan"]
    assert [r["selection"]["countNumber"] for r in keep] == [7]
    assert keep[0]["selection"]["tagPrefixList"] == ["src-"]
    assert not CACHE_TAG.startswith("src-")  # the cache tag is never expired as an image


def test_source_bucket_is_private_encrypted_versioned_before_upload(
    run: Callable[..., Evaluation],
) -> None:
    result = run()
    bucket = result.one("aws:s3/bucket:Bucket")
    block = result.one("aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock")
    assert all(
        block.inputs[key]
        for key in (
            "blockPublicAcls",
            "blockPublicPolicy",
            "ignorePublicAcls",
            "restrictPublicBuckets",
        )
    )
    versioning = result.one("aws:s3/bucketVersioning:BucketVersioning")
    assert versioning.inputs["versioningConfiguration"] == {"status": "Enabled"}
    encryption = result.one(
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration"
    )
    assert encryption.inputs["rules"][0]["applyServerSideEncryptionByDefault"] == {
        "sseAlgorithm": "AES256"
    }
    upload = result.one("aws:s3/bucketObjectv2:BucketObjectv2")
    build = result.one("pulumi-python:dynamic/image:ImageBuild")
    assert upload.inputs["key"] == f"sources/{build.inputs['image_tag']}.zip"
    assert bucket.inputs["forceDestroy"] is True  # only reproducible build inputs live here
    for guard in (block, encryption):
        assert result.depends_on(upload, guard)


def test_source_archives_expire_once_no_build_can_need_them(
    run: Callable[..., Evaluation],
) -> None:
    """Archives are content-addressed (a new key per change, never an overwrite), so only an
    expiration of current versions ever removes one; the noncurrent rule then removes what the
    expiration leaves behind in the versioned bucket. An archive must outlive the longest
    build CodeBuild can run (queue + timeout), or a build would find its source gone."""
    result = run()
    lifecycle = result.one("aws:s3/bucketLifecycleConfiguration:BucketLifecycleConfiguration")
    assert lifecycle.inputs["bucket"] == f"{result.one('aws:s3/bucket:Bucket').name}-id"
    (rule,) = lifecycle.inputs["rules"]
    assert rule["status"] == "Enabled"
    key = result.one("aws:s3/bucketObjectv2:BucketObjectv2").inputs["key"]
    assert key.startswith(rule["filter"]["prefix"]) and rule["filter"]["prefix"] == "sources/"
    days = rule["expiration"]["days"]
    longest_build_minutes = QUEUED_TIMEOUT_MINUTES + max_build_timeout_minutes()
    assert days * 24 * 60 > longest_build_minutes
    assert rule["noncurrentVersionExpiration"]["noncurrentDays"] >= 1
    assert rule["abortIncompleteMultipartUpload"]["daysAfterInitiation"] == 1


def test_a_new_image_uploads_its_own_archive(run: Callable[..., Evaluation]) -> None:
    """Same sources, other build settings: a new key, so the new build never reads an archive
    uploaded (and perhaps expired) long ago."""

    def key(config: dict[str, Any]) -> str:
        return str(run(config).one("aws:s3/bucketObjectv2:BucketObjectv2").inputs["key"])

    assert key({}) != key({"efaInstallerVersion": "1.50.0"})
    assert key({}) == key({"keepLastImages": 3})


def max_build_timeout_minutes() -> int:
    """The largest `image.buildTimeoutMinutes` the config accepts (CodeBuild's own limit)."""
    field = ImageConfig.model_fields["build_timeout_minutes"]
    (limit,) = [m.le for m in field.metadata if getattr(m, "le", None) is not None]
    return int(limit)


def test_codebuild_project_is_privileged_sized_and_logged(
    run: Callable[..., Evaluation], tmp_path: Path
) -> None:
    result = run({"computeType": "BUILD_GENERAL1_2XLARGE", "buildTimeoutMinutes": 90})
    project = result.one("aws:codebuild/project:Project")
    environment = project.inputs["environment"]
    assert environment["privilegedMode"] is True
    assert environment["computeType"] == "BUILD_GENERAL1_2XLARGE"
    assert project.inputs["buildTimeout"] == 90
    names = [v["name"] for v in environment["environmentVariables"]]
    assert sorted(names) == sorted(PROJECT_ENVIRONMENT_KEYS)
    values = {v["name"]: v["value"] for v in environment["environmentVariables"]}
    repository = result.one("aws:ecr/repository:Repository")
    assert values["REPOSITORY_URI"] == repository.outputs["repositoryUrl"]
    assert values["BASE_IMAGE"] == ImageConfig().base_image
    assert project.inputs["source"]["type"] == "S3"
    assert project.inputs["source"]["buildspec"] == BUILDSPEC_PATH
    assert (REPO / BUILDSPEC_PATH).is_file()
    upload = result.one("aws:s3/bucketObjectv2:BucketObjectv2")
    assert project.inputs["source"]["location"].endswith("/" + upload.inputs["key"])
    log_group = result.one("aws:cloudwatch/logGroup:LogGroup")
    assert log_group.inputs["retentionInDays"] == 30
    assert project.inputs["logsConfig"]["cloudwatchLogs"] == {
        "groupName": log_group.inputs["name"],
        "status": "ENABLED",
    }
    role = result.one("aws:iam/role:Role")
    assert project.inputs["serviceRole"] == role.outputs["arn"]
    assert result.depends_on(project, result.one("aws:iam/rolePolicy:RolePolicy"))


def test_role_is_scoped_to_its_repository_bucket_and_log_group(
    run: Callable[..., Evaluation],
) -> None:
    result = run()
    statements = policy_statements(result)
    repository = result.one("aws:ecr/repository:Repository").outputs["arn"]
    bucket = result.one("aws:s3/bucket:Bucket").outputs["arn"]
    log_group = result.one("aws:cloudwatch/logGroup:LogGroup").outputs["arn"]
    for statement in statements:
        actions = as_list(statement["Action"])
        resources = as_list(statement["Resource"])
        assert statement["Effect"] == "Allow"
        assert not any(a == "*" or a.endswith(":*") for a in actions), statement
        if "*" in resources:
            assert actions == ["ecr:GetAuthorizationToken"], statement
        for arn in resources:
            assert arn == "*" or arn.startswith((repository, bucket, log_group)), arn
    by_sid = {s["Sid"]: s for s in statements}
    assert "ecr:PutImage" in by_sid["PushAndCacheTrainerImage"]["Action"]
    assert as_list(by_sid["ReadBuildSource"]["Resource"]) == [f"{bucket}/sources/*"]
    assert "PullBaseImage" not in by_sid  # the default base is on nvcr.io, not ECR
    assume = json.loads(result.one("aws:iam/role:Role").inputs["assumeRolePolicy"])
    (trust,) = assume["Statement"]
    assert trust["Principal"] == {"Service": "codebuild.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": "123456789012"}}


def test_build_logs_go_to_an_owned_group_the_role_may_fully_write(
    run: Callable[..., Evaluation],
) -> None:
    """CodeBuild's service role needs logs:CreateLogGroup, CreateLogStream and PutLogEvents
    (docs.aws.amazon.com/codebuild/latest/userguide/setting-up-service-role.html, the
    CloudWatchLogsPolicy statement; aws-cdk grants the same three on /aws/codebuild/<project>).
    The group is the project's default name, owned with a retention (so `destroy` removes it
    and CodeBuild never makes one without retention), and the grants reach nothing else."""
    result = run()
    project = result.one("aws:codebuild/project:Project")
    log_group = result.one("aws:cloudwatch/logGroup:LogGroup")
    assert log_group.inputs["name"] == f"/aws/codebuild/{project.inputs['name']}"
    assert log_group.inputs["retentionInDays"] == 30
    assert result.depends_on(project, log_group)
    arn = log_group.outputs["arn"]
    logs = [
        s
        for s in policy_statements(result)
        if any(a.startswith("logs:") for a in as_list(s["Action"]))
    ]
    assert len(logs) == 1
    assert sorted(as_list(logs[0]["Action"])) == [
        "logs:CreateLogGroup",
        "logs:CreateLogStream",
        "logs:PutLogEvents",
    ]
    assert sorted(as_list(logs[0]["Resource"])) == [arn, f"{arn}:*"]


def test_an_ecr_base_image_may_be_pulled_and_nothing_else(
    run: Callable[..., Evaluation],
) -> None:
    statements = {s["Sid"]: s for s in policy_statements(run({"baseImage": DLC}))}
    pull = statements["PullBaseImage"]
    assert as_list(pull["Resource"]) == [
        "arn:aws:ecr:us-west-2:763104351884:repository/pytorch-training"
    ]
    assert "ecr:PutImage" not in pull["Action"]


def test_build_runs_for_the_content_tag_and_pins_the_digest(
    run: Callable[..., Evaluation], tmp_path: Path
) -> None:
    result = run()
    build = result.one("pulumi-python:dynamic/image:ImageBuild")
    archive = write_source_archive(REPO, tmp_path / "check")
    settings = build_settings(ImageConfig())
    expected = "src-" + build_fingerprint(archive.image_sha256, settings)[:24]
    assert build.inputs["image_tag"] == expected
    assert build.inputs["source_hash"] == archive.image_sha256
    project = result.one("aws:codebuild/project:Project")
    assert build.inputs["project_name"] == project.inputs["name"]
    assert build.inputs["source_location"] == project.inputs["source"]["location"]
    assert build.inputs["region"] == "us-west-2"
    assert build.inputs["timeout_minutes"] == 60
    assert result.depends_on(build, project)
    assert result.depends_on(build, result.one("aws:iam/rolePolicy:RolePolicy"))
    repository_url = result.one("aws:ecr/repository:Repository").outputs["repositoryUrl"]
    image_uri = result.stack_outputs["image_uri"]
    assert image_uri.startswith(repository_url + "@sha256:")
    assert len(image_uri.split("@sha256:")[1]) == 64


def test_tag_changes_with_build_settings_only(run: Callable[..., Evaluation]) -> None:
    def tag(config: dict[str, Any]) -> str:
        build = run(config).one("pulumi-python:dynamic/image:ImageBuild")
        return str(build.inputs["image_tag"])

    base = tag({})
    assert tag({"keepLastImages": 3, "computeType": "BUILD_GENERAL1_XLARGE"}) == base
    assert tag({"baseImage": DLC}) != base
    assert tag({"efaInstallerVersion": "1.50.0"}) != base
    assert tag({"smokeTestLevel": "full"}) != base


def test_a_bad_name_prefix_is_refused(run: Callable[..., Evaluation]) -> None:
    with pytest.raises(ValueError, match="name_prefix='Team_A'"):
        run(name_prefix="Team_A")
