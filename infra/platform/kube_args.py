"""A rendered Kubernetes object (a plain dict, as the pure job wing renders it) as the
arguments of a typed pulumi-kubernetes resource or of a `CustomResource`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any


def typed_args(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """Its top-level fields in snake_case, apiVersion and kind left to the resource type."""
    return {
        re.sub(r"(?<!^)([A-Z])", r"_\1", key).lower(): value
        for key, value in manifest.items()
        if key not in ("apiVersion", "kind")
    }


def custom_args(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A custom object's `CustomResource` arguments (apiVersion and kind named)."""
    return {"api_version": manifest["apiVersion"], **typed_args(manifest), "kind": manifest["kind"]}
