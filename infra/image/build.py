"""The image build as a Pulumi resource: `pulumi up` starts CodeBuild, waits, and gets a digest.

`CodeBuildImageBuilder` is plain boto3 (testable against moto); `ImageBuildProvider` /
`ImageBuild` is the Pulumi dynamic provider around it, triggered only by the content tag.
Deleting it leaves pushed images alone. The deployer needs codebuild:StartBuild,
BatchGetBuilds, ListBuildsForProject, ecr:DescribeImages, logs:GetLogEvents and s3:GetObject.
Why: docs/design/image.md#build
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import boto3  # type: ignore[import-untyped, unused-ignore]
import pulumi
from botocore.exceptions import ClientError  # type: ignore[import-untyped, unused-ignore]
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

logger = logging.getLogger(__name__)

SUCCEEDED = "SUCCEEDED"
IN_PROGRESS = "IN_PROGRESS"
QUEUE_ALLOWANCE_MINUTES = 60
"""How long past the build timeout `pulumi up` keeps waiting (a build can sit in the queue)."""

DEFAULT_POLL_SECONDS = 20.0
"""A CodeBuild phase lasts minutes; polling faster only spends API quota."""

RECENT_BUILDS = 20
"""How many of the project's latest builds are checked for one already building the tag."""

SETUP_PHASES = ("SUBMITTED", "QUEUED", "PROVISIONING", "DOWNLOAD_SOURCE")
"""CodeBuild's phases before the buildspec's own commands start."""

TRIGGER_KEYS = ("image_tag", "repository_name")
"""Inputs whose change means a different image; every other input is bookkeeping."""


class ImageBuildError(RuntimeError):
    """The image could not be built or found; the message is what the user needs to act on."""


@dataclass(frozen=True)
class BuildRequest:
    """One image to build, as the CodeBuild project and the ECR repository know it."""

    project_name: str
    repository_name: str
    image_tag: str
    source_location: str
    """`bucket/key` of the source archive in S3."""
    source_hash: str
    log_group_name: str
    timeout_minutes: int
    source_urn: str = ""
    """The Pulumi URN of the archive's bucket object, for the refresh that re-uploads it."""


@dataclass(frozen=True)
class BuiltImage:
    digest: str
    build_id: str | None
    """None when the image already existed and nothing was built."""


def _client_error_code(error: ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


class CodeBuildImageBuilder:
    """Builds (or finds) one image with CodeBuild and ECR; every AWS call goes through boto3."""

    def __init__(
        self,
        *,
        session: boto3.Session,
        endpoint_url: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        heartbeat_seconds: float = 300.0,
        log_tail_lines: int = 60,
        retry_seconds: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._codebuild = session.client("codebuild", endpoint_url=endpoint_url)
        self._ecr = session.client("ecr", endpoint_url=endpoint_url)
        self._logs = session.client("logs", endpoint_url=endpoint_url)
        self._s3 = session.client("s3", endpoint_url=endpoint_url)
        self._poll_seconds = poll_seconds
        self._heartbeat_seconds = heartbeat_seconds
        self._log_tail_lines = log_tail_lines
        self._retry_seconds = retry_seconds
        self._sleep = sleep
        self._clock = clock

    def existing_digest(self, repository_name: str, image_tag: str) -> str | None:
        """The digest of `repository:tag` if that image was pushed already, else None."""
        try:
            response = self._ecr.describe_images(
                repositoryName=repository_name, imageIds=[{"imageTag": image_tag}]
            )
        except ClientError as error:
            if _client_error_code(error) == "ImageNotFoundException":
                return None
            raise
        details = response.get("imageDetails", [])
        return str(details[0]["imageDigest"]) if details else None

    def in_flight(self, request: BuildRequest) -> str | None:
        """A running build of the same content tag (an interrupted `pulumi up` left it), if any.

        Waiting for it instead of starting a second one avoids two builds racing to push one
        immutable tag, the loser of which would fail.
        """
        ids = self._codebuild.list_builds_for_project(
            projectName=request.project_name, sortOrder="DESCENDING"
        ).get("ids", [])[:RECENT_BUILDS]
        if not ids:
            return None
        for build in self._codebuild.batch_get_builds(ids=ids).get("builds", []):
            variables = build.get("environment", {}).get("environmentVariables", [])
            tags = {v.get("value") for v in variables if v.get("name") == "IMAGE_TAG"}
            if build.get("buildStatus") == IN_PROGRESS and request.image_tag in tags:
                return str(build["id"])
        return None

    def check_source(self, request: BuildRequest) -> None:
        """Fail with what to do when the source archive is gone, before a build is started.

        The source bucket's lifecycle expires archives (infra/image/trainer_image.py
        SOURCE_ARCHIVE_DAYS), while Pulumi's state still lists the uploaded object: a build retried
        after that
        would fail in DOWNLOAD_SOURCE. A refresh drops the object from the state and the
        next `up` uploads it again. Only a definite "not found" stops here: without
        s3:ListBucket S3 answers 403 for a missing key too, and then CodeBuild decides.
        """
        bucket, _, key = request.source_location.partition("/")
        try:
            self._s3.head_object(Bucket=bucket, Key=key)
        except ClientError as error:
            if _client_error_code(error) in ("404", "NoSuchKey", "NoSuchBucket"):
                # Only this object: a whole-stack refresh would also drop a finished
                # PyTorchJob its ttlSecondsAfterFinished deleted, and `up` would run it again.
                target = request.source_urn or "<the source archive's BucketObjectv2 URN>"
                raise ImageBuildError(
                    f"the image build's source s3://{bucket}/{key} no longer exists (the "
                    f"source bucket expires build archives); run `pulumi refresh --target "
                    f"'{target}'` so Pulumi forgets it, then `pulumi up` uploads it again"
                ) from error
            logger.info("could not check s3://%s/%s (%s); starting anyway", bucket, key, error)

    def start(self, request: BuildRequest) -> str:
        response = self._codebuild.start_build(
            projectName=request.project_name,
            sourceTypeOverride="S3",
            sourceLocationOverride=request.source_location,
            timeoutInMinutesOverride=request.timeout_minutes,
            environmentVariablesOverride=[
                {"name": "IMAGE_TAG", "value": request.image_tag, "type": "PLAINTEXT"},
                {"name": "SOURCE_HASH", "value": request.source_hash, "type": "PLAINTEXT"},
            ],
        )
        build_id = str(response["build"]["id"])
        logger.info("started CodeBuild build %s for %s", build_id, request.image_tag)
        return build_id

    def wait(self, build_id: str, *, timeout_minutes: int) -> dict[str, Any]:
        """Poll until the build leaves IN_PROGRESS; log each phase change and a heartbeat."""
        started = self._clock()
        deadline = started + (timeout_minutes + QUEUE_ALLOWANCE_MINUTES) * 60
        last_phase = None
        last_report = started
        while True:
            builds = self._codebuild.batch_get_builds(ids=[build_id]).get("builds", [])
            if not builds:
                raise ImageBuildError(f"CodeBuild does not know build {build_id}")
            build: dict[str, Any] = builds[0]
            status = build.get("buildStatus", IN_PROGRESS)
            phase = build.get("currentPhase")
            now = self._clock()
            elapsed = _minutes_seconds(now - started)
            if phase != last_phase or now - last_report >= self._heartbeat_seconds:
                logger.info("build %s: %s (%s, %s elapsed)", build_id, phase, status, elapsed)
                last_phase, last_report = phase, now
            if status != IN_PROGRESS:
                return build
            if now >= deadline:
                raise ImageBuildError(
                    f"build {build_id} still {phase} after {elapsed}; gave up waiting (the "
                    f"build's own timeout is {timeout_minutes} min). Check the CodeBuild console."
                )
            self._sleep(self._poll_seconds)

    def log_tail(self, build: Mapping[str, Any], *, log_group_name: str) -> list[str]:
        """The last lines of the build's CloudWatch log (CodeBuild names the stream by the
        build's UUID when the build record does not say)."""
        logs = build.get("logs") or {}
        group = logs.get("groupName") or log_group_name
        stream = logs.get("streamName") or str(build["id"]).split(":", 1)[-1]
        try:
            events = self._logs.get_log_events(
                logGroupName=group,
                logStreamName=stream,
                startFromHead=False,
                limit=self._log_tail_lines,
            )["events"]
        except ClientError as error:
            if _client_error_code(error) == "ResourceNotFoundException":
                return [f"(no log stream {group}/{stream}: the build failed before logging)"]
            raise
        return [str(event["message"]).rstrip("\n") for event in events]

    def failure_message(self, build: Mapping[str, Any], *, log_group_name: str) -> str:
        failed = [
            phase
            for phase in build.get("phases", [])
            if phase.get("phaseStatus") not in (None, SUCCEEDED)
        ]
        where = ", ".join(
            f"{p['phaseType']} {p['phaseStatus']}: "
            + "; ".join(c.get("message", "") for c in p.get("contexts", []) if c.get("message"))
            for p in failed
        )
        tail = self.log_tail(build, log_group_name=log_group_name)
        return (
            f"image build {build['id']} {build.get('buildStatus')}"
            + (f" ({where})" if where else "")
            + f"\n--- last {len(tail)} lines of {log_group_name} ---\n"
            + "\n".join(tail)
        )

    def digest_of(self, build: Mapping[str, Any], request: BuildRequest) -> str:
        """The pushed image's digest, from the registry (the build's export must agree)."""
        digest = self.existing_digest(request.repository_name, request.image_tag)
        if digest is None:
            raise ImageBuildError(
                f"build {build['id']} succeeded but {request.repository_name}:"
                f"{request.image_tag} is not in ECR; was docker/buildspec.yml changed?"
            )
        exported = {
            v["name"]: v.get("value") for v in build.get("exportedEnvironmentVariables", [])
        }
        reported = exported.get("IMAGE_DIGEST")
        if reported and reported != digest:
            raise ImageBuildError(
                f"build {build['id']} reported {reported} but ECR holds {digest} for "
                f"{request.image_tag}; refusing to pin an image that is not the one built"
            )
        return digest

    def build(self, request: BuildRequest) -> BuiltImage:
        """Build `request` unless its content tag is already in ECR; return the digest."""
        digest = self.existing_digest(request.repository_name, request.image_tag)
        if digest is not None:
            logger.info(
                "%s:%s already built: %s", request.repository_name, request.image_tag, digest
            )
            return BuiltImage(digest=digest, build_id=None)
        build_id = self.in_flight(request)
        if build_id is not None:
            logger.info(
                "build %s for %s is already running; waiting for it", build_id, request.image_tag
            )
        else:
            self.check_source(request)
            build_id = self.start(request)
        build = self.wait(build_id, timeout_minutes=request.timeout_minutes)
        if build.get("buildStatus") != SUCCEEDED and failed_before_buildspec(build):
            # A role or policy created moments ago may not have reached every IAM endpoint;
            # CodeBuild then fails to fetch the source before any of our commands ran.
            logger.info("build %s failed before the buildspec ran; retrying once", build_id)
            self._sleep(self._retry_seconds)
            build_id = self.start(request)
            build = self.wait(build_id, timeout_minutes=request.timeout_minutes)
        if build.get("buildStatus") != SUCCEEDED:
            raise ImageBuildError(
                self.failure_message(build, log_group_name=request.log_group_name)
            )
        digest = self.digest_of(build, request)
        logger.info("built %s:%s -> %s", request.repository_name, request.image_tag, digest)
        return BuiltImage(digest=digest, build_id=build_id)


def failed_before_buildspec(build: Mapping[str, Any]) -> bool:
    """Whether the build failed while CodeBuild was still setting up (no command of ours ran)."""
    return any(
        phase.get("phaseStatus") not in (None, SUCCEEDED) and phase.get("phaseType") in SETUP_PHASES
        for phase in build.get("phases", [])
    )


def _minutes_seconds(seconds: float) -> str:
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60:02d}s"


# --- Pulumi dynamic provider ---------------------------------------------------------------

_INPUT_KEYS = (
    "project_name",
    "repository_name",
    "repository_url",
    "image_tag",
    "source_location",
    "source_hash",
    "source_urn",
    "log_group_name",
    "timeout_minutes",
    "region",
    "aws_profile",
    "endpoint_url",
    "poll_seconds",
)


def _request(props: Mapping[str, Any]) -> BuildRequest:
    return BuildRequest(
        project_name=props["project_name"],
        repository_name=props["repository_name"],
        image_tag=props["image_tag"],
        source_location=props["source_location"],
        source_hash=props["source_hash"],
        log_group_name=props["log_group_name"],
        timeout_minutes=int(props["timeout_minutes"]),
        source_urn=str(props.get("source_urn") or ""),
    )


def _send_progress_to_pulumi() -> None:
    """The dynamic provider has no engine connection; its stderr lines reach `pulumi up`."""
    if not any(getattr(h, "_fsdp_eks", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("image build: %(message)s"))
        handler._fsdp_eks = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class ImageBuildProvider(ResourceProvider):
    """CRUD for `ImageBuild`; holds no state of its own, so it pickles by reference."""

    serialize_as_secret_always = False  # it captures no secret, so state stays readable

    def builder(self, props: Mapping[str, Any]) -> CodeBuildImageBuilder:
        session = boto3.Session(profile_name=props.get("aws_profile"), region_name=props["region"])
        poll = props.get("poll_seconds")  # 0 is a setting, not an absence
        return CodeBuildImageBuilder(
            session=session,
            endpoint_url=props.get("endpoint_url"),
            poll_seconds=DEFAULT_POLL_SECONDS if poll is None else float(poll),
        )

    def _build(self, props: Mapping[str, Any]) -> dict[str, Any]:
        _send_progress_to_pulumi()
        built = self.builder(props).build(_request(props))
        return {
            **{key: props.get(key) for key in _INPUT_KEYS},
            "image_digest": built.digest,
            "image_uri": f"{props['repository_url']}@{built.digest}",
            "build_id": built.build_id or "",
        }

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._build(props)
        return CreateResult(id_=f"{props['repository_name']}:{props['image_tag']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in TRIGGER_KEYS if olds.get(key) != news.get(key)]
        return DiffResult(
            changes=bool(changed), replaces=[], stables=[], delete_before_replace=False
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._build(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing to undo: the image stays until the repository's lifecycle policy retires it."""


class ImageBuild(pulumi.dynamic.Resource, module="image", name="ImageBuild"):
    """A built image: `image_uri` is `repository@sha256:...` of the image for `image_tag`."""

    image_digest: pulumi.Output[str]
    image_uri: pulumi.Output[str]
    build_id: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        project_name: pulumi.Input[str],
        repository_name: pulumi.Input[str],
        repository_url: pulumi.Input[str],
        image_tag: pulumi.Input[str],
        source_location: pulumi.Input[str],
        source_hash: pulumi.Input[str],
        source_urn: pulumi.Input[str],
        log_group_name: pulumi.Input[str],
        timeout_minutes: int,
        region: pulumi.Input[str],
        aws_profile: str | None = None,
        endpoint_url: str | None = None,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "project_name": project_name,
            "repository_name": repository_name,
            "repository_url": repository_url,
            "image_tag": image_tag,
            "source_location": source_location,
            "source_hash": source_hash,
            "source_urn": source_urn,
            "log_group_name": log_group_name,
            "timeout_minutes": timeout_minutes,
            "region": region,
            "aws_profile": aws_profile,
            "endpoint_url": endpoint_url,
            "poll_seconds": poll_seconds,
            "image_digest": None,
            "image_uri": None,
            "build_id": None,
        }
        super().__init__(ImageBuildProvider(), resource_name, props, opts)
