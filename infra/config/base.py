"""The base every stack-config section derives from.

Stack files are written by people in Pulumi's camelCase convention, while the program reads
snake_case attributes; one alias generator keeps the two in step. `extra="forbid"` turns a
typo into an error that names the key instead of a silently ignored setting, and `frozen`
keeps components from mutating the single source of truth they were handed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ConfigSection(BaseModel):
    """A group of stack-config keys. Every field must carry a `description` (a test checks)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=False,
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=False,
    )
