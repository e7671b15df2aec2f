"""Kubernetes API servers on loopback: the one fake every cluster test talks to.

Both serve the real `KubeClient` over HTTP through an `exec`-credential kubeconfig; nothing is
faked inside the code under test. `ScriptedApiServer` serves chosen states poll by poll;
`ClusterApiServer` keeps the job in `tests.infra.ssa_model` and plays the operator.
What each answers as the API server does, with sources: docs/design/tests.md#kube_fake
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import yaml

from infra.job.job_api import PYTORCHJOB, TRAINJOB, JobApi
from tests.infra import ssa_model

TOKEN = "k8s-aws-v1.test-token"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JOB_NAME_LABEL = "training.kubeflow.org/job-name"
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"
OPERATOR_MANAGER = "manager"
"""The operator's status writes: its binary is `/manager` (v1.9.0 `build/images/
training-operator/Dockerfile`), and a client without a fieldManager is recorded under its
User-Agent's first word, the binary's name."""


def stamp(seconds_ago: float = 0) -> str:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeClock:
    """Time that passes only when slept: the waits poll at their real intervals, instantly,
    and the test can count the sleeps instead of timing them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def job_path(namespace: str, name: str) -> str:
    """Where the API server serves a PyTorchJob."""
    return f"/apis/kubeflow.org/v1/namespaces/{namespace}/pytorchjobs/{name}"


def user_kubeconfig(path: Path, server: str, *, contexts: tuple[str, ...] = ("lab",)) -> Path:
    """A kubeconfig of the user's own at `path` whose `contexts` all reach `server`."""
    document = json.loads(kubeconfig(server))
    document["contexts"] = [
        {"name": name, "context": {"cluster": "c", "user": "aws"}} for name in contexts
    ]
    document["current-context"] = contexts[0]
    path.write_text(yaml.safe_dump(document))
    return path


def kubeconfig(server: str, *, exit_code: int = 0) -> str:
    """The shape `infra.job.kubeconfig.exec_kubeconfig` writes, with a plugin that prints a
    token (and exits `exit_code`)."""
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


def config_with_user(server: str, user: dict[str, Any]) -> dict[str, Any]:
    """`kubeconfig(server)` as a document whose user is `user` (a token, nothing, ...)."""
    document: dict[str, Any] = json.loads(kubeconfig(server))
    document["users"][0]["user"] = user
    return document


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    content_type: str | None
    user_agent: str | None
    authorization: str | None
    body: Any = None


class LoopbackApiServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 that records every request."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.requests: list[Request] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    @property
    def patches(self) -> list[Request]:
        return [r for r in self.requests if r.method == "PATCH"]


class _Handler(BaseHTTPRequestHandler):
    server: LoopbackApiServer

    def _request(self) -> Request:
        parsed = urllib.parse.urlsplit(self.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = self.headers.get("Content-Type")
        body: Any = None
        if raw:
            body = yaml.safe_load(raw) if content_type == APPLY_PATCH else json.loads(raw)
        request = Request(
            self.command,
            parsed.path,
            query,
            content_type,
            self.headers.get("User-Agent"),
            self.headers.get("Authorization"),
            body,
        )
        with self.server.lock:
            self.server.requests.append(request)
        return request

    def _send(self, code: int, body: dict[str, Any]) -> None:
        payload = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *_args: Any) -> None:
        pass


Served = TypeVar("Served", bound=LoopbackApiServer)


@contextmanager
def serving(server: Served) -> Iterator[Served]:
    """`server` answering on a thread; shut down (within its 20 ms poll) on leaving."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.daemon = True
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A `metav1.Status` failure as the API server writes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


# --- scripted: one state per poll ------------------------------------------------------------


class ScriptedApiServer(LoopbackApiServer):
    """Serves `states` in turn (one per poll of the job: (HTTP code, job, pods)); PATCHes are
    recorded and answered with the job of the current state."""

    def __init__(
        self, states: list[tuple[int, dict[str, Any], list[dict[str, Any]]]], job_path: str
    ) -> None:
        super().__init__(_ScriptedHandler)
        self.states = states
        self.job_path = job_path
        self.namespace = job_path.split("/")[5]
        self.polls = 0
        self.events: list[dict[str, Any]] | None = None
        """Warning events to serve; None answers 403, as for a deployer without that right."""


class _ScriptedHandler(_Handler):
    server: ScriptedApiServer

    def do_GET(self) -> None:
        request = self._request()
        server = self.server
        index = min(server.polls, len(server.states) - 1)
        code, job, pods = server.states[index]
        pods_path = f"/api/v1/namespaces/{server.namespace}/pods"
        events_path = f"/api/v1/namespaces/{server.namespace}/events"
        if request.path == server.job_path:
            body: dict[str, Any] = job
            if code != 200:  # an error answer ends this poll: the next one sees the next state
                server.polls += 1
        elif request.path == pods_path:
            body = {"kind": "PodList", "items": pods}
            server.polls += 1
        elif request.path == events_path and server.events is not None:
            body = {"kind": "EventList", "items": server.events}
        elif request.path == events_path:
            code, body = 403, status(403, "Forbidden", "events is forbidden")
        else:
            code, body = 404, status(404, "NotFound", "the server could not find it")
        self._send(code, body)

    def do_PATCH(self) -> None:
        self._request()
        index = min(self.server.polls, len(self.server.states) - 1)
        self._send(200, self.server.states[index][1])


# --- a cluster: the job in the field-management model, and an operator -----------------------


@dataclass
class Operator:
    """training-operator v1.9.0's reaction to a job, one step per read of the job."""

    running: bool = True
    """False: no operator acts (not installed, or stalled)."""
    grace_reads: int = 1
    """Reads of the job a terminating pod survives (its grace period, in polls)."""
    pod_age_s: float = 120.0
    """How long ago a new pod's trainer started, as the pod reports it: beyond the start
    rule's stable minute, so a resumed job is seen as started on the next read."""
    pods_removable: bool = True
    """False: terminating pods never go (a kubelet that does not finish them)."""
    uids: int = 0
    terminating_reads: dict[str, int] = field(default_factory=dict)


KUEUE_MANAGER = "kueue"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclass
class Kueue:
    """kubernetes-sigs/kueue v0.19.2 for one queued job, as far as its Workload and the job's
    `suspend` go (`pkg/controller/jobframework/reconciler.go`): a Workload owned by the job;
    `spec.active: false` evicts it (reason Deactivated); an admitted Workload's job is
    unsuspended (step 7), an unsuspended job without admission suspended (step 8)."""

    admits: bool = True
    """Quota and the ProvisioningRequest check pass; False: it waits in its queue."""
    workload: dict[str, Any] | None = None
    running: bool = True
    """False: Kueue does not act (not installed with the job's integration on)."""

    def reconcile(
        self, store: ssa_model.ApiServer, suspend_path: ssa_model.Path = ssa_model.SUSPEND
    ) -> None:
        job = store.obj
        if (
            not self.running
            or job is None
            or QUEUE_LABEL not in (job["metadata"].get("labels") or {})
        ):
            return
        meta = job["metadata"]
        if self.workload is None:
            self.workload = {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "Workload",
                "metadata": {
                    "name": f"{job['kind'].lower()}-{meta['name']}-3f9a1",
                    "namespace": meta.get("namespace"),
                    "ownerReferences": [
                        {"apiVersion": job["apiVersion"], "kind": job["kind"],
                         "name": meta["name"], "uid": meta.get("uid"), "controller": True}
                    ],
                },
                "spec": {"active": True, "queueName": meta["labels"][QUEUE_LABEL]},
                "status": {},
            }  # fmt: skip
        workload = self.workload
        conditions: list[dict[str, Any]] = workload["status"].get("conditions") or []
        active = workload["spec"].get("active") is not False
        if not active:
            conditions = _set_condition(
                conditions, "Evicted", "True", "Deactivated", "The workload is deactivated"
            )
            conditions = _set_condition(conditions, "Admitted", "False", "NoReservation", "")
            conditions = _set_condition(conditions, "QuotaReserved", "False", "Pending", "")
            checks: list[dict[str, Any]] = []
        elif self.admits:
            conditions = [c for c in conditions if c["type"] != "Evicted"]
            conditions = _set_condition(
                conditions, "QuotaReserved", "True", "QuotaReserved", "Quota reserved in "
                "ClusterQueue fsdp-eks"
            )  # fmt: skip
            conditions = _set_condition(
                conditions, "Admitted", "True", "Admitted", "The workload is admitted"
            )
            checks = [{"name": "atomic-provisioning", "state": "Ready"}]
        else:
            conditions = [c for c in conditions if c["type"] != "Evicted"]
            conditions = _set_condition(
                conditions, "QuotaReserved", "False", "Pending",
                "couldn't assign flavors to pod set worker: insufficient unused quota for "
                "nvidia.com/gpu in flavor gpu, 16 more needed",
            )  # fmt: skip
            checks = [{"name": "atomic-provisioning", "state": "Pending"}]
        workload["status"] = {"conditions": conditions, "admissionChecks": checks}
        admitted = active and self.admits
        suspended = bool(ssa_model.get_path(job, suspend_path))
        if admitted == suspended:  # Kueue's client Update of the one field it owns
            patch: dict[str, Any] = {}
            ssa_model.put_path(patch, suspend_path, not admitted)
            store.merge_patch(meta["name"], patch, KUEUE_MANAGER)


def _set_condition(
    conditions: list[dict[str, Any]], kind: str, value: str, reason: str, message: str
) -> list[dict[str, Any]]:
    """v1.9.0 `pkg/util/status.go` `setCondition`: one condition per type, the newest last."""
    current = next((c for c in conditions if c["type"] == kind), None)
    if current is not None and current["status"] == value and current["reason"] == reason:
        return conditions
    rest = [c for c in conditions if c["type"] != kind]
    now = stamp()
    return [
        *rest,
        {"type": kind, "status": value, "reason": reason, "message": message,
         "lastUpdateTime": now, "lastTransitionTime": now},
    ]  # fmt: skip


def _selected(obj: dict[str, Any], query: dict[str, str]) -> bool:
    """Whether `obj` matches the request's `labelSelector` (equality terms, comma-joined)."""
    labels = obj["metadata"].get("labels") or {}
    terms = [t for t in query.get("labelSelector", "").split(",") if t]
    return all(labels.get(k) == v for k, _, v in (t.partition("=") for t in terms))


def _is_true(conditions: list[dict[str, Any]], kind: str) -> bool:
    return any(c["type"] == kind and c["status"] == "True" for c in conditions)


class ClusterApiServer(LoopbackApiServer):
    """One namespace holding one PyTorchJob (in the field-management model) and its pods."""

    def __init__(
        self, namespace: str = "training", name: str = "exp", api: JobApi = PYTORCHJOB
    ) -> None:
        super().__init__(_ClusterHandler)
        self.namespace = namespace
        self.name = name
        self.api = api
        self.store = (
            ssa_model.ApiServer()
            if api is PYTORCHJOB
            else ssa_model.ApiServer(
                kind=api.kind,
                resource=api.resource,
                api_version=api.api_version,
                # The TrainJob v2.3.0 CRD's `spec.suspend: default: false` (tests/schemas/).
                defaults={api.suspend_path: False},
            )
        )
        self.pods: dict[str, dict[str, Any]] = {}
        self.operator = Operator()
        self.events: list[dict[str, Any]] = []
        self.forbidden: set[tuple[str, str]] = set()
        """(verb, resource) pairs RBAC refuses, e.g. ("patch", "pytorchjobs")."""
        self.user = "arn:aws:sts::123456789012:assumed-role/ml-admins/ci"
        self.nodes: list[dict[str, Any]] = []
        self.logs: dict[str, list[str]] = {}
        """Each pod's container log; a pod without one answers as a container not started."""
        self.objects: dict[str, dict[str, Any]] = {}
        """Anything else applied, by its path (validate's check workloads)."""
        self.outcomes: dict[str, str] = {"Job": "Complete", "PyTorchJob": "Succeeded"}
        """The condition each kind of applied workload ends with."""
        self.kueue: Kueue | None = None
        """Kueue managing the job (it carries the queue label); None: not installed."""
        self.crd_without_suspend = False
        """An operator older than v1.7.0: the API server prunes `spec.runPolicy.suspend`, a
        field the CRD's structural schema does not declare, and answers 200
        (apiextensions-apiserver `pkg/apiserver/schema/pruning`)."""

    @property
    def job_path(self) -> str:
        api = self.api
        return f"/apis/{api.api_version}/namespaces/{self.namespace}/{api.plural}/{self.name}"

    def put_runtime(self, runtime: dict[str, Any]) -> None:
        """A TrainingRuntime as deployed, served at its path."""
        meta = runtime["metadata"]
        path = (
            f"/apis/{runtime['apiVersion']}/namespaces/{self.namespace}/trainingruntimes/"
            f"{meta['name']}"
        )
        self.objects[path] = copy.deepcopy(runtime)

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def job(self) -> dict[str, Any]:
        return self.store.get(self.name)

    @property
    def workloads_path(self) -> str:
        return f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{self.namespace}/workloads"

    def put_job(self, job: dict[str, Any]) -> None:
        """`job` as deployed (created by Pulumi, its status written by the operator); with
        Kueue, a queued job as its webhook defaults it: suspended (`jobframework/defaults.go`
        `ApplyDefaultForSuspend`), recorded under the creator's manager."""
        if self.kueue is not None and QUEUE_LABEL in (job["metadata"].get("labels") or {}):
            job = copy.deepcopy(job)
            ssa_model.put_path(job, self.api.suspend_path, True)
        self.store.create(job, "pulumi-kubernetes")
        if job.get("status"):
            self.store.update_status(self.name, job["status"], OPERATOR_MANAGER)

    def suspended(self) -> bool:
        if self.api is PYTORCHJOB:
            return ssa_model.suspended(self.store)
        obj = self.store.obj
        return obj is not None and ssa_model.get_path(obj, self.api.suspend_path) is True

    def live_pods(self) -> list[dict[str, Any]]:
        return [copy.deepcopy(p) for _, p in sorted(self.pods.items())]

    # -- the operator and the kubelet

    def reconcile(self) -> None:
        """One pass of the operator, then of the kubelets of terminating pods."""
        self._kubelet()
        if self.kueue is not None:
            self.kueue.reconcile(self.store, self.api.suspend_path)
        job = self.store.obj
        if job is None or not self.operator.running:
            return
        if self.api is TRAINJOB:
            self._reconcile_trainjob(job)
            return
        status = copy.deepcopy(job.get("status") or {})
        conditions: list[dict[str, Any]] = status.get("conditions") or []
        if _is_true(conditions, "Succeeded") or _is_true(conditions, "Failed"):
            return
        replicas = int(job["spec"]["pytorchReplicaSpecs"]["Worker"].get("replicas", 1))
        what = f"PyTorchJob {self.name}"
        if not conditions:
            conditions = _set_condition(
                conditions, "Created", "True", "PyTorchJobCreated", f"{what} is created."
            )
        if ssa_model.get_path(job, ssa_model.SUSPEND):
            for pod in self.pods.values():
                pod["metadata"].setdefault("deletionTimestamp", stamp())
            if _is_true(conditions, "Running"):
                conditions = _set_condition(
                    conditions, "Running", "False", "PyTorchJobSuspended", f"{what} is suspended."
                )
            if not _is_true(conditions, "Suspended"):
                conditions = _set_condition(
                    conditions, "Suspended", "True", "PyTorchJobSuspended", f"{what} is suspended."
                )
            status["replicaStatuses"] = {"Worker": {"active": 0}}
        else:
            if _is_true(conditions, "Suspended"):
                conditions = _set_condition(
                    conditions, "Suspended", "False", "PyTorchJobResumed", f"{what} is resumed."
                )
                status["startTime"] = stamp()
            status.setdefault("startTime", stamp())
            for index in range(replicas):
                name = f"{self.name}-worker-{index}"
                if name not in self.pods:
                    self.pods[name] = self._new_pod(name)
            running = [p for p in self.pods.values() if not p["metadata"].get("deletionTimestamp")]
            if len(running) >= replicas:
                conditions = _set_condition(
                    conditions, "Running", "True", "PyTorchJobRunning", f"{what} is running."
                )
            status["replicaStatuses"] = {"Worker": {"active": len(running)}}
        status["conditions"] = conditions
        if status != (job.get("status") or {}):
            self.store.update_status(self.name, status, OPERATOR_MANAGER)

    def _reconcile_trainjob(self, job: dict[str, Any]) -> None:
        """Trainer v2.3.0 and JobSet 0.12.0, one pass: `spec.suspend` reaches the JobSet, whose
        Jobs are suspended (their pods deleted gracefully) or resumed (new pods, new uids)."""
        status = copy.deepcopy(job.get("status") or {})
        conditions: list[dict[str, Any]] = status.get("conditions") or []
        if _is_true(conditions, "Complete") or _is_true(conditions, "Failed"):
            return
        replicas = int(job["spec"].get("trainer", {}).get("numNodes", 1))
        if ssa_model.get_path(job, TRAINJOB.suspend_path):
            for pod in self.pods.values():
                pod["metadata"].setdefault("deletionTimestamp", stamp())
            conditions = _set_condition(
                conditions, "Suspended", "True", "Suspended", "TrainJob is suspended"
            )
            active = 0
        else:
            if _is_true(conditions, "Suspended"):
                conditions = _set_condition(
                    conditions, "Suspended", "False", "Resumed", "TrainJob is resumed"
                )
            live = {
                p["metadata"]["labels"][TRAINJOB.first_worker_label]
                for p in self.pods.values()
                if not p["metadata"].get("deletionTimestamp")
            }
            for index in range(replicas):
                if str(index) not in live:
                    pod = self._new_pod(f"{self.name}-node-0-{index}-x{self.operator.uids + 1:04d}")
                    pod["metadata"]["labels"] = {
                        TRAINJOB.job_name_label: self.name,
                        TRAINJOB.worker_label[0]: TRAINJOB.worker_label[1],
                        TRAINJOB.first_worker_label: str(index),
                    }
                    pod["status"]["containerStatuses"][0]["name"] = TRAINJOB.container_name
                    self.pods[pod["metadata"]["name"]] = pod
            active = replicas
        status["conditions"] = conditions
        status["jobsStatus"] = [
            {"name": "node", "active": active, "ready": active, "suspended": int(not active)}
        ]
        if status != (job.get("status") or {}):
            self.store.update_status(self.name, status, "trainer")

    def _kubelet(self) -> None:
        if self.store.obj is None:  # the garbage collector removes a deleted job's pods
            self.pods.clear()
        for name, pod in list(self.pods.items()):
            if not pod["metadata"].get("deletionTimestamp") or not self.operator.pods_removable:
                continue
            reads = self.operator.terminating_reads.get(pod["metadata"]["uid"], 0) + 1
            self.operator.terminating_reads[pod["metadata"]["uid"]] = reads
            if reads > self.operator.grace_reads:
                del self.pods[name]

    def _new_pod(self, name: str) -> dict[str, Any]:
        self.operator.uids += 1
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": self.namespace,
                "uid": f"pod-uid-{self.operator.uids}",
                "creationTimestamp": stamp(self.operator.pod_age_s),
                "labels": {JOB_NAME_LABEL: self.name, REPLICA_TYPE_LABEL: "worker"},
            },
            "spec": {"terminationGracePeriodSeconds": 330},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "pytorch",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": stamp(self.operator.pod_age_s)}},
                    }
                ],
            },
        }


class _ClusterHandler(_Handler):
    server: ClusterApiServer

    def _refused(self, request: Request, verb: str, resource: str, group: str) -> bool:
        if request.authorization != f"Bearer {TOKEN}":
            self._send(401, status(401, "Unauthorized", "Unauthorized"))
            return True
        if (verb, resource) not in self.server.forbidden:
            return False
        server = self.server
        name = server.name if resource == server.api.plural else ""
        qualified = f"{resource}.{group}" if group else resource
        target = f'{qualified} "{name}"' if name else qualified
        message = (
            f'{target} is forbidden: User "{server.user}" cannot {verb} resource "{resource}" '
            f'in API group "{group}" in the namespace "{server.namespace}"'
        )
        self._send(403, status(403, "Forbidden", message, group=group, kind=resource, name=name))
        return True

    def do_GET(self) -> None:
        request = self._request()
        server = self.server
        with server.lock:
            if request.path == server.job_path:
                if self._refused(request, "get", server.api.plural, server.api.group):
                    return
                server.reconcile()
                if server.store.obj is None:
                    message = f'{server.api.resource} "{server.name}" not found'
                    self._send(404, status(404, "NotFound", message, name=server.name))
                    return
                self._send(200, server.job())
            elif request.path == server.pods_path:
                if self._refused(request, "list", "pods", ""):
                    return
                items = [p for p in server.live_pods() if _selected(p, request.query)]
                self._send(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
            elif request.path == f"/api/v1/namespaces/{server.namespace}/events":
                if self._refused(request, "list", "events", ""):
                    return
                self._send(200, {"kind": "EventList", "items": server.events})
            elif request.path == "/api/v1/nodes":
                if self._refused(request, "list", "nodes", ""):
                    return
                items = [n for n in server.nodes if _selected(n, request.query)]
                self._send(200, {"kind": "NodeList", "apiVersion": "v1", "items": items})
            elif request.path.startswith(server.pods_path + "/") and request.path.endswith("/log"):
                self._log(request)
            elif request.path == server.workloads_path and server.kueue is not None:
                if self._refused(request, "list", "workloads", "kueue.x-k8s.io"):
                    return
                server.reconcile()
                items = [server.kueue.workload] if server.kueue.workload else []
                self._send(200, {"kind": "WorkloadList", "items": copy.deepcopy(items)})
            elif request.path in server.objects:
                self._send(200, server.objects[request.path])
            else:
                self._send(404, status(404, "NotFound", "the server could not find it"))

    def _log(self, request: Request) -> None:
        pod = request.path.split("/")[-2]
        lines = self.server.logs.get(pod)
        if lines is None:
            message = f'container "pytorch" in pod "{pod}" is waiting to start: ContainerCreating'
            self._send(400, status(400, "BadRequest", message))
            return
        if "tailLines" in request.query:
            lines = lines[len(lines) - int(request.query["tailLines"]) :]
        # Streamed in pieces, as a followed log arrives, split inside lines.
        payload = "".join(lines).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        for start in range(0, len(payload), 7):
            self.wfile.write(payload[start : start + 7])
            self.wfile.flush()

    def do_DELETE(self) -> None:
        request = self._request()
        with self.server.lock:
            if self.server.objects.pop(request.path, None) is None:
                self._send(404, status(404, "NotFound", "the server could not find it"))
                return
            self._send(200, status(200, "", "deleted") | {"status": "Success"})

    def _apply_other(self, request: Request) -> None:
        """Apply of any object but the job: stored whole; a workload gets its outcome."""
        server = self.server
        body = copy.deepcopy(request.body)
        kind = body.get("kind", "")
        if kind in server.outcomes:
            condition = {"type": server.outcomes[kind], "status": "True"}
            body["status"] = {"conditions": [condition]}
        if kind == "Job":  # the Job controller labels its pods `job-name`
            name = body["metadata"]["name"]
            for index in range(int(body.get("spec", {}).get("parallelism", 1))):
                pod = server._new_pod(f"{name}-{index}")
                pod["metadata"]["labels"] = {"job-name": name}
                server.pods[pod["metadata"]["name"]] = pod
        server.objects[request.path] = body
        self._send(200, body)

    def do_PATCH(self) -> None:
        request = self._request()
        server = self.server
        with server.lock:
            workload = (server.kueue.workload or {}) if server.kueue else {}
            name = (workload.get("metadata") or {}).get("name")
            if name and request.path == f"{server.workloads_path}/{name}":
                # Only `spec.active` is modelled; the apply sets it.
                workload["spec"]["active"] = request.body["spec"]["active"]
                server.reconcile()
                self._send(200, copy.deepcopy(workload))
                return
            other = request.path != server.job_path and request.content_type == APPLY_PATCH
            if other and request.query.get("fieldManager"):
                self._apply_other(request)
                return
            if request.path != server.job_path:
                self._send(404, status(404, "NotFound", "the server could not find it"))
                return
            if self._refused(request, "patch", server.api.plural, server.api.group):
                return
            manager = request.query.get("fieldManager", "")
            invalid = 'PatchOptions.meta.k8s.io "" is invalid: '
            body = request.body
            try:
                if request.content_type == APPLY_PATCH:
                    if not manager:
                        message = invalid + "fieldManager: Required value: "
                        message += "is required for apply patch"
                        self._send(422, status(422, "Invalid", message))
                        return
                    if server.store.obj is None:
                        # Apply creates a missing object; a suspend-only body is no job
                        # (the CRD requires spec.pytorchReplicaSpecs).
                        message = (
                            f'PyTorchJob.kubeflow.org "{server.name}" is invalid: '
                            "spec.pytorchReplicaSpecs: Required value"
                        )
                        self._send(422, status(422, "Invalid", message))
                        return
                    force = request.query.get("force") == "true"
                    if server.crd_without_suspend:
                        body = copy.deepcopy(body)
                        body.get("spec", {}).get("runPolicy", {}).pop("suspend", None)
                    self._send(200, server.store.apply(server.name, body, manager, force=force))
                elif request.content_type == MERGE_PATCH:
                    if "force" in request.query:
                        message = invalid + "force: Forbidden: "
                        message += "may not be specified for non-apply patch"
                        self._send(422, status(422, "Invalid", message))
                        return
                    manager = manager or (request.user_agent or "").split("/")[0]
                    self._send(200, server.store.merge_patch(server.name, body, manager))
                else:
                    message = "the body of the request was in an unknown format: "
                    message += str(request.content_type)
                    self._send(415, status(415, "UnsupportedMediaType", message))
            except ssa_model.ApiError as err:
                self._send(err.code, err.status())
