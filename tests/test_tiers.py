"""The fast tier still covers every module once LONG_TESTS leave it (tests/tiers.py).

Read from the sources, not from a run: a test file's imports name the modules it tests, and a
test is fast unless `slow` (on it, its class or the file's `pytestmark`) or listed as long.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tiers import LONG_TESTS, is_long

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("trainer", "infra", "scripts")


def _project_modules() -> set[str]:
    names = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def _test_files() -> list[Path]:
    return sorted((ROOT / "tests").rglob("test_*.py"))


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _imported(tree: ast.Module) -> set[str]:
    """Every module and `module.name` an import in the file names."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _marks_slow(expressions: list[ast.expr]) -> bool:
    return any("mark.slow" in ast.unparse(expression) for expression in expressions)


def _tests(tree: ast.Module) -> Iterator[tuple[str, bool]]:
    """(pytest's name for each test function, whether `slow` marks it)."""
    file_slow = any(
        isinstance(node, ast.Assign)
        and any(getattr(target, "id", None) == "pytestmark" for target in node.targets)
        and _marks_slow([node.value])
        for node in tree.body
    )

    def walk(body: list[ast.stmt], prefix: str, slow: bool) -> Iterator[tuple[str, bool]]:
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                class_slow = slow or _marks_slow(node.decorator_list)
                yield from walk(node.body, f"{prefix}{node.name}::", class_slow)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test"
            ):
                yield f"{prefix}{node.name}", slow or _marks_slow(node.decorator_list)

    yield from walk(tree.body, "", file_slow)


def _has_fast_test(path: Path, tree: ast.Module) -> bool:
    file_id = path.relative_to(ROOT).as_posix()
    # A function with only some parameters listed keeps the others fast.
    return any(not slow and not is_long(f"{file_id}::{name}") for name, slow in _tests(tree))


def test_every_listed_long_test_exists() -> None:
    """A renamed or removed test leaves no stale id behind (it would mark nothing)."""
    defined: set[str] = set()
    for path in _test_files():
        file_id = path.relative_to(ROOT).as_posix()
        defined.update(f"{file_id}::{name}" for name, _ in _tests(_parsed(path)))
    stale = sorted(i for i in LONG_TESTS if i.split("[", 1)[0] not in defined)
    assert not stale, f"tests/tiers.py LONG_TESTS names tests that do not exist: {stale}"


def test_every_module_a_test_file_imports_has_a_fast_test_file_importing_it() -> None:
    modules = _project_modules()
    importers: dict[str, list[Path]] = {}
    fast_files = set()
    for path in _test_files():
        tree = _parsed(path)
        for name in _imported(tree) & modules:
            importers.setdefault(name, []).append(path)
        if _has_fast_test(path, tree):
            fast_files.add(path)
    uncovered = sorted(
        name for name, paths in importers.items() if not any(p in fast_files for p in paths)
    )
    assert not uncovered, (
        "only slow or long tests import these modules, so the fast tier does not test them: "
        f"{uncovered} (give each a fast test, or take a test off tests/tiers.py LONG_TESTS)"
    )


def test_the_checks_see_a_module_left_without_fast_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    """With every test listed as long, the check names the modules left untested."""
    import tests.test_tiers as tiers_test

    monkeypatch.setattr(tiers_test, "is_long", lambda nodeid: True)
    with pytest.raises(AssertionError, match="fast tier does not test them"):
        test_every_module_a_test_file_imports_has_a_fast_test_file_importing_it()
