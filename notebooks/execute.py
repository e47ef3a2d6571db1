"""Execute tutorial notebooks and store their outputs in the paired ``.ipynb``.

    .venv/bin/python notebooks/execute.py 02_mask_vs_residual.py     # on the real models
    .venv/bin/python notebooks/execute.py --fast                     # every notebook, fast setting

The ``.py`` file (Jupytext percent format) is the source; this runs it top to bottom in a fresh
kernel of this interpreter (``nbclient``, no Jupyter server) and writes ``<name>.ipynb`` next to
it with the outputs. ``tests/integration/test_notebooks.py`` checks that a stored ``.ipynb`` still matches its
source. The hub is never contacted (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jupytext
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(source: Path, *, fast: bool, timeout: int) -> Path:
    """Run ``source`` and write its executed ``.ipynb``; return the path written."""
    os.environ["LENS_POSITION_FAST"] = "1" if fast else "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # No switch hides what a user sees: the stored notebook holds lens_position's own progress lines
    # as a user's does; a library's tqdm widget is dead without a kernel and is dropped below.
    os.environ.pop("TQDM_DISABLE", None)
    notebook = jupytext.read(source)
    NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()
    strip_widgets(notebook)
    target = source.with_suffix(".ipynb")
    jupytext.write(notebook, target)
    return target


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def strip_widgets(notebook) -> int:
    """Drop progress-bar widgets, which are dead without a kernel, from an executed notebook:
    every widget view output (a bar's ``text/plain`` snapshot goes with it) and the saved widget
    state. Bars come from libraries that ignore ``TQDM_DISABLE`` (TransformerLens's patching
    sweeps use ``tqdm.auto``). Returns the number of outputs dropped."""
    dropped = 0
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        kept = [o for o in cell.get("outputs", []) if WIDGET_VIEW not in o.get("data", {})]
        dropped += len(cell.get("outputs", [])) - len(kept)
        cell.outputs = kept
    notebook.metadata.pop("widgets", None)
    return dropped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", help="notebook sources (default: every NN_*.py here)")
    parser.add_argument("--fast", action="store_true", help="LENS_POSITION_FAST=1: tiny models, short sequences")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell (default: %(default)s)")
    args = parser.parse_args(argv)
    sources = [HERE / Path(n).name for n in args.notebooks] or sorted(HERE.glob("[0-9]*.py"))
    for source in sources:
        started = time.perf_counter()
        target = execute(source, fast=args.fast, timeout=args.timeout)
        print(f"{target.name}: executed in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
