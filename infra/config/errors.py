"""Stack-config problems as the user wrote the file: one line per problem, naming the key.

pydantic reports `gpu_nodes.instance_type` and its own wording; a reviewer or a CI log needs
`gpuNodes.instanceType`, the bad value and what is allowed, so every error is rewritten here.
"""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from infra.config.stack import StackConfig


class StackConfigError(ValueError):
    """A stack config that cannot run; `problems` holds one message per problem.

    One problem is one line (`source: problem`), several a header and a line each: what a
    terminal, a CI log and a pull-request comment show as is."""

    def __init__(self, problems: list[str], *, source: str = "stack config") -> None:
        self.problems = problems
        self.source = source
        if len(problems) == 1:
            super().__init__(f"{source}: {problems[0]}")
            return
        lines = "\n".join(f"  - {problem}" for problem in problems)
        super().__init__(f"{source} is invalid ({len(problems)} problems):\n{lines}")


def allowed_keys(model: type[BaseModel]) -> list[str]:
    return sorted(field.alias or name for name, field in model.model_fields.items())


def _model_at(path: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The config model found at `path` (aliases) under StackConfig, if the path leads to one."""
    model: type[BaseModel] = StackConfig
    for part in path:
        if isinstance(part, int):
            continue
        by_alias = {field.alias or name: field for name, field in model.model_fields.items()}
        field = by_alias.get(part)
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nested = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not nested:
            return None
        model = nested[0]
    return model


def _key_paths(model: type[BaseModel], prefix: str = "") -> dict[str, list[str]]:
    """Every key of `model` and of its sections, by its own name (`maxRunHours` →
    [`job.maxRunHours`])."""
    found: dict[str, list[str]] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}{key}"
        found.setdefault(key, []).append(path)
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        for nested in (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)):
            for inner, paths in _key_paths(nested, f"{path}.").items():
                found.setdefault(inner, []).extend(paths)
    return found


def _sections_with(key: str) -> list[str]:
    """Where a key that is unknown in one section is a key: `job.maxRunHours`, ... (a key the
    user put in the wrong section gets its home named, not a list of the section's keys)."""
    return sorted(_key_paths(StackConfig).get(key, []))


def _describe_error(error: ErrorDetails) -> str:
    path = tuple(error["loc"])
    key = ".".join(str(part) for part in path) or "stack config"
    kind = error["type"]
    value = error.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(path[:-1])
        allowed = allowed_keys(parent) if parent else []
        elsewhere = _sections_with(str(path[-1]))
        if elsewhere and str(path[-1]) not in allowed:
            homes = " or ".join(elsewhere)
            return f"{key}: unknown key here; it belongs in another section: did you mean {homes}?"
        hint = difflib.get_close_matches(str(path[-1]), allowed, n=1)
        suggestion = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"{key}: unknown key{suggestion}; allowed keys here: {', '.join(allowed)}"
    if kind == "missing":
        return f"{key} is required and missing"
    if kind == "value_error":
        message = str(error["msg"]).removeprefix("Value error, ")
        # Section validators already name their keys; add the path only when they did not.
        return message if path and str(path[0]) in message else f"{key}: {message}"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"{key} must be a mapping of keys, got {value!r}"
    message = str(error["msg"])
    return f"{key} = {value!r}: {message[0].lower()}{message[1:]}"


def format_validation_error(err: ValidationError) -> list[str]:
    """One message per pydantic error, naming the camelCase key path.

    A misspelt required key is one problem, not two: its "missing" error is dropped when an
    unknown key next to it is the misspelling (the unknown-key message suggests the name).
    """
    errors = err.errors()
    suggested: set[tuple[int | str, ...]] = set()
    for error in errors:
        if error["type"] == "extra_forbidden":
            path = tuple(error["loc"])
            parent = _model_at(path[:-1])
            allowed = allowed_keys(parent) if parent else []
            for hint in difflib.get_close_matches(str(path[-1]), allowed, n=1):
                suggested.add((*path[:-1], hint))
    return [
        _describe_error(error)
        for error in errors
        if not (error["type"] == "missing" and tuple(error["loc"]) in suggested)
    ]
