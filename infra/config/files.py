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
from infra.config.parse import _unqualified, parse_stack_config
from infra.config.stack import HF_TOKEN_KEY, PROJECT, StackConfig, gated_hub_references

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


STACKS_DIR = Path(__file__).resolve().parents[2] / "stacks"


def stack_names(stacks_dir: Path | None = None) -> list[str]:
    """The stacks that have a file under `stacks/`, by name."""
    directory = stacks_dir or STACKS_DIR
    names = (p.name.removeprefix("Pulumi.") for p in directory.glob("Pulumi.*.yaml"))
    return sorted(name.removesuffix(".yaml") for name in names)


def stack_file_path(stack: str | Path, stacks_dir: Path | None = None) -> Path:
    """`dev`, `Pulumi.dev.yaml` or a path → the stack file's path."""
    candidate = Path(stack)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    path = (stacks_dir or STACKS_DIR) / f"Pulumi.{stack}.yaml"
    if not path.exists():
        names = ", ".join(stack_names(stacks_dir))
        raise FileNotFoundError(f"no stack file {path}; stacks: {names}")
    return path


def read_stack_file(stack: str | Path, stacks_dir: Path | None = None) -> StackFile:
    """Read a stack file; `secure:` values become a placeholder and are listed as secret."""
    path = stack_file_path(stack, stacks_dir)
    name = path.name.removeprefix("Pulumi.").rsplit(".", 1)[0]
    document = yaml.safe_load(path.read_text()) or {}
    raw = document.get("config") or {}
    if not isinstance(raw, dict):
        raise StackConfigError([f"{path.name}: 'config' must be a mapping"], source=str(path))
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
        source=str(stack_file.path.name),
    )
