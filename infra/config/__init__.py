"""The stack schema: one typed, validated model of a stack file, its loaders and its errors.

Import from here: `StackConfig` (the whole stack file), the loaders and the error type. This
package imports no pulumi and no torch, and no estimate: it is the floor they stand on. Its
names are loaded on first use (PEP 562), so that `infra.config.names`, which a shell completion
imports on a keypress, does not pay for pydantic.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.config.errors import StackConfigError
    from infra.config.files import StackFile, load_stack_file, read_stack_file
    from infra.config.names import UnknownStackError, stack_file_path, stack_names
    from infra.config.parse import parse_stack_config
    from infra.config.stack import PROJECT, StackConfig

_HOMES = {
    "StackConfigError": "infra.config.errors",
    "StackFile": "infra.config.files",
    "load_stack_file": "infra.config.files",
    "read_stack_file": "infra.config.files",
    "UnknownStackError": "infra.config.names",
    "stack_file_path": "infra.config.names",
    "stack_names": "infra.config.names",
    "parse_stack_config": "infra.config.parse",
    "PROJECT": "infra.config.stack",
    "StackConfig": "infra.config.stack",
}

__all__ = [
    "PROJECT",
    "StackConfig",
    "StackConfigError",
    "StackFile",
    "UnknownStackError",
    "load_stack_file",
    "parse_stack_config",
    "read_stack_file",
    "stack_file_path",
    "stack_names",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'infra.config' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
