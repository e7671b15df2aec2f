"""The stack keys of the trainer's flags, read from the trainer's own table of flags.

Each trainer flag names the stack key it is rendered from (`trainer.config.flag_table`:
`_flag(..., stack_key="training.maxSteps")`). A section of the stack schema that derives from
`TrainerKeyedSection` declares the keys whose stack meaning differs from the flag's (another
default, an `auto` the plan resolves) and gets every other key of its section from the table:
the flag's type, optional, unset meaning the trainer's default, the flag's help as its
description. So a new trainer flag with a stack key needs no edit here or in the schema.
"""

from __future__ import annotations

import argparse
import difflib
import types
from functools import cache
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, Field
from pydantic.alias_generators import to_camel, to_snake

from infra.config.base import ConfigSection
from trainer.config import FlagRow, build_parser, flag_table, test_only_flag_names


def keyed_rows() -> dict[str, FlagRow]:
    """The table's rows that have a stack key, by key."""
    return {row.stack_key: row for row in flag_table() if row.stack_key is not None}


def stack_key_of(flag: str) -> str | None:
    """The stack key `flag` is rendered from, if any."""
    return next((row.stack_key for row in flag_table() if row.name == flag), None)


def rendered_flag_names() -> frozenset[str]:
    """Flags the program renders itself (from their stack key, or from what the table says):
    `training.extraArgs` may not set them, so every setting has one place in the stack file."""
    return frozenset(row.name for row in flag_table() if row.rendered)


TABLE_SUPPLIED_KEYS: set[str] = set()
"""Stack keys a section got from the table (not declared by the section itself): unset, they
render nothing, so adding one leaves every run id as it was (`infra.job.flags.run_id`)."""


def _optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType) and type(None) in get_args(annotation):
        return annotation
    return annotation | None


class TrainerKeyedSection(ConfigSection):
    """A stack section whose trainer-flag keys the table supplies (`stack_section=` names it)."""

    def __init_subclass__(cls, stack_section: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if stack_section is None:
            return
        # Pydantic collects the fields from the class's annotations and attributes after this
        # hook (pydantic 2.14 `_model_construction.ModelMetaclass.__new__`: `super().__new__`,
        # which runs `__init_subclass__`, then `set_model_fields`).
        declared = {to_camel(name) for name in cls.__annotations__}
        for key, row in keyed_rows().items():
            section, _, name = key.partition(".")
            if section != stack_section or name in declared:
                continue
            field_name = to_snake(name)
            if to_camel(field_name) != name:
                raise TypeError(f"stack key {key} of --{row.name} is not camelCase")
            cls.__annotations__[field_name] = _optional(row.annotation)
            shown = "unset" if row.default is None else repr(row.default)
            description = f"{row.help} Default: the trainer's ({shown})."
            setattr(cls, field_name, Field(default=None, description=description))
            TABLE_SUPPLIED_KEYS.add(key)


def stack_value(config: BaseModel, key: str) -> Any:
    """The value at a camelCase `section.key` of the stack config."""
    value: Any = config
    for part in key.split("."):
        fields = type(value).model_fields
        name = next(n for n, f in fields.items() if (f.alias or n) == part)
        value = getattr(value, name)
    return value


@cache
def _parser_actions() -> dict[str, argparse.Action]:
    return {action.dest: action for action in build_parser()._actions}


def _allowed(action: argparse.Action) -> str:
    if action.choices is not None:
        return ", ".join(map(str, action.choices))
    if action.metavar == "0|1":
        return "0/1/true/false"
    names = {"INT": "an integer", "FLOAT": "a number", "STR": "text"}
    return names.get(str(action.metavar), str(action.metavar))


def extra_arg_problem(flag: str, value: object) -> str | None:
    """What is wrong with `training.extraArgs.<flag>: value`, as one line naming the key, the
    value and what is allowed; None when the trainer's parser takes it."""
    key = f"training.extraArgs.{flag}"
    table = {row.name: row for row in flag_table()}
    name = flag.lstrip("-")
    if name not in table:
        close = difflib.get_close_matches(name, sorted(table), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"{key} is not a trainer flag{hint}; `fsdp-eks trainer-flags` lists them"
    if name != flag:
        return f"{key}: write the flag without dashes; allowed: training.extraArgs.{name}"
    row = table[name]
    if name in test_only_flag_names():
        return (
            f"{key} is a test-only trainer flag (an injected fault or fp8 emulation) and no "
            "setting for a run; allowed: the other flags `fsdp-eks trainer-flags` lists"
        )
    if row.stack_key is not None:
        return f"{key} is set from its own stack key; allowed: {row.stack_key} instead"
    if row.rendered_from is not None:
        return (
            f"{key} is no setting: the program renders --{name} from {row.rendered_from}; "
            "allowed: leave it out"
        )
    action = _parser_actions()[name]
    text = str(int(value) if isinstance(value, bool) else value)
    try:
        converted = action.type(text) if callable(action.type) else text
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return f"{key} {value!r} is no value --{name} takes; allowed: {_allowed(action)}"
    if action.choices is not None and converted not in action.choices:
        return f"{key} {value!r} is not a choice of --{name}; allowed: {_allowed(action)}"
    return None
