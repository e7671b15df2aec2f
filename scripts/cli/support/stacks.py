"""The stack a command works on, taken the same way by every command.

    fsdp-eks plan dev                 # positional
    fsdp-eks plan -s dev              # or -s/--stack, as pulumi takes it
    fsdp-eks plan dev llama31-8b-p5   # several (where it makes sense), or --all
    fsdp-eks status                   # none: the stack `pulumi stack select` chose

A name, `Pulumi.<name>.yaml` or a path to a stack file all name a stack
(`infra.config.names`, the one parser); shell completion offers the files under `stacks/`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click
from click.shell_completion import CompletionItem

from infra.config.names import stack_file_path, stack_name, stack_names
from scripts.cli.support.errors import CliError
from scripts.cli.support.pulumi import selected_stack


def complete_stacks(
    context: click.Context, parameter: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """Stack names under `stacks/` that start with what was typed (standard library only)."""
    return [CompletionItem(name) for name in stack_names() if name.startswith(incomplete)]


def stack_arguments(
    *,
    many: bool = False,
    all_flag: bool = False,
    default: str | None = None,
    all_by_default: bool = False,
    optional: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add `[STACK]...` and `-s/--stack` (and `--all` when `all_flag`) to a command, which then
    receives `stacks: list[str]` (`many`) or `stack: str`. Without a stack the command takes
    every stack (`all_by_default`), else the Pulumi-selected one, else `default`, else none
    (`optional`: the command then gets `stack=None`, for a run named by other flags), else
    refuses in one line."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def command(
            *args: Any,
            stack_names_given: tuple[str, ...],
            stack_option: tuple[str, ...],
            all_stacks: bool = False,
            **kwargs: Any,
        ) -> Any:
            given = [*stack_names_given, *stack_option]
            chosen = resolve(
                given,
                all_stacks=all_stacks or (all_by_default and not given),
                many=many,
                default=default,
                optional=optional,
            )
            if many:
                return function(*args, stacks=chosen, **kwargs)
            return function(*args, stack=chosen[0] if chosen else None, **kwargs)

        decorated: Callable[..., Any] = command
        if all_flag:
            decorated = click.option(
                "--all", "all_stacks", is_flag=True, help="Every stack under stacks/."
            )(decorated)
        # Repeatable even for a command of one stack: click keeps only the last value of a
        # plain option, so `-s a -s b` would silently mean b; `resolve` refuses it instead.
        decorated = click.option(
            "-s",
            "--stack",
            "stack_option",
            multiple=True,
            metavar="STACK",
            shell_complete=complete_stacks,
            help="A stack: its name, or its stack file"
            + (" (repeatable)." if many else ".")
            + " Default: the stack `pulumi stack select` chose.",
        )(decorated)
        return click.argument(
            "stack_names_given",
            metavar="[STACK]..." if many else "[STACK]",
            nargs=-1,
            shell_complete=complete_stacks,
        )(decorated)

    return decorate


def resolve(
    given: list[str],
    *,
    all_stacks: bool,
    many: bool,
    default: str | None,
    optional: bool = False,
) -> list[str]:
    """The stacks named, checked to exist, in order and without repeats."""
    names = list(dict.fromkeys(given))
    if all_stacks:
        if names:
            raise CliError(f"name stacks or pass --all, not both (named: {', '.join(names)})")
        names = stack_names()
    if not names:
        chosen = selected_stack() or default
        if chosen is None and optional:
            return []
        if chosen is None:
            raise CliError(
                f"name a stack (stacks: {', '.join(stack_names())}), or select one with "
                "`pulumi stack select`"
            )
        names = [chosen]
    if not many and len(names) > 1:
        raise CliError(f"this command takes one stack, got {len(names)}: {', '.join(names)}")
    for name in names:
        stack_file_path(name)  # UnknownStackError (one line with the stacks) when there is none
    return names


def name_of(stack: str) -> str:
    """The stack's name, as `pulumi --stack` takes it, from a name or a stack file."""
    return stack_name(stack)
