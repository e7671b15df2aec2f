"""`fsdp-eks stop` / `fsdp-eks start`: a run stopped and started again, the platform kept.

Stopping suspends the PyTorchJob (`spec.runPolicy.suspend`, a forced server-side apply by the
field manager `fsdp-eks`: `infra.job.suspension`): training-operator v1.9 deletes its pods,
each gets SIGTERM and its grace period, in which the trainer saves a checkpoint, and the
Cluster Autoscaler removes the GPU nodes once they are idle. Starting clears it: the operator
recreates the pods, which resume from the latest checkpoint, and this waits as `pulumi up`
does until every worker trains. The program never renders `suspend`, so a `pulumi up` that
leaves the job unchanged leaves a stopped run stopped (docs/operations.md, "Stopping and
starting a run").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from scripts.cli.support.stacks import stack_arguments
from scripts.cli.support.target import RunTarget, run_options

if TYPE_CHECKING:
    from infra.job.stop_start import Pacing

PACING: Pacing | None = None
"""The waits' poll intervals and clock (None: `infra.job.stop_start.Pacing()`, the real
ones); the tests set one whose sleep only advances its clock."""


def _pacing() -> Pacing:
    from infra.job.stop_start import Pacing

    return PACING or Pacing()


def _progress(line: str) -> None:
    click.echo(f"  {line}", err=True)


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option("--timeout", type=click.FloatRange(min=1), help="Seconds to wait for the pods to "
              "go (default: their grace period plus two minutes).")  # fmt: skip
def stop(target: RunTarget, timeout: float | None) -> int:
    """Stop a run: its pods save a checkpoint and go, the GPU nodes are released; the
    cluster, the storage and the checkpoints stay.

    \b
        fsdp-eks stop llama31-8b-p5
        fsdp-eks start llama31-8b-p5      # later: resumes from the latest checkpoint

    A `pulumi up` that leaves the job unchanged leaves it stopped; one that changes the job
    replaces it, and the new job starts at once.
    """
    from infra.job.stop_start import stop_job

    pace = _pacing()
    result = stop_job(
        target.client(),
        target.namespace,
        target.require_job(),
        stack=target.stack,
        job_api=target.api,
        timeout_s=timeout,
        on_progress=_progress,
        poll_s=pace.poll_s,
        clock=pace.clock,
        sleep=pace.sleep,
    )
    click.echo(result.message)
    return 0


@click.command()
@stack_arguments(optional=True)
@run_options
@click.option("--no-wait", is_flag=True, help="Resume it and return; do not wait for workers.")
def start(target: RunTarget, no_wait: bool) -> int:
    """Start a stopped run again: its pods come back and resume from the latest checkpoint;
    waits, as `pulumi up` does, until every worker trains (or stops it again if they cannot
    all start within the stack's start budget).

    \b
        fsdp-eks start llama31-8b-p5
    """
    from infra.job.stop_start import start_job

    pace = _pacing()
    result = start_job(
        target.client(),
        target.namespace,
        target.require_job(),
        stack=target.stack,
        job_api=target.api,
        start_timeout_s=start_budget(target.stack_file),
        wait=not no_wait,
        on_progress=_progress,
        poll_s=pace.poll_s,
        watch_poll_s=pace.watch_poll_s,
        clock=pace.clock,
        sleep=pace.sleep,
    )
    click.echo(result.message)
    return 0


def start_budget(stack: str | None) -> float:
    """The stack's start budget (its run plan's); the `job.startTimeoutMinutes` default for a
    run named by --job, or when the stack file does not plan now (edited since the last
    `pulumi up`: the job on the cluster is what starts, so that must not block it)."""
    from infra.config import StackConfigError
    from infra.job.stop_start import DEFAULT_START_TIMEOUT_S

    if stack is None:
        return DEFAULT_START_TIMEOUT_S
    from infra.job.stack_checks import plan_stack_file

    try:
        return plan_stack_file(stack).timeouts.start_budget_seconds
    except StackConfigError as error:
        _progress(
            f"the stack file does not plan now ({str(error).splitlines()[0]}): waiting the "
            f"default start budget, {DEFAULT_START_TIMEOUT_S / 60:.0f} min"
        )
        return DEFAULT_START_TIMEOUT_S
