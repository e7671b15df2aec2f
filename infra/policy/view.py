"""One view of a resource for every guardrail, whoever hands it over.

The same check functions run in two places: inside `pulumi preview --policy-pack infra/policy`
(the engine hands `pulumi_policy` objects whose props may hold *unknown* values, wrapped in
proxies that raise on access) and inside our offline plan (an `infra.offline.Evaluation`
whose resources are plain dicts). Both are turned into `Resource` here, with unknowns
replaced by the `UNKNOWN` marker, so a check can say "can't tell yet" instead of crashing
and no check is written twice.

Also here: reading pod specs out of Kubernetes workloads (Pods, Jobs, PyTorchJobs, ...) and
reading GPU node groups out of EKS resources, which several guardrails need.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infra.facts.instances import INSTANCE_FACTS

if TYPE_CHECKING:
    from infra.offline import RecordedResource


class _Unknown:
    """A value the engine will only know after `pulumi up` (e.g. the ID of a new resource)."""

    _instance: _Unknown | None = None

    def __new__(cls) -> _Unknown:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<unknown during preview>"


UNKNOWN: Any = _Unknown()

# pulumi_policy marks unknown values with these sentinel strings (pulumi_policy/proxy.py).
_UNKNOWN_SENTINELS = frozenset(
    {
        "1c4a061d-8072-4f0a-a4cb-0ff528b18fe7",
        "3eeb2bf0-c639-47a8-9e75-3b44932eb421",
        "04da6b54-80e4-46f7-96ec-b56ff0331ba9",
        "6a19a0b0-7e62-4c92-b797-7f8e31da9cc2",
        "030794c1-ac77-496b-92df-f27374a8bd58",
        "e48ece36-62e2-4504-bad9-02848725956a",
        "dd056dcd-154b-4c76-9bd3-c8f88648b5ff",
    }
)


def is_unknown(value: Any) -> bool:
    return value is UNKNOWN


def plain(value: Any) -> Any:
    """`value` as plain dicts/lists, with pulumi_policy's proxies unwrapped and unknowns marked.

    The proxies raise on reading an unknown; reading their `__target` gives the raw data.
    """
    kind = type(value).__name__
    if kind in ("_DictProxy", "_ListProxy"):
        value = value["__target"]
    if isinstance(value, str):
        return UNKNOWN if value in _UNKNOWN_SENTINELS else value
    if isinstance(value, float) and value.is_integer():
        return int(value)  # the engine sends every number as a double (protobuf Struct)
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [plain(v) for v in value]
    return value


@dataclass(frozen=True)
class Resource:
    """A resource as the guardrails see it: props are camelCase, as sent to the engine."""

    urn: str
    type: str
    name: str
    props: Mapping[str, Any]
    parent_urn: str = ""
    dependency_urns: tuple[str, ...] = field(default=())

    @classmethod
    def from_recorded(cls, recorded: RecordedResource) -> Resource:
        """From the offline evaluation: the inputs the program registered."""
        return cls(
            urn=recorded.urn,
            type=recorded.type,
            name=recorded.name,
            props=plain(recorded.inputs),
            parent_urn=recorded.parent or "",
            dependency_urns=tuple(recorded.dependencies),
        )

    @classmethod
    def from_policy(cls, source: Any) -> Resource:
        """From `pulumi_policy`'s ResourceValidationArgs or PolicyResource."""
        parent = getattr(source, "parent", None)
        dependencies = getattr(source, "dependencies", None) or []
        return cls(
            urn=source.urn,
            type=source.resource_type,
            name=source.name,
            props=plain(source.props),
            parent_urn=parent.urn if parent is not None else "",
            dependency_urns=tuple(d.urn for d in dependencies),
        )


def dig(data: Any, *path: str | int) -> Any:
    """`data[p0][p1]...`, or None where a step is missing; UNKNOWN where a step is unknown."""
    for step in path:
        if data is UNKNOWN:
            return UNKNOWN
        if isinstance(step, int):
            if not isinstance(data, list) or step >= len(data):
                return None
            data = data[step]
        else:
            if not isinstance(data, Mapping):
                return None
            data = data.get(step)
    return data


# --- Kubernetes workloads ------------------------------------------------------------------

PYTORCH_JOB = "kubernetes:kubeflow.org/v1:PyTorchJob"
_POD_SPEC_PATHS: dict[str, tuple[str, ...]] = {
    "kubernetes:core/v1:Pod": ("spec",),
    "kubernetes:batch/v1:Job": ("spec", "template", "spec"),
    "kubernetes:batch/v1:CronJob": ("spec", "jobTemplate", "spec", "template", "spec"),
    "kubernetes:apps/v1:Deployment": ("spec", "template", "spec"),
    "kubernetes:apps/v1:StatefulSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:DaemonSet": ("spec", "template", "spec"),
    "kubernetes:apps/v1:ReplicaSet": ("spec", "template", "spec"),
}


@dataclass(frozen=True)
class PodTemplate:
    """One pod template of a workload: `role` is the replica type for training jobs."""

    role: str
    replicas: int
    spec: Mapping[str, Any]

    def containers(self) -> Iterator[Mapping[str, Any]]:
        for key in ("initContainers", "containers"):
            items = self.spec.get(key)
            if isinstance(items, list):
                yield from (c for c in items if isinstance(c, Mapping))


TRAINER_V2_PREFIX = "kubernetes:trainer.kubeflow.org/"
"""Kubeflow Trainer v2's kinds: a TrainJob (deadline, node count) runs the pods of the
TrainingRuntime it names (JobSet's replicated jobs)."""


def is_training_job(resource: Resource) -> bool:
    """A Kubeflow training-operator job (PyTorchJob and its siblings), or a Trainer v2
    TrainingRuntime (which holds a TrainJob's pod templates) or TrainJob."""
    if resource.type.startswith(TRAINER_V2_PREFIX):
        return resource.type.endswith((":TrainingRuntime", ":TrainJob"))
    return resource.type.startswith("kubernetes:kubeflow.org/") and resource.type.endswith("Job")


def job_deadline(resource: Resource) -> Any:
    """A training job's `activeDeadlineSeconds` (the training operator's in `runPolicy`, a
    TrainJob's in its spec), or None."""
    if resource.type.startswith(TRAINER_V2_PREFIX):
        return dig(resource.props, "spec", "activeDeadlineSeconds")
    return dig(resource.props, "spec", "runPolicy", "activeDeadlineSeconds")


def _runtime_templates(resource: Resource) -> list[PodTemplate]:
    """A TrainingRuntime's pods: each replicated job's pod template, `replicas` Jobs of
    `parallelism` pods each (jobset v0.12.0 `ReplicatedJob`, batch/v1 `JobSpec`)."""
    templates = []
    jobs = dig(resource.props, "spec", "template", "spec", "replicatedJobs")
    for replicated in jobs if isinstance(jobs, list) else []:
        pod_spec = dig(replicated, "template", "spec", "template", "spec")
        if not isinstance(pod_spec, Mapping):
            continue
        jobs_count = dig(replicated, "replicas")
        parallelism = dig(replicated, "template", "spec", "parallelism")
        count = (jobs_count if isinstance(jobs_count, int) else 1) * (
            parallelism if isinstance(parallelism, int) else 1
        )
        templates.append(PodTemplate(str(dig(replicated, "name")), count, pod_spec))
    return templates


def pod_templates(resource: Resource) -> list[PodTemplate]:
    """Pod templates of a Kubernetes workload; empty for anything else."""
    if resource.type.startswith(TRAINER_V2_PREFIX):
        return _runtime_templates(resource)
    if is_training_job(resource):
        spec = resource.props.get("spec")
        templates = []
        if isinstance(spec, Mapping):
            for key, replica_specs in spec.items():
                if not key.endswith("ReplicaSpecs") or not isinstance(replica_specs, Mapping):
                    continue
                for role, replica in replica_specs.items():
                    pod_spec = dig(replica, "template", "spec")
                    if isinstance(pod_spec, Mapping):
                        replicas = dig(replica, "replicas")
                        count = replicas if isinstance(replicas, int) else 1
                        templates.append(PodTemplate(role, count, pod_spec))
        return templates
    path = _POD_SPEC_PATHS.get(resource.type)
    if path is None:
        return []
    pod_spec = dig(resource.props, *path)
    return [PodTemplate("pod", 1, pod_spec)] if isinstance(pod_spec, Mapping) else []


def resource_quantity(container: Mapping[str, Any], name: str) -> int | None:
    """Integer quantity of an extended resource (limits win over requests); None if absent."""
    for section in ("limits", "requests"):
        value = dig(container, "resources", section, name)
        if value is None or value is UNKNOWN:
            continue
        try:
            return int(str(value))
        except ValueError:
            return None
    return None


INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")


def selected_instance_type(template: PodTemplate) -> str | None:
    """The instance type a pod template pins with its nodeSelector, if it does."""
    selector = template.spec.get("nodeSelector")
    if not isinstance(selector, Mapping):
        return None
    for label in INSTANCE_TYPE_LABELS:
        value = selector.get(label)
        if isinstance(value, str):
            return value
    return None


# --- EKS node groups -----------------------------------------------------------------------

MANAGED_NODE_GROUP = "eks:index:ManagedNodeGroup"
AWS_NODE_GROUP = "aws:eks/nodeGroup:NodeGroup"
LAUNCH_TEMPLATE = "aws:ec2/launchTemplate:LaunchTemplate"
_SELF_MANAGED_NODE_GROUPS = ("eks:index:NodeGroup", "eks:index:NodeGroupV2")
_EKS_CAPACITY = {"ON_DEMAND": "on-demand", "SPOT": "spot", "CAPACITY_BLOCK": "block"}


@dataclass(frozen=True)
class GpuNodeGroup:
    """A node group of GPU instances, read from whichever resource describes it."""

    resource: Resource
    instance_type: str
    count: Any
    """Desired size: an int, UNKNOWN, or None when not given."""
    capacity_type: str
    efa_enabled: bool | None
    """None: this resource does not say (EFA lives in a launch template it refers to)."""


def gpu_node_groups(resources: Sequence[Resource]) -> list[GpuNodeGroup]:
    """Every GPU node group in the stack, each counted once.

    Under the offline runtime only the pulumi-eks component (`eks:index:ManagedNodeGroup`) is
    visible; in a real preview its child `aws:eks/nodeGroup:NodeGroup` is too, so a child whose
    parent is such a component is skipped.
    """
    by_urn = {r.urn: r for r in resources}
    groups = []
    for resource in resources:
        props = resource.props
        if resource.type in (MANAGED_NODE_GROUP, AWS_NODE_GROUP):
            parent = by_urn.get(resource.parent_urn)
            if resource.type == AWS_NODE_GROUP and parent and parent.type == MANAGED_NODE_GROUP:
                continue
            instance_type = _first(props.get("instanceTypes"))
            template = _launch_template(resource, by_urn)
            if instance_type is None and template is not None:
                instance_type = template.props.get("instanceType")
            count = dig(props, "scalingConfig", "desiredSize")
            if not count:
                # Created at zero for the autoscaler (infra.platform.autoscaler): the job brings it
                # to its maximum, which is what runs and is billed.
                count = dig(props, "scalingConfig", "maxSize")
            capacity = _EKS_CAPACITY.get(str(props.get("capacityType") or "ON_DEMAND"), "on-demand")
            efa: bool | None = None
            if resource.type == MANAGED_NODE_GROUP:
                efa = props.get("enableEfaSupport") is True
            elif template is not None:
                efa = launch_template_has_efa(template)
        elif resource.type in _SELF_MANAGED_NODE_GROUPS:
            instance_type = props.get("instanceType")
            count = props.get("desiredCapacity")
            capacity = "spot" if props.get("spotPrice") else "on-demand"
            efa = None
        else:
            continue
        if isinstance(instance_type, str) and instance_type in INSTANCE_FACTS:
            groups.append(GpuNodeGroup(resource, instance_type, count, capacity, efa))
    return groups


def launch_template_has_efa(template: Resource) -> bool:
    interfaces = template.props.get("networkInterfaces")
    if not isinstance(interfaces, list):
        return False
    return any(
        isinstance(i, Mapping) and i.get("interfaceType") in ("efa", "efa-only") for i in interfaces
    )


def _launch_template(node_group: Resource, by_urn: Mapping[str, Resource]) -> Resource | None:
    """The launch template a node group uses: an input, so it is among its dependencies."""
    for urn in node_group.dependency_urns:
        dependency = by_urn.get(urn)
        if dependency is not None and dependency.type == LAUNCH_TEMPLATE:
            return dependency
    return None


def _first(values: Any) -> Any:
    if isinstance(values, list) and values:
        return values[0]
    return None
