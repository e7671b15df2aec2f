"""A model of Kubernetes field management and of pulumi-kubernetes over it, for one object.

Restates the rules of structured-merge-diff v6.4.0, the API server (v0.36.1) and
pulumi-kubernetes v4.32.0 so that tests play create, stop, up, refresh, replace and start
without a cluster; `test_ssa_model.py` holds it to structured-merge-diff's test tables.
Each rule with its source, and what is not modelled: docs/design/tests.md#ssa_model
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

Path = tuple[str, ...]

APPLY = "Apply"
UPDATE = "Update"


@dataclass(frozen=True)
class Manager:
    name: str
    operation: str
    subresource: str = ""


PYTORCHJOB_API_VERSION = "kubeflow.org/v1"
SUSPEND: Path = ("spec", "runPolicy", "suspend")

CRD_DEFAULTS: dict[Path, Any] = {SUSPEND: False}
"""The PyTorchJob v1.9.0 CRD's default for the field that matters here (`runPolicy.suspend:
default: false`, shared/schemas/kubeflow.org_pytorchjobs.v1.9.0.yaml)."""

STRIPPED: frozenset[Path] = frozenset(
    {
        ("apiVersion",),
        ("kind",),
        ("metadata",),
        ("metadata", "name"),
        ("metadata", "namespace"),
        ("metadata", "creationTimestamp"),
        ("metadata", "selfLink"),
        ("metadata", "uid"),
        ("metadata", "clusterName"),
        ("metadata", "generation"),
        ("metadata", "managedFields"),
        ("metadata", "resourceVersion"),
    }
)
"""apimachinery v0.36.1 `internal/stripmeta.go` `NewStripMetaManager`."""

SERVER_SET = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


# --- values as leaves ----------------------------------------------------------------------


def leaves(obj: Any, prefix: Path = ()) -> dict[Path, Any]:
    """Every leaf of `obj` by path; an empty map is a leaf of its own."""
    if isinstance(obj, dict) and (obj or not prefix):
        out: dict[Path, Any] = {}
        for key, value in obj.items():
            out.update(leaves(value, (*prefix, key)))
        return out
    return {prefix: obj}


def get_path(obj: Any, path: Path) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def put_path(obj: dict[str, Any], path: Path, value: Any) -> None:
    for key in path[:-1]:
        nxt = obj.get(key)
        if not isinstance(nxt, dict):
            nxt = obj[key] = {}
        obj = nxt
    obj[path[-1]] = value


def delete_path(obj: dict[str, Any], path: Path) -> None:
    parent = get_path(obj, path[:-1]) if len(path) > 1 else obj
    if isinstance(parent, dict):
        parent.pop(path[-1], None)


def merge(live: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """The configuration's leaves written over the live object (`TypedValue.Merge`)."""
    out = copy.deepcopy(live)
    for path, value in leaves(config).items():
        if path:
            put_path(out, path, copy.deepcopy(value))
    return out


def merge_patch(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 JSON merge patch."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            current = out.get(key)
            out[key] = merge_patch(current if isinstance(current, dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True)
class Comparison:
    added: frozenset[Path]
    removed: frozenset[Path]
    modified: frozenset[Path]

    @property
    def changed(self) -> frozenset[Path]:
        return self.added | self.removed | self.modified


def compare(old: dict[str, Any], new: dict[str, Any]) -> Comparison:
    a, b = leaves(old), leaves(new)
    return Comparison(
        added=frozenset(set(b) - set(a)),
        removed=frozenset(set(a) - set(b)),
        modified=frozenset(p for p in set(a) & set(b) if a[p] != b[p]),
    )


def dotted(path: Path) -> str:
    """A field path as structured-merge-diff prints it (`fieldpath.Path.String`)."""
    return "".join(f".{step}" for step in path)


# --- API errors in the API server's Status shape -------------------------------------------


class ApiError(Exception):
    """An answer other than 2xx, as `metav1.Status` (apimachinery `pkg/api/errors`)."""

    code = 500
    reason = "InternalError"

    def __init__(self, message: str, causes: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.causes = causes or []

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.causes:
            body["details"] = {"causes": self.causes}
        return body


class NotFoundError(ApiError):
    code, reason = 404, "NotFound"


class AlreadyExistsError(ApiError):
    code, reason = 409, "AlreadyExists"


class InvalidError(ApiError):
    code, reason = 422, "Invalid"


class ConflictError(ApiError):
    """An apply that would change fields other managers own (`internal/conflict.go`
    `NewConflictError`: one cause per field, the message naming manager and path)."""

    code, reason = 409, "Conflict"

    def __init__(self, conflicts: dict[Manager, set[Path]], api_version: str) -> None:
        self.conflicts = conflicts
        pairs = sorted((m.name, m.operation, p) for m, paths in conflicts.items() for p in paths)

        def who(name: str, operation: str) -> str:
            return f'"{name}"' + (f" using {api_version}" if operation == UPDATE else "")

        causes = [
            {
                "reason": "FieldManagerConflict",
                "message": f"conflict with {who(name, op)}",
                "field": dotted(path),
            }
            for name, op, path in pairs
        ]
        if len(pairs) == 1:
            name, op, path = pairs[0]
            message = f"Apply failed with 1 conflict: conflict with {who(name, op)}: {dotted(path)}"
        else:
            lines = []
            for name, op in sorted({(n, o) for n, o, _ in pairs}):
                lines.append(f"conflicts with {who(name, op)}:")
                lines += [f"- {dotted(p)}" for n, o, p in pairs if (n, o) == (name, op)]
            message = f"Apply failed with {len(pairs)} conflicts: " + "\n".join(lines)
        super().__init__(message, causes)


# --- the API server, for one object --------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class ApiServer:
    """One custom resource's storage and field management, as the API server keeps them."""

    kind: str = "PyTorchJob"
    resource: str = "pytorchjobs.kubeflow.org"
    api_version: str = PYTORCHJOB_API_VERSION
    defaults: dict[Path, Any] = field(default_factory=lambda: dict(CRD_DEFAULTS))
    obj: dict[str, Any] | None = None
    managers: dict[Manager, set[Path]] = field(default_factory=dict)
    times: dict[Manager, str] = field(default_factory=dict)
    creations: int = 0
    revision: int = 0

    # -- helpers

    def _default(self, obj: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        for path, value in self.defaults.items():
            if isinstance(get_path(out, path[:-1]), dict) and get_path(out, path) is None:
                put_path(out, path, value)
        return out

    def _require(self, name: str) -> dict[str, Any]:
        if self.obj is None:
            raise NotFoundError(f'{self.resource} "{name}" not found')
        return self.obj

    @staticmethod
    def _main(obj: dict[str, Any]) -> dict[str, Any]:
        """The object as the main resource owns it: no status, no server-set metadata."""
        out = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
        meta = out.get("metadata")
        if isinstance(meta, dict):
            out["metadata"] = {k: v for k, v in meta.items() if k not in SERVER_SET}
        return out

    @staticmethod
    def _owned(paths: set[Path] | frozenset[Path]) -> set[Path]:
        return {p for p in paths if p not in STRIPPED}

    def _store(self, main: dict[str, Any]) -> None:
        """Keep `main` with the live status and server-set metadata."""
        previous = self.obj or {}
        meta = dict(main.get("metadata") or {})
        for key in SERVER_SET:
            if key in (previous.get("metadata") or {}):
                meta[key] = previous["metadata"][key]
        self.revision += 1
        meta["resourceVersion"] = str(self.revision)
        new = {**main, "metadata": meta}
        if "status" in previous:
            new["status"] = previous["status"]
        if previous and self._main(previous).get("spec") != main.get("spec"):
            meta["generation"] = int(meta.get("generation", 1)) + 1
        self.obj = new

    def _update_fields(self, live: dict[str, Any], new: dict[str, Any], me: Manager) -> None:
        """`Updater.Update`: never conflicts; what changed moves to `me`."""
        cmp = compare(live, new)
        taken = cmp.added | cmp.modified
        for other in list(self.managers):
            if other != me and other.subresource == me.subresource:
                self.managers[other] -= taken | cmp.removed
        mine = (self.managers.get(me, set()) - cmp.removed) | self._owned(taken)
        self.managers[me] = mine
        self.times[me] = _now()
        self._drop_empty()

    def _drop_empty(self) -> None:
        self.managers = {m: s for m, s in self.managers.items() if s}
        self.times = {m: t for m, t in self.times.items() if m in self.managers}

    # -- verbs

    def create(self, body: dict[str, Any], manager: str) -> dict[str, Any]:
        """POST: decode with defaults, then an update from nothing by `manager`."""
        if self.obj is not None:
            raise AlreadyExistsError(f'{self.resource} "{body["metadata"]["name"]}" already exists')
        self.creations += 1
        main = self._default(self._main(body))
        self.managers, self.times = {}, {}
        self._update_fields({}, main, Manager(manager, UPDATE))
        self.obj = None
        self._store(main)
        assert self.obj is not None
        self.obj["metadata"].update(
            uid=f"uid-{self.creations}", generation=1, creationTimestamp=_now()
        )
        return self.get(body["metadata"]["name"])

    def delete(self, name: str = "") -> None:
        self._require(name)
        self.obj, self.managers, self.times = None, {}, {}

    def update(self, name: str, body: dict[str, Any], manager: str) -> dict[str, Any]:
        """PUT of the whole object: decoded with defaults, then an update by `manager`."""
        live = self._main(self._require(name))
        new = self._default(self._main(body))
        self._update_fields(live, new, Manager(manager, UPDATE))
        self._store(new)
        return self.get(name)

    def merge_patch(self, name: str, patch: dict[str, Any], manager: str) -> dict[str, Any]:
        """A JSON merge patch: decoded with defaults, then an update by `manager`."""
        live = self._main(self._require(name))
        new = self._default(self._main(merge_patch(live, patch)))
        self._update_fields(live, new, Manager(manager, UPDATE))
        self._store(new)
        return self.get(name)

    def apply(
        self, name: str, config: dict[str, Any], manager: str, *, force: bool = False
    ) -> dict[str, Any]:
        """Server-side apply of `config` by `manager` (`Updater.Apply`)."""
        live = self._main(self._require(name))
        config = self._main(config)
        me = Manager(manager, APPLY)
        merged = merge(live, config)
        last = self.managers.get(me, set())
        mine = self._owned(set(leaves(config)))
        others = {m: s for m, s in self.managers.items() if m != me}
        for path in last - mine:
            if not any(path in owned for owned in others.values()):
                delete_path(merged, path)
        cmp = compare(live, merged)
        conflicts = {m: s & (cmp.added | cmp.modified) for m, s in others.items()}
        conflicts = {m: s for m, s in conflicts.items() if s}
        if conflicts and not force:
            raise ConflictError(conflicts, self.api_version)
        for other in others:
            self.managers[other] = self.managers[other] - conflicts.get(other, set())
            self.managers[other] -= cmp.removed
        self.managers[me] = mine
        self.times[me] = _now()
        self._drop_empty()
        self._store(self._default(merged))
        return self.get(name)

    def update_status(self, name: str, status: dict[str, Any], manager: str) -> dict[str, Any]:
        """PUT on the `status` subresource (what the operator's `Status().Update` sends)."""
        obj = self._require(name)
        me = Manager(manager, UPDATE, "status")
        old = {"status": obj.get("status") or {}}
        new = {"status": copy.deepcopy(status)}
        self._update_fields(old, new, me)
        self.revision += 1
        obj["status"] = copy.deepcopy(status)
        obj["metadata"]["resourceVersion"] = str(self.revision)
        return self.get(name)

    def replace_managed_fields(self, managers: dict[Manager, set[Path]]) -> None:
        """A JSON patch replacing `metadata.managedFields` (what pulumi-kubernetes sends)."""
        self.managers = {m: set(s) for m, s in managers.items()}
        self.times = {m: self.times.get(m, _now()) for m in self.managers}
        self._drop_empty()

    # -- reads

    def managed_fields(self) -> list[dict[str, Any]]:
        """`metadata.managedFields` as the API server serves it (FieldsV1)."""
        entries = []
        for manager, paths in self.managers.items():
            fields: dict[str, Any] = {}
            for path in sorted(paths):
                node = fields
                for step in path:
                    node = node.setdefault(f"f:{step}", {})
            entry: dict[str, Any] = {
                "manager": manager.name,
                "operation": manager.operation,
                "apiVersion": self.api_version,
                "time": self.times.get(manager, _now()),
                "fieldsType": "FieldsV1",
                "fieldsV1": fields,
            }
            if manager.subresource:
                entry["subresource"] = manager.subresource
            entries.append(entry)
        return entries

    def get(self, name: str = "") -> dict[str, Any]:
        obj = copy.deepcopy(self._require(name))
        obj["metadata"]["managedFields"] = self.managed_fields()
        return obj

    def owners(self, path: Path) -> set[Manager]:
        return {m for m, s in self.managers.items() if path in s}

    @property
    def uid(self) -> str | None:
        return None if self.obj is None else str(self.obj["metadata"]["uid"])


def suspended(server: ApiServer) -> bool:
    return server.obj is not None and get_path(server.obj, SUSPEND) is True


# --- pulumi-kubernetes -----------------------------------------------------------------------

TAKEOVER: tuple[tuple[str, str], ...] = (
    ("kubectl", APPLY),
    ("kubectl", UPDATE),
    ("before-first-apply", UPDATE),
    ("pulumi-kubernetes", UPDATE),
    ("pulumi-kubernetes.exe", UPDATE),
    ("pulumi-resource-kubernetes", UPDATE),
)
"""The managers pulumi-kubernetes v4.32.0 takes over on update (`await.go`
`fixCSAFieldManagers`), matched by name prefix and operation (fluxcd/pkg `ssa/patch.go`
`matchFieldManager`, `ExactMatch` unset), main resource only."""


def taken_over(manager: Manager) -> bool:
    return manager.subresource == "" and any(
        manager.name.startswith(prefix) and manager.operation == operation
        for prefix, operation in TAKEOVER
    )


def prune(live: Any, shape: Any) -> Any:
    """`pruneMap` / `pruneSlice` (`provider/util.go`): keep what the inputs have a key for."""
    if isinstance(live, dict) and isinstance(shape, dict):
        return {k: prune(v, shape[k]) for k, v in live.items() if k in shape}
    if isinstance(live, list) and isinstance(shape, list):
        if not live or not shape:
            return []
        if type(live[0]) is not type(shape[0]):
            return copy.deepcopy(live)
        return [prune(v, t) for v, t in zip(live, shape, strict=False)]
    return copy.deepcopy(live)


@dataclass
class PulumiState:
    inputs: dict[str, Any]
    live: dict[str, Any]
    field_manager: str


@dataclass
class Pulumi:
    """`pulumi up` / `refresh` of the one `k8s.apiextensions.CustomResource` over `server`,
    registered as `infra.launch.training_job` does (`replace_on_changes=["spec"]`,
    `delete_before_replace=True`, no `pulumi.com/patchForce`, provider defaults: server-side
    apply on, `enablePatchForce` off)."""

    server: ApiServer
    replace_on_changes: tuple[str, ...] = ("spec",)
    patch_force: bool = False
    state: PulumiState | None = None
    field_managers: int = 0
    steps: list[str] = field(default_factory=list)

    def _new_field_manager(self) -> str:
        # `fieldManagerName`: "pulumi-kubernetes-" + 8 random hex digits, kept in the state.
        self.field_managers += 1
        return f"pulumi-kubernetes-{self.field_managers:08x}"

    def refresh(self) -> None:
        if self.state is None:
            return
        if self.server.obj is None:
            self.state = None  # Read: 404 -> deleteResponse
            return
        live = self.server.get()
        self.state = PulumiState(prune(live, self.state.inputs), live, self.state.field_manager)

    def diff(self, inputs: dict[str, Any]) -> set[Path]:
        """Paths where `inputs` differ from the last live object pruned to the old inputs."""
        assert self.state is not None
        return set(compare(prune(self.state.live, self.state.inputs), inputs).changed)

    def _create(self, inputs: dict[str, Any], field_manager: str | None = None) -> None:
        live = self.server.create(copy.deepcopy(inputs), "pulumi-kubernetes")
        self.state = PulumiState(
            copy.deepcopy(inputs), live, field_manager or self._new_field_manager()
        )

    def _fix_csa_field_managers(self, field_manager: str) -> None:
        """`fixCSAFieldManagers` through `PatchReplaceFieldsManagers`: the first matching
        entry is renamed to our Apply manager unless we have one, the rest merged into it."""
        ours = Manager(field_manager, APPLY)
        managers: dict[Manager, set[Path]] = {}
        merged: set[Path] | None = (
            set(self.server.managers[ours]) if (ours in self.server.managers) else None
        )
        for manager, paths in self.server.managers.items():
            if manager == ours:
                continue
            if taken_over(manager):
                merged = set(paths) if merged is None else merged | paths
                continue
            managers[manager] = set(paths)
        if merged is not None:
            managers[ours] = merged
        self.server.replace_managed_fields(managers)

    def _update(self, inputs: dict[str, Any]) -> None:
        assert self.state is not None
        name = inputs["metadata"]["name"]
        live = self.server.get(name)  # NotFound fails the update
        field_manager = self.state.field_manager
        if live["metadata"]["managedFields"]:
            self._fix_csa_field_managers(field_manager)
        force = self.patch_force or not live["metadata"]["managedFields"]
        stored = self.server.apply(name, copy.deepcopy(inputs), field_manager, force=force)
        self.state = PulumiState(copy.deepcopy(inputs), stored, field_manager)

    def up(self, inputs: dict[str, Any], *, refresh: bool = False, replace: bool = False) -> str:
        """One `pulumi up` of the resource; returns the step: create, same, update, replace."""
        if refresh:
            self.refresh()
        if self.state is None:
            self._create(inputs)
            step = "create"
        else:
            changed = self.diff(inputs)
            if replace or any(p[:1] in {(k,) for k in self.replace_on_changes} for p in changed):
                # `await.Deletion`: NotFound is success.
                with contextlib.suppress(NotFoundError):
                    self.server.delete(inputs["metadata"]["name"])
                self.state = None
                self._create(inputs)
                step = "replace"
            elif changed:
                self._update(inputs)
                step = "update"
            else:
                step = "same"
        self.steps.append(step)
        return step


# --- the run's job and the ways to stop it ---------------------------------------------------


def job_inputs(
    *,
    image: str = "img@sha256:1",
    label: str = "a",
    suspend: bool | None = None,
    name: str = "exp",
    namespace: str = "training",
) -> dict[str, Any]:
    """A small PyTorchJob as the program registers it (`spec` and `metadata.labels`)."""
    run_policy: dict[str, Any] = {"cleanPodPolicy": "None", "backoffLimit": 3}
    if suspend is not None:
        run_policy["suspend"] = suspend
    return {
        "apiVersion": PYTORCHJOB_API_VERSION,
        "kind": "PyTorchJob",
        "metadata": {"name": name, "namespace": namespace, "labels": {"release": label}},
        "spec": {
            "runPolicy": run_policy,
            "pytorchReplicaSpecs": {
                "Worker": {
                    "replicas": 2,
                    "template": {"spec": {"containers": [{"name": "pytorch", "image": image}]}},
                }
            },
        },
    }
