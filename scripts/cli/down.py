"""`fsdp-eks down`: `pulumi destroy` of a stack, after a summary of what stays and what bills.

What stays is read from the stack's state (`pulumi stack export`: resources recorded with
`retainOnDelete`, which the engine drops from the state without deleting them: pulumi
`pkg/resource/deploy/step.go` `DeleteStep.Apply`), not from the stack file, which may have
changed since the last `pulumi up`. `--remove` is never passed: it would delete the stack's
config file too, and that file is the experiment (pulumi `pkg/cmd/pulumi/operations/destroy.go`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click

from scripts.cli.support.stacks import name_of, stack_arguments

BUCKET_TYPE = "aws:s3/bucket:Bucket"
FSX_TYPE = "aws:fsx/lustreFileSystem:LustreFileSystem"


@dataclass(frozen=True)
class Summary:
    resources: int
    kept: list[str]
    """`type name` of every resource the destroy leaves in the account."""
    protected: list[str]
    bucket: str | None
    kept_bucket: bool
    bucket_named: bool | None
    """Whether the stack names its bucket (storage.bucket.name): a later `up` finds it again.
    None: unknown, the stack file no longer validates (edited since the last `up`)."""
    usd_per_hour: float | None
    job: str | None


def summarize(
    state: Mapping[str, Any], outputs: Mapping[str, Any], bucket_named: bool | None
) -> Summary:
    """What `pulumi destroy` will and will not delete, from the stack's exported state."""
    resources = [
        r
        for r in (state.get("deployment") or {}).get("resources") or []
        if not str(r.get("type", "")).startswith("pulumi:")
    ]

    def label(resource: Mapping[str, Any]) -> str:
        outs = resource.get("outputs") or {}
        ident = outs.get("bucket") or outs.get("id") or resource.get("id") or ""
        name = str(resource.get("urn", "")).rsplit("::", 1)[-1]
        return f"{resource.get('type')} {name}" + (f" ({ident})" if ident else "")

    kept = [r for r in resources if r.get("retainOnDelete")]
    usd = outputs.get("estimatedUsdPerHour")
    return Summary(
        resources=len(resources),
        kept=[label(r) for r in kept],
        protected=[label(r) for r in resources if r.get("protect")],
        bucket=outputs.get("bucketName") if isinstance(outputs.get("bucketName"), str) else None,
        kept_bucket=any(r.get("type") == BUCKET_TYPE for r in kept),
        bucket_named=bucket_named,
        usd_per_hour=float(usd) if isinstance(usd, int | float) else None,
        job=outputs.get("jobName") if isinstance(outputs.get("jobName"), str) else None,
    )


def describe(stack: str, summary: Summary, standing_per_day: float | None) -> list[str]:
    lines = [f"pulumi destroy -s {stack} deletes {summary.resources} resources."]
    if summary.kept:
        lines.append("Kept in the account (retained: storage.dataPolicy retain):")
        lines += [f"  {item}" for item in summary.kept]
        lines.append("  They bill on (S3 storage; a kept FSx file system by its size).")
    else:
        lines.append("Nothing is kept: the bucket and its checkpoints go too.")
    if summary.protected:
        lines.append("Protected (destroy stops at these): " + ", ".join(summary.protected))
    until = []
    if summary.usd_per_hour is not None:
        until.append(f"GPU nodes at ${summary.usd_per_hour:,.2f}/h while any run")
    if standing_per_day is not None:
        until.append(f"the platform at ~${standing_per_day:,.2f}/day")
    if until:
        lines.append("Until the destroy completes: " + "; ".join(until) + ".")
    if summary.job:
        lines.append(
            f"The job {summary.job} is deleted with its pods: a run still training stops "
            "without a final checkpoint beyond its latest (`fsdp-eks stop` saves one first)."
        )
    if summary.kept_bucket and summary.bucket and not summary.bucket_named:
        head = (
            "The stack file does not validate now, so whether it names its bucket is unknown; "
            "unless it does, a later"
            if summary.bucket_named is None
            else "The stack does not name its bucket, so a later"
        )
        lines.append(
            f"{head} `pulumi up` creates a new one and starts fresh. To resume from "
            f"{summary.bucket}, put in the stack file: storage.bucket.create: false and "
            f"storage.bucket.name: {summary.bucket}."
        )
    return lines


@click.command()
@stack_arguments()
@click.option("-y", "--yes", is_flag=True, help="Do not ask; destroy after the summary.")
def down(stack: str, yes: bool) -> int:
    """Take a stack down: say what is kept (the bucket and its checkpoints, by default) and what
    bills until then, ask, then run `pulumi destroy`.

    \b
        fsdp-eks down llama31-8b-p5
        fsdp-eks down llama31-8b-p5 --yes
    """
    from scripts.cli.support.pulumi import stack_export, stack_outputs
    from scripts.cli.support.tools import ROOT, require_tool

    name = name_of(stack)
    pulumi = require_tool("pulumi")
    outputs = stack_outputs(name)
    summary = summarize(stack_export(name), outputs, bucket_named=names_its_bucket(stack))
    if summary.resources == 0:
        click.echo(f"stack {name} has nothing deployed; nothing to destroy")
        return 0
    standing = outputs.get("standingUsdPerDay")
    per_day = float(standing) if isinstance(standing, int | float) else standing_per_day(stack)
    for line in describe(name, summary, per_day):
        click.echo(line)
    if not yes and not click.confirm(f"Destroy stack {name}?", err=True):
        click.echo("nothing destroyed", err=True)
        return 1
    command = [pulumi, "destroy", "--yes", "--stack", name]
    click.echo(f"# {' '.join(command[1:])}", err=True)
    return subprocess.run(command, cwd=ROOT, check=False).returncode


def names_its_bucket(stack: str) -> bool | None:
    """Whether the stack file names its bucket (storage.bucket.name); None when the file does
    not validate now: what is deployed is destroyed all the same, so a file edited since the
    last `pulumi up` must not block `down`."""
    from infra.config import StackConfigError, load_stack_file

    try:
        return load_stack_file(stack).storage.bucket.name is not None
    except StackConfigError:
        return None


def standing_per_day(stack: str) -> float | None:
    """The platform's cost per day while it stands, from the stack file's run plan, for a
    stack deployed before its outputs carried `standingUsdPerDay` (None: the file no longer
    plans, e.g. edited since)."""
    from infra.config import StackConfigError
    from infra.job.stack_checks import plan_stack_file

    try:
        return plan_stack_file(stack).standing.usd_per_day
    except StackConfigError:
        return None
