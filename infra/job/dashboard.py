"""The run's Grafana dashboard, generated with grafana-foundation-sdk (Grafana 11.6's schema).

One dashboard per stack: training (loss, tokens/s and MFU against the plan's range, step time
and data wait, checkpoints, restarts and goodput, spend against the ceiling), the GPUs per
node (utilisation, memory, power, temperature, XIDs) and EFA per node (throughput, errors).
The plan's figures are drawn as constant series beside the measured ones. Every query names
only series the trainer and the exporters serve (`infra.job.watch_series`; a test parses each
with promtool). Pure: the program exports it and `fsdp-eks dashboard` writes it to a file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from infra.job import watch_series as s
from infra.job.alert_rules import AlertThresholds, alert_thresholds, spend_usd_expr

if TYPE_CHECKING:
    from infra.estimates.run_plan import RunPlan

REF_IDS = "ABCDEFGHIJ"
"""Grafana names a panel's queries A, B, ...: expressions and transforms refer to them."""
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
"""Chosen on import: the dashboard names no data source of anyone's Grafana."""


def dashboard_uid(stack: str) -> str:
    """The dashboard's uid (Grafana keeps uids to 40 characters): its URL is `/d/<uid>`."""
    return f"fsdp-eks-{stack}"[:40]


@dataclass(frozen=True)
class PlanFigures:
    """What the plan expects, drawn beside what the run does."""

    tokens_per_second: float | None
    mfu_low: float | None
    mfu_expected: float | None
    mfu_high: float | None
    step_seconds: float | None
    ceiling_usd: float | None


def plan_figures(plan: RunPlan, thresholds: AlertThresholds) -> PlanFigures:
    mfu = plan.duration.mfu if plan.duration is not None else None
    return PlanFigures(
        tokens_per_second=thresholds.expected_tokens_per_second,
        mfu_low=mfu.low if mfu else None,
        mfu_expected=mfu.expected if mfu else None,
        mfu_high=mfu.high if mfu else None,
        step_seconds=thresholds.expected_step_seconds,
        ceiling_usd=thresholds.ceiling_usd,
    )


def _query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def _plan_line(value: float | None, legend: str) -> list[prometheus.Dataquery]:
    return [] if value is None else [_query(f"vector({value:g})", legend)]


def _series(
    title: str, unit: str, queries: list[prometheus.Dataquery], *, description: str, width: int = 12
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .unit(unit)
        .datasource(DATASOURCE)
        .height(8)
        .span(width)
    )
    for ref, query in zip(REF_IDS, queries, strict=False):
        panel = panel.with_target(query.ref_id(ref))
    return panel


def run_dashboard(t: AlertThresholds, plan: PlanFigures) -> gd.Dashboard:
    """The dashboard builder for one stack's run (`$run` picks among its runs)."""
    run = f'{t.selector}, run=~"$run"'
    trainer = f"{{{run}}}"
    by_run = "max by (run)"
    gpu = s.GPU_NODE_LABEL
    efa = s.EFA_NODE_LABEL
    training = [
        _series(
            "Loss",
            "none",
            [_query(f"{by_run} ({s.LOSS}{trainer})", "loss {{run}}")],
            description="Mean training loss at each log. A jump or NaN: see the diverged alerts.",
        ),
        _series(
            "Tokens/s against the plan",
            "short",
            [
                _query(f"{by_run} ({s.TOKENS_PER_SECOND}{trainer})", "tokens/s {{run}}"),
                *_plan_line(plan.tokens_per_second, "plan expected"),
                *_plan_line(t.slow_tokens_per_second, "slow alert below"),
            ],
            description="Global tokens per second; the slow alert fires 15 min under the floor.",
        ),
        _series(
            "MFU against the plan's range",
            "percentunit",
            [
                _query(f"{by_run} ({s.MFU}{trainer})", "MFU {{run}}"),
                *_plan_line(plan.mfu_low, "plan low"),
                *_plan_line(plan.mfu_expected, "plan expected"),
                *_plan_line(plan.mfu_high, "plan high"),
            ],
            description="Model FLOPs utilisation by the trainer's formula (GPU runs only).",
        ),
        _series(
            "Step time and data wait",
            "s",
            [
                _query(f"{by_run} ({s.STEP_SECONDS}{trainer})", "step {{run}}"),
                _query(f"{by_run} ({s.DATA_WAIT_SECONDS}{trainer})", "data wait {{run}}"),
                *_plan_line(plan.step_seconds, "plan step"),
            ],
            description="Data wait near the step time: the loader, not the GPUs, sets the pace.",
        ),
        _series(
            "Last step's age",
            "s",
            [
                _query(f"time() - {by_run} ({s.LAST_STEP_TIME}{trainer})", "age {{run}}"),
                *_plan_line(t.hang_after_seconds, "hang alert above"),
            ],
            description="Seconds since the last completed step; the hang alert fires above.",
        ),
        _series(
            "Checkpoints",
            "s",
            [
                _query(f"{by_run} ({s.CHECKPOINT_STAGED_SECONDS}{trainer})", "staged {{run}}"),
                _query(f"{by_run} ({s.CHECKPOINT_DURABLE_SECONDS}{trainer})", "durable {{run}}"),
                _query(f"{by_run} ({s.CHECKPOINT_FAILURES}{trainer})", "failed saves {{run}}"),
            ],
            description="Staged: training blocked; durable: until on shared storage.",
        ),
        _series(
            "Restarts, rollbacks and goodput",
            "short",
            [
                _query(f"{by_run} ({s.RESTARTS}{trainer})", "restarts {{run}}"),
                _query(f"{by_run} ({s.ROLLBACKS}{trainer})", "rollbacks {{run}}"),
                _query(f"{by_run} ({s.SKIPPED_STEPS}{trainer})", "skipped steps {{run}}"),
                _query(f"{by_run} ({s.GOODPUT}{trainer})", "goodput {{run}}"),
            ],
            description="Goodput: share of wall time not lost to restarts (0..1).",
        ),
    ]
    spend = (
        stat.Panel()
        .title("Spent against the ceiling")
        .description(
            "Run time x the plan's $/h for the GPU nodes (as fsdp-eks status computes it)."
        )
        .unit("currencyUSD")
        .datasource(DATASOURCE)
        .height(8)
        .span(12)
    )
    spent = [_query(spend_usd_expr(t), "spent {{run}}")] if t.usd_per_hour is not None else []
    for ref, query in zip(
        REF_IDS, [*spent, *_plan_line(plan.ceiling_usd, "ceiling")], strict=False
    ):
        spend = spend.with_target(query.ref_id(ref))
    gpus = [
        _series(
            title,
            unit,
            [_query(f"max by ({gpu}, gpu) ({metric})", f"{{{{{gpu}}}}} gpu {{{{gpu}}}}")],
            description=description,
        )
        for title, metric, unit, description in (
            ("GPU utilisation", s.GPU_UTIL, "percent", "Near 100% while training."),
            ("GPU memory used", s.GPU_MEMORY_USED_MIB, "decmbytes", "Framebuffer in use."),
            ("GPU power", s.GPU_POWER_WATTS, "watt", "A low outlier is a slow or idle GPU."),
            ("GPU temperature", s.GPU_TEMPERATURE_C, "celsius", "Hot GPUs throttle clocks."),
            ("Last XID per GPU", s.GPU_LAST_XID, "none", "Non-zero: the GPU reported an XID."),
        )
    ]
    fabric = [
        _series(
            "EFA throughput per node",
            "Bps",
            [
                _query(f"sum by ({efa}) (rate({s.EFA_RX_BYTES}[5m]))", "rx {{" + efa + "}}"),
                _query(f"sum by ({efa}) (rate({s.EFA_TX_BYTES}[5m]))", "tx {{" + efa + "}}"),
            ],
            description="All EFA devices of a node; one low node slows every collective.",
        ),
        _series(
            "EFA errors and retransmits per node",
            "short",
            [
                *(
                    _query(f"sum by ({efa}) (rate({name}[5m]))", f"{name} {{{{{efa}}}}}")
                    for name in s.EFA_ERRORS
                ),
                _query(
                    f"sum by ({efa}) (rate({s.EFA_RETRANSMITTED_BYTES}[5m]))",
                    "retransmitted B/s {{" + efa + "}}",
                ),
            ],
            description="Errors per second; rising on one node: cordon it.",
        ),
    ]
    builder = (
        gd.Dashboard(f"fsdp-eks run: {t.stack}")
        .uid(dashboard_uid(t.stack))
        .tags(["fsdp-eks", t.stack])
        .refresh("1m")
        .time("now-6h", "now")
        .timezone("utc")
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(
            gd.QueryVariable("run")
            .label("Run")
            .datasource(DATASOURCE)
            .query(f"label_values({s.RUN_STATE}{{{t.selector}}}, run)")
            .multi(True)
            .include_all(True)
            .all_value(".*")
        )
        .with_row(gd.Row("Training"))
    )
    for panel in [*training, spend]:
        builder = builder.with_panel(panel)
    builder = builder.with_row(gd.Row("GPUs per node"))
    for panel in gpus:
        builder = builder.with_panel(panel)
    builder = builder.with_row(gd.Row("EFA per node"))
    for panel in fabric:
        builder = builder.with_panel(panel)
    return builder


def dashboard_json(t: AlertThresholds, plan: PlanFigures) -> str:
    """The dashboard as Grafana's import takes it (JSON, keys sorted: a stable diff)."""
    model = run_dashboard(t, plan).build()
    return json.dumps(json.loads(JSONEncoder(sort_keys=True).encode(model)), indent=2)


def panel_queries(document: str) -> list[str]:
    """Every PromQL expression of the dashboard's panels (the test parses each)."""
    panels = json.loads(document)["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets") or []]


def stack_dashboard(plan: RunPlan) -> str:
    """The dashboard JSON of `stack`'s run, from its plan: what the program exports and
    `fsdp-eks dashboard` writes."""
    thresholds = alert_thresholds(plan)
    return dashboard_json(thresholds, plan_figures(plan, thresholds))
