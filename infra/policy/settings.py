"""The policy pack's configuration, derived from a stack's config.

Only the cost ceiling needs any. The engine hands the pack the stack's config in
`PULUMI_CONFIG` (pulumi/pulumi `pkg/engine/update.go`), so `policy_config_from_engine` reads
what the program reads; `--policy-pack-config FILE` still wins key by key.
Why, with sources: docs/design/program.md#policy-settings
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infra.config import StackConfig, load_stack_file
from infra.config.cluster import GpuNodesConfig
from infra.config.cost import CostConfig
from infra.config.job import JobConfig

PROJECT = "fsdp-eks"
COST_POLICY = "cost-ceiling"

PolicyConfig = dict[str, dict[str, Any]]
"""Policy name -> that policy's settings, the shape of a `--policy-pack-config` file."""


def policy_config(
    cost: CostConfig,
    *,
    instance_type: str | None = None,
    node_count: int | None = None,
    capacity_type: str | None = None,
    job_max_run_hours: float | None = None,
) -> PolicyConfig:
    """Settings for the pack from a stack's validated sections.

    From the root stack model: `policy_config(cfg.cost, instance_type=cfg.gpu_nodes.instance_type,
    node_count=cfg.gpu_nodes.count, capacity_type=cfg.gpu_nodes.capacity.type,
    job_max_run_hours=cfg.job.max_run_hours)`.
    """
    settings: dict[str, Any] = {
        "maxUsdPerRun": cost.max_usd_per_run,
        "maxRunHours": cost.run_hours(job_max_run_hours),
        "usdPerInstanceHour": cost.usd_per_instance_hour,
        "instanceType": instance_type,
        "nodeCount": node_count,
        "capacityType": capacity_type,
    }
    return {COST_POLICY: settings}


def policy_config_for(config: StackConfig) -> PolicyConfig:
    """Settings for the pack from a whole validated stack config."""
    return policy_config(
        config.cost,
        instance_type=config.gpu_nodes.instance_type,
        node_count=config.gpu_nodes.count,
        capacity_type=config.gpu_nodes.capacity.type,
        job_max_run_hours=config.job.max_run_hours,
    )


def policy_config_from_stack_file(path: Path) -> PolicyConfig:
    """Settings for the pack from a `stacks/Pulumi.<name>.yaml` file.

    The file goes through the same config model as `pulumi up`, so a typo anywhere in it fails
    here with the key named, before any guardrail runs.
    """
    config = load_stack_file(path)
    return policy_config_for(config)


def policy_config_from_engine(environ: Mapping[str, str] | None = None) -> PolicyConfig:
    """Settings for the pack from the stack the engine is previewing or updating.

    `environ` defaults to the process environment, where the engine put `PULUMI_CONFIG` and
    `PULUMI_STACK` (see the module docstring). Empty when the pack runs outside a stack
    operation (e.g. `pulumi policy publish`). Only the sections the settings come from are
    validated, each on its own: the whole-stack checks (the config model's own cost check
    among them) are the program's, and the pack must still see a ceiling the stack breaks.
    Raises ValueError naming the key for a section the program would reject too.
    """
    env = os.environ if environ is None else environ
    raw, stack = env.get("PULUMI_CONFIG"), env.get("PULUMI_STACK")
    if not raw or not stack:
        return {}
    sections: dict[str, Any] = {}
    for key, value in json.loads(raw).items():
        namespace, _, name = key.rpartition(":")
        if namespace == PROJECT and name in _SETTINGS_SECTIONS:
            sections[name] = json.loads(value) if isinstance(value, str) else value
    name = ""
    try:
        name = "cost"
        cost = CostConfig.model_validate(sections.get(name) or {})
        name = "job"
        job = JobConfig.model_validate(sections.get(name) or {})
        name = "gpuNodes"
        nodes = GpuNodesConfig.model_validate(sections[name]) if name in sections else None
    except ValidationError as error:
        raise ValueError(f"stack {stack!r} (PULUMI_CONFIG): {_problems(name, error)}") from None
    return policy_config(
        cost,
        instance_type=nodes.instance_type if nodes else None,
        node_count=nodes.count if nodes else None,
        capacity_type=nodes.capacity.type if nodes else None,
        job_max_run_hours=job.max_run_hours,
    )


_SETTINGS_SECTIONS = ("cost", "gpuNodes", "job")


def _problems(section: str, error: ValidationError) -> str:
    """`section.key: message` for each of pydantic's errors in one section."""
    return "; ".join(
        ".".join(str(part) for part in (section, *detail["loc"])) + f": {detail['msg']}"
        for detail in error.errors()
    )
