"""The claims table computes each verdict from the data by its stated criterion, and the HTML
report is one offline file that a real browser draws without JavaScript errors."""

from __future__ import annotations

import html
import re

import pandas as pd
import pytest
from fake_results import N_SEQUENCES, fake_results

from lens_position.analyses.claims import CLAIMS, FAILS, HOLDS, INCONCLUSIVE, NOT_MEASURED, Criteria, claims_table
from lens_position.report import html as report
from lens_position.report.html import build_report, check_in_browser, report_figure_specs


def _overall(claims, claim):
    return claims[(claims["claim"] == claim) & (claims["architecture"] == "overall")].iloc[0]


def _rows(claims, claim):
    return claims[(claims["claim"] == claim) & (claims["architecture"] != "overall")]


def test_claims_hold_when_the_numbers_meet_the_criteria():
    claims = claims_table(fake_results())
    assert list(dict.fromkeys(claims["claim"])) == ["C1", "C2", "C3", "C4", "C5"]
    for claim in ("C1", "C2", "C3", "C4", "C5"):
        assert _overall(claims, claim)["verdict"] == HOLDS, claim
        assert (_rows(claims, claim)["verdict"] == HOLDS).all(), claim
    # Every row states the paper's claim and our criterion; every estimate but C5's exact spread has an interval.
    assert claims["statement"].str.len().min() > 40
    assert claims["criterion"].str.len().min() > 20
    with_interval = claims[(claims["architecture"] != "overall") & (claims["claim"] != "C5")]
    assert (with_interval["value_lo"] <= with_interval["value"]).all()
    assert (with_interval["value"] <= with_interval["value_hi"]).all()


def test_claims_fail_when_the_numbers_do_not_and_say_by_how_much():
    claims = claims_table(fake_results(failing=True))
    assert _overall(claims, "C3")["verdict"] == FAILS  # NTK residual share above standard
    assert _overall(claims, "C4")["verdict"] == FAILS  # 90% removed, not about 40%
    c4 = _rows(claims, "C4")
    assert c4["value"].tolist() == pytest.approx([0.9, 0.9, 0.9])
    for text in c4["explanation"]:
        assert "removes 90%" in text and "about 40%" in text and "50 points more" in text
    ntk = _rows(claims, "C3").set_index("architecture").loc["NTK-scaled RoPE: ntk"]
    assert ntk["verdict"] == FAILS and "above 0 over its whole interval" in ntk["explanation"]


def test_claim_verdicts_follow_the_criteria_thresholds():
    strict = Criteria(min_signal=0.5)  # no component reaches half of Var(log A) in the fake tables
    claims = claims_table(fake_results(), strict)
    assert _overall(claims, "C1")["verdict"] == FAILS and _overall(claims, "C2")["verdict"] == FAILS
    assert "0.5" in _overall(claims, "C1")["criterion"]


def test_an_interval_across_the_threshold_is_inconclusive_and_says_which_N_would_decide():
    tables = fake_results(noise=0.01)
    c1 = _rows(claims_table(tables), "C1").iloc[0]
    threshold = c1["value"] - 0.5 * (c1["value"] - c1["value_lo"])  # inside the interval, below the estimate
    row = _rows(claims_table(tables, Criteria(min_signal=threshold)), "C1").iloc[0]
    assert row["verdict"] == INCONCLUSIVE
    # intervals shrink as 1/sqrt(N): N' = N (half-width / distance)^2 = 16 * 2^2
    assert row["n_to_decide"] == pytest.approx(N_SEQUENCES * 4, abs=1)
    assert f"about N = {row['n_to_decide']:.0f} sequences (now N = {N_SEQUENCES})" in row["explanation"]


def test_without_intervals_nothing_is_decided():
    tables = {k: v for k, v in fake_results().items() if not k.endswith("replicates")}
    claims = claims_table(tables)
    for claim in ("C1", "C2", "C3", "C4"):
        assert (_rows(claims, claim)["verdict"] == INCONCLUSIVE).all(), claim
    assert "intervals were switched off" in _rows(claims, "C1")["explanation"].iloc[0]


def test_C3_is_not_measured_without_all_three_architectures():
    tables = {k: v[v["role"] != "ntk"] for k, v in fake_results().items()}
    row = _overall(claims_table(tables), "C3")
    assert row["verdict"] == NOT_MEASURED and "NTK-scaled RoPE" in row["measured"]


def test_C5_measures_relative_spread_and_needs_a_sink_head_above_eps_over_its_interval():
    tables = fake_results()
    claims = claims_table(tables)
    fp = tables["fingerprint"]
    auto = fp[fp["condition"] == "auto-bos"]
    for row in _rows(claims, "C5").itertuples():
        part = auto[auto["architecture"] == row.architecture]
        assert row.value == pytest.approx((part["spread"] / part["norm"]).max())
    maybe = dict(tables, sink_heads=tables["sink_heads"].assign(sink_score_lo=0.2))
    assert _overall(claims_table(maybe), "C5")["verdict"] == INCONCLUSIVE


def test_C5_is_not_applicable_not_refuted_where_no_sink_formed():
    tables = fake_results()
    no_sinks = dict(tables, sink_heads=tables["sink_heads"].assign(sink_score=0.15, sink_score_lo=0.1,
                                                                   sink_score_hi=0.2))
    claims = claims_table(no_sinks)
    for row in _rows(claims, "C5").itertuples():
        assert row.verdict == INCONCLUSIVE
        assert "no sink formed" in row.measured and "not applicable, no sink formed" in row.explanation
        assert "largest score 0.15" in row.explanation
    assert _overall(claims, "C5")["verdict"] == INCONCLUSIVE
    # The fingerprint part still decides on its own: a varying auto-BOS fingerprint fails C5 with or without sinks.
    fp = no_sinks["fingerprint"]
    varying = fp.assign(spread=fp["spread"].where(fp["condition"] != "auto-bos", fp["norm"] * 0.5))
    assert _overall(claims_table(dict(no_sinks, fingerprint=varying)), "C5")["verdict"] == FAILS
    # Without the sink step the sink part is undecided, not failed.
    unmeasured = {k: v for k, v in tables.items() if k != "sink_heads"}
    assert _overall(claims_table(unmeasured), "C5")["verdict"] == INCONCLUSIVE


def test_each_claim_is_written_once():
    assert [c.key for c in CLAIMS] == ["C1", "C2", "C3", "C4", "C5"]
    assert not hasattr(report, "CLAIMS") and not hasattr(report, "_c3_verdict")


def test_the_report_explains_every_claim_that_does_not_hold_in_words_from_the_numbers():
    tables = fake_results(failing=True)
    claims = claims_table(tables)
    text = build_report(tables)
    explained = claims[(claims["architecture"] != "overall") & claims["verdict"].isin([FAILS, INCONCLUSIVE])]
    assert len(explained) > 0
    for explanation in explained["explanation"]:
        assert html.escape(explanation) in text
    assert 'id="disagreements"' in text and "[" in text  # the intervals are in the table


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
    assert set(specs) == {"layer_components", "layer_components_early", "head_heatmaps", "probe", "bos",
                          "fingerprint", "sinks", "sink_rate", "sink_ablation"}
    layers = tables["decompose_layers"]
    for trace in specs["layer_components"]["data"]:
        part = layers[layers["architecture"] == trace["meta"]["group"]].sort_values("layer")
        assert trace["y"] == pytest.approx(part[trace["meta"]["quantity"]].tolist())
    overall = tables["bos_overall"]
    bars = [t for t in specs["bos"]["data"] if t["type"] == "bar"]
    for trace in bars:
        part = overall[overall["architecture"] == trace["meta"]["group"]]
        assert trace["y"] == pytest.approx(part["fraction_removed"].tolist())


@pytest.mark.fault(area="output folder", given="--browser-check with TMPDIR naming a folder that does not exist",
                   happens="the check runs: Chromium gets the temporary folder Python itself falls back to")
def test_the_browser_check_draws_every_figure_with_tmpdir_naming_no_folder(report_file, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path / "no-such-folder"))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again, as a fresh process does
    check = check_in_browser(report_file)
    assert check.ok, check


def test_report_opens_in_chromium_without_errors_and_draws_every_figure(report_file):
    shot = report_file.parent / "report.png"
    check = check_in_browser(report_file, screenshot=shot)
    assert check.js_errors == []
    assert check.undrawn == [] and check.figures_drawn == check.figures_expected == 9
    assert check.ok
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000


def test_one_chromium_launch_checks_the_report_and_takes_the_screenshot(tmp_path, report_file, monkeypatch):
    """One launch dumps the DOM and saves the screenshot; a Chromium that ignores the
    screenshot beside --dump-dom (one thing per launch) is started again for it."""
    import subprocess

    from lens_position.report import html as report_module

    launches = []
    real_run = subprocess.run

    def run(args, **kwargs):
        launches.append(args)
        return real_run(args, **kwargs)

    monkeypatch.setattr(report_module.subprocess, "run", run)
    check = check_in_browser(report_file, screenshot=tmp_path / "one.png")
    assert check.ok and check.screenshot is not None and len(launches) == 1

    def dom_only(args, **kwargs):  # an older Chromium: --dump-dom wins, no screenshot
        launches.append(args)
        if "--dump-dom" in args:
            args = [a for a in args if not a.startswith(("--screenshot", "--window-size"))]
        return real_run(args, **kwargs)

    launches.clear()
    monkeypatch.setattr(report_module.subprocess, "run", dom_only)
    check = check_in_browser(report_file, screenshot=tmp_path / "two.png")
    assert check.ok and (tmp_path / "two.png").stat().st_size > 50_000 and len(launches) == 2


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


def test_a_single_sequence_is_not_explained_as_intervals_switched_off():
    """N = 1: no interval because there is nothing to resample, which the explanation says."""
    tables = {k: v for k, v in fake_results().items() if not k.endswith("replicates")}
    tables = {k: (v.assign(n_sequences=1) if "n_sequences" in v.columns else v) for k, v in tables.items()}
    explanation = _rows(claims_table(tables), "C1")["explanation"].iloc[0]
    assert "with N = 1 sequence there is nothing to resample" in explanation
    assert "switched off" not in explanation


@pytest.mark.parametrize("role, label", [("no-rope", "no RoPE: nope"),
                                         ("interpolated", "position-interpolated RoPE: pi")])
def test_a_model_without_rope_is_outside_C3_and_leaves_the_comparison_alone(role, label):
    """NoPE / learned absolute positions (role 'no-rope') and linear position interpolation
    (role 'interpolated') are neither standard nor NTK-scaled RoPE: C3 says so for them, and the
    verdicts of the other models do not change."""
    tables = fake_results()
    extra = {}
    for name, frame in tables.items():
        if "role" in frame.columns:
            other = frame[frame["role"] == "standard"].assign(role=role, architecture=label, model="other")
            extra[name] = pd.concat([frame, other], ignore_index=True)
        else:
            extra[name] = frame
    before, after = claims_table(tables), claims_table(extra)
    row = _rows(after, "C3").set_index("architecture").loc[label]
    assert row["verdict"] == NOT_MEASURED and "not part of C3" in row["measured"]
    c3_before = _rows(before, "C3").set_index("architecture")["verdict"]
    c3_after = _rows(after, "C3").set_index("architecture")["verdict"].drop(label)
    assert c3_after.to_dict() == c3_before.to_dict()


def test_zoo_models_without_rope_get_their_own_role():
    from lens_position.models import load_model

    roles = {v: load_model(f"zoo:{v}").spec.role for v in ("rope", "ntk", "window", "nope", "learned")}
    assert roles == {"rope": "standard", "ntk": "ntk", "window": "sliding", "nope": "no-rope", "learned": "no-rope"}


@pytest.mark.parametrize(("provenance", "banner"), [
    ({"quick": True, "settings": {"N": 4, "T": 40, "n_resamples": 50}},
     "Quick run (N = 4, T = 40, 50 bootstrap replicates): the verdicts are indicative"),
    ({"quick": False, "settings": {"N": 6, "T": 128, "n_resamples": 1000}}, "Small run (N = 6, T = 128"),
    ({"quick": False, "settings": {"N": 16, "T": 128, "n_resamples": 1000}}, None),
    (None, None),
])
def test_a_quick_or_small_run_says_so_above_everything_else(provenance, banner):
    text = build_report(fake_results(), provenance=provenance)
    if banner is None:
        assert 'id="small-run"' not in text
    else:
        assert banner in html.unescape(text)
        assert text.index('id="small-run"') < text.index("<h2>Claims</h2>") < text.index('id="claims"')
