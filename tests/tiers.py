"""The two test tiers: `dev.py test --fast` leaves out tests marked `slow`, the multi-process
training runs. A test that starts such a run without the mark fails here, by name, so the fast
tier can never grow slow unnoticed (tests/conftest.py records each test's marks)."""

from __future__ import annotations

import os

TIER_ENV = "FSDP_EKS_TEST_SLOW"
"""Set by tests/conftest.py before each test's setup: 1 when it is marked `slow`, else 0."""


def require_slow_tier(what: str) -> None:
    """Called where a test starts a multi-process run (torchrun, a local rehearsal)."""
    if os.environ.get(TIER_ENV) == "0":
        test = os.environ.get("PYTEST_CURRENT_TEST", "this test").rsplit(" (", 1)[0]
        raise AssertionError(
            f"{test} starts {what}: mark it @pytest.mark.slow (the fast tier leaves those out)"
        )
