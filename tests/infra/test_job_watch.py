"""The start watch against an API server on loopback, reached the way the provider reaches EKS.

The server is a plain HTTP server holding PyTorchJob / Pod documents (the shapes of
`test_job_wait`); the kubeconfig names it with an `exec` credential plugin, so the token the
watch sends comes from running that plugin exactly as client-go would (ExecCredential JSON on
stdout, `status.token`). Nothing is faked inside the watch itself.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from infra.job.start_rule import JobStartError
from infra.launch.start_watch import (
    JobStartWatchProvider,
    KubernetesApi,
    WatchedJob,
    wait_for_start,
)

TOKEN = "k8s-aws-v1.test-token"
JOB_PATH = "/apis/kubeflow.org/v1/namespaces/training/pytorchjobs/exp"
PODS_PATH = "/api/v1/namespaces/training/pods"
EVENTS_PATH = "/api/v1/namespaces/training/events"


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


class FakeApiServer(ThreadingHTTPServer):
    """Serves `states` in turn (one per poll of the job) and records every request."""

    def __init__(self, states: list[tuple[int, dict[str, Any], list[dict[str, Any]]]]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.states = states
        self.polls = 0
        self.events: list[dict[str, Any]] | None = None
        """Warning events to serve; None answers 403, as for a deployer without that right."""
        self.requests: list[tuple[str, str, str | None]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []
        """(path, content type, body) of each PATCH."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeApiServer

    def do_GET(self) -> None:
        parsed = urllib.parse.urlsplit(self.path)
        params = urllib.parse.parse_qs(parsed.query)
        query = (params.get("labelSelector") or params.get("fieldSelector") or [""])[0] or None
        self.server.requests.append((parsed.path, self.headers["Authorization"], query))
        index = min(self.server.polls, len(self.server.states) - 1)
        code, job, pods = self.server.states[index]
        if parsed.path == JOB_PATH:
            body: dict[str, Any] = job
            if code != 200:  # an error answer ends this poll: the next one sees the next state
                self.server.polls += 1
        elif parsed.path == PODS_PATH:
            body = {"kind": "PodList", "items": pods}
            self.server.polls += 1
        elif parsed.path == EVENTS_PATH and self.server.events is not None:
            body = {"kind": "EventList", "items": self.server.events}
        elif parsed.path == EVENTS_PATH:
            code, body = 403, {"kind": "Status", "code": 403}
        else:
            code, body = 404, {"kind": "Status", "code": 404}
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def do_PATCH(self) -> None:
        length = int(self.headers["Content-Length"])
        body = json.loads(self.rfile.read(length))
        self.server.patches.append((self.path, self.headers["Content-Type"], body))
        payload = json.dumps({"kind": "PyTorchJob"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[FakeApiServer] = []

    def start(states: list[tuple[int, dict[str, Any], list[dict[str, Any]]]]) -> FakeApiServer:
        server = FakeApiServer(states)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def kubeconfig(server: str, *, exit_code: int = 0) -> str:
    """The shape `infra.platform.kube_access.exec_kubeconfig` writes, with a plugin that prints a
    token."""
    credential = {
        "apiVersion": "client.authentication.k8s.io/v1beta1",
        "kind": "ExecCredential",
        "status": {"token": TOKEN},
    }
    script = f"import sys; print({json.dumps(json.dumps(credential))}); sys.exit({exit_code})"
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": server}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "aws"}}],
            "current-context": "c",
            "users": [
                {
                    "name": "aws",
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": sys.executable,
                            "args": ["-c", script],
                        }
                    },
                }
            ],
        }
    )


def watch(server: FakeApiServer, **kwargs: Any) -> str:
    api = KubernetesApi.from_kubeconfig(kubeconfig(server.url))
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
    assert {auth for _, auth, _ in server.requests} == {f"Bearer {TOKEN}"}
    selectors = {query for path, _, query in server.requests if path == PODS_PATH}
    assert selectors == {"training.kubeflow.org/job-name=exp"}


def test_a_failed_job_fails_up_at_once_with_the_operators_message(serve: Any) -> None:
    message = "Job exp has failed because it has reached the specified backoff limit"
    server = serve([(200, job_doc(("Created", "c"), ("Failed", message)), [])])
    with pytest.raises(JobStartError, match="reached the specified backoff limit") as error:
        watch(server)
    assert server.patches == []  # the operator already cleaned up a failed job's pods
    assert "kubectl -n training describe pytorchjob exp" in str(error.value)
    assert server.polls == 1


def test_gives_up_after_its_limit_with_the_last_progress(serve: Any) -> None:
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve([(200, running, [worker(0, 300)])])
    ticks = iter(range(100))
    with pytest.raises(JobStartError, match=r"not every worker started.*1/2 workers running"):
        watch(server, limit_s=3, clock=lambda: float(next(ticks)))
    assert [path for path, _, _ in server.patches] == [JOB_PATH]


def test_the_job_s_start_budget_bounds_the_wait(serve: Any) -> None:
    """`job.startTimeoutMinutes` (here 10 min), plus the minute a worker must then run."""
    running = job_doc(("Created", "c"), ("Running", "r"))
    server = serve([(200, running, [worker(0, 300)])])
    ticks = iter(range(0, 100_000, 60))  # one poll a minute
    api = KubernetesApi.from_kubeconfig(kubeconfig(server.url))
    job = WatchedJob("training", "exp", 2, start_timeout_s=600)
    with pytest.raises(JobStartError, match=r"not every worker started within 11 min"):
        wait_for_start(api, job, poll_s=0, clock=lambda: float(next(ticks)))
    assert server.polls == 11  # a minute apart: the wait ends at its limit, not before
    assert [path for path, _, _ in server.patches] == [JOB_PATH]


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
    server = serve([(200, job_doc(("Created", "c")), [])])
    api = KubernetesApi.from_kubeconfig(kubeconfig(server.url, exit_code=3))
    with pytest.raises(JobStartError, match=r"credential command .* failed \(exit 3\)"):
        wait_for_start(api, WatchedJob("training", "exp", 2), poll_s=0)


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
    ):
        watch(server)
    # All or nothing: the worker that did start must not keep its GPU node.
    assert server.patches == [
        (JOB_PATH, "application/merge-patch+json", {"spec": {"runPolicy": {"suspend": True}}})
    ]
    assert (
        "/api/v1/namespaces/training/events",
        f"Bearer {TOKEN}",
        "involvedObject.kind=Pod,type=Warning",
    ) in server.requests


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
