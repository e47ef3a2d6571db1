"""The claims table computes each verdict from the data by its stated criterion, and the HTML
report is one offline file that a real browser draws without JavaScript errors."""

from __future__ import annotations

import re

import pytest

from fake_results import fake_results
from lens_position import report
from lens_position.report import Criteria, build_report, check_in_browser, claims_table, report_figure_specs


def _overall(claims, claim):
    return claims[(claims["claim"] == claim) & (claims["architecture"] == "overall")].iloc[0]


def test_claims_hold_when_the_numbers_meet_the_criteria():
    claims = claims_table(fake_results())
    assert list(dict.fromkeys(claims["claim"])) == ["C1", "C2", "C3", "C4", "C5"]
    for claim in ("C1", "C2", "C3", "C4", "C5"):
        assert _overall(claims, claim)["holds"] is True, claim
    # Every row states the paper's claim and our criterion.
    assert claims["statement"].str.len().min() > 40
    assert claims["criterion"].str.len().min() > 20


def test_claims_fail_when_the_numbers_do_not():
    claims = claims_table(fake_results(failing=True))
    assert _overall(claims, "C3")["holds"] is False  # NTK residual share above standard
    assert _overall(claims, "C4")["holds"] is False  # 90% removed, not about 40%
    assert "NTK share below standard: no" in _overall(claims, "C3")["measured"]
    c4 = claims[(claims["claim"] == "C4") & (claims["architecture"] != "overall")]
    assert c4["value"].tolist() == pytest.approx([0.9, 0.9, 0.9])


def test_claim_verdicts_follow_the_criteria_thresholds():
    tables = fake_results()
    strict = Criteria(min_signal=0.5)  # no component reaches half of Var(log A) in the fake tables
    claims = claims_table(tables, strict)
    assert _overall(claims, "C1")["holds"] is False and _overall(claims, "C2")["holds"] is False
    assert "0.5" in _overall(claims, "C1")["criterion"]


def test_C3_is_undecided_without_all_three_architectures():
    tables = {k: v[v["role"] != "ntk"] for k, v in fake_results().items()}
    row = _overall(claims_table(tables), "C3")
    assert row["holds"] is None and "NTK-scaled RoPE" in row["measured"]


def test_C5_measures_relative_spread_and_counts_sink_heads():
    tables = fake_results()
    claims = claims_table(tables)
    c5 = claims[(claims["claim"] == "C5") & (claims["architecture"] != "overall")]
    fp = tables["fingerprint"]
    auto = fp[fp["condition"] == "auto-bos"]
    for row in c5.itertuples():
        part = auto[auto["architecture"] == row.architecture]
        assert row.value == pytest.approx((part["spread"] / part["norm"]).max())
    no_sinks = dict(tables, sink_heads=tables["sink_heads"].assign(is_sink=False))
    assert _overall(claims_table(no_sinks), "C5")["holds"] is False


@pytest.fixture(scope="module")
def report_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "report.html"
    report.write_report(path, fake_results(), provenance={"seed": 0, "models": [
        {"name": "std", "architecture": "standard RoPE: std", "source": "custom", "weights_sha256": "ab" * 32}]})
    return path


def test_report_is_self_contained(report_file):
    text = report_file.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=["\']?(https?:)?//', text)
    assert text.count("plotly.js v") == 1  # the library is inlined once
    assert text.index('id="claims"') < text.index('class="figure"')  # opens with the claims table


def test_report_figures_hold_the_tables_numbers(report_file):
    tables = fake_results()
    specs = report_figure_specs(report_file.read_text())
    assert set(specs) == {"layer_components", "head_heatmaps", "probe", "bos", "fingerprint", "sinks",
                          "sink_rate", "sink_ablation"}
    layers = tables["decompose_layers"]
    for trace in specs["layer_components"]["data"]:
        part = layers[layers["architecture"] == trace["meta"]["group"]].sort_values("layer")
        assert trace["y"] == pytest.approx(part[trace["meta"]["quantity"]].tolist())
    overall = tables["bos_overall"]
    bars = [t for t in specs["bos"]["data"] if t["type"] == "bar"]
    for trace in bars:
        part = overall[overall["architecture"] == trace["meta"]["group"]]
        assert trace["y"] == pytest.approx(part["fraction_removed"].tolist())


def test_report_opens_in_chromium_without_errors_and_draws_every_figure(report_file):
    shot = report_file.parent / "report.png"
    check = check_in_browser(report_file, screenshot=shot)
    assert check.js_errors == []
    assert check.undrawn == [] and check.figures_drawn == check.figures_expected == 8
    assert check.ok
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_browser_check_catches_a_javascript_error(tmp_path, report_file):
    broken = tmp_path / "broken.html"
    text = report_file.read_text()
    # A figure whose JSON cannot be parsed: the render script must record it.
    broken.write_text(text.replace('<script type="application/json" id="data-probe">',
                                   '<script type="application/json" id="data-probe">{oops', 1))
    check = check_in_browser(broken)
    assert not check.ok
    assert "probe" in check.undrawn and check.js_errors


def test_build_report_with_no_tables_still_shows_the_claims():
    text = build_report({})
    assert 'id="claim-C1"' in text and "not measured" in text
