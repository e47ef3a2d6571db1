"""The package's architecture as contracts: layers as folders, imports only downward, no cycles.

The layers and the no-cycle rule are declared once, in ``pyproject.toml``'s
``[tool.importlinter]`` (import-linter, run here on the source tree); the depth bound is ours.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

import grimp
import pytest
from importlinter import api as importlinter_api

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("cli", "pipeline", "report", "findings", "analyses", "core", "models", "ground")


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("lens_position")


def test_import_linter_contracts_are_kept(monkeypatch):
    monkeypatch.chdir(ROOT)
    options = importlinter_api.read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    assert {contract["id"] for contract in options} == {"layers", "acyclic", "cli-parses"}
    layers = next(c for c in options if c["id"] == "layers")["layers"]
    assert tuple(name.removeprefix("lens_position.") for name in layers) == LAYERS
    from importlinter.cli import lint_imports

    # import-linter configures logging with dictConfig, which disables every logger that exists:
    # the package's warnings would then reach no test that runs after this one.
    loggers = [logger for logger in logging.root.manager.loggerDict.values() if isinstance(logger, logging.Logger)]
    disabled = [logger.disabled for logger in loggers]
    try:
        assert lint_imports(config_filename=str(ROOT / "pyproject.toml")) == 0
    finally:
        for logger, was in zip(loggers, disabled):
            logger.disabled = was


def test_every_module_sits_in_a_declared_layer(graph):
    stray = sorted(m for m in graph.modules if m != "lens_position" and _layer(m) not in LAYERS
                   and m != "lens_position.__main__")
    assert stray == [], f"modules outside the layers {LAYERS}: {stray}"


def test_no_module_imports_a_layer_above_its_own(graph):
    rank = {name: i for i, name in enumerate(LAYERS)}
    upward = [(m, d) for m in graph.modules if _layer(m) in rank
              for d in graph.find_modules_directly_imported_by(m)
              if _layer(d) in rank and rank[_layer(d)] < rank[_layer(m)]]
    assert upward == []


def test_only_the_package_facade_imports_the_package_root(graph):
    importers = sorted(graph.find_modules_that_directly_import("lens_position"))
    assert importers == [], f"import the defining module instead of the lens_position facade: {importers}"


def test_the_import_graph_between_top_level_packages_is_at_most_9_deep(graph):
    """Depth: the longest chain of imports between the packages directly under
    ``lens_position`` (each layer one node; the facade ``lens_position/__init__.py`` left out)."""
    edges: dict[str, set[str]] = {}
    for m in graph.modules:
        for d in graph.find_modules_directly_imported_by(m):
            a, b = _layer(m), _layer(d)
            if a and b and a != b:
                edges.setdefault(a, set()).add(b)

    @functools.cache
    def depth(node: str) -> int:
        return 1 + max((depth(n) for n in edges.get(node, ())), default=0)

    assert max(depth(layer) for layer in LAYERS) <= 9
