"""Settings every test runs under."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_plan_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every plan a test makes is evaluated: a kept plan would hide what a test changed in the
    process (tests/cli/test_plan_cache.py turns the cache on for itself)."""
    monkeypatch.setenv("FSDP_EKS_CACHE", "off")
