"""Each figure draws exactly the numbers of the table it is given, one trace per architecture."""

from __future__ import annotations

import json
import math

import pandas as pd
import plotly.graph_objects as go
import pytest
from fake_results import fake_results

from lens_position.ground.errors import BadInputError
from lens_position.report import plots


@pytest.fixture(scope="module")
def tables():
    return fake_results()


def _traces(fig: go.Figure, quantity: str) -> dict[str, dict]:
    found = {t["meta"]["group"]: t for t in plots.trace_data(fig) if t["meta"]["quantity"] == quantity}
    assert found, f"no trace draws {quantity!r}: a test looping over these traces would check nothing"
    return found


def _same(values, expected) -> bool:
    expected = [None if (isinstance(e, float) and math.isnan(e)) else e for e in expected]
    return len(values) == len(expected) and all(
        (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=1e-12))
        for a, b in zip(values, expected))


def test_layer_components_draw_heldout_values_with_intervals_on_relative_depth_by_default(tables):
    frame = tables["decompose_layers"]
    fig = plots.layer_components(frame)
    quantities = {t["meta"]["quantity"] for t in plots.trace_data(fig)}
    assert quantities == {"R_rf_heldout", "M_rf_heldout", "R_heldout", "M_heldout"}  # both splits, held-out
    for quantity in quantities:
        traces = _traces(fig, quantity)
        assert set(traces) == set(frame["architecture"])
        for arch, trace in traces.items():
            part = frame[frame["architecture"] == arch].sort_values("layer")
            assert list(trace["x"]) == part["relative_depth"].tolist()
            assert _same(list(trace["y"]), part[quantity].tolist())
            error = trace["error_y"]
            assert _same(list(error["array"]), (part[f"{quantity}_hi"] - part[quantity]).tolist())
            assert _same(list(error["arrayminus"]), (part[quantity] - part[f"{quantity}_lo"]).tolist())
    in_sample = plots.layer_components(frame, heldout=False, components=("R", "M"))
    assert {t["meta"]["quantity"] for t in plots.trace_data(in_sample)} == {"R", "M"}


def test_head_heatmaps_hold_every_head_value_heldout_by_default(tables):
    frame = tables["decompose_heads"]
    fig = plots.head_heatmaps(frame)
    assert len(fig.data) == 3 * frame["architecture"].nunique()
    for quantity in ("total_heldout", "R_rf_heldout", "M_rf_heldout"):
        for arch, trace in _traces(fig, quantity).items():
            part = frame[frame["architecture"] == arch]
            for row in part.itertuples():
                i = list(trace["y"]).index(row.layer)
                j = list(trace["x"]).index(row.head)
                assert trace["z"][i][j] == pytest.approx(getattr(row, quantity))
                assert trace["customdata"][i][j][:2] == pytest.approx(
                    [getattr(row, f"{quantity}_lo"), getattr(row, f"{quantity}_hi")])


def test_probe_figure_draws_heldout_and_shuffled_r2_with_their_intervals(tables):
    frame = tables["probe_layers"]
    fig = plots.probe_r2(frame)
    for quantity in ("r2_heldout", "r2_shuffled"):
        for arch, trace in _traces(fig, quantity).items():
            part = frame[frame["architecture"] == arch].sort_values("layer")
            assert _same(list(trace["y"]), part[quantity].tolist())
            assert _same(list(trace["error_y"]["array"]), (part[f"{quantity}_hi"] - part[quantity]).tolist())
            assert _same(list(trace["error_y"]["arrayminus"]), (part[quantity] - part[f"{quantity}_lo"]).tolist())


def test_an_interval_that_excludes_its_estimate_is_marked_and_says_its_method_when_hovered():
    """A bias-corrected interval may lie beside its in-sample estimate: the error bar then spans
    the interval and the estimate (it cannot be drawn around it), the marker is open (a bar is
    hatched), and the hover text gives the interval and says what it is."""
    layers = pd.DataFrame({"architecture": "a", "layer": [0, 1], "relative_depth": [0.0, 1.0],
                           "R_rf": [0.30, 0.20], "R_rf_lo": [0.20, 0.15], "R_rf_hi": [0.28, 0.25],
                           "M_rf": [0.1, 0.1], "M_rf_lo": [0.05, 0.05], "M_rf_hi": [0.15, 0.15]})
    fig = plots.layer_components(layers, heldout=False, components=("R_rf", "M_rf"))
    trace = _traces(fig, "R_rf")["a"]
    assert list(trace["marker"]["symbol"]) == ["circle-open", "circle"]
    assert _same(list(trace["error_y"]["array"]), [0.0, 0.05]) and _same(list(trace["error_y"]["arrayminus"]),
                                                                         [0.10, 0.05])
    assert list(trace["text"]) == [
        "interval [0.2000, 0.2800] (bias-corrected interval; the in-sample estimate lies above it)",
        "interval [0.1500, 0.2500] (bias-corrected interval)"]
    assert "%{text}" in trace["hovertemplate"]
    assert list(_traces(fig, "M_rf")["a"]["marker"]["symbol"]) == ["circle", "circle"]

    overall = pd.DataFrame({"architecture": "a", "replacement": ["token", "mean"], "fraction_removed_rf": [0.9, 0.7],
                            "fraction_removed_rf_lo": [0.92, 0.6], "fraction_removed_rf_hi": [0.97, 0.8]})
    per_layer = overall.assign(layer=0)
    bars = _traces(plots.bos_fraction_removed(per_layer, overall), "fraction_removed_rf (overall)")["a"]
    assert list(bars["marker"]["pattern"]["shape"]) == ["/", ""]
    assert list(bars["text"])[0] == \
        "interval [0.920, 0.970] (bias-corrected interval; the in-sample estimate lies below it)"

    probe = pd.DataFrame({"architecture": "a", "layer": [0], "r2_heldout": [0.5], "r2_heldout_lo": [0.55],
                          "r2_heldout_hi": [0.6], "r2_shuffled": [0.0], "r2_shuffled_lo": [-0.1],
                          "r2_shuffled_hi": [0.1]})
    r2 = _traces(plots.probe_r2(probe), "r2_heldout")["a"]  # a percentile interval: the off-centre words
    assert list(r2["text"]) == ["interval [0.5500, 0.6000] (the estimate lies outside its bootstrap interval: an "
                                "off-centre resampling distribution)"]


def test_bos_figure_draws_overall_and_per_layer_fractions(tables):
    layers, overall = tables["bos_layers"], tables["bos_overall"]
    fig = plots.bos_fraction_removed(layers, overall)
    for arch, trace in _traces(fig, "fraction_removed_rf (overall)").items():  # the fraction C4 is decided on
        part = overall[overall["architecture"] == arch]
        assert list(trace["x"]) == part["replacement"].tolist()
        assert _same(list(trace["y"]), part["fraction_removed_rf"].tolist())
        assert _same(list(trace["error_y"]["arrayminus"]),
                     (part["fraction_removed_rf"] - part["fraction_removed_rf_lo"]).tolist())
    for rep in ("token", "mean", "random"):
        for arch, trace in _traces(fig, f"fraction_removed_rf ({rep})").items():
            part = layers[(layers["architecture"] == arch) & (layers["replacement"] == rep)].sort_values("layer")
            assert _same(list(trace["y"]), part["fraction_removed_rf"].tolist())
    # The paper's 40% is drawn as a reference line in every panel.
    assert [s["y0"] for s in fig.layout.shapes] == [plots.PAPER_C4_FRACTION] * 4


def test_one_layer_with_a_small_denominator_cannot_flatten_the_overall_bars(tables):
    """A per-layer fraction of -4000% (a near-zero R' at one layer) clips the per-layer panels at
    ±200%; the overall bars, which C4 is decided on, keep an axis of their own."""
    layers, overall = tables["bos_layers"].copy(), tables["bos_overall"]
    layers.loc[layers.index[0], "fraction_removed_rf"] = -40.0
    fig = plots.bos_fraction_removed(layers, overall)
    axes = [fig.layout[name] for name in ("yaxis", "yaxis2", "yaxis3", "yaxis4")]
    assert axes[0].range is None and axes[0].matches is None  # the overall panel: its own autoscaled axis
    for axis in axes[1:]:
        assert tuple(axis.range) == (-plots.CLIP_FRACTION - 0.1, plots.CLIP_FRACTION + 0.1)
    assert "fraction of R' removed" in axes[0].title.text


def test_fingerprint_figure_shows_a_zero_spread_on_the_log_axis(tables):
    frame = tables["fingerprint"]
    fig = plots.fingerprint_layers(frame)
    for cond in ("auto-bos", "varying-token0"):
        for arch, trace in _traces(fig, f"spread ({cond})").items():
            part = frame[(frame["architecture"] == arch) & (frame["condition"] == cond)].sort_values("layer")
            expected = [None if v == 0 else v for v in part["spread"].tolist()]
            assert _same(list(trace["y"]), expected)
        for arch, trace in _traces(fig, f"norm ({cond})").items():
            part = frame[(frame["architecture"] == arch) & (frame["condition"] == cond)].sort_values("layer")
            assert _same(list(trace["y"]), part["norm"].tolist())
    assert fig.layout.yaxis.type == "log"
    # every exact zero is marked, at the tick labelled "0 (exact)"
    zeros = frame[frame["spread"] == 0]
    assert len(zeros) > 0
    for arch, trace in _traces(fig, "spread == 0 (auto-bos)").items():
        part = zeros[(zeros["architecture"] == arch) & (zeros["condition"] == "auto-bos")]
        assert list(trace["x"]) == part["layer"].tolist()
        floor = trace["y"][0]
        assert floor > 0 and floor < frame.loc[frame["spread"] > 0, "spread"].min()
        assert fig.layout.yaxis.ticktext[0] == "0 (exact)" and fig.layout.yaxis.tickvals[0] == floor


def test_sink_map_marks_sink_heads_and_top_sink_reading_heads(tables):
    sinks, reading = tables["sink_heads"], tables["sink_reading"]
    fig = plots.sink_heads_map(sinks, reading, top_reading=3)
    for arch, trace in _traces(fig, "is_sink").items():
        part = sinks[(sinks["architecture"] == arch) & sinks["is_sink"]]
        assert sorted(zip(trace["y"], trace["x"])) == sorted(zip(part["layer"], part["head"]))
    for arch, trace in _traces(fig, "sink_reading_top").items():
        top = reading[reading["architecture"] == arch].sort_values("reading_rank").head(3)
        assert list(zip(trace["y"], trace["x"])) == list(zip(top["layer"], top["head"]))


def test_sink_rate_bars_are_gu_et_al_metric_in_percent_with_intervals_and_the_pooled_rate_beside(tables):
    frame = tables["sink_rate"]
    fig = plots.sink_rate_bars(frame)
    for arch, trace in _traces(fig, "sink_rate_percent").items():
        part = frame[frame["architecture"] == arch]
        assert _same(list(trace["y"]), [100 * v for v in part["sink_rate"]])
        assert _same(list(trace["error_y"]["array"]), (100 * (part["sink_rate_hi"] - part["sink_rate"])).tolist())
    for arch, trace in _traces(fig, "sink_rate_pooled_percent").items():
        part = frame[frame["architecture"] == arch]
        assert _same(list(trace["y"]), [100 * v for v in part["sink_rate_pooled"]])


def test_sink_ablation_draws_heldout_R_before_and_after_by_default_with_the_change_interval(tables):
    frame = tables["sink_ablation"]
    fig = plots.sink_ablation(frame)
    for kind in ("zero", "mean"):
        for arch, trace in _traces(fig, f"R_heldout_after ({kind})").items():
            part = frame[(frame["architecture"] == arch) & (frame["ablation"] == kind)].sort_values("layer")
            assert _same(list(trace["y"]), part["R_heldout_after"].tolist())
            assert _same(list(trace["error_y"]["array"]),
                         (part["R_heldout_change_hi"] - part["R_heldout_change"]).tolist())
            assert _same(list(trace["error_y"]["arrayminus"]),
                         (part["R_heldout_change"] - part["R_heldout_change_lo"]).tolist())


def test_a_frame_without_architecture_column_is_one_group(tables):
    frame = tables["probe_layers"]
    single = frame[frame["architecture"] == frame["architecture"].iloc[0]].drop(columns="architecture")
    fig = plots.probe_r2(single)
    assert [t.meta["group"] for t in fig.data] == ["", ""]  # one unnamed group, no "all" in the legend


def test_figures_serialise_numbers_literally(tables):
    """Plain lists, not base64 typed arrays, so the report's JSON can be checked against the tables."""
    fig = plots.layer_components(tables["decompose_layers"])
    text = json.dumps(fig.to_plotly_json()["data"])
    assert "bdata" not in text


def test_missing_columns_are_a_clear_error():
    with pytest.raises(BadInputError, match="r2_shuffled"):
        plots.probe_r2(pd.DataFrame({"layer": [0], "r2_heldout": [0.5]}))


def test_a_panel_with_no_finite_value_says_why_in_its_place_and_drawn_panels_say_nothing(tables):
    layers, overall = tables["bos_layers"].copy(), tables["bos_overall"]
    column = plots.c4_column(layers)[0]
    layers.loc[layers["replacement"] == "mean", column] = float("nan")  # R' not resolved at any layer
    fig = plots.bos_fraction_removed(layers, overall)
    notes = [a for a in fig.layout.annotations if a.text and "undefined" in a.text]
    assert len(notes) == 1
    mean_panel = 1 + ["token", "mean", "random"].index("mean") + 1  # after the overall panel
    assert notes[0].xref == f"x{mean_panel} domain"
    assert not [a for a in plots.bos_fraction_removed(tables["bos_layers"], overall).layout.annotations
                if a.text and "undefined" in a.text]


def test_heatmap_panels_are_titled_in_words_not_column_names(tables):
    fig = plots.head_heatmaps(tables["decompose_heads"])
    titles = [a.text.replace("<br>", " ") for a in fig.layout.annotations]
    assert any("residual component R' (reference-free), held-out" in t for t in titles)
    assert not any("_heldout" in t or "R_rf" in t for t in titles)
