"""Guardrails on the Kubernetes side: NCCL environment, EFA requests, bounded runs.

Each check is a plain function over `Resource`s that returns messages; `infra.policy.registry`
registers them with the policy pack and the offline plan. A message names the resource, the
bad setting and what to do instead, because it ends up in a PR comment.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from infra.facts.instances import INSTANCE_FACTS, known_facts
from infra.policy.view import (
    UNKNOWN,
    PodTemplate,
    Resource,
    gpu_node_groups,
    is_training_job,
    job_deadline,
    pod_templates,
    resource_quantity,
    selected_instance_type,
)

EFA_RESOURCE = "vpc.amazonaws.com/efa"
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class Finding:
    """A stack-level violation; `urn` points at the resource to fix ("" for the whole stack)."""

    message: str
    urn: str = ""


# --- forbidden NCCL / CUDA variables --------------------------------------------------------

_TRUTHY = frozenset({"1", "true", "yes", "on"})


@dataclass(frozen=True)
class ForbiddenEnv:
    name: str
    values: frozenset[str] | None
    """Forbidden values (lower case); None: any value is forbidden."""
    why: str


FORBIDDEN_ENV: tuple[ForbiddenEnv, ...] = (
    ForbiddenEnv(
        "NCCL_SOCKET_IFNAME",
        frozenset({"eth0"}),
        "AL2023 names interfaces ens*/enp*, and pinning one ENI starves NCCL's bootstrap and "
        "socket transport; leave it unset",
    ),
    ForbiddenEnv(
        "NCCL_PROTO",
        None,
        "forcing a protocol overrides NCCL's tuner for the EFA/NVLink topology (slow or hangs)",
    ),
    ForbiddenEnv(
        "NCCL_ALGO",
        None,
        "forcing an algorithm overrides NCCL's tuner for the EFA/NVLink topology (slow or hangs)",
    ),
    ForbiddenEnv(
        "NCCL_P2P_DISABLE",
        _TRUTHY,
        "it switches off NVLink peer-to-peer between the GPUs of a node",
    ),
    ForbiddenEnv(
        "CUDA_LAUNCH_BLOCKING",
        _TRUTHY,
        "it serialises every kernel launch, a debugging switch that makes training far slower",
    ),
)


def check_forbidden_env(resource: Resource) -> list[str]:
    """No container of a workload sets a variable from FORBIDDEN_ENV."""
    messages = []
    for template in pod_templates(resource):
        for container in template.containers():
            env = container.get("env")
            if not isinstance(env, list):
                continue
            for variable in env:
                if not isinstance(variable, Mapping):
                    continue
                rule = next((r for r in FORBIDDEN_ENV if r.name == variable.get("name")), None)
                value = variable.get("value")
                if rule is None or value is UNKNOWN:
                    continue
                text = "" if value is None else str(value)
                if rule.values is None or text.strip().lower() in rule.values:
                    messages.append(
                        f"{resource.name}: container {container.get('name')!r} ({template.role}) "
                        f"sets {rule.name}={text!r}; remove it: {rule.why}"
                    )
    return messages


# --- a run must end ------------------------------------------------------------------------

MAX_STEPS_FLAGS = ("--max_steps", "--max_training_steps")


def max_steps_in_command(tokens: Sequence[str]) -> int | None:
    """The trainer's `--max_steps N` (or `--max_steps=N`) in a command line, if any."""
    for index, token in enumerate(tokens):
        for flag in MAX_STEPS_FLAGS:
            value = None
            if token == flag and index + 1 < len(tokens):
                value = tokens[index + 1]
            elif token.startswith(flag + "="):
                value = token.split("=", 1)[1]
            if value is not None:
                try:
                    return int(value)
                except ValueError:
                    return None
    return None


def _command_tokens(container: Mapping[str, object]) -> list[str]:
    """command + args, with shell strings (`bash -c "torchrun ..."`) split into words."""
    tokens: list[str] = []
    for key in ("command", "args"):
        items = container.get(key)
        if not isinstance(items, list):
            continue
        for item in items:
            if not isinstance(item, str):
                continue
            try:
                tokens.extend(shlex.split(item) if " " in item else [item])
            except ValueError:
                tokens.append(item)
    return tokens


def check_run_is_bounded(resource: Resource) -> list[str]:
    """A training job stops by itself: a deadline (activeDeadlineSeconds) or --max_steps."""
    if not is_training_job(resource) or resource.type.endswith(":TrainJob"):
        return []  # a TrainJob's pods, and their --max_steps, are its TrainingRuntime's
    deadline = job_deadline(resource)
    if deadline is UNKNOWN or (isinstance(deadline, int | float) and deadline > 0):
        return []
    for template in pod_templates(resource):
        for container in template.containers():
            steps = max_steps_in_command(_command_tokens(container))
            if steps is not None and steps > 0:
                return []
    return [
        f"{resource.name}: the job has no deadline (spec.runPolicy.activeDeadlineSeconds) and "
        f"no positive --max_steps in its command, so nothing stops it from running (and "
        f"billing) forever; set fsdp-eks:job.maxRunHours or fsdp-eks:training.maxSteps"
    ]


# --- EFA ------------------------------------------------------------------------------------


def _job_instance_type(templates: Sequence[PodTemplate], node_group_types: set[str]) -> str | None:
    for template in templates:
        selected = selected_instance_type(template)
        if selected is not None:
            return selected
    if len(node_group_types) == 1:
        return next(iter(node_group_types))
    return None


def check_efa(resources: Sequence[Resource]) -> list[Finding]:
    """Multi-node GPU jobs on EFA instances request every EFA interface; nothing else asks.

    Without `vpc.amazonaws.com/efa` the pod gets no EFA device and NCCL silently falls back to
    TCP sockets, at a fraction of the bandwidth. A single-node job talks over NVLink only, so
    it is not required to (but may) request EFA. Multi-node GPU node groups on EFA instances
    must have EFA switched on, or there is nothing to request.
    """
    findings: list[Finding] = []
    groups = gpu_node_groups(resources)
    for group in groups:
        interfaces = INSTANCE_FACTS[group.instance_type].efa_interfaces
        multi_node = isinstance(group.count, int) and group.count > 1
        if interfaces and multi_node and group.efa_enabled is False:
            findings.append(
                Finding(
                    f"{group.resource.name}: {group.count} x {group.instance_type} without EFA "
                    f"(the type has {interfaces} EFA interfaces); set "
                    f"fsdp-eks:gpuNodes.efa to auto or true",
                    group.resource.urn,
                )
            )
    group_types = {g.instance_type for g in groups}
    for resource in resources:
        templates = pod_templates(resource)
        if not is_training_job(resource) or not templates:
            continue
        instance_type = _job_instance_type(templates, group_types)
        facts = known_facts(instance_type or "")  # a HyperPod ml.* name has its EC2 facts
        if instance_type is None or facts is None:
            continue
        nodes = sum(t.replicas for t in templates)
        for template in templates:
            for container in template.containers():
                gpus = resource_quantity(container, GPU_RESOURCE) or 0
                efa = resource_quantity(container, EFA_RESOURCE) or 0
                where = f"{resource.name}: container {container.get('name')!r} ({template.role})"
                if efa and not facts.efa_interfaces:
                    findings.append(
                        Finding(
                            f"{where} requests {EFA_RESOURCE}: {efa} but {instance_type} has no "
                            f"EFA, so the pod can never be scheduled; drop the request",
                            resource.urn,
                        )
                    )
                elif gpus and nodes > 1 and facts.efa_interfaces and efa != facts.efa_interfaces:
                    findings.append(
                        Finding(
                            f"{where} runs a {nodes}-node job on {instance_type} but requests "
                            f"{EFA_RESOURCE}: {efa}; request all {facts.efa_interfaces} "
                            f"interfaces, or NCCL falls back to TCP (or loses bandwidth)",
                            resource.urn,
                        )
                    )
    return findings
