"""The start watch against an API server on loopback, reached the way the provider reaches EKS.

The server (`tests.infra.kube_fake.ScriptedApiServer`) serves PyTorchJob / Pod documents (the
shapes of `test_job_wait`) one state per poll; the kubeconfig names it with an `exec`
credential plugin, so the token the watch sends comes from running that plugin exactly as
client-go would (ExecCredential JSON on stdout, `status.token`). Nothing is faked inside the
watch itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from infra.job.kube_client import KubeClient
from infra.job.start_rule import JobStartError
from infra.job.start_wait import WatchedJob, wait_for_start
from infra.job.suspension import FIELD_MANAGER
from infra.launch.start_watch import JobStartWatchProvider
from tests.infra.kube_fake import APPLY_PATCH, TOKEN, ScriptedApiServer, kubeconfig, serving

JOB_PATH = "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/exp"
PODS_PATH = "/api/v1/namespaces/training/pods"
EVENTS_PATH = "/api/v1/namespaces/training/events"
SUSPEND_APPLY = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "exp", "namespace": "training"},
    "spec": {"runPolicy": {"suspend": True}},
}


def stamp(seconds_ago: float) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_doc(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": "exp", "namespace": "training", "creationTimestamp": stamp(600)},
        "status": {
            "conditions": [
                {"type": kind, "status": "True", "reason": f"PyTorchJob{kind}", "message": msg}
                for kind, msg in conditions
            ]
        },
    }


def worker(index: int, started_ago: float) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"exp-worker-{index}",
            "creationTimestamp": stamp(600),
            "labels": {
                "training.kubeflow.org/job-name": "exp",
                "training.kubeflow.org/replica-type": "worker",
            },
        },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "pytorch",
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


def seen(server: ScriptedApiServer) -> list[tuple[str, str | None, str | None]]:
    """(path, Authorization, selector) of every GET."""
    return [
        (r.path, r.authorization, r.query.get("labelSelector") or r.query.get("fieldSelector"))
        for r in server.requests
        if r.method == "GET"
    ]


def released(server: ScriptedApiServer) -> list[tuple[str, str | None, dict[str, str], Any]]:
    return [(r.path, r.content_type, r.query, r.body) for r in server.patches]


RELEASE = (JOB_PATH, APPLY_PATCH, {"fieldManager": FIELD_MANAGER, "force": "true"}, SUSPEND_APPLY)


def watch(server: ScriptedApiServer, **kwargs: Any) -> str:
    api = KubeClient.from_kubeconfig(kubeconfig(server.url))
    return wait_for_start(api, WatchedJob("training", "exp", 2), poll_s=0, **kwargs)


def test_returns_once_every_worker_runs_with_the_plugins_token(serve: Any) -> None:
    created = job_doc(("Created", "PyTorchJob exp is created."))
    running = job_doc(("Created", "created"), ("Running", "PyTorchJob training/exp is running."))
    server = serve(
        [
            (200, created, []),
            (200, running, [worker(0, 300), worker(1, 5)]),  # worker 1 only just started
            (200, running, [worker(0, 300), worker(1, 120)]),
        ]
    )
    assert watch(server).startswith("2/2 workers running")
    assert server.polls == 3
    assert {auth for _, auth, _ in seen(server)} == {f"Bearer {TOKEN}"}
    selectors = {query for path, _, query in seen(server) if path == PODS_PATH}
    assert selectors == {"training.kubeflow.org/job-name=exp"}


def test_a_failed_job_fails_up_at_once_with_the_operators_message(serve: Any) -> None:
    message = "Job exp has failed because it has reached the specified backoff limit"
    server = serve([(200, job_doc(("Created", "c"), ("Failed", message)), [])])
    with pytest.raises(JobStartError, match="reached the specified backoff limit") as error:
        watch(server)
    assert server.patches == []  # the operator already cleaned up a failed job's pods
    assert "kubectl -n training describe pytorchjob exp" in str(error.value)
    assert server.polls == 1


def test_a_suspended_job_fails_the_watch_at_once_and_is_left_suspended(serve: Any) -> None:
    stopped = job_doc(("Created", "c"), ("Suspended", "PyTorchJob exp is suspended."))
    stopped["spec"] = {"runPolicy": {"suspend": True}}
    server = serve([(200, stopped, [])])
    ticks = iter(range(0, 100_000, 60))
    with pytest.raises(JobStartError) as error:
        watch(server, clock=lambda: float(next(ticks)))
    assert str(error.value) == (
        "PyTorchJob exp is stopped (suspended): `fsdp-eks start <stack>` resumes it from its "
        "latest checkpoint"
    )
    assert server.polls == 1 and server.patches == []


def test_gives_up_after_its_limit_with_the_last_progress(serve: Any) -> None:
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve([(200, running, [worker(0, 300)])])
    ticks = iter(range(100))
    with pytest.raises(JobStartError, match=r"not every worker started.*1/2 workers running"):
        watch(server, limit_s=3, clock=lambda: float(next(ticks)))
    assert released(server) == [RELEASE]


def test_the_job_s_start_budget_bounds_the_wait(serve: Any) -> None:
    """`job.startTimeoutMinutes` (here 10 min), plus the minute a worker must then run."""
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve([(200, running, [worker(0, 300)])])
    ticks = iter(range(0, 100_000, 60))  # one poll a minute
    api = KubeClient.from_kubeconfig(kubeconfig(server.url))
    job = WatchedJob("training", "exp", 2, start_timeout_s=600)
    with pytest.raises(JobStartError, match=r"not every worker started within 11 min"):
        wait_for_start(api, job, poll_s=0, clock=lambda: float(next(ticks)))
    assert server.polls == 11  # a minute apart: the wait ends at its limit, not before
    assert released(server) == [RELEASE]


def test_refused_access_names_what_the_deployer_needs(serve: Any) -> None:
    server = serve([(403, {"kind": "Status", "code": 403}, [])])
    with pytest.raises(JobStartError, match=r"HTTP 403.*read access to pytorchjobs and pods"):
        watch(server)


def test_a_deleted_job_is_reported(serve: Any) -> None:
    server = serve([(404, {"kind": "Status", "code": 404}, [])])
    with pytest.raises(JobStartError, match="disappeared"):
        watch(server)


def test_transient_server_errors_are_retried(serve: Any) -> None:
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve([(503, {}, []), (200, running, [worker(0, 300), worker(1, 300)])])
    assert watch(server).startswith("2/2")
    assert server.polls == 2


def test_a_failing_credential_plugin_is_one_clear_error(serve: Any) -> None:
    """The client runs the plugin as it is built: the watch fails `up` with why."""
    server = serve([(200, job_doc(("Created", "c")), [])])
    props = {"kubeconfig": kubeconfig(server.url, exit_code=3), "namespace": "training",
             "job_name": "exp", "workers": 2}  # fmt: skip
    with pytest.raises(
        JobStartError, match=r"credential command .* failed \(exec: process returned 3"
    ):
        JobStartWatchProvider().create(props)
    assert server.requests == []


def test_only_a_new_job_makes_up_wait_again() -> None:
    provider = JobStartWatchProvider()
    olds = {"namespace": "training", "job_name": "exp", "job_uid": "u1", "workers": 2}
    same = provider.diff("id", olds, {**olds, "kubeconfig": "another token"})
    assert not same.changes
    assert provider.diff("id", olds, {**olds, "job_uid": "u2"}).changes
    assert provider.diff("id", olds, {**olds, "job_uid": "u2"}).replaces == []


def test_the_provider_process_unpickles_the_watch_provider() -> None:
    """The engine starts dynamic providers in the project root with the launcher's python
    (tests/infra/test_engine_layout.py models those rules): the watch's provider must pickle
    by reference to `infra.launch.start_watch` and import there, as the image build's does."""
    from tests.infra import test_engine_layout as layout

    run = layout.provider_process()
    payload = run(
        "from pulumi.dynamic.dynamic import serialize_provider\n"
        "from infra.launch.start_watch import JobStartWatchProvider\n"
        "print(serialize_provider(JobStartWatchProvider()))\n"
    )
    module, name, _ = run(layout.DESERIALIZE, stdin=payload).split()
    assert (module, name) == ("infra.launch.start_watch", "JobStartWatchProvider")


def mounting(index: int, uid: str) -> dict[str, Any]:
    """A worker scheduled onto a node whose FSx volume will not mount: Pending, the init
    container still `PodInitializing` as during any image pull."""
    pod = worker(index, 0)
    pod["metadata"]["uid"] = uid
    pod["status"] = {
        "phase": "Pending",
        "startTime": stamp(1200),
        "initContainerStatuses": [
            {"name": "prepare-run-dirs", "restartCount": 0, "state": {"waiting": {}}}
        ],
        "containerStatuses": [
            {
                "name": "pytorch",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "PodInitializing"}},
            }
        ],
    }
    return pod


def failed_mount(uid: str, first_ago: float) -> dict[str, Any]:
    return {
        "kind": "Event",
        "type": "Warning",
        "reason": "FailedMount",
        "message": 'MountVolume.SetUp failed for volume "fsx" : rpc error: code = Internal '
        'desc = Could not mount "fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcd"',
        "involvedObject": {"kind": "Pod", "name": "exp-worker-0", "uid": uid},
        "firstTimestamp": stamp(first_ago),
        "lastTimestamp": stamp(5),
        "count": 9,
    }


def test_a_volume_that_will_not_mount_fails_up_with_kubelets_event(serve: Any) -> None:
    running = job_doc(("Created", "c"))
    server = serve([(200, running, [mounting(0, "u0"), worker(1, 300)])])
    server.events = [failed_mount("u0", 900), failed_mount("someone-else", 900)]
    with pytest.raises(
        JobStartError, match=r"exp-worker-0 stuck in ContainerCreating.*FailedMount"
    ) as error:
        watch(server)
    # All or nothing: the worker that did start must not keep its GPU node.
    # Suspended as `fsdp-eks stop` does (a forced apply by fsdp-eks), so `fsdp-eks start`
    # resumes it; the message says so.
    assert released(server) == [RELEASE]
    assert "`fsdp-eks start <stack>`" in str(error.value)
    assert (
        "/api/v1/namespaces/training/events",
        f"Bearer {TOKEN}",
        "involvedObject.kind=Pod,type=Warning",
    ) in seen(server)


def test_without_the_right_to_read_events_the_watch_goes_on(serve: Any) -> None:
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve(
        [
            (200, running, [mounting(0, "u0"), worker(1, 300)]),
            (200, running, [worker(0, 300), worker(1, 300)]),
        ]
    )
    assert watch(server).startswith("2/2")


def test_workers_recreated_on_every_start_fail_up_at_the_backoff_limit(serve: Any) -> None:
    """restartPolicy ExitCode: each poll finds worker 0 under a new uid after an OOM kill."""
    running = job_doc(("Created", "c"), ("Restarting", "job exp is restarting"))

    def oom_killed(uid: str) -> dict[str, Any]:
        pod = worker(0, 5)
        pod["metadata"]["uid"] = uid
        pod["status"]["phase"] = "Failed"
        pod["status"]["containerStatuses"][0]["state"] = {
            "terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": stamp(1)}
        }
        return pod

    server = serve([(200, running, [oom_killed(f"u{n}"), worker(1, 300)]) for n in range(5)])
    with pytest.raises(JobStartError, match=r"recreated 3 times.*code 137 \(OOMKilled\)"):
        watch(server)
    assert server.polls == 4
