"""The policy pack's configuration, derived from a stack's config.

`pulumi preview --policy-pack infra/policy --policy-pack-config FILE` hands each policy its own
settings (`{"<policy name>": {...}}`). Only the cost ceiling needs any: the ceiling and price
override of `fsdp-eks:cost`, and the GPU facts of `fsdp-eks:gpuNodes` as a fallback for a
stack that creates no node group (an existing cluster). CI writes the file with
`scripts/policy_config.py`; the offline plan passes the same dict to `run_policies`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra.config.cost import CostConfig

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


def policy_config_from_stack_file(path: Path) -> PolicyConfig:
    """Settings for the pack from a `stacks/Pulumi.<name>.yaml` file.

    Reads only the keys the pack needs, so it works before (and independently of) the full
    stack model; `fsdp-eks:cost` is validated with its own model, so a typo there fails here
    with the key named.
    """
    document = yaml.safe_load(path.read_text()) or {}
    config = document.get("config") or {}
    if not isinstance(config, Mapping):
        raise ValueError(f"{path}: `config` must be a mapping, got {type(config).__name__}")
    cost = CostConfig.model_validate(config.get(f"{PROJECT}:cost") or {})
    gpu_nodes = config.get(f"{PROJECT}:gpuNodes") or {}
    job = config.get(f"{PROJECT}:job") or {}
    capacity = gpu_nodes.get("capacity") or {}
    return policy_config(
        cost,
        instance_type=gpu_nodes.get("instanceType"),
        node_count=gpu_nodes.get("count"),
        capacity_type=(capacity.get("type") if isinstance(capacity, Mapping) else None)
        or "on-demand",
        job_max_run_hours=job.get("maxRunHours") if isinstance(job, Mapping) else None,
    )
