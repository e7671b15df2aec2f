"""Evaluate the real Pulumi program with no engine, no CLI and no cloud credentials.

The Pulumi SDK's mock runtime, with resource references switched off (they can hang across
event loops) and every registration recorded with its parent, options and dependencies.
Why: docs/design/program.md#offline-runtime
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pulumi
from google.protobuf import empty_pb2
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime.proto import resource_pb2
from pulumi.runtime.stack import wait_for_rpcs
from pulumi.runtime.sync_await import _ensure_event_loop, _sync_await

from infra.offline.outputs import FakeCloud

STACK_TYPE = "pulumi:pulumi:Stack"


@dataclass
class RecordedResource:
    """One registration the program made, as the engine would have received it."""

    urn: str
    type: str
    name: str
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    parent: str
    custom: bool
    remote: bool
    provider: str
    dependencies: list[str]
    retain_on_delete: bool
    delete_before_replace: bool
    replace_on_changes: list[str]
    ignore_changes: list[str]


@dataclass
class Evaluation:
    """What one evaluation of the program produced."""

    resources: list[RecordedResource]
    stack_outputs: dict[str, Any]
    invokes: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What the program logged as warnings (`pulumi.log.warn`): the engine would show them in
    `pulumi preview`; the offline plan shows them labelled, beside its summary."""

    def of_type(self, type_token: str) -> list[RecordedResource]:
        return [r for r in self.resources if r.type == type_token]

    def one(self, type_token: str, name: str | None = None) -> RecordedResource:
        """The single resource of `type_token` (and `name`, when given); anything else fails."""
        matches = [r for r in self.of_type(type_token) if name is None or r.name == name]
        assert len(matches) == 1, (
            f"expected one {type_token} {name or ''}, found {[r.name for r in matches]}"
        )
        return matches[0]

    def by_urn(self, urn: str) -> RecordedResource:
        for resource in self.resources:
            if resource.urn == urn:
                return resource
        raise KeyError(urn)

    def ancestors(self, resource: RecordedResource) -> list[RecordedResource]:
        """Parents of `resource`, nearest first (the stack itself excluded)."""
        chain = []
        parent = resource.parent
        while parent:
            try:
                owner = self.by_urn(parent)
            except KeyError:
                break
            chain.append(owner)
            parent = owner.parent
        return chain

    def depends_on(self, resource: RecordedResource, other: RecordedResource) -> bool:
        """Whether `resource` (or one of its component parents) declares a dependency on `other`.

        Pulumi treats a dependency on a component as a dependency on all of its children, and a
        child inherits the wait of a parent's `depends_on`; both are honoured here.
        """
        targets = {other.urn} | {a.urn for a in self.ancestors(other)}
        holders = [resource, *self.ancestors(resource)]
        return any(targets & set(holder.dependencies) for holder in holders)


class _RecordingMonitor(pulumi_mocks.MockMonitor):
    """A MockMonitor that records whole registrations and never rehydrates references."""

    def __init__(self, mocks: FakeCloud) -> None:
        super().__init__(mocks)
        self.fake_cloud = mocks
        self.recorded: list[RecordedResource] = []
        self.thread_loops: set[asyncio.AbstractEventLoop] = set()
        self._lock = threading.Lock()

    def _track_thread_loop(self) -> None:
        """Remember the event loop of the executor thread serving this call.

        The SDK calls the monitor from its loop's executor threads, and each of those gets a
        loop of its own on first use that nothing closes; `evaluate` closes them when done.
        """
        loop = _ensure_event_loop()
        with self._lock:
            self.thread_loops.add(loop)

    def Invoke(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        self._track_thread_loop()
        return super().Invoke(request)

    def ReadResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        self._track_thread_loop()
        return super().ReadResource(request)

    def GetDeploymentInfo(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        info = super().GetDeploymentInfo(request)
        features = [
            f
            for f in info.supportedFeatures
            if f != resource_pb2.RESOURCE_MONITOR_FEATURE_RESOURCE_REFERENCES
        ]
        return resource_pb2.DeploymentInfo(supportedFeatures=features)

    def SupportsFeature(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        supported = request.id not in ("outputValues", "resourceReferences")
        return type("SupportsFeatureResponse", (object,), {"hasSupport": supported})

    def RegisterResource(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        self._track_thread_loop()
        urn = self.make_urn(request.parent, request.type, request.name)
        if request.type == STACK_TYPE:
            return resource_pb2.RegisterResourceResponse(urn=urn)
        inputs = rpc.deserialize_properties(request.object)
        args = pulumi_mocks.MockResourceArgs(
            typ=request.type,
            name=request.name,
            inputs=inputs,
            provider=request.provider,
            resource_id=request.importId,
            custom=request.custom or False,
        )
        mock_id, state = self.mocks.new_resource(args)
        id_ = mock_id or ""
        self.resources[urn] = pulumi_mocks.MockMonitor.ResourceRegistration(urn, id_, state)
        self.recorded.append(
            RecordedResource(
                urn=urn,
                type=request.type,
                name=request.name,
                inputs=inputs,
                outputs=state,
                parent=request.parent,
                custom=bool(request.custom),
                remote=bool(request.remote),
                provider=request.provider,
                dependencies=list(request.dependencies),
                retain_on_delete=bool(request.retainOnDelete),
                delete_before_replace=bool(request.deleteBeforeReplace),
                replace_on_changes=list(request.replaceOnChanges),
                ignore_changes=list(request.ignoreChanges),
            )
        )
        state_proto = _sync_await(rpc.serialize_properties(state, {}))
        return resource_pb2.RegisterResourceResponse(urn=urn, id=id_, object=state_proto)

    def RegisterResourceOutputs(self, request: Any) -> Any:  # noqa: N802 - gRPC method name
        return empty_pb2.Empty()


class _WarningRecorder(logging.Handler):
    """The mock engine's logger (`pulumi.runtime.mocks.MockEngine` logs `pulumi.log` calls to
    it): warnings and errors are kept, in order, and nothing reaches the terminal."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []
        # One logger for every evaluation, this recorder its only handler while one runs: a
        # logger per evaluation stayed in logging's registry for the life of the process.
        self.logger = logging.getLogger("fsdp-eks.offline")
        self.logger.propagate = False
        self.logger.handlers = [self]

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _config_entries(project: str, config: Mapping[str, Any]) -> dict[str, str]:
    """Stack-file config (`key` or `namespace:key` → value) as the engine hands it over.

    Pulumi passes every value as a string; structured values arrive as JSON.
    """
    entries = {}
    for key, value in config.items():
        full_key = key if ":" in key else f"{project}:{key}"
        entries[full_key] = value if isinstance(value, str) else json.dumps(value)
    return entries


def evaluate(
    program: Callable[[], None],
    *,
    config: Mapping[str, Any],
    secret_keys: Sequence[str] = (),
    project: str = "fsdp-eks",
    stack: str = "dev",
    fake_cloud: FakeCloud | None = None,
) -> Evaluation:
    """Run `program` under the mock runtime with `config` and return what it registered.

    `config` maps `key` (project namespace implied) or `namespace:key` to values as in a stack
    file. An exception raised by the program propagates after pending registrations settle, so
    callers can check that a rejected config registered nothing.
    """
    region = config.get("aws:region")
    cloud = fake_cloud or FakeCloud(region if isinstance(region, str) else None)
    logged = _WarningRecorder()
    monitor = _RecordingMonitor(cloud)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    failed = False

    def report_unless_failed(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # After a failed evaluation the SDK leaves futures holding the very error that was
        # raised to the caller; asyncio would print each again when they are collected.
        if failed and isinstance(context.get("exception"), Exception):
            return
        loop.default_exception_handler(context)

    loop.set_exception_handler(report_unless_failed)
    try:
        settings.ROOT.set(None)
        entries = _config_entries(project, config)
        secrets = [k if ":" in k else f"{project}:{k}" for k in secret_keys]
        pulumi.runtime.set_all_config(entries, secret_keys=secrets)
        pulumi_mocks.set_mocks(
            cloud,
            project=project,
            stack=stack,
            preview=False,
            monitor=monitor,
            logger=logged.logger,
        )
        error: BaseException | None = None
        try:
            program()
        except BaseException as exc:
            error = exc
        try:
            _sync_await(wait_for_rpcs())
        except BaseException:
            failed = True
            raise
        if error is not None:
            failed = True
            raise error
        root = settings.get_root_resource()
        exported = dict(getattr(root, "outputs", {}) or {})
        stack_outputs = {
            name: _sync_await(pulumi.Output.from_input(value).future())
            for name, value in exported.items()
        }
        return Evaluation(
            resources=list(monitor.recorded),
            stack_outputs=stack_outputs,
            invokes=list(cloud.invokes),
            warnings=list(logged.messages),
        )
    finally:
        # A program that raised leaves outputs pending in the SDK's process-wide settings; they
        # belong to this loop, and the next evaluation must not find them.
        pending = [task for task in settings.SETTINGS.outputs if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        settings.SETTINGS.outputs.clear()
        settings.ROOT.set(None)
        logged.logger.removeHandler(logged)
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        for thread_loop in monitor.thread_loops - {loop}:
            if not thread_loop.is_running():
                thread_loop.close()
        asyncio.set_event_loop(None)
