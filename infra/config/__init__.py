"""The typed, validated stack config: the single source of truth for every component.

Import from here: `StackConfig` (the whole stack file), the loaders and the error type. This
package imports no pulumi and no torch, so scripts without either (the local run) can use it.
"""

from infra.config.stack import (
    PROJECT,
    StackConfig,
    StackConfigError,
    StackFile,
    load_stack_config,
    load_stack_file,
    parse_stack_config,
    read_stack_file,
    stack_file_path,
)

__all__ = [
    "PROJECT",
    "StackConfig",
    "StackConfigError",
    "StackFile",
    "load_stack_config",
    "load_stack_file",
    "parse_stack_config",
    "read_stack_file",
    "stack_file_path",
]
