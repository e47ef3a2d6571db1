"""Every tutorial notebook runs top to bottom, and its stored outputs match its source.

The notebooks live in ``notebooks/`` as Jupytext percent-format ``.py`` files (the reviewed
source), some paired with an executed ``.ipynb``. Each one reads ``LENS_POSITION_FAST`` in its
first cell; here it is set to 1, so the notebooks use tiny models and short sequences and the
whole set runs in a few minutes. A cell that raises fails the test with the cell and traceback.
The fast run is marked ``tl4``: ``make test`` runs every notebook on TransformerLens 3.9 and 4.3.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
SOURCES = sorted(NOTEBOOK_DIR.glob("[0-9]*.py"))
PAIRED = sorted(NOTEBOOK_DIR.glob("[0-9]*.ipynb"))
FAST_SWITCH = 'os.environ.get("LENS_POSITION_FAST"'
# The notebooks that end with a takeaway built from their numbers (lens_position.report.takeaways).
# 06 (the zoo) is written and executed separately and does not have one yet.
TEACHING = ("01", "02", "03", "04", "05", "07", "08", "09")
TAKEAWAY_HEADING = "### What the numbers show"


def execute(notebook: nbformat.NotebookNode, workdir: Path, timeout: int = 900) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel of this interpreter, in ``workdir``; raise on the first error."""
    client = NotebookClient(
        notebook,
        timeout=timeout,
        startup_timeout=180,  # a loaded machine can take a while to import the kernel
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return notebook


@pytest.fixture
def fast_env(monkeypatch, tmp_path):
    """What CI sets for the notebook kernels: fast mode, never a hub download, and a weight
    cache of their own (notebook 5 converts a checkpoint it writes to a temporary folder).
    Progress is left as users get it (no TQDM_DISABLE)."""
    monkeypatch.setenv("LENS_POSITION_FAST", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "weight-cache"))


def test_the_tutorials_exist():
    numbers = [p.stem.split("_")[0] for p in SOURCES]
    assert len(set(numbers)) == len(numbers), SOURCES
    assert {"01", "02", "03", "04", "05", "06", "07", "08", "09"} <= set(numbers), SOURCES


def test_the_tutorials_page_lists_every_notebook():
    page = (NOTEBOOK_DIR.parent / "docs" / "notebooks.md").read_text(encoding="utf-8")
    missing = [p.name for p in SOURCES if f"`{p.name}`" not in page]
    assert not missing, f"docs/notebooks.md does not list {missing}"


def _teaching(paths):
    return [p for p in paths if p.stem.split("_")[0] in TEACHING]


def takeaway_problems(notebook: nbformat.NotebookNode, source_text: str) -> list[str]:
    """What is wrong with a notebook's ending: its last cell must be a code cell that builds the
    takeaway with lens_position.report.takeaways (the claims rendered by ``claims_markdown``), after a
    markdown cell that announces it; when executed, its output is that Markdown, and no line of
    it that holds a number is written in the source (the words come from the numbers)."""
    problems = []
    last, before = notebook.cells[-1], notebook.cells[-2]
    if last.cell_type != "code" or "takeaways.Takeaway.join(" not in last.source:
        problems.append("the last cell does not build a takeaway (takeaways.Takeaway.join)")
    if "takeaways.claims_markdown(" not in last.source:
        problems.append("the takeaway does not compare with the paper's claims (takeaways.claims_markdown)")
    if before.cell_type != "markdown" or "## What the numbers show" not in before.source:
        problems.append("the cell before the takeaway does not announce it (## What the numbers show)")
    outputs = last.get("outputs", [])
    if last.get("execution_count"):
        markdown = [o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {})]
        if len(markdown) != 1 or not markdown[0].startswith(TAKEAWAY_HEADING):
            problems.append(f"the takeaway cell shows no takeaway Markdown ({len(markdown)} Markdown outputs)")
        else:
            lines = [line.strip("-* ") for line in markdown[0].splitlines()]
            copied = [line for line in lines if re.search(r"\d", line) and len(line) > 20 and line in source_text]
            if copied:
                problems.append(f"takeaway lines written in the source instead of computed: {copied}")
    return problems


@pytest.mark.parametrize("source", _teaching(SOURCES), ids=lambda p: p.stem)
def test_teaching_notebook_source_ends_with_its_takeaway(source):
    assert not takeaway_problems(jupytext.read(source), source.read_text()), source.name


def test_takeaway_check_catches_a_missing_or_hard_coded_takeaway():
    cells = [nbformat.v4.new_code_cell("x = 1"),
             nbformat.v4.new_markdown_cell("## What the numbers show"),
             nbformat.v4.new_code_cell("takeaways.Takeaway.join(takeaways.claims_markdown(tables, ['C1']))")]
    good = nbformat.v4.new_notebook(cells=cells)
    assert takeaway_problems(good, "") == []
    missing = nbformat.v4.new_notebook(cells=cells[:1] + [nbformat.v4.new_markdown_cell("The end.")])
    assert len(takeaway_problems(missing, "")) == 3
    prose = "R removes 40% of the residual component at early queries."
    written = nbformat.v4.new_notebook(cells=cells[:2] + [nbformat.v4.new_code_cell(
        f"takeaways.Takeaway.join(takeaways.claims_markdown(tables, ['C4']), {prose!r})",
        execution_count=3, outputs=[nbformat.v4.new_output(
            "execute_result", data={"text/markdown": f"{TAKEAWAY_HEADING}\n\n{prose}"}, execution_count=3)])])
    assert takeaway_problems(written, written.cells[-1].source) == [
        f"takeaway lines written in the source instead of computed: {[prose]}"]
    silent = nbformat.v4.new_notebook(cells=cells[:2] + [nbformat.v4.new_code_cell(
        cells[2].source, execution_count=3, outputs=[])])
    assert takeaway_problems(silent, "") == ["the takeaway cell shows no takeaway Markdown (0 Markdown outputs)"]


@pytest.mark.tl4  # every notebook on both TransformerLens lines (make test runs tl4 tests in .venv-tl4 too)
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_in_fast_mode(source, tmp_path, fast_env):
    notebook = jupytext.read(source)
    first_code = next(c for c in notebook.cells if c.cell_type == "code")
    assert FAST_SWITCH in first_code.source, f"{source.name}: the first code cell must read LENS_POSITION_FAST"
    try:
        execute(notebook, tmp_path)
    except CellExecutionError as error:
        pytest.fail(f"{source.name} failed:\n{error}", pytrace=False)
    outputs = [o for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors
    assert outputs, f"{source.name} ran but showed nothing"
    if source in _teaching(SOURCES):
        assert not takeaway_problems(notebook, source.read_text()), source.name


@pytest.mark.parametrize("paired", PAIRED, ids=lambda p: p.stem)
def test_stored_ipynb_matches_its_py_source(paired):
    """An executed .ipynb is only useful if it shows the code in the reviewed .py source."""
    source = paired.with_suffix(".py")
    assert source.exists(), f"{paired.name} has no paired .py source"
    from_py = [(c.cell_type, c.source.strip()) for c in jupytext.read(source).cells]
    from_ipynb = [(c.cell_type, c.source.strip()) for c in nbformat.read(paired, as_version=4).cells]
    assert from_ipynb == from_py, f"{paired.name} is out of sync: run `jupytext --sync {source}`"
    stored = nbformat.read(paired, as_version=4)
    code_cells = [c for c in stored.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code_cells), f"{paired.name} is not fully executed"
    assert not [o for c in code_cells for o in c.outputs if o.output_type == "error"]
    if paired in _teaching(PAIRED):
        assert not takeaway_problems(stored, source.read_text()), paired.name


def test_harness_fails_on_a_cell_that_raises(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("x = 1"),
        nbformat.v4.new_code_cell("raise RuntimeError('boom')"),
        nbformat.v4.new_code_cell("y = 2"),
    ])
    with pytest.raises(CellExecutionError, match="boom"):
        execute(notebook, tmp_path, timeout=120)
    assert "execution_count" not in notebook.cells[2] or notebook.cells[2].execution_count is None


def test_harness_kernel_is_this_interpreter_with_the_fast_setting(tmp_path, fast_env):
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import os, sys\nprint(sys.executable)\nprint(os.environ['LENS_POSITION_FAST'])"),
    ])
    execute(notebook, tmp_path, timeout=120)
    printed = notebook.cells[0].outputs[0].text.split()
    assert Path(printed[0]).resolve() == Path(sys.executable).resolve()
    assert printed[1] == "1"


def _figure_outputs(notebook: nbformat.NotebookNode) -> int:
    return sum("application/vnd.plotly.v1+json" in o.get("data", {})
               for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", []))


WITH_FIGURES = [p for p in PAIRED if _figure_outputs(nbformat.read(p, as_version=4))]


def test_stored_notebooks_keep_no_widget_residue():
    """Progress-bar widgets are dead in a stored notebook (no kernel): none may be stored."""
    for paired in PAIRED:
        text = paired.read_text()
        assert "application/vnd.jupyter.widget" not in text, f"{paired.name} stores widget outputs or state"
        notebook = nbformat.read(paired, as_version=4)
        streams = [o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.get("outputs", [])
                   if o.get("output_type") == "stream"]
        bars = [t for t in streams if TQDM_TEXT.search(t)]
        assert not bars, f"{paired.name} stores progress-bar text: {bars[0][:200]!r}"


TQDM_TEXT = re.compile(r"\d+%\|[^|\n]*\|")  # tqdm's text bar, " 40%|####      | 4/10"


def test_progress_bar_text_is_recognised():
    assert TQDM_TEXT.search("Loading weights:  40%|####      | 4/10 [00:01<00:02]")
    assert not TQDM_TEXT.search("fraction removed: token -2%, mean +1% | random")


@pytest.mark.parametrize("paired", WITH_FIGURES, ids=lambda p: p.stem)
def test_exported_notebook_draws_its_figures_offline_in_chromium(paired, tmp_path):
    """`jupyter nbconvert --to html` of a stored notebook, opened without a network: every
    figure is drawn (plotly.js is embedded in the notebook, not loaded from a CDN)."""
    from nbconvert import HTMLExporter
    from offline_browser import dump_dom_offline

    notebook = nbformat.read(paired, as_version=4)
    body, _ = HTMLExporter().from_notebook_node(notebook)
    page = tmp_path / f"{paired.stem}.html"
    page.write_text(body, encoding="utf-8")
    dom = dump_dom_offline(page)
    expected = _figure_outputs(notebook)
    figures = len(re.findall(r'class="plotly-graph-div', dom))
    drawn = len(re.findall(r'class="[^"]*js-plotly-plot', dom))
    svgs = len(re.findall(r'<svg[^>]*class="main-svg"', dom))
    assert figures == expected, f"{paired.name}: {figures} figure divs for {expected} figures"
    assert drawn == expected and svgs >= expected, f"{paired.name}: {drawn} of {expected} figures drawn offline"
    if paired in _teaching(PAIRED):  # the takeaway's Markdown is rendered, not shown as source
        assert re.search(r"<h3[^>]*>What the numbers show", dom), f"{paired.name}: the takeaway is not rendered"
        assert "**C" not in dom, f"{paired.name}: the takeaway's Markdown is shown unrendered"


def test_execute_strips_dead_progress_widgets():
    sys.path.insert(0, str(NOTEBOOK_DIR))
    try:
        from execute import strip_widgets
    finally:
        sys.path.remove(str(NOTEBOOK_DIR))
    bar = nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "x", "version_major": 2, "version_minor": 0},
        "text/plain": "  0%|          | 0/300 [00:00<?, ?it/s]"})
    printed = nbformat.v4.new_output("stream", name="stdout", text="layers x positions (30, 10)\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("sweep()", outputs=[bar, printed])],
                                        metadata={"widgets": {"application/vnd.jupyter.widget-state+json": {}}})
    assert strip_widgets(notebook) == 1
    assert notebook.cells[0].outputs == [printed] and "widgets" not in notebook.metadata
    assert "application/vnd.jupyter.widget" not in nbformat.writes(notebook)
