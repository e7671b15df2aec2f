"""The one client of a cluster's Kubernetes API, over the Kubernetes project's Python client.

Every verb that reaches a cluster talks through `KubeClient`, from the program's kubeconfig or a
context of the user's (kubernetes-client/python v37.0.1 `config/kube_config.py`). Objects come
back as the API server's JSON; every failure is one-line `KubernetesApiError`.
Why and sources: docs/design/job.md#kube_client
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.config.config_exception import ConfigException

from infra.job.job_api import CustomKind, JobApi
from infra.job.queueing import KUEUE_GROUP, WORKLOAD_VERSION

APPLY_PATCH_TYPE = "application/apply-patch+yaml"
"""Server-side apply (apimachinery `pkg/types/patch.go` `ApplyYAMLPatchType`). Passed as
`_content_type`: without it the generated `patch_*` methods pick the first JSON type of their
list, a JSON patch, which rest.py turns into a strategic merge patch that CRDs refuse (v37.0.1
`api_client.py` `select_header_content_type`, `rest.py`)."""

REQUEST_TIMEOUT_S = 30.0
"""Per request (connect and read); a followed log stream has none."""


@dataclass(frozen=True)
class ResourceRef:
    """What a request names, in the words RBAC uses (verb, resource.group, namespace)."""

    verb: str
    resource: str
    """`pods`, or `pytorchjobs.kubeflow.org` for a resource outside the core group."""
    namespace: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"`{self.verb}` on {self.resource}{where}"


class KubernetesApiError(RuntimeError):
    """A request the API server refused, or one that got no answer (`status` None)."""

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
        """Status `details.causes` (an apply conflict: one per field, `FieldManagerConflict`)."""
        self.request = request


class KubernetesCredentialError(KubernetesApiError):
    """The kubeconfig gives no usable credentials (no such context, no token, or its credential
    command failed): retrying does not help, unlike a connection error."""


def _refused(err: k8s.ApiException, request: ResourceRef) -> KubernetesApiError:
    """The API server's `Status` answer as one line (apimachinery `pkg/api/errors`)."""
    try:
        status: Any = json.loads(err.body or b"{}")
    except (ValueError, TypeError):
        status = {}
    if not isinstance(status, dict):
        status = {}
    code = int(err.status or 0)
    reason = str(status.get("reason") or err.reason or "")
    api_message = str(status.get("message") or "").strip()
    causes = tuple((status.get("details") or {}).get("causes") or ())
    target = request.resource + (f" {request.namespace}/" if request.namespace else " ")
    target += request.name or ""
    text = f"{request.verb} {target.rstrip()}: HTTP {code} {reason}"
    if api_message:
        text += f": {api_message}"
    if code == 401:
        text += (
            "; the cluster did not accept the kubeconfig's credentials: the identity "
            f"`aws eks get-token` signs as needs an EKS access entry on the cluster and {request}"
        )
    elif code == 403:
        text += (
            f"; the identity the kubeconfig signs as needs {request} (an RBAC Role bound to it, "
            "or an EKS access policy)"
        )
    return KubernetesApiError(
        text, status=code, reason=reason, api_message=api_message, causes=causes, request=request
    )


class _CapturedErrors(logging.Handler):
    """The library logs a failed exec plugin and goes on without a token (v37.0.1
    `kube_config.py` `_load_from_exec_plugin`); kept here to say why in one line."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _loading(what: str) -> Iterator[_CapturedErrors]:
    captured = _CapturedErrors()
    root = logging.getLogger()
    root.addHandler(captured)
    try:
        yield captured
    except ConfigException as err:
        raise KubernetesCredentialError(f"{what}: {err}") from None
    finally:
        root.removeHandler(captured)


def _user_of(config: Mapping[str, Any], context: str | None) -> Mapping[str, Any]:
    name = context or config.get("current-context")
    chosen = next((c.get("context") or {} for c in config.get("contexts") or []
                   if c.get("name") == name), {})  # fmt: skip
    user = next((u.get("user") or {} for u in config.get("users") or []
                 if u.get("name") == chosen.get("user")), {})  # fmt: skip
    return user if isinstance(user, Mapping) else {}


CREDENTIAL_KEYS = ("token", "tokenFile", "exec", "client-certificate", "client-certificate-data",
                   "username", "auth-provider")  # fmt: skip
"""What a kubeconfig user may sign with (client-go `tools/clientcmd/api/types.go` AuthInfo)."""


def _require_token(
    api_client: k8s.ApiClient, user: Mapping[str, Any], captured: _CapturedErrors
) -> None:
    """A user without credentials, or an exec user whose plugin gave no token, would go on
    unauthenticated: say why now."""
    if not any(user.get(key) for key in CREDENTIAL_KEYS):
        raise KubernetesCredentialError(
            "the cluster's kubeconfig has neither a token nor an exec credential plugin for "
            "its user"
        )
    exec_spec = user.get("exec")
    if not isinstance(exec_spec, Mapping) or api_client.configuration.api_key.get("BearerToken"):
        return
    words = [exec_spec.get("command"), *(exec_spec.get("args") or [])]
    command = " ".join(str(word) for word in words)
    why = captured.lines[-1] if captured.lines else "it printed no token"
    raise KubernetesCredentialError(
        f"the kubeconfig's credential command `{command}` failed ({why.strip()[-500:]}); the "
        "Kubernetes provider needs it too (the AWS CLI for EKS)"
    )


def _trim_token(api_client: k8s.ApiClient) -> None:
    """A `tokenFile`'s token without its trailing newline, as client-go reads it
    (`transport/token_source.go` `fileTokenSource`: `strings.TrimSpace`); the library keeps
    the newline (v37.0.1 `FileOrData`) and re-sets it before every request, so its hook is
    wrapped."""
    configuration = api_client.configuration
    refresh = configuration.refresh_api_key_hook

    def refreshed(conf: k8s.Configuration) -> None:
        if refresh is not None:
            refresh(conf)
        token = conf.api_key.get("BearerToken")
        if isinstance(token, str):
            conf.api_key["BearerToken"] = token.strip()

    configuration.refresh_api_key_hook = refreshed
    refreshed(configuration)


def user_kubeconfig_files() -> str:
    """The files kubectl reads: `KUBECONFIG`'s list, else `~/.kube/config` (client-go
    `tools/clientcmd/loader.go`); read at each call, not when the library was imported."""
    return os.environ.get("KUBECONFIG") or str(Path("~/.kube/config").expanduser())


# Kinds `apply`/`delete` handle: (api, snake name) of their typed methods.
_TYPED = {
    ("v1", "ConfigMap"): ("core", "config_map"),
    ("batch/v1", "Job"): ("batch", "job"),
    ("networking.k8s.io/v1", "NetworkPolicy"): ("networking", "network_policy"),
}
_PLURALS = {"ConfigMap": "configmaps", "Job": "jobs", "NetworkPolicy": "networkpolicies"}


class KubeClient:
    """One cluster's API: the reads, applies, deletes and log streams the verbs need."""

    def __init__(self, api_client: k8s.ApiClient) -> None:
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.batch = k8s.BatchV1Api(api_client)
        self.networking = k8s.NetworkingV1Api(api_client)
        self.custom = k8s.CustomObjectsApi(api_client)

    @property
    def server(self) -> str:
        return str(self.api_client.configuration.host)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | Mapping[str, Any]) -> KubeClient:
        """The current context of a kubeconfig document, or its text (JSON is YAML)."""
        document = yaml.safe_load(kubeconfig) if isinstance(kubeconfig, str) else kubeconfig
        with _loading("the cluster's kubeconfig") as captured:
            api_client = k8s_config.new_client_from_config_dict(
                dict(document), persist_config=False
            )
        _require_token(api_client, _user_of(document, None), captured)
        _trim_token(api_client)
        return cls(api_client)

    @classmethod
    def from_user_context(cls, context: str) -> KubeClient:
        """A context of the user's own kubeconfig, as `kubectl --context` reads it."""
        files = user_kubeconfig_files()
        with _loading(f"--context {context}") as captured:
            # The merge kubectl does, first file to name an entry wins (KubeConfigMerger).
            document = _plain(k8s_config.kube_config.KubeConfigMerger(files).config) or {}
            names = [str(c.get("name")) for c in document.get("contexts") or []]
            if context not in names:
                raise KubernetesCredentialError(
                    f"--context {context}: no such context in {', '.join(files.split(os.pathsep))}"
                    f" (contexts: {', '.join(names) or 'none'})"
                )
            api_client = k8s_config.new_client_from_config(
                config_file=files, context=context, persist_config=False
            )
        _require_token(api_client, _user_of(document, context), captured)
        _trim_token(api_client)
        return cls(api_client)

    @contextmanager
    def _asking(self, request: ResourceRef) -> Iterator[None]:
        try:
            yield
        except k8s.ApiException as err:
            if err.status in (None, 0):  # the library's own refusals carry no status
                raise KubernetesApiError(f"{request.verb} {request.resource}: {err}") from None
            raise _refused(err, request) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise KubernetesApiError(
                f"{request.verb} {request.resource}: no answer from the Kubernetes API server "
                f"{self.server} ({type(err).__name__}: {err})",
                request=request,
            ) from None

    # -- the job ------------------------------------------------------------------------------

    def get_job(self, api: CustomKind, namespace: str, name: str) -> dict[str, Any]:
        with self._asking(ResourceRef("get", api.resource, namespace, name)):
            answer = self.custom.get_namespaced_custom_object(
                api.group, api.version, namespace, api.plural, name,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return dict(_document(answer))

    def apply_job(
        self,
        api: JobApi,
        namespace: str,
        name: str,
        body: Mapping[str, Any],
        *,
        field_manager: str,
        force: bool,
    ) -> dict[str, Any]:
        """Server-side apply of `body` as `field_manager`; the object as stored. The manager
        then owns exactly the fields `body` sets (structured-merge-diff v6.4.0
        `merge/update.go` `Updater.Apply`); `force` takes them over instead of a 409."""
        with self._asking(ResourceRef("patch", api.resource, namespace, name)):
            answer = self.custom.patch_namespaced_custom_object(
                api.group, api.version, namespace, api.plural, name, dict(body),
                field_manager=field_manager, force=force, _content_type=APPLY_PATCH_TYPE,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return dict(_document(answer))

    # -- Kueue's Workloads (a queued job's admission) -----------------------------------------

    def list_workloads(self, namespace: str) -> list[dict[str, Any]]:
        """Kueue's Workloads in `namespace` (in `WORKLOAD_VERSION`, served by Kueue v0.9+)."""
        with self._asking(ResourceRef("list", "workloads.kueue.x-k8s.io", namespace)):
            answer = self.custom.list_namespaced_custom_object(
                KUEUE_GROUP, WORKLOAD_VERSION, namespace, "workloads",
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return list(_document(answer).get("items") or [])

    def apply_workload(
        self, namespace: str, name: str, body: Mapping[str, Any], *, field_manager: str
    ) -> dict[str, Any]:
        """Server-side apply of `body` to a Workload as `field_manager`, forced (Kueue's own
        manager may own the field); the Workload as stored."""
        with self._asking(ResourceRef("patch", "workloads.kueue.x-k8s.io", namespace, name)):
            answer = self.custom.patch_namespaced_custom_object(
                KUEUE_GROUP, WORKLOAD_VERSION, namespace, "workloads", name, dict(body),
                field_manager=field_manager, force=True, _content_type=APPLY_PATCH_TYPE,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return dict(_document(answer))

    # -- core objects -------------------------------------------------------------------------

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        with self._asking(ResourceRef("list", "pods", namespace)):
            answer = self.core.list_namespaced_pod(
                namespace, label_selector=label_selector,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return list(_document(answer).get("items") or [])

    def list_events(self, namespace: str, field_selector: str) -> list[dict[str, Any]]:
        with self._asking(ResourceRef("list", "events", namespace)):
            answer = self.core.list_namespaced_event(
                namespace, field_selector=field_selector,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return list(_document(answer).get("items") or [])

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        with self._asking(ResourceRef("list", "nodes")):
            answer = self.core.list_node(
                label_selector=label_selector,
                _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
            )  # fmt: skip
            return list(_document(answer).get("items") or [])

    def get_batch_job(self, namespace: str, name: str) -> dict[str, Any]:
        with self._asking(ResourceRef("get", "jobs.batch", namespace, name)):
            answer = self.batch.read_namespaced_job(
                name, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
            return dict(_document(answer))

    def pod_log_lines(
        self,
        namespace: str,
        pod: str,
        container: str | None,
        *,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> Iterator[str]:
        """The container's log, line by line (newline kept); followed until the container
        ends when `follow` (the library's log stream: `watch.Watch.stream` on
        `read_namespaced_pod_log`)."""
        options: dict[str, Any] = {}
        if container is not None:  # None: the pod's only container
            options["container"] = container
        if tail is not None:
            options["tail_lines"] = tail
        if previous:
            options["previous"] = True
        with self._asking(ResourceRef("get", "pods (subresource log)", namespace, pod)):
            if follow:
                for line in k8s_watch.Watch().stream(
                    self.core.read_namespaced_pod_log, pod, namespace, **options
                ):
                    yield f"{line}\n"
                return
            answer = self.core.read_namespaced_pod_log(
                pod, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S,
                **options,
            )  # fmt: skip
            for line in k8s_watch.watch.iter_resp_lines(answer):
                yield f"{line}\n"

    # -- any manifest the check workloads use -------------------------------------------------

    def apply(self, manifests: Iterable[Mapping[str, Any]], *, field_manager: str) -> None:
        """Server-side apply of each manifest (as `kubectl apply --server-side`, unforced)."""
        for manifest in manifests:
            self._each(manifest, "patch", field_manager=field_manager)

    def delete(self, manifests: Iterable[Mapping[str, Any]]) -> None:
        """Delete each manifest's object, its dependants in the background; absent is fine."""
        for manifest in manifests:
            try:
                self._each(manifest, "delete")
            except KubernetesApiError as err:
                if err.status != 404:
                    raise

    def _each(self, manifest: Mapping[str, Any], verb: str, *, field_manager: str = "") -> None:
        api_version, kind = str(manifest["apiVersion"]), str(manifest["kind"])
        meta = manifest.get("metadata") or {}
        name, namespace = str(meta["name"]), str(meta.get("namespace") or "default")
        options: dict[str, Any] = {"_preload_content": False}
        options["_request_timeout"] = REQUEST_TIMEOUT_S
        if verb == "patch":
            options.update(field_manager=field_manager, _content_type=APPLY_PATCH_TYPE)
        else:
            options["propagation_policy"] = "Background"
        typed = _TYPED.get((api_version, kind))
        if typed is None:  # a custom resource (the NCCL check's PyTorchJob)
            group, _, version = api_version.rpartition("/")
            plural = f"{kind.lower()}s"
            request = ResourceRef(verb, f"{plural}.{group}", namespace, name)
            method = getattr(self.custom, f"{verb}_namespaced_custom_object")
            args: tuple[Any, ...] = (group, version, namespace, plural, name)
        else:
            api, snake = typed
            group = api_version.rpartition("/")[0]
            resource = _PLURALS[kind] + (f".{group}" if group else "")
            request = ResourceRef(verb, resource, namespace, name)
            method = getattr(getattr(self, api), f"{verb}_namespaced_{snake}")
            args = (name, namespace)
        if verb == "patch":
            args = (*args, dict(manifest))
        with self._asking(request):
            method(*args, **options)


def _document(answer: object) -> Any:
    """The JSON body of a call made with `_preload_content=False` (a urllib3 response)."""
    return json.loads(getattr(answer, "data", b"") or b"{}")


def _plain(node: Any) -> Any:
    """The library's merged kubeconfig (ConfigNode wrappers) as plain dicts and lists."""
    value = node.value if hasattr(node, "value") else node
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value
