"""The floor plan, held against the code: which wing a module belongs to and what it may import.

`infra/` is in wings, lowest first (infra/__init__.py lists them, and
docs/design/program.md#infra-package says what each holds). A wing imports
only wings below it or itself; the pure wings (facts, config, estimates, job) never import
pulumi or an ML framework, because the local run and the offline plan import them on a
machine that has neither; the trainer never imports the program or the tools. Imports are
read from the source (every `import`, at module level or inside a function, type-checking
ones included: each is a dependency a reader must follow), and the pure wings are also
imported for real, in a fresh interpreter, to see what they pull in.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WINGS = (
    "infra.facts",
    "infra.config",
    "infra.estimates",
    "infra.job",
    "infra.platform",
    "infra.image",
    "infra.launch",
    "infra.offline",
    "infra.compat",  # infra/image_build.py, infra/job_watch.py: old dynamic-provider paths
    "infra.program",
    "infra.policy",
)
"""Lowest first: a module may import its own wing and those before it."""
PURE_WINGS = WINGS[:4]
COMPAT_SHIMS = {"infra.image_build", "infra.job_watch"}
INFRA_TOP_LEVEL = {"__init__.py", "program.py", "image_build.py", "job_watch.py"}
PAYLOADS = "infra.job.payloads"
"""Programs shipped into pods as text; they run with torch and are never imported here."""
FORBIDDEN_IN_PURE = ("pulumi", "pulumi_aws", "pulumi_eks", "pulumi_kubernetes", "pulumi_policy")
HEAVY = ("torch", "transformers", "datasets", "numpy")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in ("infra", "trainer", "scripts"):
        for path in (ROOT / package).rglob("*.py"):
            modules[module_name(path)] = path
    return modules


MODULES = project_modules()


def imported_names(path: Path) -> Iterator[str]:
    """Every module name an import statement in `path` names (relative imports resolved)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent / "x")
    package = package.rpartition(".")[0] if path.name != "__init__.py" else package
    yield from names_imported_under([ast.parse(path.read_text(), str(path))], package)


def names_imported_under(nodes: Iterable[ast.AST], package: str) -> Iterator[str]:
    """Every module name an import statement under `nodes` names, relative ones resolved
    against `package`; `from package import name` yields `package.name` too, since the name
    may be a module."""
    for node in (inner for top in nodes for inner in ast.walk(top)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def project_imports(name: str) -> set[str]:
    """The project modules `name` imports (its own package's __init__ excluded)."""
    return {target for target in imported_names(MODULES[name]) if target in MODULES} - {name}


def wing_of(name: str) -> str | None:
    if name in COMPAT_SHIMS:
        return "infra.compat"
    return next((w for w in WINGS if name == w or name.startswith(f"{w}.")), None)


def infra_modules() -> list[str]:
    return sorted(n for n in MODULES if n.startswith("infra") and not n.startswith(PAYLOADS))


def test_infra_top_level_holds_the_program_and_compatibility_shims_only() -> None:
    files = {p.name for p in (ROOT / "infra").glob("*.py")}
    assert files == INFRA_TOP_LEVEL
    for name in infra_modules():
        assert name == "infra" or wing_of(name) is not None, f"{name} belongs to no wing"


@pytest.mark.parametrize("name", infra_modules())
def test_a_wing_imports_only_itself_and_the_wings_below(name: str) -> None:
    wing = wing_of(name)
    if wing is None:  # infra/__init__.py
        assert not project_imports(name)
        return
    rank = WINGS.index(wing)
    for target in project_imports(name):
        if target.startswith(("trainer", "scripts")):
            assert not target.startswith("scripts"), f"{name} imports the tool {target}"
            continue
        target_wing = wing_of(target)
        assert target_wing is not None and WINGS.index(target_wing) <= rank, (
            f"{name} ({wing}) imports {target} ({target_wing}), a wing above it"
        )


def test_no_module_imports_itself_back() -> None:
    """No import circle anywhere in the program, the trainer or the tools (Tarjan)."""
    graph = {name: project_imports(name) for name in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            # A package importing its own modules, which import nothing back, is no circle.
            if len(component) > 1:
                circles.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    assert circles == []


def test_the_trainer_imports_neither_the_program_nor_the_tools() -> None:
    for name in (n for n in MODULES if n.startswith("trainer")):
        assert not {t for t in project_imports(name) if not t.startswith("trainer")}, name


@pytest.mark.parametrize("name", [n for n in infra_modules() if wing_of(n) in PURE_WINGS])
def test_pure_wings_name_no_pulumi_and_no_ml_framework(name: str) -> None:
    external = {t.split(".")[0] for t in imported_names(MODULES[name])}
    assert not external & {*FORBIDDEN_IN_PURE, *HEAVY}, name


def test_pure_wings_pull_in_no_pulumi_and_no_ml_framework_when_imported() -> None:
    pure = [n for n in infra_modules() if wing_of(n) in PURE_WINGS]
    forbidden = set(FORBIDDEN_IN_PURE + HEAVY)
    code = (
        "import importlib, sys\n"
        f"for name in {pure!r}:\n"
        "    importlib.import_module(name)\n"
        f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & {forbidden!r})\n"
        "print(loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
