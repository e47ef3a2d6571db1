"""MkDocs hook: the "bad input or fault -> what happens" table, read off the tests.

A test that checks how lens_position meets a bad input or a fault declares the row itself::

    @pytest.mark.fault(area="prompts", given="token id -1 in a token tensor",
                       happens="refused before any forward pass: BadInputError naming the vocabulary")
    def test_negative_token_ids_are_refused(...): ...

Several ``fault`` marks may sit on one test, also inside ``pytest.param(..., marks=...)`` of an
inline ``@pytest.mark.parametrize``. The arguments must be string literals: this hook reads them
with ``ast`` (nothing is imported or run), and replaces the marker ``<!-- fault-table -->`` with
one row per mark, sorted by area, each naming the test that checks it. A row exists exactly as
long as its test does; a mark with a missing or non-literal argument fails the build.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass
from pathlib import Path

MARKER = "<!-- fault-table -->"
FIELDS = ("area", "given", "happens")
log = logging.getLogger("mkdocs.hooks.fault_table")


@dataclass(frozen=True)
class FaultRow:
    area: str
    given: str
    happens: str
    test: str  # "tests/test_x.py::test_name"


def _is_fault_mark(node: ast.AST) -> bool:
    """``pytest.mark.fault(...)`` (or ``mark.fault(...)``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "fault"
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark")


def _row(call: ast.Call, test: str) -> FaultRow:
    values = {}
    for keyword in call.keywords:
        if keyword.arg in FIELDS:
            if not (isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, str)):
                raise ValueError(f"{test}: fault mark argument {keyword.arg}= must be a string literal")
            values[keyword.arg] = keyword.value.value
    missing = [name for name in FIELDS if not values.get(name, "").strip()]
    if missing or call.args:
        raise ValueError(f"{test}: a fault mark takes keyword arguments {FIELDS}; missing {missing}")
    return FaultRow(test=test, **values)


def collect(tests_dir: Path) -> list[FaultRow]:
    """Every ``fault`` mark on a test function under ``tests_dir``, sorted by area then test."""
    rows = []
    for path in sorted(tests_dir.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                test = f"tests/{path.relative_to(tests_dir).as_posix()}::{node.name}"
                for decorator in node.decorator_list:
                    rows += [_row(call, test) for call in ast.walk(decorator) if _is_fault_mark(call)]
    return sorted(rows, key=lambda row: (row.area, row.test, row.given))


def _escape(text: str) -> str:
    return " ".join(str(text).replace("|", "\\|").split())


def fault_table(tests_dir: Path) -> str:
    rows = collect(tests_dir)
    if not rows:
        raise ValueError(f"no fault marks found under {tests_dir}")
    lines = ["| area | bad input or fault | what happens | checked by |", "|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {_escape(row.area)} | {_escape(row.given)} | {_escape(row.happens)} | "
                     f"`{row.test.split('::')[1]}` |")
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        tests_dir = Path(config["config_file_path"]).parent / "tests"
        try:
            markdown = markdown.replace(MARKER, fault_table(tests_dir))
        except Exception as exc:  # strict mode turns the logged error into a failed build
            log.error("cannot generate the fault table on %s: %s", page.file.src_uri, exc)
    return markdown
