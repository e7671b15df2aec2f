"""`fsdp-eks`: one command for a run's whole life after `pulumi up`, or before it.

    fsdp-eks plan -s llama31-8b-p5           # offline: what it creates, fits, takes and costs
    fsdp-eks local -s dev                    # the run on this machine (CPU or its GPUs)
    fsdp-eks status -s llama31-8b-p5         # state, pods, GPU lease, restarts, spend so far
    fsdp-eks logs -s llama31-8b-p5           # follow rank 0
    fsdp-eks checkpoints -s STACK list       # or: download latest ./ckpt
    fsdp-eks validate -s STACK               # GPUs, EFA, NCCL bandwidth on the cluster
    fsdp-eks plot -s STACK                   # loss.png from the run's metrics file
    fsdp-eks tensorboard -s STACK            # the run's event files, served locally

Every subcommand takes the stack the same way, `-s/--stack`, defaulting like `pulumi` itself
to the selected stack (`pulumi stack select`). Each is the script of the same name under
`scripts/` (its own `--help` lists every flag), so `scripts/` stays the home of the code.

A mistake is one line on stderr and exit status 2: an unknown stack, a missing tool, no AWS
credentials, a refused config. `--debug` (before the subcommand) shows the traceback instead.
"""

from __future__ import annotations

import functools
import importlib
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ROOT = Path(__file__).resolve().parents[2]

TOOLS = {
    "kubectl": "install kubectl (https://kubernetes.io/docs/tasks/tools/)",
    "pulumi": "install the Pulumi CLI (https://www.pulumi.com/docs/install/)",
    "aws": "install the AWS CLI v2 (https://docs.aws.amazon.com/cli/)",
    "tensorboard": "install TensorBoard (`pip install tensorboard`, or `python3 scripts/dev.py "
    "setup`, whose .venv-dev has it)",
}
"""Programs the subcommands run, and what to do when one is missing."""


MODULE_GROUPS = {
    "pulumi": "infra",
    "pulumi_aws": "infra",
    "pulumi_kubernetes": "infra",
    "boto3": "infra",
    "torch": "trainer",
    "transformers": "trainer",
    "datasets": "trainer",
    "matplotlib": "local",
}
"""Where a missing import comes from: `dev.py local` installs the trainer without Pulumi,
`pulumi install` the infra group without torch (pyproject.toml dependency groups)."""


class UsageError(click.ClickException):
    """A user mistake: one line, exit status 2."""

    exit_code = 2


def selected_stack() -> str | None:
    """The stack `pulumi stack select` chose for this project, as `pulumi` would use it; None
    without the Pulumi CLI or a selection."""
    if shutil.which("pulumi") is None:
        return None
    done = subprocess.run(
        ["pulumi", "stack", "--show-name", "--non-interactive"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    name = done.stdout.strip()
    return name if done.returncode == 0 and name else None


def explain(error: BaseException) -> str | None:
    """The one line for an error a user can fix; None for anything else."""
    if isinstance(error, FileNotFoundError) and str(error.filename) in TOOLS:
        return f"{error.filename} is not on PATH: {TOOLS[str(error.filename)]}"
    kind = type(error).__name__
    if kind in ("NoCredentialsError", "PartialCredentialsError"):
        return (
            "no AWS credentials: run `aws configure` or `aws sso login`, or set AWS_PROFILE "
            "to a profile that has them"
        )
    if kind in ("ClientError", "EndpointConnectionError", "TokenRetrievalError"):
        return f"AWS refused or could not be reached: {error}"
    if kind == "StackConfigError":
        return str(error)
    if isinstance(error, ModuleNotFoundError) and error.name:
        package = error.name.split(".")[0]
        group = MODULE_GROUPS.get(package)
        if group is not None:
            return (
                f"this command needs {package} (the `{group}` dependency group), which this "
                "environment lacks: `python3 scripts/dev.py setup` installs every group"
            )
    return None


def run_script(module: str, argv: Sequence[str], *, debug: bool) -> None:
    """Import `scripts.<module>`, run its `main(argv)` and exit with its status; errors become
    one line."""
    try:
        main: Callable[[list[str]], int] = importlib.import_module(f"scripts.cli.{module}").main
        status = main(list(argv))
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
        if isinstance(done.code, str):
            click.echo(done.code, err=True)
    except KeyboardInterrupt:
        status = 130
    except Exception as error:
        if debug:
            raise
        line = explain(error)
        if line is None:
            raise click.ClickException(
                f"{type(error).__name__}: {error} (run `fsdp-eks --debug ...` for the traceback)"
            ) from None
        raise UsageError(line) from None
    sys.exit(status)


PASS_THROUGH: dict[str, Any] = {
    "ignore_unknown_options": True,
    "allow_extra_args": True,
    "help_option_names": [],  # `--help` reaches the script, whose help lists every flag
}


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
@click.pass_context
def cli(context: click.Context, debug: bool) -> None:
    """One command for a training run: plan it, rehearse it locally, watch it, fetch its
    results. Each subcommand's `--help` lists its flags."""
    context.obj = debug


def _stack_option(function: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "-s", "--stack", help="Stack name or file (default: the selected Pulumi stack)."
    )(function)


def _script_command(
    name: str, module: str, *, positional: bool, fallback: str | None = None
) -> None:
    """A subcommand that hands its arguments to `scripts/<module>.py`'s `main`, the stack
    first: as the positional argument those scripts take, or as their `--stack`."""

    @cli.command(name, context_settings=PASS_THROUGH, help=_first_line(module))
    @_stack_option
    @click.pass_context
    def command(context: click.Context, stack: str | None) -> None:
        chosen = stack or selected_stack() or fallback
        args = list(context.args)
        asks_help = "--help" in args or "-h" in args
        if chosen is None and positional and not asks_help:
            raise UsageError(
                f"name a stack: fsdp-eks {name} -s STACK (stacks: {', '.join(known_stacks())}), "
                "or select one with `pulumi stack select`"
            )
        if chosen is not None:
            args = [chosen, *args] if positional else ["--stack", chosen, *args]
        run_script(module, args, debug=bool(context.obj))

    del command


def known_stacks() -> list[str]:
    """`infra.config.stack_names`, imported only when a stack is missing (pydantic)."""
    from infra.config import stack_names

    return stack_names()


@functools.cache
def _first_line(module: str) -> str:
    """The script's own summary (its docstring's first line) as the subcommand's help."""
    text = (ROOT / "scripts" / "cli" / f"{module}.py").read_text(encoding="utf-8")
    docstring = text.split('"""', 2)[1] if text.lstrip().startswith('"""') else ""
    return docstring.strip().splitlines()[0] if docstring.strip() else module


_script_command("plan", "plan", positional=True)
_script_command("local", "local", positional=True, fallback="dev")
_script_command("validate", "validate", positional=True)
_script_command("status", "status", positional=False)
_script_command("logs", "logs", positional=False)
_script_command("checkpoints", "checkpoints", positional=False)
_script_command("plot", "plot", positional=False)
_script_command("tensorboard", "tensorboard_events", positional=False)


def main(argv: Sequence[str] | None = None) -> None:
    """The console script's entry point (pyproject.toml `[project.scripts]`)."""
    cli.main(args=list(sys.argv[1:] if argv is None else argv), prog_name="fsdp-eks")


if __name__ == "__main__":
    main()
