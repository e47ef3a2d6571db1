"""The report answers first: per model one sentence built from the numbers, on the first screen
of a 1400 x 900 browser window; compact claim cells; a banner over random-weight models."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from fake_results import ARCHS, fake_results

from lens_position.analyses.sentences import UNTRAINED_NOTE
from lens_position.report import html as report


def _models(tiny: bool = False):
    return [{"name": "tiny-llama" if tiny and model == "std" else model, "architecture": arch,
             "source": "registry:tiny-llama" if tiny and model == "std" else "custom"} for arch, _, model in ARCHS]


def _tables(tiny: bool = False):
    tables = fake_results()
    if tiny:
        tables = {name: frame.assign(model=frame["model"].replace({"std": "tiny-llama"}))
                  if "model" in frame.columns else frame for name, frame in tables.items()}
    return tables


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    path = tmp_path_factory.mktemp("first-screen") / "report.html"
    report.write_report(path, _tables(), provenance={"seed": 0, "models": _models()})
    return path


def _text(fragment: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", " ", fragment))


def test_each_model_gets_one_answer_built_from_its_numbers_before_the_claims(page):
    text = page.read_text()
    tables = fake_results()
    layers = tables["decompose_layers"]
    assert text.index('id="answers"') < text.index('id="claims"')
    for k, (arch, _, _) in enumerate(ARCHS):
        block = _text(re.search(rf'<div class="answer" id="answer-{k}">(.*?)</div>', text, re.S).group(1))
        part = layers[layers["architecture"] == arch]
        # the mask's and the residual's held-out reference-free means, as the sentence writes them
        assert f"M' = {part['M_rf_heldout'].mean():.3g}" in block and f"R' = {part['R_rf_heldout'].mean():.3g}" in block
        assert "of it is the causal mask's" in block and "the residual stream's" in block
        assert "attention sink" in block and "sink readers" in block


def test_claim_cells_are_short_with_three_significant_figures_and_the_detail_folded_away(page):
    text = page.read_text()
    table = re.search(r'<table id="claims">(.*?)</table>', text, re.S).group(1)
    for cell in re.findall(r'<div class="cell">(.*?)</div></td>', table, re.S):
        visible = re.sub(r"<details>.*?</details>", "", cell, flags=re.S)
        assert visible.count("<br>") <= 1, visible
        for number in re.findall(r"\d+\.\d+", _text(visible)):
            assert len(number.replace(".", "").lstrip("0")) <= 3, (number, visible)
    assert table.count("<details>") >= 5


def test_a_random_weight_model_carries_a_visible_banner(tmp_path):
    path = report.write_report(tmp_path / "tiny.html", _tables(tiny=True), provenance={"models": _models(tiny=True)})
    text = path.read_text()
    blocks = re.findall(r'<div class="answer" id="answer-\d">(.*?)</div>', text, re.S)
    assert UNTRAINED_NOTE in html_lib.unescape(blocks[0]) and 'class="untrained"' in blocks[0]
    assert all('class="untrained"' not in b for b in blocks[1:])


def test_the_first_screen_shows_every_answer_in_a_1400_by_900_browser(page):
    shot = page.parent / "first-screen.png"
    check = report.check_in_browser(page, screenshot=shot, width=1400, height=900)
    assert check.js_errors == [] and check.ok
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert int(check.page["data-answers"]) == len(ARCHS)
    assert int(check.page["data-answers-on-first-screen"]) == len(ARCHS)
    assert 1 <= int(check.page["data-claim-cell-lines"]) <= 3
