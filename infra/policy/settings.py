"""The policy pack's configuration, derived from a stack's config.

`pulumi preview --policy-pack infra/policy --policy-pack-config FILE` hands each policy its own
settings (`{"<policy name>": {...}}`). Only the cost ceiling needs any: the ceiling and price
override of `fsdp-eks:cost`, and the GPU facts of `fsdp-eks:gpuNodes` as a fallback for a
stack that creates no node group (an existing cluster). CI writes the file with
`scripts/policy_config.py`; the offline plan passes the same dict to `run_policies`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra.config import StackConfig, load_stack_file
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
