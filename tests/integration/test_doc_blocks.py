"""Every ```python block of README.md and docs/ runs, so none can go stale.

The blocks of one page run in order in one namespace, in a scratch folder, after the page's
*setup* below: the names a how-to takes from the pages before it (``loaded``, ``prompts``), written
once here. With ``LENS_POSITION_FAST=1`` (the default here, as for the notebooks) the real models
are swapped for the tiny random ones built in code and the sizes shrink (``FAST_SWAPS``), so the
test needs no weights and runs in seconds per page. A block preceded by
``<!-- not run: <why> -->`` is shown, not run (a path on the reader's disk, a hub download); the
test checks each such block says why, and that there are few of them.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FAST = os.environ.get("LENS_POSITION_FAST", "1") == "1"
FAST_SWAPS = [('"smollm2-135m"', '"tiny-llama"'), ('"gemma3-270m"', '"tiny-gemma3"'), ("T=128", "T=32"),
              ("T=64", "T=32"), ("N=16", "N=4"), ("[0, 5, 11]", "[0, 2]"), ("[0, 6, 12]", "[0, 1, 2]"),
              ("range(12)", "range(3)"), ("blocks.3.hook_resid_pre", "blocks.2.hook_resid_pre"),
              ("query_range=(0, 32)", "query_range=(0, 16)"), ('layers="0:6"', 'layers="0:2"'),
              ("resid_pre_patch(clean_cache, 3, 5)", "resid_pre_patch(clean_cache, 2, 5)")]
BLOCK = re.compile(r"(<!-- not run: (?P<why>[^>]*?) -->\s*)?```python\n(?P<code>.*?)```", re.S)
MAX_NOT_RUN = 2

_BASE = """
import torch
from lens_position.models import load_model
from lens_position.core.data import build_prompts
loaded = load_model("smollm2-135m")
prompts = build_prompts(loaded, source="natural", T=64, N=16, bos="force")
"""
# The README's own checkpoint ("my-checkpoint"): a local Hugging Face folder, the tiny Llama saved.
_CHECKPOINT = """
from lens_position.models.tiny import tiny_hf_model
_hf_model, _tokenizer = tiny_hf_model("tiny-llama")
_hf_model.save_pretrained("my-checkpoint")
_tokenizer.save_pretrained("my-checkpoint")
"""
SETUP = {
    "README.md": _CHECKPOINT,
    "docs/howto/scaling-up.md": _CHECKPOINT,
    "docs/howto/prompt-sets.md": _BASE,
    "docs/howto/decompose.md": _BASE,
    "docs/notebooks.md": _BASE + """
from lens_position.analyses.decompose import decompose
from lens_position.analyses.bos import bos_replacement
result = decompose(loaded, prompts)
bos = bos_replacement(loaded, prompts)
""",
    "docs/howto/custom-patches.md": _BASE + """
model = loaded.model
clean_tokens = prompts.tokens
corrupted_tokens = build_prompts(loaded, source="natural", T=64, N=16, bos="force", seed=1).tokens
other_prompts = build_prompts(loaded, source="natural", T=64, N=16, bos="force", seed=2)
patching_metric = lambda logits: logits[:, -1].logsumexp(-1).mean()
my_key = torch.zeros(model.cfg.d_head)
""",
}


def _fast(code: str) -> str:
    for old, new in FAST_SWAPS if FAST else []:
        code = code.replace(old, new)
    return code


def _blocks(page: Path) -> list[re.Match]:
    return list(BLOCK.finditer(page.read_text(encoding="utf-8")))


RUN = [p for p in PAGES if any(m.group("why") is None for m in _blocks(p))]


@pytest.mark.parametrize("page", RUN, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_the_page_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_block__"}
    name = str(page.relative_to(ROOT))
    exec(compile(_fast(SETUP.get(name, "")), f"{name} (setup)", "exec"), namespace)
    for k, match in enumerate(_blocks(page)):
        if match.group("why") is not None:
            continue
        code = _fast(match.group("code"))
        try:
            exec(compile(code, f"{name} block {k + 1}", "exec"), namespace)
        except Exception as error:  # say which block, with its code
            pytest.fail(f"{name}, block {k + 1} failed: {type(error).__name__}: {error}\n{code}")


def test_blocks_that_are_not_run_say_why_and_are_few():
    not_run = [(p, m.group("why")) for p in PAGES for m in _blocks(p) if m.group("why") is not None]
    assert all(len(why.strip()) > 10 for _, why in not_run), not_run
    assert len(not_run) <= MAX_NOT_RUN, not_run
    assert sum(len(_blocks(p)) for p in PAGES) >= 25  # the pages do hold the blocks this test runs


# A screen, as tests/unit/core/test_summaries.py counts it.
SCREEN_LINES, SCREEN_COLUMNS = 30, 120
DAY_ONE_MAX_LINES = 20


def test_the_readme_quickstart_is_the_whole_first_day_in_at_most_20_lines():
    """Load SmolLM2, decompose, a figure, an intervention with an interval, the sink heads and your
    own local checkpoint, in at most 20 lines."""
    code = _blocks(ROOT / "README.md")[0].group("code")
    lines = [line for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]
    assert len(lines) <= DAY_ONE_MAX_LINES, len(lines)
    for needed in ('load_model("smollm2-135m")', "analyze(", "plots.", "bos_replacement", "sink_heads",
                   'load_model("my-checkpoint")', "decompose("):
        assert needed in code, needed


def test_every_object_the_readme_quickstart_shows_fits_on_a_screen(tmp_path, monkeypatch):
    """Run the quickstart statement by statement, as in a notebook: what ``print`` writes and the repr
    of every bare expression is at most a screen."""
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__doc_block__"}
    exec(compile(_fast(_CHECKPOINT), "README.md (setup)", "exec"), namespace)
    tree = ast.parse(_fast(_blocks(ROOT / "README.md")[0].group("code")))
    shown = 0
    for statement in tree.body:
        source = ast.unparse(statement)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            if isinstance(statement, ast.Expr):
                value = eval(compile(ast.Expression(statement.value), "README.md", "eval"), namespace)
            else:
                exec(compile(ast.Module([statement], []), "README.md", "exec"), namespace)
                value = None
        text = out.getvalue() + ("" if value is None else repr(value))
        if not text.strip():
            continue
        shown += 1
        rows = text.rstrip("\n").splitlines()
        assert len(rows) <= SCREEN_LINES and max(map(len, rows)) <= SCREEN_COLUMNS, f"{source} shows:\n{text}"
    assert shown >= 5  # print(result), summary(), top_heads(), sink_heads, bos_replacement, decompose


QUOTED = re.compile(r"```text\n(?P<text>On smollm2-135m.*?)```", re.S)
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:e[+-]?\d+)?")


@pytest.mark.slow
def test_the_quoted_answer_is_what_print_result_prints_today():
    """The answer the README, the docs' home page and getting-started quote after their snippet is the
    shape of what ``print(lp.analyze(...))`` prints on SmolLM2 now (numbers masked, each quoted piece
    between "[...]" found in order in the real output)."""
    import lens_position as lp

    model = lp.load_model("smollm2-135m")
    prompts = lp.build_prompts(model, source="natural", T=128, N=16, bos="force")
    printed = " ".join(str(lp.analyze(model, prompts, progress=False)).split())
    shape = NUMBER.sub("#", printed)
    quoted = {page: [m.group("text") for m in QUOTED.finditer(page.read_text())]
              for page in (ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "getting-started.md")}
    for page, texts in quoted.items():
        assert texts, f"{page.name} quotes no answer"
        for text in texts:
            at = 0
            for piece in " ".join(text.split()).split("[...]"):
                piece = NUMBER.sub("#", piece.strip(" ;,"))
                found = shape.find(piece, at)
                assert found >= 0, f"{page.name} quotes {piece!r}, which print(result) no longer prints"
                at = found + len(piece)
