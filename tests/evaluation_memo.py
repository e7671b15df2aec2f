"""One evaluation of the Pulumi program per distinct input and test worker, reused by every
test that asks for it again (the tests asked for ~100 configs 366 times; docs/benchmarks.md).

The key holds what the program reads besides the repository's files (which tests copy rather
than edit): config, secret keys, project and stack, environment, working directory, `sys.path`.
A patched object cannot be keyed: while any `pytest.MonkeyPatch` holds a patch the program
could see, every evaluation runs afresh. Each test gets its own deep copy.
`FSDP_EKS_TEST_MEMO=off` turns it off (to compare a whole run with and without it).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import sys
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.tiers import TIER_ENV

MEMO_ENV = "FSDP_EKS_TEST_MEMO"
KEPT = 48
"""Evaluations kept per worker, least recently used dropped first (each is a few MB)."""
VOLATILE_ENV = {"PYTEST_CURRENT_TEST", TIER_ENV}
"""Set per test by pytest and tests/conftest.py; the program reads neither."""
PROGRAM = ("infra.program", "main")
"""The one program whose evaluations are kept; tests' own small programs always run."""
INERT_PACKAGES = ("tests.", "scripts.", "_pytest.")
"""Patches on these cannot reach the program: infra imports neither our tests nor our scripts
(tests/test_architecture.py), and pytest patches its own config for tmp_path."""

_live_patches: weakref.WeakSet[pytest.MonkeyPatch] = weakref.WeakSet()


def _module_of(target: object) -> str:
    if isinstance(target, ModuleType):
        return target.__name__
    return str(getattr(target, "__module__", "") or "")


def _inert(target: object) -> bool:
    if target is os.environ:
        return True  # the environment is part of the key
    return _module_of(target).startswith(INERT_PACKAGES)


def patched() -> bool:
    """Whether a live MonkeyPatch holds a patch the program could see."""
    for patcher in list(_live_patches):
        setattrs, setitems = getattr(patcher, "_setattr", None), getattr(patcher, "_setitem", None)
        if setattrs is None or setitems is None:
            return True  # a pytest that keeps its undo lists elsewhere: never reuse
        targets = [target for target, _, _ in setattrs] + [mapping for mapping, _, _ in setitems]
        if not all(_inert(target) for target in targets):
            return True
    return False


def _mock_answers() -> tuple[tuple[str, object], ...]:
    """Which rule answers each mocked call: a test that swaps one without MonkeyPatch still
    changes the key. The rules themselves, not their ids: a freed rule's id can be reused."""
    from infra.offline.outputs import INVOKE_RESULTS, RESOURCE_OUTPUTS

    rules = {**INVOKE_RESULTS, **RESOURCE_OUTPUTS}
    return tuple(sorted(rules.items(), key=lambda item: item[0]))


def _key(kwargs: dict[str, Any]) -> Hashable | None:
    """None where the config has no canonical form (a mapping whose keys mix types, as YAML's
    `on:` or `1:` make): such an evaluation is not kept."""
    try:
        config = json.dumps(kwargs.get("config"), sort_keys=True, default=repr)
    except TypeError:
        return None
    environment = {k: v for k, v in os.environ.items() if k not in VOLATILE_ENV}
    return (
        _mock_answers(),
        config,
        tuple(kwargs.get("secret_keys", ())),
        kwargs.get("project", "fsdp-eks"),
        kwargs.get("stack", "dev"),
        tuple(sorted(environment.items())),
        str(Path.cwd()),
        tuple(sys.path),
    )


def _is_the_program(run: Callable[[], None]) -> bool:
    """`infra.program.main`, known by name so that installing the memo imports no provider."""
    return getattr(run, "__module__", None) == PROGRAM[0] and (
        getattr(run, "__qualname__", None) == PROGRAM[1]
    )


class Memo:
    """Evaluations kept by input, least recently used dropped first."""

    def __init__(self, evaluate: Callable[..., Any], kept: int = KEPT) -> None:
        self.evaluate = evaluate
        self.kept: OrderedDict[Hashable, Any] = OrderedDict()
        self.size = kept
        self.counts = {"evaluated": 0, "reused": 0}

    def __call__(self, run: Callable[[], None], **kwargs: Any) -> Any:
        reusable = (
            _is_the_program(run)
            and kwargs.get("fake_cloud") is None
            and os.environ.get(MEMO_ENV, "").lower() != "off"
            and not patched()
        )
        key = _key(kwargs) if reusable else None
        if key is None:
            return self.evaluate(run, **kwargs)
        if key in self.kept:
            self.kept.move_to_end(key)
            self.counts["reused"] += 1
        else:
            self.counts["evaluated"] += 1
            self.kept[key] = self.evaluate(run, **kwargs)  # a refusal raises: nothing kept
            while len(self.kept) > self.size:
                self.kept.popitem(last=False)
        return copy.deepcopy(self.kept[key])


def install() -> None:
    """Put the memo in front of `infra.offline.evaluate` before any test module imports it,
    and note every MonkeyPatch made from now on."""
    import infra.offline
    import infra.offline.runtime

    memo = Memo(infra.offline.runtime.evaluate)
    evaluate: Any = functools.wraps(memo.evaluate)(memo)
    infra.offline.evaluate = infra.offline.runtime.evaluate = evaluate
    original_init = pytest.MonkeyPatch.__init__

    def init_and_note(self: pytest.MonkeyPatch) -> None:
        original_init(self)
        _live_patches.add(self)

    pytest.MonkeyPatch.__init__ = init_and_note  # type: ignore[method-assign]
