"""`fsdp-eks ls`: one row per stack file: deployed or not, the job's state, its step, ETA,
$/h and $ so far.

A deployed stack's figures come from its outputs (`pulumi stack output`) and its run's metrics
file in S3 (its head and tail, two ranged reads); a stack that is not deployed, or whose
metrics cannot be read from here, shows its plan's figures (expected hours and $/h) instead,
marked as such. Nothing here reaches a cluster: `fsdp-eks status STACK` does.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import click

from scripts.cli.support.stacks import stack_arguments

PARALLEL_STACKS = 8
"""Stacks read at once: each is a `pulumi stack output` process and two S3 reads."""


@dataclass(frozen=True)
class Row:
    stack: str
    deployed: str
    """yes, no, updating, or unknown (no Pulumi CLI, or it failed)."""
    state: str
    step: str
    eta: str
    usd_per_hour: str
    usd_so_far: str
    note: str = ""


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:.1f} h" if hours >= 1 else f"{seconds / 60:.0f} min"


def planned_row(stack: str, deployed: str, note: str = "") -> Row:
    """A row from the stack's plan: its expected hours and $/h, nothing measured."""
    from infra.config import StackConfigError
    from infra.job.stack_checks import plan_stack_file

    try:
        plan = plan_stack_file(stack)
    except StackConfigError:
        return Row(stack, deployed, "invalid", "-", "-", "-", "-", "`fsdp-eks plan` says why")
    cost, duration = plan.cost, plan.duration
    steps = plan.config.training.max_steps
    return Row(
        stack,
        deployed,
        "not started" if deployed == "no" else "?",
        f"0/{steps}",
        f"~{duration.hours:.1f} h (plan)" if duration else "-",
        f"{cost.usd_per_hour:,.2f} (plan)" if cost else "-",
        "-",
        note,
    )


def deployed_row(stack: str, summary: dict[str, Any]) -> Row:
    """A deployed stack's row, from its outputs and its metrics file where readable."""
    from scripts.cli.support.progress import METRICS_FILE, progress, read_window
    from scripts.cli.support.pulumi import stack_outputs
    from scripts.cli.support.target import resolve_target

    updating = bool(summary.get("updateInProgress"))
    deployed = "updating" if updating else "yes"
    try:
        outputs = stack_outputs(stack)
        target = resolve_target(stack)
        uri = f"{target.require_checkpoint_uri()}/{METRICS_FILE}"
        head, tail = read_window(uri)
    except Exception as error:  # no credentials, no output yet, FSx without export, ...
        return planned_row(stack, deployed, note=f"metrics not readable: {_short(error)}")
    usd = target.usd_per_hour
    found = progress(head, tail)
    if found.step is None:
        return planned_row(stack, deployed, note="no metrics yet")
    spent = f"~{usd * found.trained_hours:,.2f}" if usd is not None else "-"
    return Row(
        stack,
        deployed,
        found.state,
        f"{found.step}/{found.max_steps or '?'}",
        _hours(found.eta_s) if found.eta_s is not None else "-",
        f"{usd:,.2f}" if usd is not None else "-",
        spent,
        "" if outputs.get("jobName") else "no job output",
    )


def _short(error: BaseException) -> str:
    from scripts.cli.support.errors import explain

    line = explain(error) or f"{type(error).__name__}: {error}"
    return line if len(line) <= 80 else line[:77] + "..."


def rows_for(stacks: list[str]) -> list[Row]:
    """One row per stack, the deployed ones read in parallel."""
    from scripts.cli.support import tools
    from scripts.cli.support.errors import CliError
    from scripts.cli.support.pulumi import stack_list

    if tools.find_tool("pulumi") is None:
        return [planned_row(name, "unknown", note="no Pulumi CLI here") for name in stacks]
    try:
        listed = stack_list()
    except CliError as error:
        return [planned_row(name, "unknown", note=_short(error)) for name in stacks]

    def row(name: str) -> Row:
        summary = listed.get(name)
        if summary is None:
            return planned_row(name, "no", note="no stack: `pulumi stack init`")
        if not summary.get("resourceCount"):
            return planned_row(name, "no")
        return deployed_row(name, summary)

    with ThreadPoolExecutor(PARALLEL_STACKS) as pool:
        return list(pool.map(row, stacks))


HEADERS = ("STACK", "DEPLOYED", "JOB", "STEP", "ETA", "$/H", "$ SO FAR", "")


@click.command()
@stack_arguments(many=True, all_flag=False, default=None, all_by_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per stack.")
def ls(stacks: list[str], as_json: bool) -> int:
    """Every stack (or those named): deployed or not, the job's state, step, ETA, $/h and $ so
    far. Deployed runs are read from their outputs and metrics in S3; the others show their
    plan's figures, marked (plan).

    \b
        fsdp-eks ls
        fsdp-eks ls llama31-8b-p5 --json
    """
    rows = rows_for(stacks)
    if as_json:
        for row in rows:
            click.echo(json.dumps(asdict(row)))
        return 0
    table = [HEADERS, *((r.stack, r.deployed, r.state, r.step, r.eta, r.usd_per_hour,
                         r.usd_so_far, r.note) for r in rows)]  # fmt: skip
    widths = [max(len(str(line[i])) for line in table) for i in range(len(HEADERS))]
    for line in table:
        click.echo(
            "  ".join(
                str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)
            ).rstrip()
        )
    return 0
