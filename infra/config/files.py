"""Stack files: `stacks/Pulumi.<name>.yaml`, read as the engine would pass them.

The one place that turns a stack name into its file (and lists the stacks), for the plan, the
local run, the command-line tool and the tests, which have a file but no Pulumi engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import Any

import yaml

from infra.config.errors import StackConfigError
from infra.config.names import STACKS_DIR, stack_file_path, stack_name
from infra.config.parse import _unqualified, parse_stack_config
from infra.config.stack import HF_TOKEN_KEY, PROJECT, StackConfig, gated_hub_references

REPO_ROOT = STACKS_DIR.parent

SECRET_PLACEHOLDER = "offline-placeholder-secret"
"""Stands in for an encrypted value when a stack file is read without its secrets provider."""


@dataclass(frozen=True)
class StackFile:
    """A `Pulumi.<stack>.yaml` as the engine would pass it: values plus which are secret."""

    stack_name: str
    path: Path
    config: dict[str, Any]
    secret_keys: list[str]
    warnings: list[str] = dataclass_field(default_factory=list)
    """What `pulumi up` needs that the file lacks: a secret the run needs and only the
    deployer sets (`hfToken` for a gated model), read here as a placeholder so that the
    offline plan shows the run as it will be; the program itself refuses without it."""


def display_path(path: Path) -> str:
    """A repository file as its path from the root (`stacks/Pulumi.dev.yaml`), others as is."""
    resolved = path.resolve()
    return str(resolved.relative_to(REPO_ROOT)) if resolved.is_relative_to(REPO_ROOT) else str(path)


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping: PyYAML keeps the last
    silently (`SafeConstructor.construct_mapping` fills a dict), so a second
    `fsdp-eks:training:` section would replace the first without a word. The Pulumi CLI's
    YAML parser (go-yaml v3) refuses such a file too ("mapping key ... already defined")."""


def _refuse_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: dict[Any, yaml.Mark] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            first = seen[key].line + 1
            raise yaml.MarkedYAMLError(
                problem=f"{key!r} is given twice (lines {first} and {key_node.start_mark.line + 1})"
                "; YAML would keep only the last and drop the first without a word: merge them",
                problem_mark=key_node.start_mark,
            )
        seen[key] = key_node.start_mark
    loader.flatten_mapping(node)
    return dict(loader.construct_pairs(node))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _refuse_duplicates)


def load_yaml(path: Path) -> dict[str, Any]:
    """A stack file's YAML; a syntax error or a duplicated key is one line `file:line:col: what`,
    a file that cannot be read or is not UTF-8 one line naming it (a StackConfigError, so every
    command and the program treat it as any other mistake)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        byte = error.object[error.start]
        raise StackFileError(
            f"{display_path(path)}: not UTF-8 text (byte {error.start} is {byte:#04x}); stack "
            "files are UTF-8, as Pulumi reads them"
        ) from None
    except OSError as error:
        raise StackFileError(
            f"{display_path(path)}: cannot be read: {error.strerror or error}"
        ) from None
    try:
        document = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = (
            f"{display_path(path)}:{mark.line + 1}:{mark.column + 1}"
            if mark
            else display_path(path)
        )
        what = error.problem or error.context or "not valid YAML"
        if mark is not None and "\t" in _indent_of(text, mark.line):
            what += " (a tab in the indentation: YAML indents with spaces only)"
        raise StackFileError(f"{where}: {what}") from None
    except yaml.YAMLError as error:
        raise StackFileError(f"{display_path(path)}: not valid YAML: {error}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise StackFileError(
            f"{display_path(path)}: a stack file is a mapping with a `config:` key"
        )
    return document


def _indent_of(text: str, line: int) -> str:
    """The leading whitespace of a line (0-based) of `text`; empty past its end."""
    lines = text.splitlines()
    if line >= len(lines):
        return ""
    return lines[line][: len(lines[line]) - len(lines[line].lstrip())]


class StackFileError(StackConfigError):
    """A stack file that cannot be read or is not valid YAML: one line that names the file
    (and the line and column of a YAML mistake)."""

    def __init__(self, line: str) -> None:
        super().__init__([line], source="")
        self.args = (line,)

    def __str__(self) -> str:
        return str(self.args[0])


def read_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> StackFile:
    """Read a stack file; `secure:` values become a placeholder and are listed as secret."""
    path = stack_file_path(stack, stacks_dir)
    name = stack_name(path)
    document = load_yaml(path)
    raw = document.get("config") or {}
    if not isinstance(raw, dict):
        raise StackConfigError(["'config' must be a mapping of keys"], source=display_path(path))
    config: dict[str, Any] = {}
    secret_keys: list[str] = []
    for key, value in raw.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            config[key] = SECRET_PLACEHOLDER
            secret_keys.append(key)
        else:
            config[key] = value
    warnings = []
    token_needed_by = _gated_in_raw(config)
    if token_needed_by and not any(_unqualified(key) == HF_TOKEN_KEY for key in config):
        # A shipped stack cannot carry a token (only the deployer's secrets provider can
        # decrypt one), so the file has none until `pulumi config set --secret` writes it.
        key = f"{PROJECT}:{HF_TOKEN_KEY}"
        config[key] = SECRET_PLACEHOLDER
        secret_keys.append(key)
        warnings.append(
            f"{HF_TOKEN_KEY} is not set and {', '.join(token_needed_by)} is gated on the "
            f"Hugging Face hub: `pulumi up` refuses this stack until you run `pulumi config "
            f"set --secret {HF_TOKEN_KEY} hf_... -s {name}` (planned here as if it were set)"
        )
    return StackFile(
        stack_name=name, path=path, config=config, secret_keys=secret_keys, warnings=warnings
    )


def _gated_in_raw(values: Mapping[str, Any]) -> list[str]:
    """gated_hub_references over a stack file's raw sections (before validation)."""
    sections = {_unqualified(key): value for key, value in values.items()}
    model = sections.get("model")
    data = sections.get("data")
    model = model if isinstance(model, Mapping) else {}
    data = data if isinstance(data, Mapping) else {}
    return gated_hub_references(
        init_from=model.get("initFrom"),
        tokenizer=data.get("tokenizer"),
        dataset=data.get("dataset"),
    )


def load_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> StackConfig:
    """Read and validate a stack file without the Pulumi engine (plan, tests, local run)."""
    stack_file = read_stack_file(stack, stacks_dir)
    return parse_stack_config(
        stack_file.config,
        stack_name=stack_file.stack_name,
        secret_keys=stack_file.secret_keys,
        source=display_path(stack_file.path),
    )
