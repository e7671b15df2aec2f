"""The start watch (`pulumi up`'s JobStartWatch and `fsdp-eks start`) on a TrainJob, as
tests/infra/test_job_watch.py holds it on a PyTorchJob: each poll a scripted state of the
TrainJob (Trainer v2.3.0 conditions: `Suspended`, `Complete`, `Failed`, no `Running`) and its
JobSet pods."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infra.job.start_rule import JobStartError
from infra.job.start_wait import DEFAULT_POLL_SECONDS
from infra.launch import start_watch
from infra.launch.start_watch import JobStartWatchProvider
from tests.infra.kube_fake import APPLY_PATCH, ScriptedApiServer, kubeconfig, serving

JOB_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/training/trainjobs/exp"
PODS_PATH = "/api/v1/namespaces/training/pods"


def stamp(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def trainjob(*conditions: tuple[str, str, str], jobs: bool = True) -> dict[str, Any]:
    status: dict[str, Any] = {
        "conditions": [
            {"type": kind, "status": value, "reason": reason, "message": f"{kind} {reason}"}
            for kind, value, reason in conditions
        ]
    }
    if jobs:
        status["jobsStatus"] = [{"name": "node", "active": 2, "ready": 2}]
    return {
        "metadata": {"name": "exp", "namespace": "training", "creationTimestamp": stamp(600)},
        "spec": {"trainer": {"numNodes": 2}},
        "status": status,
    }


def node_pod(index: int, started_ago: float) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"exp-node-0-{index}-abc{index}",
            "creationTimestamp": stamp(600),
            "labels": {
                "jobset.sigs.k8s.io/jobset-name": "exp",
                "jobset.sigs.k8s.io/replicatedjob-name": "node",
                "batch.kubernetes.io/job-completion-index": str(index),
            },
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "node",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": stamp(started_ago)}},
                }
            ],
        },
    }


@pytest.fixture
def serve() -> Iterator[Any]:
    with ExitStack() as stack:

        def start(states: list[tuple[int, dict[str, Any], list[dict[str, Any]]]]) -> Any:
            return stack.enter_context(serving(ScriptedApiServer(states, JOB_PATH)))

        yield start


def create(server: ScriptedApiServer) -> dict[str, Any]:
    props = {
        "kubeconfig": kubeconfig(server.url),
        "namespace": "training",
        "job_name": "exp",
        "job_uid": "u1",
        "workers": 2,
        "backoff_limit": 3,
        "start_timeout_seconds": 600,
        "poll_seconds": 0,
        "job_api": "trainjob",
    }
    return dict(JobStartWatchProvider().create(props).outs or {})


def test_up_returns_once_every_node_runs(serve: Any) -> None:
    # No condition at all while it runs: Trainer v2 writes only jobsStatus.
    server = serve([(200, trainjob(), [node_pod(0, 300), node_pod(1, 5)]),
                    (200, trainjob(), [node_pod(0, 300), node_pod(1, 120)])])  # fmt: skip
    assert create(server)["started"].startswith("2/2 workers running")
    gets = {(r.path, r.query.get("labelSelector")) for r in server.requests if r.method == "GET"}
    assert (JOB_PATH, None) in gets
    assert (PODS_PATH, "jobset.sigs.k8s.io/jobset-name=exp") in gets


def test_a_failed_trainjob_fails_up_with_its_reason(serve: Any) -> None:
    server = serve([(200, trainjob(("Failed", "True", "DeadlineExceeded")), [])])
    with pytest.raises(JobStartError, match="TrainJob exp failed \\(DeadlineExceeded\\)") as error:
        create(server)
    assert "kubectl -n training describe trainjob exp" in str(error.value)


def test_a_suspended_trainjob_fails_the_watch_and_is_left_alone(serve: Any) -> None:
    suspended = trainjob(("Suspended", "True", "Suspended"))
    suspended["spec"]["suspend"] = True
    server = serve([(200, suspended, [])])
    with pytest.raises(JobStartError, match="TrainJob exp is stopped"):
        create(server)
    assert server.patches == []


def test_a_node_that_cannot_start_is_released_by_suspending_the_trainjob(serve: Any) -> None:
    stuck = node_pod(1, 0)
    stuck["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": "node", "ready": False, "restartCount": 0,
             "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}
        ],
    }  # fmt: skip
    stuck["metadata"]["creationTimestamp"] = stamp(3600)
    for status in stuck["status"]["containerStatuses"]:
        status["state"]["waiting"]["since"] = stamp(3600)
    server = serve([(200, trainjob(), [node_pod(0, 300), stuck])] * 3)
    with pytest.raises(JobStartError, match="was suspended"):
        create(server)
    [patch] = server.patches
    assert (patch.path, patch.content_type) == (JOB_PATH, APPLY_PATCH)
    assert patch.body == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "exp", "namespace": "training"},
        "spec": {"suspend": True},
    }


def test_a_trainjob_nobody_reconciles_is_named_as_such(serve: Any) -> None:
    server = serve([(200, trainjob(jobs=False), [])])
    with pytest.raises(JobStartError, match="Kubeflow Trainer v2 is not reconciling TrainJobs"):
        create(server)


@pytest.mark.parametrize(("given", "polls_every"), [(0, 0.0), (None, DEFAULT_POLL_SECONDS)])
def test_the_watch_polls_at_the_interval_it_was_given(
    serve: Any, monkeypatch: pytest.MonkeyPatch, given: float | None, polls_every: float
) -> None:
    """A poll interval of 0 is a setting (the tests give it), not an absent one: read as absent
    it made every watch test that polls twice wait 15 s."""
    intervals: list[float] = []

    def recording_wait(client: Any, job: Any, *, poll_s: float) -> str:
        intervals.append(poll_s)
        return "2/2 workers running"

    monkeypatch.setattr(start_watch, "wait_for_start", recording_wait)
    props: dict[str, Any] = {"kubeconfig": kubeconfig(serve([]).url), "namespace": "training"}
    props["job_name"] = "exp"
    props |= {"workers": 2, "job_api": "trainjob"}
    if given is not None:
        props["poll_seconds"] = given
    JobStartWatchProvider().create(props)
    assert intervals == [polls_every]
