"""Comments say why at the line they explain; the long provenance essays live in docs/design/.

Issue 29 item 5 moved them out of the code (../shared/STYLE.md: "comments of one to three lines
at the line they explain, with the upstream link; provenance essays belong in docs/"). These
tests keep them from growing back in the directories that were cleaned, and keep every
`docs/design/<page>.md#<anchor>` pointer in the code resolving to a heading of that page.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CLEANED = ("trainer", "infra", "scripts", "tests")
"""Where the essays were moved out; add a directory here once its essays are in docs/design/."""
HELP_TEXT = {"scripts/dev.py:module", "scripts/cli/plan.py:plan"}
"""Docstrings that are a command's `--help` (argparse `description=__doc__`, a click command's
help): written for the person running it, so they stay whole. `path:name`, `module` for one."""
DOCSTRING_MAX_LINES = 12
"""Lines of one module, class or function docstring, quotes included."""
COMMENT_BLOCK_MAX_LINES = 4
"""Consecutive whole-line `#` comments."""
POINTER = re.compile(r"docs/design/([\w.-]+\.md)#([\w-]+)")


def python_files(paths: tuple[str, ...]) -> Iterator[Path]:
    for name in paths:
        path = ROOT / name
        yield from [path] if path.is_file() else sorted(path.rglob("*.py"))


def long_docstrings(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if ast.get_docstring(node, clean=False) is None:
            continue
        first = node.body[0]
        lines = (first.end_lineno or first.lineno) - first.lineno + 1
        if lines > DOCSTRING_MAX_LINES:
            name = getattr(node, "name", "module")
            yield f"{path.relative_to(ROOT)}:{first.lineno} {name} docstring: {lines} lines"


def long_comment_blocks(path: Path) -> Iterator[str]:
    source = path.read_text()
    lines = source.splitlines()
    block: list[int] = []
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    whole_line = [
        token.start[0]
        for token in tokens
        if token.type == tokenize.COMMENT and lines[token.start[0] - 1].lstrip().startswith("#")
    ]
    for line in [*whole_line, -1]:
        if block and line == block[-1] + 1:
            block.append(line)
            continue
        if len(block) > COMMENT_BLOCK_MAX_LINES:
            yield f"{path.relative_to(ROOT)}:{block[0]} comment block: {len(block)} lines"
        block = [line]


def is_help_text(problem: str) -> bool:
    """Whether a `long_docstrings` finding is one of `HELP_TEXT`."""
    where, name = problem.split(" ")[:2]
    path = where.rpartition(":")[0]
    return f"{path}:{name}" in HELP_TEXT


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors: the heading lowercased, punctuation but `-` and `_` dropped, spaces `-`."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", text).replace(" ", "-"))
    return anchors


def test_docstrings_and_comment_blocks_stay_short_where_essays_moved_to_docs() -> None:
    too_long = [
        problem
        for path in python_files(CLEANED)
        for problem in (*long_docstrings(path), *long_comment_blocks(path))
        if not is_help_text(problem)
    ]
    assert not too_long, (
        f"docstrings over {DOCSTRING_MAX_LINES} lines or comment blocks over "
        f"{COMMENT_BLOCK_MAX_LINES}: keep the why at the line, move the essay to docs/design/ "
        "and point at it:\n" + "\n".join(too_long)
    )


def test_every_docs_design_pointer_in_the_code_resolves_to_a_heading() -> None:
    pointers = 0
    broken = []
    for path in python_files(("infra", "trainer", "scripts", "tests")):
        for page, anchor in POINTER.findall(path.read_text()):
            pointers += 1
            doc = ROOT / "docs" / "design" / page
            if not doc.is_file() or anchor not in heading_anchors(doc.read_text()):
                broken.append(f"{path.relative_to(ROOT)}: docs/design/{page}#{anchor}")
    assert pointers, "no docs/design pointers found: the pattern no longer matches the code"
    assert not broken, "pointers without a heading to land on:\n" + "\n".join(broken)


def test_the_anchor_rule_is_githubs() -> None:
    anchors = heading_anchors("# Title\n\n## system node IMDS\n## _SlicedHeadCrossEntropy\n")
    assert anchors == {"title", "system-node-imds", "_slicedheadcrossentropy"}
