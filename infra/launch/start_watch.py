"""`pulumi up` waits for the job's workers to start, and fails fast with the reason when they don't.

pulumi-kubernetes cannot do this itself (see `infra.job.start_rule`: `waitFor` never fails early),
so this is a small Pulumi dynamic resource, like `infra.image.build`'s, that is created after
the PyTorchJob and polls it and its pods through the Kubernetes API until `job_wait.assess`
says started (the resource is created), failed (`up` fails with the operator's or kubelet's
reason) or the start budget is spent.

It reaches the API server exactly as the stack's Kubernetes provider does: from the same
kubeconfig (`Cluster.kubeconfig`), running the kubeconfig's credential plugin
(`aws eks get-token ...`, with the profile / role it names) and trusting the cluster's CA.
That is the client-go exec-credential protocol: run `user.exec.command` with `args` and `env`,
read `status.token` from the `ExecCredential` it prints (k8s.io/client-go
`plugin/pkg/client/auth/exec/exec.go`). The deployer therefore needs nothing beyond what the
Kubernetes provider already needs: read access to PyTorchJobs, Pods and Events in the job's
namespace (without the last, mount failures are only reported at the time limit), and patch
on PyTorchJobs, to suspend a job that cannot start so that its GPU nodes are released.

The resource waits again whenever the job is recreated (its `metadata.uid` changes); an `up`
that leaves the job alone does not wait. Deleting it does nothing.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pulumi
import yaml
from pulumi.dynamic import CreateResult, DiffResult, ResourceProvider, UpdateResult

from infra.job.manifest import API_VERSION
from infra.job.start_rule import (
    DEFAULT_START_TIMEOUT_S,
    JOB_NAME_LABEL,
    STABLE_RUNNING_S,
    JobStartError,
    StartHistory,
    assess,
)

logger = logging.getLogger(__name__)

DEFAULT_POLL_SECONDS = 15.0
"""Pods change state over tens of seconds; faster polling only loads the API server."""


def wait_limit_seconds(start_timeout_s: float) -> float:
    """The longest `up` waits: the last worker may start at the end of the start budget and
    must then run `STABLE_RUNNING_S`. `job_wait.assess` fails most stuck jobs much sooner."""
    return start_timeout_s + STABLE_RUNNING_S


TOKEN_REFRESH_S = 300.0
"""EKS tokens from `aws eks get-token` last 15 minutes; fetch a new one well before."""

TRIGGER_KEYS = ("namespace", "job_name", "job_uid", "workers")
"""Inputs whose change means a new job to wait for; the kubeconfig is only how to reach it."""

_TRANSIENT_HTTP = {429, 500, 502, 503, 504}
_MAX_TRANSIENT_ERRORS = 8


class KubernetesApi:
    """GETs against one API server with a bearer token from the kubeconfig's user."""

    def __init__(
        self,
        server: str,
        token: Callable[[], str],
        context: ssl.SSLContext | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self.server = server.rstrip("/")
        self._token = token
        self._context = context
        self._timeout_s = timeout_s

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str) -> KubernetesApi:
        """The current context's server, CA and credentials (a token or an exec plugin)."""
        config = yaml.safe_load(kubeconfig)  # JSON (what the cluster component writes) is YAML
        current = config.get("current-context")
        [context] = [c["context"] for c in config["contexts"] if c["name"] == current]
        [cluster] = [c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"]]
        [user] = [u.get("user") or {} for u in config["users"] if u["name"] == context["user"]]
        ssl_context = None
        if cluster["server"].startswith("https://"):
            ca = cluster.get("certificate-authority-data")
            ssl_context = ssl.create_default_context(
                cadata=base64.b64decode(ca).decode() if ca else None
            )
        if user.get("token"):
            static = str(user["token"])
            return cls(cluster["server"], lambda: static, ssl_context)
        if user.get("exec"):
            return cls(cluster["server"], ExecCredential(user["exec"]).token, ssl_context)
        raise JobStartError(
            "the cluster's kubeconfig has neither a token nor an exec credential plugin for "
            f"user {context['user']!r}; cannot watch the job"
        )

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(
            url, headers={"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._context) as r:
            return dict(json.load(r))

    def merge_patch(self, path: str, body: Mapping[str, Any]) -> None:
        """A JSON merge patch (RFC 7386), which custom resources accept."""
        request = urllib.request.Request(
            self.server + path,
            data=json.dumps(body).encode(),
            method="PATCH",
            headers={
                "Authorization": f"Bearer {self._token()}",
                "Content-Type": "application/merge-patch+json",
                "Accept": "application/json",
            },
        )
        with urllib.request.urlopen(request, timeout=self._timeout_s, context=self._context):
            pass


class ExecCredential:
    """Runs a kubeconfig `exec` plugin the way client-go does and caches its token."""

    def __init__(self, spec: Mapping[str, Any], clock: Callable[[], float] = time.monotonic):
        self._spec = spec
        self._clock = clock
        self._token: str | None = None
        self._fetched = 0.0

    def token(self) -> str:
        if self._token is None or self._clock() - self._fetched > TOKEN_REFRESH_S:
            self._token = self._run()
            self._fetched = self._clock()
        return self._token

    def _run(self) -> str:
        spec = self._spec
        env = {**os.environ, **{e["name"]: e["value"] for e in spec.get("env") or []}}
        # What client-go hands every plugin: the apiVersion it expects back, non-interactive.
        env["KUBERNETES_EXEC_INFO"] = json.dumps(
            {
                "apiVersion": spec.get("apiVersion"),
                "kind": "ExecCredential",
                "spec": {"interactive": False},
            }
        )
        command = [str(spec["command"]), *[str(a) for a in spec.get("args") or []]]
        try:
            done = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=60, check=False
            )
        except OSError as err:
            raise JobStartError(
                f"cannot run the kubeconfig's credential command {command[0]!r} ({err}); the "
                "Kubernetes provider needs it too (the AWS CLI for EKS)"
            ) from None
        if done.returncode != 0:
            raise JobStartError(
                f"the kubeconfig's credential command `{' '.join(command)}` failed "
                f"(exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        return str(json.loads(done.stdout)["status"]["token"])


SUSPEND = {"spec": {"runPolicy": {"suspend": True}}}


def release_gpus(api: KubernetesApi, job_path: str) -> str:
    """All or nothing: a job that cannot start all its workers must not hold the nodes it got.

    Suspending the PyTorchJob makes the operator delete its pods and services (training-
    operator v1.9.0 `pkg/controller.v1/common/job.go`: `IsJobSuspended` -> `CleanUpResources`
    -> `DeletePodsAndServices`, every pod of an unfinished job), so the autoscaler scales the
    GPU nodes back to zero. Returns the sentence to add to the error.
    """
    try:
        api.merge_patch(job_path, SUSPEND)
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        return (
            f"; could not suspend the job to release its GPU nodes ({err}): delete it or its "
            "pods, or the nodes it holds keep billing"
        )
    return (
        "; the job was suspended so its pods and GPU nodes are released (to try again as it "
        "is: set spec.runPolicy.suspend to false with `kubectl patch`)"
    )


@dataclass(frozen=True)
class WatchedJob:
    namespace: str
    name: str
    workers: int
    backoff_limit: int = 3
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S


def _pending(pods: list[dict[str, Any]]) -> bool:
    return any(p.get("status", {}).get("phase") == "Pending" for p in pods)


def wait_for_start(
    api: KubernetesApi,
    job: WatchedJob,
    *,
    limit_s: float | None = None,
    poll_s: float = DEFAULT_POLL_SECONDS,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll until every worker runs (returns the progress line) or raise `JobStartError`;
    `limit_s` defaults to the job's start budget plus a stable minute."""
    if limit_s is None:
        limit_s = wait_limit_seconds(job.start_timeout_s)
    job_path = f"/apis/{API_VERSION}/namespaces/{job.namespace}/pytorchjobs/{job.name}"
    pods_path = f"/api/v1/namespaces/{job.namespace}/pods"
    events_path = f"/api/v1/namespaces/{job.namespace}/events"
    selector = {"labelSelector": f"{JOB_NAME_LABEL}={job.name}"}
    # Event field selectors: pkg/registry/core/event/strategy.go `ToSelectableFields`.
    warnings = {"fieldSelector": "involvedObject.kind=Pod,type=Warning"}
    read_events = True
    history = StartHistory()
    deadline = clock() + limit_s
    transient = 0
    last_progress = ""
    follow = f"kubectl -n {job.namespace} describe pytorchjob {job.name}"
    while True:
        try:
            document = api.get(job_path)
            pods = api.get(pods_path, selector).get("items") or []
            events: list[dict[str, Any]] = []
            if read_events and _pending(pods):
                try:
                    events = api.get(events_path, warnings).get("items") or []
                except urllib.error.HTTPError as err:
                    if err.code in _TRANSIENT_HTTP:
                        raise
                    read_events = False
                    logger.info(
                        "cannot read Events (HTTP %s): mount failures show at the limit", err.code
                    )
            transient = 0
        except urllib.error.HTTPError as err:
            if err.code in (401, 403):
                raise JobStartError(
                    f"the Kubernetes API refused to show PyTorchJob {job.namespace}/{job.name} "
                    f"(HTTP {err.code}): the principal running `pulumi up` needs read access "
                    "to pytorchjobs and pods in that namespace (an EKS access entry)"
                ) from None
            if err.code == 404:
                raise JobStartError(
                    f"PyTorchJob {job.namespace}/{job.name} disappeared while `up` waited for "
                    "it to start (deleted by someone, or its CRD was removed)"
                ) from None
            if err.code not in _TRANSIENT_HTTP or transient >= _MAX_TRANSIENT_ERRORS:
                raise JobStartError(f"watching PyTorchJob {job.name}: {err}") from None
            transient += 1
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            if transient >= _MAX_TRANSIENT_ERRORS:
                raise JobStartError(
                    f"the Kubernetes API server stopped answering while `up` waited for "
                    f"PyTorchJob {job.name}: {err}"
                ) from None
            transient += 1
        else:
            now = datetime.now(UTC)
            history.observe(pods, now)
            verdict = assess(
                document,
                pods,
                workers=job.workers,
                now=now,
                backoff_limit=job.backoff_limit,
                start_timeout_s=job.start_timeout_s,
                events=events,
                history=history,
            )
            if verdict.failure is not None:
                holds_nodes = verdict.progress in ("cannot start", "restarting")
                released = release_gpus(api, job_path) if holds_nodes else ""
                # A later `up` does not relaunch an unchanged job: it would report this again.
                raise JobStartError(
                    f"{verdict.failure}{released} (details: `{follow}`; to relaunch the same "
                    "job, `pulumi up --replace <the PyTorchJob's URN>`)"
                )
            if verdict.done:
                logger.info("%s", verdict.progress)
                return verdict.progress
            if verdict.progress != last_progress:
                logger.info("%s", verdict.progress)
                last_progress = verdict.progress
        if clock() >= deadline:
            raise JobStartError(
                f"PyTorchJob {job.name}: not every worker started within "
                f"{limit_s / 60:.0f} min ({last_progress or 'no status'})"
                f"{release_gpus(api, job_path)}; see `{follow}`"
            )
        sleep(poll_s)


# --- Pulumi dynamic provider ---------------------------------------------------------------


def _send_progress_to_pulumi() -> None:
    """The dynamic provider has no engine connection; its stderr lines reach `pulumi up`."""
    if not any(getattr(h, "_fsdp_eks", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("job start: %(message)s"))
        handler._fsdp_eks = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


class JobStartWatchProvider(ResourceProvider):
    """CRUD for `JobStartWatch`; holds no state of its own, so it pickles by reference."""

    def _wait(self, props: Mapping[str, Any]) -> dict[str, Any]:
        _send_progress_to_pulumi()
        job = WatchedJob(
            props["namespace"],
            props["job_name"],
            int(props["workers"]),
            int(props.get("backoff_limit", 3)),
            float(props.get("start_timeout_seconds") or DEFAULT_START_TIMEOUT_S),
        )
        progress = wait_for_start(
            KubernetesApi.from_kubeconfig(props["kubeconfig"]),
            job,
            poll_s=float(props.get("poll_seconds") or DEFAULT_POLL_SECONDS),
        )
        # The kubeconfig stays an input only: outputs need not carry credentials around.
        return {**{key: props.get(key) for key in TRIGGER_KEYS}, "started": progress}

    def create(self, props: dict[str, Any]) -> CreateResult:
        outs = self._wait(props)
        return CreateResult(id_=f"{props['namespace']}/{props['job_name']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        changed = [key for key in TRIGGER_KEYS if olds.get(key) != news.get(key)]
        return DiffResult(
            changes=bool(changed), replaces=[], stables=[], delete_before_replace=False
        )

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> UpdateResult:
        return UpdateResult(outs=self._wait(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        """Nothing to undo: the watch created nothing in the cluster."""


class JobStartWatch(pulumi.dynamic.Resource, module="job", name="JobStartWatch"):
    """Created once every worker of the PyTorchJob runs; its creation fails with the reason
    when the job fails or its workers cannot start."""

    started: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        kubeconfig: pulumi.Input[str],
        namespace: pulumi.Input[str],
        job_name: pulumi.Input[str],
        job_uid: pulumi.Input[str | None],
        workers: int,
        backoff_limit: int,
        start_timeout_seconds: int,
        poll_seconds: float = DEFAULT_POLL_SECONDS,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        props = {
            "kubeconfig": pulumi.Output.secret(kubeconfig),
            "namespace": namespace,
            "job_name": job_name,
            "job_uid": job_uid,
            "workers": workers,
            "backoff_limit": backoff_limit,
            "start_timeout_seconds": start_timeout_seconds,
            "poll_seconds": poll_seconds,
            "started": None,
        }
        super().__init__(JobStartWatchProvider(), resource_name, props, opts)
