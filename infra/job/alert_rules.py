"""The run's alert rules: Prometheus rule groups rendered from the run plan.

Thresholds come from the plan (step time, tokens/s, checkpoint write time, $/hour, cost ceiling);
the rendering is pure, taken by AMP, a PrometheusRule or `promtool`. The end alerts look back
over a window and carry `notify="once"`, so a run that ends says so once.
Why and sources: docs/design/job.md#alert_rules
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import yaml

from infra.job import watch_series as s

if TYPE_CHECKING:
    from infra.estimates.run_plan import RunPlan

END_WINDOW = "15m"
"""How long after a run's last sample its end alert still fires (then resolves by itself)."""
HANG_STEPS = 10
"""Steps at the plan's low MFU without a completed one before a run counts as hung."""
MIN_HANG_SECONDS = 300
"""Never sooner: scrapes (15-60 s apart) and the trainer's log cadence need the room."""
IDLE_MINUTES = 15
SLOW_MINUTES = 15
MAX_SPEND_WINDOW_HOURS = 7 * 24
"""The spend rule finds the run's first sample within this many hours at most."""
LIVE_STATES = "training|checkpointing|rolling_back"
"""Run states in which GPUs are being used for the run."""


@dataclass(frozen=True)
class AlertThresholds:
    """What the rules compare against, each figure from the run plan."""

    stack: str
    """The series' `stack` label: the job's name, which the pod gives the trainer
    (infra/job/manifest.py) and the scrape configuration gives the exporters."""
    expected_step_seconds: float | None
    expected_tokens_per_second: float | None
    slow_tokens_per_second: float | None
    """Below this for 15 minutes is slow (alerts.throughputFloor x expected)."""
    hang_after_seconds: int | None
    usd_per_hour: float | None
    ceiling_usd: float | None
    spend_warning_usd: float | None
    spend_window_hours: int
    owns_gpu_nodes: bool
    """Only a stack whose cluster it created knows every GPU node is its own (idle rule)."""
    idle_minutes: int

    @property
    def selector(self) -> str:
        """The label matcher that picks this stack's trainer series out of a shared Prometheus."""
        return f'stack="{self.stack}"'


def alert_thresholds(plan: RunPlan) -> AlertThresholds:
    """The thresholds of `plan`'s run; figures the plan lacks leave their rules out."""
    config = plan.config
    duration, cost, alerts = plan.duration, plan.cost, config.alerts
    step_s = tokens_s = slow_tokens_s = hang_s = None
    if duration is not None:
        max_steps = config.training.max_steps
        step_s = duration.training_hours * 3600 / max_steps
        tokens_s = config.tokens_per_step / step_s
        slow_tokens_s = alerts.throughput_floor * tokens_s
        # Several slow steps, the trainer's log cadence (a gauge moves only when it logs), and
        # one checkpoint written between two steps (the last save is synchronous) are no hang.
        slow_step_s = duration.training_hours_at(duration.mfu.low) * 3600 / max_steps
        steps = max(HANG_STEPS, config.training.logging_every)
        save_s = plan.timeouts.checkpoint_seconds if plan.has_timeouts else 0.0
        hang_s = max(MIN_HANG_SECONDS, math.ceil(steps * slow_step_s + save_s))
    usd_per_hour = cost.usd_per_hour if cost is not None else None
    ceiling = config.cost.max_usd_per_run
    # Long enough to reach the whole ceiling at the plan's rate (a run may outlast its plan).
    window = MAX_SPEND_WINDOW_HOURS
    if ceiling is not None and usd_per_hour:
        window = min(window, math.ceil(ceiling / usd_per_hour) + 1)
    tail = cost.lease_tail_hours if cost is not None else None
    # A normal end keeps leased nodes for the autoscaler's idle time: no alert for that.
    idle = max(IDLE_MINUTES, math.ceil((tail or 0) * 60) + 5)
    return AlertThresholds(
        stack=str(config.job.name),
        expected_step_seconds=step_s,
        expected_tokens_per_second=tokens_s,
        slow_tokens_per_second=slow_tokens_s,
        hang_after_seconds=hang_s,
        usd_per_hour=usd_per_hour,
        ceiling_usd=ceiling,
        spend_warning_usd=(
            round(alerts.spend_warning * ceiling, 2)
            if ceiling is not None and usd_per_hour
            else None
        ),
        spend_window_hours=window,
        owns_gpu_nodes=config.cluster.mode == "create",
        idle_minutes=idle,
    )


def spend_usd_expr(t: AlertThresholds) -> str:
    """The run's GPU-node spend so far: hours since its trainer first reported (within the
    window) x the plan's $/hour, the same arithmetic as `fsdp-eks status`. It leaves out the
    minutes nodes boot before the trainer reports and the lease tail after the run."""
    first_seen = (
        f"min by (stack, run) (min_over_time(timestamp({s.RUN_STATE}"
        f'{{{t.selector}, state="starting"}})[{t.spend_window_hours}h:1m]))'
    )
    return f"(time() - {first_seen}) / 3600 * {t.usd_per_hour:g}"


def _rule(
    name: str,
    expr: str,
    *,
    severity: str,
    summary: str,
    action: str,
    wait: str | None = None,
    once: bool = False,
) -> dict[str, Any]:
    labels = {"severity": severity, **({"notify": "once"} if once else {})}
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if wait is not None:
        rule["for"] = wait
    rule["labels"] = labels
    rule["annotations"] = {"summary": summary, "action": action}
    return rule


def _by_run(expr: str) -> str:
    return f"max by (stack, run) ({expr})"


def run_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    """Rules on the trainer's series: how the run ends, hangs, diverges, slows, spends."""
    sel = t.selector
    state = f"{s.RUN_STATE}{{{sel}"
    seen = f"group by (stack, run) (max_over_time({state}}}[{END_WINDOW}]))"
    present = f"group by (stack, run) ({state}}})"

    def was(states: str) -> str:
        return f"({_by_run(f'max_over_time({state}, state=~{states!r}}}[{END_WINDOW}])')} == 1)"

    run = "{{ $labels.stack }} run {{ $labels.run }}"
    rules = [
        _rule(
            "FsdpRunFailed",
            was("failed"),
            severity="critical",
            once=True,
            summary=f"{run} failed",
            action="fsdp-eks logs: read rank 0's last lines; fix, then pulumi up to resume",
        ),
        _rule(
            "FsdpRunFinished",
            was("finished"),
            severity="info",
            once=True,
            summary=f"{run} finished: every step trained and the last checkpoint is durable",
            action="fsdp-eks checkpoints to fetch the model; pulumi destroy when done",
        ),
        _rule(
            "FsdpRunStopped",
            f"{was('stopping')} unless on (stack, run) {present}",
            severity="info",
            once=True,
            wait="2m",
            summary=f"{run} stopped (SIGTERM: fsdp-eks stop, a deadline or a node drain)",
            action="fsdp-eks status; fsdp-eks start resumes from the last checkpoint",
        ),
        _rule(
            "FsdpRunLost",
            f"{seen} unless on (stack, run) {present}"
            f" unless on (stack, run) {was('finished|failed|stopping')}",
            severity="critical",
            once=True,
            wait="5m",
            summary=f"{run}: the trainer stopped reporting without finishing (pod or node lost)",
            action="fsdp-eks status (pods, restarts); kubectl describe the missing pod",
        ),
        _rule(
            "FsdpRunNonFinite",
            f"count by (stack, run) ({s.LOSS}{{{sel}}} != {s.LOSS}{{{sel}}}"
            f" or abs({s.LOSS}{{{sel}}}) == Inf)"
            f" or {_by_run(f'increase({s.SKIPPED_STEPS}{{{sel}}}[15m])')} > 0",
            severity="critical",
            summary=f"{run}: non-finite loss or gradient (updates skipped)",
            action="fsdp-eks logs; lower the learning rate or resume from an earlier checkpoint",
        ),
        _rule(
            "FsdpRunRolledBack",
            f"{_by_run(f'increase({s.ROLLBACKS}{{{sel}}}[15m])')} > 0",
            severity="warning",
            summary=f"{run} rolled back to its last checkpoint (loss diverged)",
            action="watch the loss panel; repeated rollbacks: fix the run and restart it",
        ),
        _rule(
            "FsdpCheckpointFailed",
            f"{_by_run(f'increase({s.CHECKPOINT_FAILURES}{{{sel}}}[30m])')} > 0",
            severity="warning",
            summary=f"{run}: a checkpoint save failed",
            action="fsdp-eks logs: storage full or unreachable? A restart resumes from older",
        ),
    ]
    live = f"{_by_run(f'{state}, state=~{LIVE_STATES!r}}}')} == 1"
    if t.hang_after_seconds is not None:
        rules.append(
            _rule(
                "FsdpRunHung",
                f"time() - {_by_run(f'{s.LAST_STEP_TIME}{{{sel}}} > 0')}"
                f" > {t.hang_after_seconds} and on (stack, run) {live}",
                severity="critical",
                wait="2m",
                summary=(
                    f"{run}: no step for {{{{ $value | humanizeDuration }}}} (plan: a step "
                    f"every {t.expected_step_seconds:.1f} s)"
                ),
                action="fsdp-eks logs --all: which rank is stuck? delete its pod to restart",
            )
        )
    if t.slow_tokens_per_second is not None and t.expected_tokens_per_second is not None:
        rules.append(
            _rule(
                "FsdpRunSlow",
                f"{_by_run(f'{s.TOKENS_PER_SECOND}{{{sel}}}')}"
                f" < {t.slow_tokens_per_second:.0f} and on (stack, run) {live}",
                severity="warning",
                wait=f"{SLOW_MINUTES}m",
                summary=(
                    f"{run}: {{{{ $value | humanize }}}} tokens/s, below "
                    f"{t.slow_tokens_per_second:,.0f} (plan {t.expected_tokens_per_second:,.0f})"
                ),
                action="dashboard: data wait, GPU utilisation, EFA throughput; a slow node?",
            )
        )
    if t.spend_warning_usd is not None and t.usd_per_hour is not None:
        rules.append(
            _rule(
                "FsdpSpendNearCeiling",
                f"{spend_usd_expr(t)} > {t.spend_warning_usd:g}",
                severity="warning",
                once=True,
                summary=(
                    f'{run} has spent ~${{{{ $value | printf "%.0f" }}}} of its '
                    f"${t.ceiling_usd:g} ceiling (GPU nodes at ${t.usd_per_hour:g}/h)"
                ),
                action="fsdp-eks status; stop the run or raise cost.maxUsdPerRun knowingly",
            )
        )
    return rules


def node_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    """Rules on the GPU and EFA exporters' series: hardware errors and idle GPU nodes."""
    gpu = f"{s.GPU_NODE_LABEL}, gpu"
    # Filtered before the union: rate() drops the names, so an `or` of unfiltered rates would
    # keep only the first counter of each node.
    efa_errors = " or ".join(
        f"sum by ({s.EFA_NODE_LABEL}) (rate({name}[10m])) > 0" for name in s.EFA_ERRORS
    )
    rules = [
        _rule(
            "FsdpGpuXidError",
            f"max by ({gpu}, xid) ({s.GPU_XID_COUNT}) > 0",
            severity="critical",
            summary=(
                f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.{s.GPU_NODE_LABEL} }}}} reported "
                "XID {{ $labels.xid }}"
            ),
            action="NVIDIA's XID catalogue; 48/63/64/79/94/95: cordon the node and replace it",
        ),
        _rule(
            "FsdpGpuUnhealthy",
            f"max by ({gpu}) ({s.GPU_HEALTH}) != 0"
            f" or max by ({gpu}) ({s.GPU_ROW_REMAP_FAILURE}) > 0",
            severity="critical",
            summary=(
                f"GPU {{{{ $labels.gpu }}}} on {{{{ $labels.{s.GPU_NODE_LABEL} }}}} failed "
                "DCGM's health watches (or could not remap a failing memory row)"
            ),
            action="cordon the node; a GPU reset or a new node is needed before training on it",
        ),
        _rule(
            "FsdpEfaErrorsRising",
            efa_errors,
            severity="warning",
            wait="10m",
            summary=f"EFA errors rising on {{{{ $labels.{s.EFA_NODE_LABEL} }}}}",
            action="compare nodes on the EFA panel; one node: cordon it; all: check the SG/NCCL",
        ),
    ]
    if t.owns_gpu_nodes:
        rules.append(
            _rule(
                "FsdpGpuNodesIdle",
                f"count by ({s.GPU_NODE_LABEL}) ({s.GPU_UTIL})"
                f" unless on () (max({s.RUN_STATE}{{{t.selector}, state=~{LIVE_STATES!r}}}) == 1)",
                severity="warning",
                wait=f"{t.idle_minutes}m",
                summary=(
                    f"GPU node {{{{ $labels.{s.GPU_NODE_LABEL} }}}} is up and no trainer of "
                    f"{t.stack} is training"
                ),
                action="fsdp-eks status: a stuck start or a finished run? fsdp-eks stop or down",
            )
        )
    return rules


def rule_groups(t: AlertThresholds) -> dict[str, Any]:
    """The Prometheus rule file (`groups:`) for the run."""
    return {
        "groups": [
            {"name": f"fsdp-run-{t.stack}", "interval": "1m", "rules": run_rules(t)},
            {"name": f"fsdp-nodes-{t.stack}", "interval": "1m", "rules": node_rules(t)},
        ]
    }


def rules_yaml(t: AlertThresholds) -> str:
    return yaml.safe_dump(rule_groups(t), sort_keys=False, width=100)


def prometheus_rule(t: AlertThresholds, *, name: str, namespace: str) -> dict[str, Any]:
    """The same groups as a prometheus-operator PrometheusRule (monitoring.coreos.com/v1)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": name, "namespace": namespace, "labels": {"fsdp-eks/stack": t.stack}},
        "spec": rule_groups(t),
    }


def alertmanager_definition(topic_arn: str, region: str) -> str:
    """AMP's alert manager definition: every alert to the SNS topic, end alerts once.

    AMP reads `alertmanager_config` as Prometheus Alertmanager's configuration and allows SNS
    receivers only, signed with SigV4 (AWS AMP user guide, AMP-alertmanager-config: "repeat
    interval ... maximum value allowed is five days")."""
    sns = {"topic_arn": topic_arn, "sigv4": {"region": region}}
    config = {
        "route": {
            "receiver": "sns",
            "group_by": ["alertname", "stack", "run"],
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {
                    "receiver": "sns-once",
                    "matchers": ['notify="once"'],
                    "repeat_interval": "120h",
                }
            ],
        },
        # A failed or lost run is not also hung or slow: one message, not three.
        "inhibit_rules": [
            {
                "source_matchers": ['alertname=~"FsdpRunFailed|FsdpRunLost|FsdpRunStopped"'],
                "target_matchers": ['alertname=~"FsdpRunHung|FsdpRunSlow"'],
                "equal": ["stack", "run"],
            }
        ],
        "receivers": [
            {"name": "sns", "sns_configs": [{**sns, "send_resolved": True}]},
            {"name": "sns-once", "sns_configs": [{**sns, "send_resolved": False}]},
        ],
    }
    return yaml.safe_dump(
        {"alertmanager_config": yaml.safe_dump(config, sort_keys=False)}, sort_keys=False
    )
