"""The documentation site builds with warnings as errors, and it covers the whole package.

``mkdocs build --strict`` turns every warning into a failure: a broken link, a page missing from
the navigation, a docstring mkdocstrings cannot parse, an API page naming a function that no longer
exists, or a command line reference that cannot be generated from the argument parser.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import lens_position

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def _modules() -> list[str]:
    names = [lens_position.__name__]
    for info in pkgutil.walk_packages(lens_position.__path__, prefix="lens_position."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


# One API page per module in these layers; one page per package for models and pipeline (their
# modules are rendered inside it).
FLAT_LAYERS = ("ground", "core", "analyses", "report", "cli")
PACKAGE_PAGES = ("lens_position.models", "lens_position.pipeline")


def _paged_modules() -> list[str]:
    return [m for m in _modules() if (m.count(".") == 2 and m.split(".")[1] in FLAT_LAYERS) or m in PACKAGE_PAGES]


def _public_objects(module):
    """Functions and classes a user is meant to call: ``__all__``, else public names defined here."""
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n, obj in vars(module).items()
                 if not n.startswith("_") and getattr(obj, "__module__", None) == module.__name__]
    for name in names:
        obj = getattr(module, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            yield name, obj


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    problems = [line for line in proc.stderr.splitlines() if re.search(r"WARNING|ERROR", line)]
    assert proc.returncode == 0, "mkdocs build --strict failed:\n" + "\n".join(problems or [proc.stderr])
    return out


def test_docs_build_with_warnings_as_errors(site):
    for page in ["index.html", "getting-started/index.html", "concepts/index.html",
                 "cli/index.html", "notebooks/index.html"]:
        assert (site / page).is_file(), page


def test_concepts_page_states_the_exact_decomposition(site):
    html = (site / "concepts" / "index.html").read_text()
    for quantity in [r"t_{ij} = s_{ij} - s_{ii}", r"\log A_{ij} = t_{ij} - z_i",
                     r"\operatorname{abs}(\log A) = \operatorname{abs}(t) - \operatorname{abs}(z)"]:
        assert quantity in html, quantity
    for name in ["total signal", "residual component", "mask component", "interaction"]:
        assert name in html


def test_cli_reference_is_generated_from_the_parser(site):
    from lens_position.cli.commands import build_parser

    html = (site / "cli" / "index.html").read_text()
    assert "cli-reference" not in html
    parser = build_parser()
    subcommands = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    assert subcommands, "the CLI has no sub-commands to document"
    for name, sub in subcommands[0].choices.items():
        assert f"{parser.prog} {name}" in html, name
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--"):
                    assert option in html, f"{name} {option} missing from the CLI reference"


def test_cli_reference_lists_nested_sub_commands_and_their_options():
    """`lens-position zoo` has its own actions (train, list, sink-sweep): each gets a section
    with every one of its options."""
    import argparse
    import importlib.util

    from lens_position.cli.commands import build_parser

    spec = importlib.util.spec_from_file_location("cli_reference", DOCS / "hooks" / "cli_reference.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    parser = build_parser()
    text = hook.render(parser)
    zoo = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["zoo"]
    actions = next(a for a in zoo._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert {"train", "list", "sink-sweep"} <= set(actions)
    for name, sub in actions.items():
        section = text.split(f"### `{parser.prog} zoo {name}`")[1].split("### ")[0]
        for action in sub._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    assert f"`{option}" in section, f"zoo {name} {option} missing from the CLI reference"


def test_every_public_module_has_an_api_page():
    pages = "\n".join(p.read_text() for p in (DOCS / "api").rglob("*.md"))
    documented = set(re.findall(r"^::: (lens_position[\w.]*)", pages, flags=re.M))
    wanted = set(_paged_modules())
    assert wanted <= documented, f"modules without an API page: {sorted(wanted - documented)}"


def test_api_pages_render_the_public_functions(site):
    rendered = "\n".join(p.read_text() for p in (site / "api").rglob("*.html"))
    for module_name in _paged_modules():
        module = importlib.import_module(module_name)
        for name, _ in _public_objects(module):
            assert f'id="{module_name}.{name}"' in rendered, f"{module_name}.{name} is not in the API reference"


def test_every_public_function_and_class_has_a_docstring():
    missing = []
    for module_name in _modules():
        module = importlib.import_module(module_name)
        if not (module.__doc__ or "").strip():
            missing.append(module_name)
        for name, obj in _public_objects(module):
            if obj.__module__ != module.__name__:
                continue  # re-exported: checked where it is defined
            doc = (obj.__doc__ or "").strip()  # not inspect.getdoc: an inherited docstring does not count
            if not doc or doc.startswith(f"{name}("):  # dataclasses write their signature as a docstring
                missing.append(f"{module_name}.{name}")
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)


def test_readme_answers_first_what_it_measures_the_two_commands_and_the_snippet():
    """The first 15 lines: what the project measures, the two commands with their times and the start
    of the Python snippet; the whole README at most 8,000 characters; then links to docs and notebooks."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme) <= 8000, len(readme)
    first_block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, flags=re.S)
    assert first_block, "README has no command block"
    before = [line for line in readme[: readme.index(first_block.group(0))].splitlines() if line.strip()]
    assert before[0] == readme.splitlines()[0] and 2 <= len(before) <= 7, "a title and a short description first"
    assert "attention" in " ".join(before) and "absolute position" in " ".join(before)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines() if line.strip()]
    assert commands == ["make reproduce", "make test"]
    assert all(re.search(r"\d+ min", line) for line in first_block.group(1).splitlines() if line.strip())
    first_15 = "\n".join(readme.splitlines()[:15])
    assert "```python" in first_15 and "import lens_position" in first_15
    assert "docs/" in readme and "mkdocs" in readme
    assert "notebooks/" in readme
    for notebook in sorted((ROOT / "notebooks").glob("[0-9]*.py")):
        assert notebook.name in readme or notebook.stem in readme, f"README does not link {notebook.name}"


def _typeset_equations(dom: str) -> tuple[int, int, int]:
    """(equations on the page, typeset by MathJax as SVG, MathJax errors) in a dumped DOM."""
    equations = len(re.findall(r'class="arithmatex"', dom))
    typeset = len(re.findall(r"<mjx-container[^>]*>\s*<svg", dom))
    errors = len(re.findall(r"data-mjx-error|<mjx-merror", dom))
    return equations, typeset, errors


def test_equations_render_offline_in_chromium(site):
    """The concepts page opened from disk without a network: every equation is typeset (SVG)."""
    from offline_browser import dump_dom_offline

    dom = dump_dom_offline(site / "concepts" / "index.html")
    equations, typeset, errors = _typeset_equations(dom)
    assert equations >= 20, "the concepts page lost its equations"
    assert typeset == equations and errors == 0, f"{typeset} of {equations} equations typeset, {errors} errors"
    sources = " ".join(re.findall(r'<script[^>]+src="([^"]+)"', dom))
    assert "https://" not in sources, "a script still loads from the web"


def test_offline_check_fails_for_math_from_a_cdn(site, tmp_path):
    """Control: the same page with MathJax from a CDN typesets nothing, so the check above can fail."""
    from offline_browser import dump_dom_offline

    page = tmp_path / "cdn" / "concepts" / "index.html"
    page.parent.mkdir(parents=True)
    text = (site / "concepts" / "index.html").read_text()
    page.write_text(text.replace("../javascripts/vendor/mathjax/tex-svg.js",
                                 "https://unpkg.com/mathjax@3/es5/tex-svg.js"))
    equations, typeset, _ = _typeset_equations(dump_dom_offline(page, budget_ms=5000))
    assert equations >= 20 and typeset == 0


def test_readme_and_docs_refer_to_nothing_outside_the_repository():
    """A user has the repository, not the team's design notes: no link may leave it."""
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        assert not re.search(r"shared/|DESIGN\.md|STYLE\.md", text), f"{page.relative_to(ROOT)} refers outside the repo"
        for target in re.findall(r"\]\(([^)#\s]+)", text):
            if re.match(r"[a-z]+:", target):
                continue  # a web address, not a file
            resolved = (page.parent / target).resolve()
            assert ROOT in resolved.parents or resolved == ROOT, \
                f"{page.relative_to(ROOT)} links {target} outside the repo"


def test_concepts_page_carries_the_design(site):
    """The claims, both splits, the interventions, the models and the data are on the concepts page."""
    html = (site / "concepts" / "index.html").read_text()
    for needed in ["C1", "C2", "C3", "C4", "C5", "mask-only counterfactual", "Why the reference matters",
                   "BOS replacement", "trajectory patching", "Sink-reading heads", "fingerprint",
                   "SmolLM2-135M", "Gemma-3-270M", "NTK-by-parts", "pydoc_data.topics", "repeated token",
                   "holds", "inconclusive"]:
        assert needed in html, needed

def test_fault_table_rows_are_declared_by_existing_tests():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fault_table", ROOT / "docs" / "hooks" / "fault_table.py")
    fault_table = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = fault_table  # dataclasses look their module up there
    spec.loader.exec_module(fault_table)
    rows = fault_table.collect(ROOT / "tests")
    assert {"prompts", "options"} <= {row.area for row in rows}
    for row in rows:
        path, name = row.test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text()
    assert "<!-- fault-table -->" in (DOCS / "troubleshooting.md").read_text()


def test_readme_says_why_each_dependency_is_there():
    """Every requirement of pyproject.toml (extras included) has a row in the README's table."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values()
                                                    for r in extra]
    names = {re.match(r"[A-Za-z0-9_.\-]+", r).group(0).lower().replace("_", "-") for r in requirements}
    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("## Dependencies"):]
    rows = {m.lower().replace("_", "-") for m in re.findall(r"`([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?`", table)}
    assert names <= rows, f"dependencies without a README row: {sorted(names - rows)}"


def test_the_changelog_is_release_notes_with_a_heading_for_this_version():
    """Keep a Changelog: a heading for the package's version, one line per change, no paragraphs."""
    from lens_position.ground.version import __version__

    text = (ROOT / "CHANGELOG.md").read_text()
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, flags=re.M)
    body = text[text.index("\n## ["):]
    for line in body.splitlines():
        assert not line.startswith("  "), f"a change continued over lines: {line!r}"
        if line and not line.startswith(("#", "- ", "|")):
            raise AssertionError(f"a paragraph in the release notes: {line!r}")
    assert not re.search(r"\d+(\.\d+)? ?(s|GiB|MiB)\b.*\d+(\.\d+)?x", body), "measurements belong in performance.md"
