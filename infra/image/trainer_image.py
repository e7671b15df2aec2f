"""`TrainerImage`: the trainer image the job runs, pinned by digest.

With `image.uri` set, a pass-through; otherwise it owns the pipeline: ECR repository, S3 source
bucket, source archive (`infra.image.source`), CodeBuild project and the `ImageBuild` that runs
it (`infra.image.build`). The content tag hashes the sources and every build setting, so
`image_uri` changes exactly when the image would differ. Built in `infra/program.py`; the job
gets `image.image_uri`. Details: docs/design/image.md#trainer_image
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pulumi
import pulumi_aws as aws

from infra.config.image import ImageConfig
from infra.image.build import ImageBuild
from infra.image.source import build_fingerprint, write_source_archive
from infra.job.manifest import TRAINER_USER_ID
from infra.platform.bucket import guard_bucket

REPO_ROOT = Path(__file__).resolve().parents[2]

CODEBUILD_IMAGE = "aws/codebuild/amazonlinux-x86_64-standard:5.0"
"""CodeBuild's own Amazon Linux 2023 image with Docker; the build runs Docker inside it."""

BUILDSPEC_PATH = "docker/buildspec.yml"
IMAGE_USER_ID = TRAINER_USER_ID
"""uid:gid the built image runs as (docker/Dockerfile `USER`); the job's init container hands
the run's directories on the shared volume to this uid (infra/job/manifest.py)."""
CACHE_TAG = "buildcache"
"""The one mutable tag in the repository: the last image built, moved by every build. The image
carries BuildKit's inline cache, which the next build imports from this tag (docker/buildspec.yml:
the daemon's own builder, so no BuildKit image is pulled from Docker Hub)."""
IMAGE_TAG_PREFIX = "src-"
"""Content tags start with this, which is how the lifecycle policy tells them from the cache."""
UNTAGGED_EXPIRY_DAYS = 1
QUEUED_TIMEOUT_MINUTES = 60
SOURCE_PREFIX = "sources/"
"""Key prefix of the build source archives in the source bucket (the role may read only this)."""
SOURCE_ARCHIVE_DAYS = 30
"""Days a source archive stays after upload. A build reads it within its queue time plus its
timeout (at most 60 min + 2160 min, under two days); a month also covers a failed build that
is retried by a later `pulumi up`. Each archive is named by its image tag, so every new image
uploads a fresh archive and no build waits on one uploaded long ago."""
NONCURRENT_SOURCE_DAYS = 1
"""Days an overwritten or expired archive version stays: nothing reads old versions (CodeBuild
reads the current one), they only cost storage."""
LOG_ACTIONS = ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]
"""What the build's role may do on its own log group (and nothing else in CloudWatch Logs)."""

PROJECT_ENVIRONMENT_KEYS = (
    "REPOSITORY_URI",
    "BASE_IMAGE",
    "EFA_INSTALLER_VERSION",
    "SMOKE_TEST_LEVEL",
    "CACHE_TAG",
)
"""Variables the CodeBuild project sets for docker/buildspec.yml (a test holds them together)."""

BUILD_ENVIRONMENT_KEYS = ("IMAGE_TAG", "SOURCE_HASH")
"""Variables `ImageBuild` sets per build (see `CodeBuildImageBuilder.start`)."""

_ECR_IMAGE = re.compile(
    r"^(?P<account>[0-9]{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[^:@]+)"
)
_NAME_PREFIX = re.compile(r"^[a-z0-9][a-z0-9-]{0,60}$")


@dataclass(frozen=True)
class TrainerImageArgs:
    """What `TrainerImage` needs; all of it comes from the stack config and the stack name."""

    config: ImageConfig
    name_prefix: str
    """Lowercase prefix for AWS names (repository, project, log group), unique per stack,
    e.g. `fsdp-eks-<stack>`; letters, digits and '-' only, at most 61 characters."""
    source_root: Path = REPO_ROOT
    """Repository checkout the image is built from."""
    archive_dir: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "fsdp-eks-image-source"
    )
    """Where the source archive is written before upload (content-addressed, reused)."""
    aws_profile: str | None = None
    """AWS profile the build waiter uses (the stack's `aws:profile`); None: default chain."""
    tags: Mapping[str, str] = field(default_factory=dict)
    """Tags for every AWS resource created here."""


def ecr_base_repository_arn(base_image: str, partition: str = "aws") -> str | None:
    """The ECR repository ARN of an ECR-hosted base image (an AWS DLC), else None."""
    match = _ECR_IMAGE.match(base_image)
    if match is None:
        return None
    return (
        f"arn:{partition}:ecr:{match['region']}:{match['account']}:repository/{match['repository']}"
    )


def build_settings(config: ImageConfig) -> dict[str, str]:
    """The build inputs besides the sources; they change the image, so they feed its tag."""
    return {
        "BASE_IMAGE": config.base_image,
        "EFA_INSTALLER_VERSION": config.efa_installer_version,
        "SMOKE_TEST_LEVEL": config.smoke_test_level,
    }


class TrainerImage(pulumi.ComponentResource):
    """The trainer image: `image_uri` is digest-pinned, or `image.uri` from the config as is."""

    image_uri: pulumi.Output[str]
    """`<repository>@sha256:<digest>` of the built image, or the configured `image.uri`."""
    repository_url: pulumi.Output[str] | None
    """The ECR repository (None when `image.uri` is set)."""
    image_tag: str | None
    """The content tag built (None when `image.uri` is set)."""
    source_hash: str | None
    """Hash of what the image is built from (None when `image.uri` is set)."""

    def __init__(
        self,
        name: str,
        args: TrainerImageArgs,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__("fsdp-eks:image:TrainerImage", name, None, opts)
        config = args.config
        if config.uri is not None:
            self.image_uri = pulumi.Output.from_input(config.uri)
            self.repository_url = None
            self.image_tag = None
            self.source_hash = None
            self.register_outputs({"image_uri": self.image_uri})
            return
        if not _NAME_PREFIX.match(args.name_prefix):
            raise ValueError(
                f"TrainerImageArgs.name_prefix={args.name_prefix!r} must be lowercase letters, "
                "digits and '-', at most 61 characters (it names the ECR repository)"
            )

        child = pulumi.ResourceOptions(parent=self)
        tags = dict(args.tags)
        project_name = f"{args.name_prefix}-trainer-image"

        archive = write_source_archive(args.source_root, args.archive_dir)
        settings = build_settings(config)
        self.source_hash = archive.image_sha256
        self.image_tag = IMAGE_TAG_PREFIX + build_fingerprint(archive.image_sha256, settings)[:24]

        repository = self._repository(name, args, tags, child)
        bucket, source = self._source(
            name, archive.path, f"{SOURCE_PREFIX}{self.image_tag}.zip", tags, child
        )
        log_group = aws.cloudwatch.LogGroup(
            f"{name}-build-logs",
            name=f"/aws/codebuild/{project_name}",
            retention_in_days=config.log_retention_days,
            tags=tags,
            opts=child,
        )
        role, policy = self._role(name, config, repository, bucket, log_group, tags, child)
        source_location = pulumi.Output.concat(bucket.bucket, "/", source.key)
        project_variables: dict[str, pulumi.Input[str]] = {
            "REPOSITORY_URI": repository.repository_url,
            **settings,
            "CACHE_TAG": CACHE_TAG,
        }
        project = aws.codebuild.Project(
            f"{name}-build",
            name=project_name,
            description="Builds the fsdp-eks trainer image (started by `pulumi up`).",
            service_role=role.arn,
            artifacts=aws.codebuild.ProjectArtifactsArgs(type="NO_ARTIFACTS"),
            environment=aws.codebuild.ProjectEnvironmentArgs(
                type="LINUX_CONTAINER",
                image=CODEBUILD_IMAGE,
                compute_type=config.compute_type,
                privileged_mode=True,  # the build runs the Docker daemon
                image_pull_credentials_type="CODEBUILD",
                environment_variables=[
                    aws.codebuild.ProjectEnvironmentEnvironmentVariableArgs(
                        name=key, value=value, type="PLAINTEXT"
                    )
                    for key, value in project_variables.items()
                ],
            ),
            source=aws.codebuild.ProjectSourceArgs(
                type="S3", location=source_location, buildspec=BUILDSPEC_PATH
            ),
            logs_config=aws.codebuild.ProjectLogsConfigArgs(
                cloudwatch_logs=aws.codebuild.ProjectLogsConfigCloudwatchLogsArgs(
                    group_name=log_group.name, status="ENABLED"
                ),
                s3_logs=aws.codebuild.ProjectLogsConfigS3LogsArgs(status="DISABLED"),
            ),
            build_timeout=config.build_timeout_minutes,
            queued_timeout=QUEUED_TIMEOUT_MINUTES,
            tags=tags,
            # CodeBuild checks at creation that it may assume the role with its policy.
            opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]),
        )
        region = aws.get_region_output(opts=pulumi.InvokeOutputOptions(parent=self))
        build = ImageBuild(
            f"{name}-image",
            project_name=project.name,
            repository_name=repository.name,
            repository_url=repository.repository_url,
            image_tag=self.image_tag,
            source_location=source_location,
            source_hash=archive.image_sha256,
            source_urn=source.urn,
            log_group_name=log_group.name,
            timeout_minutes=config.build_timeout_minutes,
            region=region.region,
            aws_profile=args.aws_profile,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[project, policy]),
        )
        self.repository_url = repository.repository_url
        self.image_uri = build.image_uri
        self.register_outputs(
            {
                "image_uri": self.image_uri,
                "repository_url": self.repository_url,
                "image_tag": self.image_tag,
                "source_hash": self.source_hash,
            }
        )

    def _repository(
        self,
        name: str,
        args: TrainerImageArgs,
        tags: dict[str, str],
        child: pulumi.ResourceOptions,
    ) -> aws.ecr.Repository:
        repository = aws.ecr.Repository(
            f"{name}-repository",
            name=f"{args.name_prefix}/trainer",
            image_scanning_configuration={"scan_on_push": True},
            # A tag names one image forever, except the cache tag each build moves.
            image_tag_mutability="IMMUTABLE_WITH_EXCLUSION",
            image_tag_mutability_exclusion_filters=[
                {"filter": CACHE_TAG, "filter_type": "WILDCARD"}
            ],
            encryption_configurations=[{"encryption_type": "AES256"}],
            # The repository belongs to this stack's experiment; `pulumi destroy` ends both.
            force_delete=True,
            tags=tags,
            opts=child,
        )
        aws.ecr.LifecyclePolicy(
            f"{name}-lifecycle",
            repository=repository.name,
            policy=json.dumps(lifecycle_policy(args.config.keep_last_images)),
            opts=child,
        )
        return repository

    def _source(
        self,
        name: str,
        archive_path: Path,
        key: str,
        tags: dict[str, str],
        child: pulumi.ResourceOptions,
    ) -> tuple[aws.s3.Bucket, aws.s3.BucketObjectv2]:
        bucket = aws.s3.Bucket(
            f"{name}-source",
            force_destroy=True,  # only build inputs, reproducible from the repository
            tags=tags,
            opts=child,
        )
        guards = list(guard_bucket(f"{name}-source", bucket, child))
        aws.s3.BucketLifecycleConfiguration(
            f"{name}-source-lifecycle",
            bucket=bucket.id,
            # Archives are content-addressed (nothing overwrites one), so current versions
            # must expire too; the noncurrent rule and S3 then remove them and their delete
            # markers (docs.aws.amazon.com/AmazonS3/latest/userguide/ManagingDelMarkers.html).
            # Detail: docs/design/image.md#source-archive-expiry
            rules=[
                {
                    "id": "expire-build-sources",
                    "status": "Enabled",
                    "filter": {"prefix": SOURCE_PREFIX},
                    "expiration": {"days": SOURCE_ARCHIVE_DAYS},
                    "noncurrent_version_expiration": {"noncurrent_days": NONCURRENT_SOURCE_DAYS},
                    "abort_incomplete_multipart_upload": {"days_after_initiation": 1},
                }
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=guards),
        )
        source = aws.s3.BucketObjectv2(
            f"{name}-source-archive",
            bucket=bucket.id,
            key=key,
            source=pulumi.FileAsset(str(archive_path)),
            content_type="application/zip",
            tags=tags,
            # Never upload before the bucket is private and encrypted.
            opts=pulumi.ResourceOptions(parent=self, depends_on=guards),
        )
        return bucket, source

    def _role(
        self,
        name: str,
        config: ImageConfig,
        repository: aws.ecr.Repository,
        bucket: aws.s3.Bucket,
        log_group: aws.cloudwatch.LogGroup,
        tags: dict[str, str],
        child: pulumi.ResourceOptions,
    ) -> tuple[aws.iam.Role, aws.iam.RolePolicy]:
        invoke = pulumi.InvokeOutputOptions(parent=self)
        identity = aws.get_caller_identity_output(opts=invoke)
        partition = aws.get_partition_output(opts=invoke)
        assume = aws.iam.get_policy_document_output(
            statements=identity.account_id.apply(assume_role_statements), opts=invoke
        )
        role = aws.iam.Role(
            f"{name}-build-role",
            assume_role_policy=assume.json,
            description="CodeBuild role of the fsdp-eks trainer image build",
            tags=tags,
            opts=child,
        )
        statements = pulumi.Output.all(
            log_group=log_group.arn,
            bucket=bucket.arn,
            repository=repository.arn,
            partition=partition.partition,
        ).apply(
            lambda arns: role_statements(
                log_group_arn=arns["log_group"],
                bucket_arn=arns["bucket"],
                repository_arn=arns["repository"],
                base_repository_arn=ecr_base_repository_arn(config.base_image, arns["partition"]),
            )
        )
        policy = aws.iam.RolePolicy(
            f"{name}-build-policy",
            role=role.id,
            policy=aws.iam.get_policy_document_output(statements=statements, opts=invoke).json,
            opts=child,
        )
        return role, policy


def assume_role_statements(account_id: str) -> list[aws.iam.GetPolicyDocumentStatementArgsDict]:
    """CodeBuild may assume the role, for builds in this account only (confused deputy)."""
    return [
        {
            "actions": ["sts:AssumeRole"],
            "principals": [{"type": "Service", "identifiers": ["codebuild.amazonaws.com"]}],
            "conditions": [
                {"test": "StringEquals", "variable": "aws:SourceAccount", "values": [account_id]}
            ],
        }
    ]


def role_statements(
    *,
    log_group_arn: str,
    bucket_arn: str,
    repository_arn: str,
    base_repository_arn: str | None,
) -> list[aws.iam.GetPolicyDocumentStatementArgsDict]:
    """What the build may do: write its log, read its source, push to its own repository."""
    statements: list[aws.iam.GetPolicyDocumentStatementArgsDict] = [
        {
            # CodeBuild's documented minimum for logs, scoped to the one group owned here
            # (https://docs.aws.amazon.com/codebuild/latest/userguide/
            # setting-up-service-role.html). Detail: docs/design/image.md#build-log-permissions
            "sid": "BuildLogs",
            "actions": LOG_ACTIONS,
            "resources": [log_group_arn, f"{log_group_arn}:*"],
        },
        {
            "sid": "ReadBuildSource",
            "actions": ["s3:GetObject", "s3:GetObjectVersion"],
            "resources": [f"{bucket_arn}/{SOURCE_PREFIX}*"],
        },
        {
            "sid": "LocateBuildSource",
            "actions": ["s3:GetBucketAcl", "s3:GetBucketLocation"],
            "resources": [bucket_arn],
        },
        {
            # The registry login token has no resource-level permission in IAM.
            "sid": "RegistryLogin",
            "actions": ["ecr:GetAuthorizationToken"],
            "resources": ["*"],
        },
        {
            "sid": "PushAndCacheTrainerImage",
            "actions": [
                "ecr:BatchCheckLayerAvailability",
                "ecr:BatchGetImage",
                "ecr:CompleteLayerUpload",
                "ecr:DescribeImages",
                "ecr:GetDownloadUrlForLayer",
                "ecr:InitiateLayerUpload",
                "ecr:PutImage",
                "ecr:UploadLayerPart",
            ],
            "resources": [repository_arn],
        },
    ]
    if base_repository_arn is not None:
        statements.append(
            {
                "sid": "PullBaseImage",
                "actions": [
                    "ecr:BatchCheckLayerAvailability",
                    "ecr:BatchGetImage",
                    "ecr:GetDownloadUrlForLayer",
                ],
                "resources": [base_repository_arn],
            }
        )
    return statements


def lifecycle_policy(keep_last_images: int) -> dict[str, object]:
    """ECR lifecycle rules: untagged leftovers go after a day; only the newest N images stay."""
    return {
        "rules": [
            {
                "rulePriority": 1,
                "description": "untagged manifests (replaced build caches) after a day",
                "selection": {
                    "tagStatus": "untagged",
                    "countType": "sinceImagePushed",
                    "countUnit": "days",
                    "countNumber": UNTAGGED_EXPIRY_DAYS,
                },
                "action": {"type": "expire"},
            },
            {
                "rulePriority": 2,
                "description": f"keep the last {keep_last_images} trainer images",
                "selection": {
                    "tagStatus": "tagged",
                    "tagPrefixList": [IMAGE_TAG_PREFIX],
                    "countType": "imageCountMoreThan",
                    "countNumber": keep_last_images,
                },
                "action": {"type": "expire"},
            },
        ]
    }
