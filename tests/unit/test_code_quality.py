"""The code keeps the shape the contributing page describes: the linter (ruff, imports sorted) and the
type checker (mypy) find nothing, no function runs over 80 lines, and no module reaches into another
module's private names (the engines' parts are public where they are shared)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lens_position"
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_the_linter_finds_nothing():
    run = _run("ruff", "check", "--no-cache", "lens_position", "tests", "benchmarks", "docs/hooks", "scripts")
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_type_checker_finds_nothing(tmp_path):
    # settings in pyproject.toml ([tool.mypy]); a cache of its own, so a stale one never hides a finding
    run = _run("mypy", "--cache-dir", str(tmp_path / "mypy"))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Success" in run.stdout


def _functions(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_function_runs_over_80_lines():
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in _modules() for node in _functions(ast.parse(path.read_text()))
            if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "\n".join(long)


def _private_imports(source: str) -> list[str]:
    """``from lens_position.x import _name`` (and ``import lens_position.x._y``) in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lens_position"):
            found += [f"{node.module}.{alias.name}" for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
            found += [node.module] if any(part.startswith("_") and not part.startswith("__")
                                          for part in node.module.split(".")) else []
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.startswith("lens_position")
                      and any(part.startswith("_") and not part.startswith("__") for part in alias.name.split("."))]
    return found


def test_no_module_imports_another_modules_private_name():
    offenders = {str(path.relative_to(ROOT)): names for path in _modules()
                 if (names := _private_imports(path.read_text()))}
    assert not offenders, offenders


@pytest.mark.parametrize("source, found", [
    ("from lens_position.analyses.decompose import _components", ["lens_position.analyses.decompose._components"]),
    ("from lens_position.core.checks import check_seed, _as_int", ["lens_position.core.checks._as_int"]),
    ("import lens_position.models._private", ["lens_position.models._private"]),
    ("from lens_position.analyses.engine.fit import Fitter", []),
    ("from lens_position import __version__", []),
])
def test_the_private_import_check_sees_what_it_should(source, found):
    assert _private_imports(source) == found
