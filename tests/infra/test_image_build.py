"""The image-build provider's AWS logic, against moto running as a server on loopback.

Every call goes over HTTP from boto3 to a real `moto.server.ThreadedMotoServer`. One gap of
moto 5 (CodeBuild builds that always succeed at once) is bridged by `scripted_builds`.
The gap and the bridge: docs/design/tests.md#test_image_build
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import boto3  # type: ignore[import-untyped, unused-ignore]
import dill  # type: ignore[import-untyped, unused-ignore]
import pytest
from moto.codebuild.models import CodeBuildBackend
from moto.ecr.models import ecr_backends
from pulumi.dynamic.dynamic import serialize_provider

from infra.image.build import (
    BuildRequest,
    CodeBuildImageBuilder,
    ImageBuildError,
    ImageBuildProvider,
)
from tests.s3_server import moto_server_endpoint

ACCOUNT = "123456789012"
REGION = "us-west-2"
PROJECT = "trainer-image"
REPOSITORY = "fsdp-eks/trainer"
LOG_GROUP = "/aws/codebuild/trainer-image"
TAG = "src-0123456789abcdef01234567"
NOW_MS = int(time.time() * 1000)  # CloudWatch drops events older than 14 days
SOURCE_BUCKET = "source-bucket"
SOURCE_KEY = "sources/image-source-abc.zip"
SOURCE_URN = (
    "urn:pulumi:dev::fsdp-eks::fsdp-eks:image:TrainerImage$aws:s3/bucketObjectv2:BucketObjectv2"
    "::exp-source"
)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per call
    with moto_server_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def session(monkeypatch: pytest.MonkeyPatch) -> boto3.Session:
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    return boto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=REGION
    )


@pytest.fixture
def aws(moto_endpoint: str, session: boto3.Session) -> dict[str, Any]:
    """Fresh moto state with the repository, project and log group `TrainerImage` creates."""
    reset = urllib.request.Request(f"{moto_endpoint}/moto-api/reset", method="POST")
    urllib.request.urlopen(reset).close()
    clients = {
        name: session.client(name, endpoint_url=moto_endpoint)
        for name in ("ecr", "codebuild", "logs", "iam", "s3")
    }
    clients["s3"].create_bucket(
        Bucket=SOURCE_BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION}
    )
    clients["s3"].put_object(Bucket=SOURCE_BUCKET, Key=SOURCE_KEY, Body=b"PK\x05\x06" + bytes(18))
    clients["ecr"].create_repository(repositoryName=REPOSITORY)
    clients["logs"].create_log_group(logGroupName=LOG_GROUP)
    clients["codebuild"].create_project(
        name=PROJECT,
        source={"type": "S3", "location": "source-bucket/sources/old.zip"},
        artifacts={"type": "NO_ARTIFACTS"},
        environment={
            "type": "LINUX_CONTAINER",
            "image": "aws/codebuild/amazonlinux-x86_64-standard:5.0",
            "computeType": "BUILD_GENERAL1_LARGE",
            "privilegedMode": True,
        },
        serviceRole=f"arn:aws:iam::{ACCOUNT}:role/trainer-image-build",
    )
    return clients


def make_builder(
    session: boto3.Session, endpoint: str, *, step: int = 30, **kwargs: Any
) -> CodeBuildImageBuilder:
    clock = iter(range(0, 10**6, step))  # each poll is `step` s later, without sleeping
    return CodeBuildImageBuilder(
        session=session,
        endpoint_url=endpoint,
        sleep=lambda _seconds: None,
        clock=lambda: float(next(clock)),
        **kwargs,
    )


def request(**overrides: Any) -> BuildRequest:
    values: dict[str, Any] = {
        "project_name": PROJECT,
        "repository_name": REPOSITORY,
        "image_tag": TAG,
        "source_location": f"{SOURCE_BUCKET}/{SOURCE_KEY}",
        "source_hash": "abc",
        "log_group_name": LOG_GROUP,
        "timeout_minutes": 60,
        "source_urn": SOURCE_URN,
    }
    values.update(overrides)
    return BuildRequest(**values)


def push_image(tag: str, layer: str = "layer") -> str:
    """What the buildspec's `docker push` leaves in ECR; returns the digest ECR assigns."""
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"digest": "sha256:" + "c" * 64, "size": 7},
            "layers": [{"digest": "sha256:" + layer.encode().hex().ljust(64, "0"), "size": 9}],
        }
    )
    image = ecr_backends[ACCOUNT][REGION].put_image(REPOSITORY, manifest, tag)
    return str(image.get_image_digest())


State = tuple[str, str]  # (currentPhase, buildStatus)


@pytest.fixture
def scripted_builds(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[list[str]]]:
    """Make moto's stored builds advance through `states`, one state per poll.

    Returns a function `script(states, *, logs=None, exported=None, push_tag=None)`; the
    list it returns collects, per poll, the phases moto served (for assertions on polling).
    """
    served: list[list[str]] = []

    def script(
        states: list[State],
        *,
        logs: dict[str, str] | None = None,
        exported: dict[str, str] | None = None,
        push_tag: str | None = None,
        failed_phase_message: str | None = None,
        later: list[State] | None = None,
        image_tag: str | None = None,
    ) -> list[list[str]]:
        polls: dict[str, int] = {}
        pushed: set[str] = set()
        first: list[str] = []

        def batch_get_builds(self: CodeBuildBackend, ids: list[str]) -> list[dict[str, Any]]:
            found = []
            for history in self.build_metadata_history.values():
                for build in history:
                    if build["id"] not in ids:
                        continue
                    if build.get("buildComplete"):  # a finished build stays as it ended
                        found.append(build)
                        continue
                    first[:] = first or [build["id"]]
                    script = states if later is None or build["id"] == first[0] else later
                    index = min(polls.get(build["id"], 0), len(script) - 1)
                    polls[build["id"]] = index + 1
                    phase, status = script[index]
                    build["currentPhase"], build["buildStatus"] = phase, status
                    build["buildComplete"] = status != "IN_PROGRESS"
                    if status == "FAILED":
                        build["phases"] = [
                            {
                                "phaseType": phase,
                                "phaseStatus": "FAILED",
                                "contexts": [
                                    {
                                        "statusCode": "COMMAND_EXECUTION_ERROR",
                                        "message": failed_phase_message or "exit status 1",
                                    }
                                ],
                            },
                        ]
                    if logs is not None:
                        build["logs"] = {**build["logs"], **logs}
                    if image_tag is not None:  # moto drops start_build's overrides
                        build["environment"]["environmentVariables"] = [
                            {"name": "IMAGE_TAG", "value": image_tag, "type": "PLAINTEXT"}
                        ]
                    if status == "SUCCEEDED":
                        if push_tag is not None and build["id"] not in pushed:
                            pushed.add(build["id"])
                            push_image(push_tag, layer=push_tag)
                        if exported is not None:
                            build["exportedEnvironmentVariables"] = [
                                {"name": k, "value": v} for k, v in exported.items()
                            ]
                    found.append(build)
            served.append([b["currentPhase"] for b in found])
            return found

        monkeypatch.setattr(CodeBuildBackend, "batch_get_builds", batch_get_builds)
        return served

    return script


def started_builds(aws: dict[str, Any]) -> list[dict[str, Any]]:
    ids = aws["codebuild"].list_builds_for_project(projectName=PROJECT)["ids"]
    return aws["codebuild"].batch_get_builds(ids=ids)["builds"] if ids else []


# --- moto as it ships ------------------------------------------------------------------------


def test_existing_tag_is_reported_without_starting_a_build(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str
) -> None:
    digest = push_image(TAG)
    built = make_builder(session, moto_endpoint).build(request())
    assert (built.digest, built.build_id) == (digest, None)
    assert aws["codebuild"].list_builds_for_project(projectName=PROJECT)["ids"] == []


def test_existing_digest_is_none_for_an_unknown_tag(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str
) -> None:
    push_image("src-other")
    assert make_builder(session, moto_endpoint).existing_digest(REPOSITORY, TAG) is None


def test_success_without_the_pushed_tag_is_an_error(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str
) -> None:
    """Unpatched moto: the build 'succeeds' at once but nothing was pushed under the tag."""
    with pytest.raises(ImageBuildError, match=f"{REPOSITORY}:{TAG} is not in ECR"):
        make_builder(session, moto_endpoint).build(request())
    (build,) = aws["codebuild"].list_builds_for_project(projectName=PROJECT)["ids"]
    assert build.startswith(f"{PROJECT}:")


@pytest.mark.parametrize("gone", ["object", "bucket"])
def test_an_expired_source_archive_stops_before_a_build_with_what_to_do(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str, gone: str
) -> None:
    """The source bucket's lifecycle expires archives while Pulumi's state still lists them;
    a retried build would fail in DOWNLOAD_SOURCE (and be retried once for nothing)."""
    aws["s3"].delete_object(Bucket=SOURCE_BUCKET, Key=SOURCE_KEY)
    if gone == "bucket":
        aws["s3"].delete_bucket(Bucket=SOURCE_BUCKET)
    with pytest.raises(ImageBuildError, match="no longer exists") as error:
        make_builder(session, moto_endpoint).build(request())
    # Only the archive is refreshed: a whole-stack refresh would forget a finished job its TTL
    # deleted, and the next `up` would launch the run again.
    assert f"`pulumi refresh --target '{SOURCE_URN}'`" in str(error.value)
    assert aws["codebuild"].list_builds_for_project(projectName=PROJECT)["ids"] == []


def test_log_tail_reads_the_stream_named_after_the_build(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str
) -> None:
    builder = make_builder(session, moto_endpoint, log_tail_lines=3)
    build_id = builder.start(request())
    stream = build_id.split(":", 1)[1]  # CodeBuild's stream name: the build's UUID
    aws["logs"].create_log_stream(logGroupName=LOG_GROUP, logStreamName=stream)
    aws["logs"].put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName=stream,
        logEvents=[{"timestamp": NOW_MS + i, "message": f"line {i}"} for i in range(5)],
    )
    build = aws["codebuild"].batch_get_builds(ids=[build_id])["builds"][0]
    assert builder.log_tail(build, log_group_name=LOG_GROUP) == ["line 2", "line 3", "line 4"]


def test_log_tail_without_a_stream_says_so(
    aws: dict[str, Any], session: boto3.Session, moto_endpoint: str
) -> None:
    builder = make_builder(session, moto_endpoint)
    build_id = builder.start(request())
    build = aws["codebuild"].batch_get_builds(ids=[build_id])["builds"][0]
    (line,) = builder.log_tail(build, log_group_name=LOG_GROUP)
    assert "failed before logging" in line


# --- scripted CodeBuild states ---------------------------------------------------------------


def test_start_poll_success_reports_the_registry_digest(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    served = scripted_builds(
        [
            ("QUEUED", "IN_PROGRESS"),
            ("PROVISIONING", "IN_PROGRESS"),
            ("BUILD", "IN_PROGRESS"),
            ("BUILD", "IN_PROGRESS"),
            ("COMPLETED", "SUCCEEDED"),
        ],
        push_tag=TAG,
    )
    caplog.set_level(logging.INFO, logger="infra.image.build")
    built = make_builder(session, moto_endpoint).build(request())

    assert built.digest.startswith("sha256:")
    assert (
        built.digest
        == aws["ecr"].describe_images(repositoryName=REPOSITORY, imageIds=[{"imageTag": TAG}])[
            "imageDetails"
        ][0]["imageDigest"]
    )
    assert served == [["QUEUED"], ["PROVISIONING"], ["BUILD"], ["BUILD"], ["COMPLETED"]]
    (build,) = started_builds(aws)
    assert built.build_id == build["id"]
    progress = [r.getMessage() for r in caplog.records if "elapsed" in r.getMessage()]
    # One line per phase change, none for the repeated BUILD poll.
    assert [line.split(": ")[1].split(" ")[0] for line in progress] == [
        "QUEUED",
        "PROVISIONING",
        "BUILD",
        "COMPLETED",
    ]


def test_start_build_sends_the_source_and_the_content_tag(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    captured: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        captured.append(params)

    builder = make_builder(session, moto_endpoint)
    builder._codebuild.meta.events.register("provide-client-params.codebuild.StartBuild", record)
    scripted_builds([("COMPLETED", "SUCCEEDED")], push_tag=TAG)
    builder.build(request())
    (params,) = captured
    assert params["sourceLocationOverride"] == f"{SOURCE_BUCKET}/{SOURCE_KEY}"
    assert params["sourceTypeOverride"] == "S3"
    assert params["timeoutInMinutesOverride"] == 60
    env = {v["name"]: v["value"] for v in params["environmentVariablesOverride"]}
    assert env == {"IMAGE_TAG": TAG, "SOURCE_HASH": "abc"}


def test_failure_raises_with_the_failed_phase_and_the_log_tail(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    aws["logs"].create_log_stream(logGroupName=LOG_GROUP, logStreamName="trainer/run-1")
    aws["logs"].put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName="trainer/run-1",
        logEvents=[
            {"timestamp": NOW_MS, "message": "[smoke] quick imports PASSED"},
            {"timestamp": NOW_MS + 1, "message": "[smoke] standard efa_libraries FAILED"},
        ],
    )
    scripted_builds(
        [("BUILD", "IN_PROGRESS"), ("BUILD", "FAILED")],
        logs={"groupName": LOG_GROUP, "streamName": "trainer/run-1"},
        failed_phase_message="Error while executing command: docker run. Reason: exit status 1",
    )
    with pytest.raises(ImageBuildError) as error:
        make_builder(session, moto_endpoint).build(request())
    message = str(error.value)
    assert "FAILED" in message
    assert "BUILD FAILED: Error while executing command: docker run" in message
    assert message.endswith("[smoke] quick imports PASSED\n[smoke] standard efa_libraries FAILED")
    assert aws["ecr"].describe_images(repositoryName=REPOSITORY)["imageDetails"] == []


def test_a_failure_before_the_buildspec_ran_is_retried_once(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    served = scripted_builds(
        [("DOWNLOAD_SOURCE", "FAILED")],
        later=[("BUILD", "IN_PROGRESS"), ("COMPLETED", "SUCCEEDED")],
        push_tag=TAG,
        failed_phase_message="ACCESS_DENIED: Service role is not authorized to s3:GetObject",
    )
    built = make_builder(session, moto_endpoint).build(request())
    assert built.digest.startswith("sha256:")
    assert len(started_builds(aws)) == 2
    assert served[:3] == [["DOWNLOAD_SOURCE"], ["BUILD"], ["COMPLETED"]]


def test_a_failure_in_our_own_commands_is_not_retried(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    scripted_builds([("BUILD", "FAILED")], later=[("COMPLETED", "SUCCEEDED")], push_tag=TAG)
    with pytest.raises(ImageBuildError, match="BUILD FAILED"):
        make_builder(session, moto_endpoint).build(request())
    assert len(started_builds(aws)) == 1


@pytest.mark.parametrize(("running_tag", "builds"), [(TAG, 1), ("src-another-image", 2)])
def test_a_running_build_of_the_same_tag_is_awaited_not_duplicated(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
    running_tag: str,
    builds: int,
) -> None:
    """An interrupted `pulumi up` left a build running; the next one waits for it."""
    scripted_builds(
        [("BUILD", "IN_PROGRESS"), ("BUILD", "IN_PROGRESS"), ("COMPLETED", "SUCCEEDED")],
        push_tag=TAG,
        image_tag=running_tag,
    )
    builder = make_builder(session, moto_endpoint)
    earlier = builder.start(request())
    built = builder.build(request())
    assert built.digest.startswith("sha256:")
    assert len(started_builds(aws)) == builds
    assert (built.build_id == earlier) is (builds == 1)


@pytest.mark.parametrize("status", ["FAULT", "TIMED_OUT", "STOPPED"])
def test_every_unsuccessful_end_state_fails(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
    status: str,
) -> None:
    scripted_builds([("BUILD", status)])
    with pytest.raises(ImageBuildError, match=status):
        make_builder(session, moto_endpoint).build(request())


def test_waiting_gives_up_after_the_timeout_plus_queue_allowance(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    served = scripted_builds([("BUILD", "IN_PROGRESS")])
    builder = make_builder(session, moto_endpoint, step=300)
    with pytest.raises(ImageBuildError, match="gave up waiting"):
        builder.build(request(timeout_minutes=5))
    # A poll every 5 minutes; the deadline is 5 + 60 minutes after the start: 13 polls.
    assert len(served) == 13


def test_exported_digest_that_disagrees_with_ecr_is_refused(
    aws: dict[str, Any],
    session: boto3.Session,
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    scripted_builds(
        [("COMPLETED", "SUCCEEDED")], push_tag=TAG, exported={"IMAGE_DIGEST": "sha256:" + "f" * 64}
    )
    with pytest.raises(ImageBuildError, match="refusing to pin"):
        make_builder(session, moto_endpoint).build(request())


# --- the Pulumi dynamic provider ---------------------------------------------------------------


def provider_props(moto_endpoint: str, **overrides: Any) -> dict[str, Any]:
    props: dict[str, Any] = {
        "project_name": PROJECT,
        "repository_name": REPOSITORY,
        "repository_url": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{REPOSITORY}",
        "image_tag": TAG,
        "source_location": f"{SOURCE_BUCKET}/{SOURCE_KEY}",
        "source_hash": "abc",
        "log_group_name": LOG_GROUP,
        "timeout_minutes": 60,
        "region": REGION,
        "aws_profile": None,
        "endpoint_url": moto_endpoint,
        "poll_seconds": 0.001,
    }
    props.update(overrides)
    return props


@pytest.fixture
def moto_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The provider builds its own session from the environment, as in `pulumi up`."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("moto_credentials")
def test_provider_create_then_update_rebuilds_only_for_a_new_tag(
    aws: dict[str, Any],
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    provider = ImageBuildProvider()
    scripted_builds([("BUILD", "IN_PROGRESS"), ("COMPLETED", "SUCCEEDED")], push_tag=TAG)
    created = provider.create(provider_props(moto_endpoint))
    assert created.id == f"{REPOSITORY}:{TAG}"
    outs = created.outs
    assert outs is not None
    assert (
        outs["image_uri"]
        == f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/{REPOSITORY}@" + (outs["image_digest"])
    )
    assert outs["build_id"].startswith(f"{PROJECT}:")

    # Same tag (same sources and settings), other bookkeeping changed: nothing to do.
    same = provider.diff(created.id, outs, provider_props(moto_endpoint, timeout_minutes=90))
    assert same.changes is False
    assert len(started_builds(aws)) == 1

    new_tag = "src-fedcba9876543210fedcba98"
    news = provider_props(moto_endpoint, image_tag=new_tag, source_hash="def")
    assert provider.diff(created.id, outs, news).changes is True
    scripted_builds([("COMPLETED", "SUCCEEDED")], push_tag=new_tag)
    updated = provider.update(created.id, outs, news)
    assert updated.outs is not None
    assert updated.outs["image_digest"] != outs["image_digest"]
    assert updated.outs["image_uri"].endswith("@" + updated.outs["image_digest"])
    assert updated.outs["image_tag"] == new_tag
    assert len(started_builds(aws)) == 2


@pytest.mark.usefixtures("moto_credentials")
def test_provider_create_fails_with_the_log_tail(
    aws: dict[str, Any],
    moto_endpoint: str,
    scripted_builds: Callable[..., list[list[str]]],
) -> None:
    aws["logs"].create_log_stream(logGroupName=LOG_GROUP, logStreamName="s")
    aws["logs"].put_log_events(
        logGroupName=LOG_GROUP,
        logStreamName="s",
        logEvents=[{"timestamp": NOW_MS, "message": "No space left on device"}],
    )
    scripted_builds([("BUILD", "FAILED")], logs={"groupName": LOG_GROUP, "streamName": "s"})
    with pytest.raises(ImageBuildError, match="No space left on device"):
        ImageBuildProvider().create(provider_props(moto_endpoint))


def test_provider_delete_leaves_images_alone(aws: dict[str, Any], moto_endpoint: str) -> None:
    push_image(TAG)
    ImageBuildProvider().delete(f"{REPOSITORY}:{TAG}", provider_props(moto_endpoint))
    assert len(aws["ecr"].describe_images(repositoryName=REPOSITORY)["imageDetails"]) == 1


def test_provider_pickles_by_reference() -> None:
    """Pulumi stores the provider in state; by reference, a code fix applies to old stacks."""
    encoded = serialize_provider(ImageBuildProvider())
    payload = base64.b64decode(encoded)
    assert b"infra.image.build" in payload
    assert len(payload) < 1000
    assert isinstance(dill.loads(payload), ImageBuildProvider)
