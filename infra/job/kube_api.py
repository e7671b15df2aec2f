"""A small client for one cluster's Kubernetes API: reads, and server-side apply.

`pulumi up`'s start watch and the `fsdp-eks stop` / `start` commands reach the API server
exactly as the stack's Kubernetes provider does: from the kubeconfig the program builds
(`infra.job.kubeconfig`), running its credential plugin (`aws eks get-token ...`, with the
profile and role it names) and trusting the cluster's CA. That is the client-go
exec-credential protocol: run `user.exec.command` with `args` and `env`, read `status.token`
from the `ExecCredential` it prints (k8s.io/client-go `plugin/pkg/client/auth/exec/exec.go`).

Plain `urllib`, no Kubernetes client library: the few calls needed (GET, list with a label
selector, an apply PATCH) do not justify a dependency in the environments that import this
(the Pulumi program's dynamic provider and the command-line tool, which must not import
pulumi).

Every failure is a `KubernetesApiError` with the HTTP status and the API server's own
message; a refused request (401/403) also names the permission it needed, read from the
request (`get`/`list`/`patch` on which resource in which namespace).
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

TOKEN_REFRESH_S = 300.0
"""EKS tokens from `aws eks get-token` last 15 minutes; fetch a new one well before."""

APPLY_PATCH_TYPE = "application/apply-patch+yaml"
"""The server-side apply patch type (k8s.io/apimachinery `pkg/types/patch.go`
`ApplyYAMLPatchType`); its body is YAML, and JSON is YAML."""


@dataclass(frozen=True)
class ResourceRef:
    """What an API path names, in the words RBAC uses (verb, resource.group, namespace)."""

    verb: str
    resource: str
    """`pods`, or `pytorchjobs.kubeflow.org` for a resource outside the core group."""
    namespace: str | None
    name: str | None

    @classmethod
    def from_request(cls, method: str, path: str) -> ResourceRef:
        """`/api/v1/namespaces/N/pods`, `/apis/G/V/namespaces/N/R/NAME`, ... as RBAC sees them
        (k8s.io/apiserver `pkg/endpoints/request/requestinfo.go`: a GET of a collection is
        `list`, of one object `get`)."""
        parts = [p for p in urllib.parse.urlsplit(path).path.split("/") if p]
        group = ""
        if parts[:1] == ["api"]:
            rest = parts[2:]
        else:
            group, rest = (parts[1] if len(parts) > 1 else ""), parts[3:]
        namespace = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            namespace, rest = rest[1], rest[2:]
        resource = rest[0] if rest else ""
        name = rest[1] if len(rest) > 1 else None
        qualified = f"{resource}.{group}" if group else resource
        if len(rest) > 2:
            qualified += f" (subresource {rest[2]})"
        verbs = {
            "GET": "get" if name else "list",
            "PATCH": "patch",
            "POST": "create",
            "PUT": "update",
            "DELETE": "delete",
        }
        return cls(verbs.get(method, method.lower()), qualified, namespace, name)

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"`{self.verb}` on {self.resource}{where}"


class KubernetesApiError(RuntimeError):
    """A request the API server refused, or one that got no answer (`status` None).

    `str()` is one line for the user: what was asked, the HTTP status, the server's message
    and, for 401/403, the permission the caller needs."""

    def __init__(
        self,
        text: str,
        *,
        status: int | None = None,
        reason: str = "",
        api_message: str = "",
        causes: tuple[Mapping[str, Any], ...] = (),
        request: ResourceRef | None = None,
    ) -> None:
        super().__init__(text)
        self.status = status
        self.reason = reason
        """The Status `reason` (`NotFound`, `Conflict`, `Forbidden`, ...)."""
        self.api_message = api_message
        self.causes = causes
        """Status `details.causes` (for an apply conflict: one per field, type
        `FieldManagerConflict`)."""
        self.request = request


class KubernetesCredentialError(KubernetesApiError):
    """The kubeconfig gives no usable credentials: no token, or its credential command
    failed. Retrying does not help, unlike a connection error."""


def _http_error(err: urllib.error.HTTPError, request: ResourceRef) -> KubernetesApiError:
    """The API server's `Status` answer as one line (k8s.io/apimachinery `pkg/api/errors`)."""
    try:
        status: dict[str, Any] = json.loads(err.read() or b"{}")
    except ValueError:
        status = {}
    if not isinstance(status, dict):
        status = {}
    reason = str(status.get("reason") or err.reason or "")
    api_message = str(status.get("message") or "").strip()
    causes = tuple((status.get("details") or {}).get("causes") or ())
    target = request.resource + (f" {request.namespace}/" if request.namespace else " ")
    target += request.name or ""
    text = f"{request.verb} {target.rstrip()}: HTTP {err.code} {reason}"
    if api_message:
        text += f": {api_message}"
    if err.code == 401:
        text += (
            "; the cluster did not accept the kubeconfig's credentials: the identity "
            f"`aws eks get-token` signs as needs an EKS access entry on the cluster and {request}"
        )
    elif err.code == 403:
        text += (
            f"; the identity the kubeconfig signs as needs {request} (an RBAC Role bound to it, "
            "or an EKS access policy)"
        )
    return KubernetesApiError(
        text,
        status=err.code,
        reason=reason,
        api_message=api_message,
        causes=causes,
        request=request,
    )


class KubernetesApi:
    """Requests to one API server with a bearer token from the kubeconfig's user."""

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
    def from_kubeconfig(cls, kubeconfig: str | Mapping[str, Any]) -> KubernetesApi:
        """The current context's server, CA and credentials (a token or an exec plugin).
        `kubeconfig` is the document or its text (JSON, as the cluster component writes it,
        is YAML)."""
        config = yaml.safe_load(kubeconfig) if isinstance(kubeconfig, str) else kubeconfig
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
        raise KubernetesCredentialError(
            "the cluster's kubeconfig has neither a token nor an exec credential plugin for "
            f"user {context['user']!r}"
        )

    def _request(
        self,
        method: str,
        path: str,
        query: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
    ) -> dict[str, Any]:
        ref = ResourceRef.from_request(method, path)
        headers = {"Authorization": f"Bearer {self._token()}", "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        url = self.server + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        request = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(
                request, timeout=self._timeout_s, context=self._context
            ) as answer:
                return dict(json.load(answer))
        except urllib.error.HTTPError as err:
            raise _http_error(err, ref) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            reason = getattr(err, "reason", err)
            raise KubernetesApiError(
                f"{ref.verb} {ref.resource}: no answer from the Kubernetes API server "
                f"{self.server} ({reason})",
                request=ref,
            ) from None

    def get(self, path: str, query: Mapping[str, str] | None = None) -> dict[str, Any]:
        """GET an object or a list (`query`: `labelSelector`, `fieldSelector`, ...)."""
        return self._request("GET", path, query)

    def apply(
        self, path: str, body: Mapping[str, Any], *, field_manager: str, force: bool
    ) -> dict[str, Any]:
        """Server-side apply of `body` as `field_manager`; returns the object as stored.

        The manager then owns exactly the fields `body` sets, whether or not they changed
        (kubernetes-sigs/structured-merge-diff v6.4.0 `merge/update.go` `Updater.Apply`).
        `force` takes fields over from other managers instead of failing with 409 Conflict.
        The API server refuses an apply without a manager (k8s.io/apimachinery v0.36.1
        `pkg/apis/meta/v1/validation/validation.go` `ValidatePatchOptions`).
        """
        query = {"fieldManager": field_manager, "force": "true" if force else "false"}
        data = json.dumps(body).encode()
        return self._request("PATCH", path, query, data, APPLY_PATCH_TYPE)


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
        except (OSError, subprocess.TimeoutExpired) as err:
            raise KubernetesCredentialError(
                f"cannot run the kubeconfig's credential command {command[0]!r} ({err}); the "
                "Kubernetes provider needs it too (the AWS CLI for EKS)"
            ) from None
        if done.returncode != 0:
            raise KubernetesCredentialError(
                f"the kubeconfig's credential command `{' '.join(command)}` failed "
                f"(exit {done.returncode}): {done.stderr.strip()[-500:]}"
            )
        try:
            return str(json.loads(done.stdout)["status"]["token"])
        except (ValueError, KeyError, TypeError):
            raise KubernetesCredentialError(
                f"the kubeconfig's credential command `{' '.join(command)}` printed no "
                "ExecCredential with status.token"
            ) from None
