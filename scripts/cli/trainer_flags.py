"""`fsdp-eks trainer-flags`: the trainer's flags, as the trainer's `--help` lists them, from
any environment of the project (the parser is torch-free: `trainer.config`)."""

from __future__ import annotations

import click


# Flags may be named with their dashes (`--lr`): click passes them on as arguments.
@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("names", nargs=-1, metavar="[FLAG]...")
def trainer_flags(names: tuple[str, ...]) -> int:
    """The trainer's flags: what `training.extraArgs` may set (without the leading dashes),
    each with its help, type and default.

    \b
        fsdp-eks trainer-flags                 # all of them, by section
        fsdp-eks trainer-flags loss_chunk_tokens watchdog_factor
        fsdp-eks trainer-flags --lr           # with dashes, as in training.extraArgs

    Flags the stack renders are listed after the help (and marked when asked for by name)
    with the stack key to set instead, or what the program renders them from.
    """
    import argparse

    from scripts.cli.support.errors import CliError
    from trainer.config import build_parser, flag_names, flag_table

    parser = build_parser()
    parser.prog = "torchrun [...] -m trainer"  # how the job runs it (no venv needed to read)
    wanted = {name.lstrip("-") for name in names}
    unknown = sorted(wanted - flag_names())
    if unknown:
        import difflib

        hints = [
            f"{name} (did you mean {match[0]}?)" if (match := difflib.get_close_matches(
                name, sorted(flag_names()), n=1)) else name
            for name in unknown
        ]  # fmt: skip
        raise CliError(f"not a trainer flag: {', '.join(hints)}")
    marks = {row.name: _mark(row.stack_key, row.rendered_from) for row in flag_table()}
    if not wanted:
        click.echo(parser.format_help())
        click.echo("Rendered by the stack (not for training.extraArgs):")
        for name, mark in marks.items():
            if mark:
                click.echo(f"  --{name}{mark}")
        return 0
    actions = {
        action.dest: action
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction)
    }
    for name in dict.fromkeys(name.lstrip("-") for name in names):  # as asked, once each
        action = actions[name]
        choices = f" {{{','.join(map(str, action.choices))}}}" if action.choices else ""
        click.echo(f"--{action.dest}{choices}{marks[name]}\n    {action.help}")
    return 0


def _mark(stack_key: str | None, rendered_from: str | None) -> str:
    """How the listing marks a flag the stack renders: the key to set, or its source."""
    if stack_key is not None:
        return f" (set by stack key {stack_key})"
    if rendered_from is not None:
        return f" (rendered from {rendered_from})"
    return ""
