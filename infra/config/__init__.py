"""The stack schema: one typed, validated model of a stack file, its loaders and its errors.

Import from here: `StackConfig` (the whole stack file), the loaders and the error type. This
package imports no pulumi and no torch, and no estimate: it is the floor they stand on.
"""

from infra.config.errors import StackConfigError
from infra.config.files import (
    StackFile,
    load_stack_file,
    read_stack_file,
    stack_file_path,
    stack_names,
)
from infra.config.parse import parse_stack_config
from infra.config.stack import PROJECT, StackConfig

__all__ = [
    "PROJECT",
    "StackConfig",
    "StackConfigError",
    "StackFile",
    "load_stack_file",
    "parse_stack_config",
    "read_stack_file",
    "stack_file_path",
    "stack_names",
]
