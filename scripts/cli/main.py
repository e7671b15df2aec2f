"""`fsdp-eks`: one command for a training run's whole life, before `pulumi up` and after it.

Every command takes the stack as `[STACK]` or `-s STACK`; an error is one line on stderr (exit
2 a mistake, 1 a failure; `--debug` shows the traceback); commands are imported when they run.
The commands at a glance, and the conventions: docs/design/cli.md#fsdp-eks
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.cli.support.errors import EXIT_MISTAKE, exit_status, explain

COMMANDS: dict[str, tuple[str, str]] = {
    # name: (module:attribute, one line for `fsdp-eks --help`), in the order of a run's life
    "plan": ("scripts.cli.plan:plan", "What a stack creates, fits, takes and costs (offline)."),
    "local": ("scripts.cli.local:local", "Rehearse a stack's run on this machine, for free."),
    "trainer-flags": ("scripts.cli.trainer_flags:trainer_flags", "The trainer's flags."),
    "doctor": ("scripts.cli.doctor:doctor", "What this machine has for deploying and running."),
    "ls": ("scripts.cli.ls:ls", "Every stack: deployed or not, job state, step, ETA, cost."),
    "validate": ("scripts.cli.validate:validate", "Check the stack's GPUs, EFA and NCCL."),
    "status": ("scripts.cli.status:status", "Where a run stands: job, pods, lease, spend."),
    "dashboard": ("scripts.cli.dashboard:dashboard", "Write a run's Grafana dashboard to import."),
    "logs": ("scripts.cli.logs:logs", "Follow a run's logs: rank 0, one node, or all."),
    "stop": ("scripts.cli.job:stop", "Stop a run (checkpoint, GPUs released); keep the rest."),
    "start": ("scripts.cli.job:start", "Start a stopped run again from its latest checkpoint."),
    "checkpoints": ("scripts.cli.checkpoints:checkpoints", "List or download a run's checkpoints."),
    "plot": ("scripts.cli.plot:plot", "Plot a run's loss curve from its metrics file."),
    "tensorboard": ("scripts.cli.tensorboard:tensorboard", "Serve a run's TensorBoard events."),
    "down": ("scripts.cli.down:down", "Take a stack down: what is kept, what bills, destroy."),
}


class LazyGroup(click.Group):
    """Commands imported when invoked; `--help` lists them from COMMANDS without importing."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        module, _, attribute = COMMANDS[cmd_name][0].partition(":")
        command = getattr(importlib.import_module(module), attribute)
        assert isinstance(command, click.Command)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, summary) for name, (_, summary) in COMMANDS.items()])


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option("--debug", is_flag=True, help="Show the traceback of an error.")
def cli(debug: bool) -> None:
    """One command for a training run: plan it, rehearse it, run it, watch it, stop it, take
    it down. `fsdp-eks COMMAND --help` lists a command's flags."""


def main(argv: Sequence[str] | None = None) -> None:
    """The console script (pyproject.toml `[project.scripts]`): run, then exit with the
    command's status; an error is one line (status 2 a mistake, 1 a failure), never a
    traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args[: next((i for i, a in enumerate(args) if a in COMMANDS), 0)]
    try:
        status: Any = cli.main(args=args, prog_name="fsdp-eks", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("fsdp-eks: stopped", err=True)
        sys.exit(130)
    except click.UsageError as error:  # a bad flag or argument: one line naming it
        path = error.ctx.command_path if error.ctx is not None else "fsdp-eks"
        click.echo(f"{path}: {error.format_message()} (`{path} --help` lists them)", err=True)
        sys.exit(EXIT_MISTAKE)
    except click.ClickException as error:
        command = next((a for a in args if a in COMMANDS), None)
        prefix = f"fsdp-eks {command}" if command else "fsdp-eks"
        click.echo(f"{prefix}: {error.format_message()}", err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as error:
        if debug:
            raise
        line = explain(error)
        command = next((a for a in args if a in COMMANDS), None)
        prefix = f"fsdp-eks {command}" if command else "fsdp-eks"
        if line is None:
            click.echo(
                f"{prefix}: unexpected {type(error).__name__}: {error} "
                "(`fsdp-eks --debug ...` shows the traceback)",
                err=True,
            )
            sys.exit(1)
        click.echo(f"{prefix}: {line}", err=True)
        sys.exit(exit_status(error))
    sys.exit(status if isinstance(status, int) else 0)


if __name__ == "__main__":
    main()
