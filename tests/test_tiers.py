"""Every module a test file imports keeps fast tests once LONG_TESTS leave the fast tier.

Read from the sources: an import at a file's top level counts for all its tests, one inside a
test for that test; a test is fast unless marked `slow` or listed in tests/tiers.py.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests import tiers
from tests.conftest import COLLECTED_IDS
from tests.test_architecture import ROOT, names_imported_under, project_modules
from tests.tiers import LONG_TESTS, is_long


def _test_files() -> list[Path]:
    return sorted((ROOT / "tests").rglob("test_*.py"))


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imported(nodes: Sequence[ast.AST]) -> set[str]:
    """Every module and `module.name` that an import under these nodes names."""
    return set(names_imported_under(nodes, package="tests"))


def _marks_slow(expressions: list[ast.expr]) -> bool:
    return any("mark.slow" in ast.unparse(expression) for expression in expressions)


def _is_pytestmark(node: ast.stmt) -> bool:
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return any(getattr(target, "id", None) == "pytestmark" for target in targets)


@functools.cache
def _tests(path: Path) -> tuple[tuple[str, bool, ast.AST], ...]:
    """(pytest's id of each test function, whether `slow` marks it, its node)."""
    tree = _parsed(path)
    file_id = path.relative_to(ROOT).as_posix()

    def walk(body: list[ast.stmt], prefix: str, slow: bool) -> Iterator[tuple[str, bool, ast.AST]]:
        slow = slow or any(
            _is_pytestmark(node) and _marks_slow([node.value])
            for node in body
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None
        )
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                class_slow = slow or _marks_slow(node.decorator_list)
                yield from walk(node.body, f"{prefix}{node.name}::", class_slow)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                yield f"{prefix}{node.name}", slow or _marks_slow(node.decorator_list), node

    return tuple(
        (f"{file_id}::{name}", slow, node) for name, slow, node in walk(tree.body, "", False)
    )


def _fast_imports(path: Path) -> set[str]:
    """What the file's fast tests import: the top level's if any test is fast, plus each fast
    test's own. A function with only some parameters listed keeps the others fast."""
    tests = _tests(path)
    fast = [node for test_id, slow, node in tests if not slow and not is_long(test_id)]
    if not fast:
        return set()
    test_nodes = {id(node) for _, _, node in tests}
    top_level = [node for node in _parsed(path).body if id(node) not in test_nodes]
    return _imported(top_level) | _imported(fast)


def test_every_listed_long_test_exists(request: pytest.FixtureRequest) -> None:
    """A renamed test or parameter leaves no stale id behind (it would mark nothing): checked
    against this session's collection for the files it collected, else the test functions."""
    collected = request.config.stash.get(COLLECTED_IDS, frozenset())
    collected_files = {test_id.split("::", 1)[0] for test_id in collected}
    # The ids is_long matches: each test's own, and its function's.
    collected_matches = collected | {test_id.split("[", 1)[0] for test_id in collected}
    defined = {test_id for path in _test_files() for test_id, _, _ in _tests(path)}
    stale = []
    for listed in sorted(LONG_TESTS):
        if listed.split("::", 1)[0] in collected_files:
            known = listed in collected_matches
        else:  # a file this session did not collect: its functions, parameters unseen
            known = listed.split("[", 1)[0] in defined
        if not known:
            stale.append(listed)
    assert not stale, f"tests/tiers.py LONG_TESTS names tests that do not exist: {stale}"


def test_every_module_a_test_file_imports_has_a_fast_test_importing_it() -> None:
    modules = set(project_modules())
    imported = set()
    fast = set()
    for path in _test_files():
        imported |= _imported([_parsed(path)]) & modules
        fast |= _fast_imports(path) & modules
    uncovered = sorted(imported - fast)
    assert not uncovered, (
        "only slow or long tests import these modules, so the fast tier does not test them: "
        f"{uncovered} (give each a fast test, or take a test off tests/tiers.py LONG_TESTS)"
    )


def test_the_check_finds_a_module_whose_only_fast_test_is_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """test_launch.py's other tests are `slow`: listing its one fast test leaves the launcher
    without any."""
    import tests.test_tiers as tiers_test

    listed = (
        "tests/trainer/test_launch.py::test_a_worker_killed_by_a_signal_exits_as_a_shell_reports_it"
    )
    monkeypatch.setattr(
        tiers_test, "is_long", lambda test_id: test_id == listed or tiers.is_long(test_id)
    )
    with pytest.raises(AssertionError) as missing:
        test_every_module_a_test_file_imports_has_a_fast_test_importing_it()
    assert "['trainer.launch']" in str(missing.value)


def test_the_longest_files_are_test_files_that_start_multi_process_runs_or_long_tests() -> None:
    """FIRST_FILES goes stale quietly (a renamed file is simply scheduled as collected): each
    entry is a test file here, listed once, with slow or long tests in it."""
    assert len(set(tiers.FIRST_FILES)) == len(tiers.FIRST_FILES)
    for listed in tiers.FIRST_FILES:
        path = ROOT / listed
        assert path.is_file(), f"tests/tiers.py FIRST_FILES names a missing file: {listed}"
        ids = [(f"{listed}::{test_id}", slow) for test_id, slow, _ in _tests(path)]
        assert any(slow or is_long(test_id) for test_id, slow in ids), listed


def test_the_longest_files_go_first_and_every_file_keeps_its_order() -> None:
    first, second = tiers.FIRST_FILES[:2]
    collected = [
        "tests/cli/test_main.py::test_a",
        f"{second}::test_b",
        "tests/cli/test_main.py::test_c",
        f"{first}::test_d",
        f"{second}::test_e",
        f"{first}::test_f",
    ]
    order = [collected[i] for i in tiers.first_files_first(collected)]
    assert order == [
        f"{first}::test_d",
        f"{first}::test_f",
        f"{second}::test_b",
        f"{second}::test_e",
        "tests/cli/test_main.py::test_a",
        "tests/cli/test_main.py::test_c",
    ]
