"""The real Prometheus binaries (Debian's `prometheus` package: prometheus, promtool) for tests.

A developer machine without them skips those tests; CI (`CI` set, where `.ci/run` installs the
package) fails instead, so a missing binary never passes for a passing test."""

from __future__ import annotations

import os
import shutil

import pytest


def require_binary(name: str) -> str:
    """The path of `name` (`promtool`, `prometheus`): skip when absent, fail in CI."""
    path = shutil.which(name)
    if path is not None:
        return path
    message = f"{name} is not installed (Debian package `prometheus`; .ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
