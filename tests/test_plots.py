"""Each figure draws exactly the numbers of the table it is given, one trace per architecture."""

from __future__ import annotations

import json
import math

import pandas as pd
import plotly.graph_objects as go
import pytest

from fake_results import fake_results
from lens_position import plots
from lens_position.errors import BadInputError


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


def test_layer_components_draw_R_and_M_per_layer_for_each_architecture(tables):
    frame = tables["decompose_layers"]
    fig = plots.layer_components(frame)
    for quantity in ("R", "M"):
        traces = _traces(fig, quantity)
        assert set(traces) == set(frame["architecture"])
        for arch, trace in traces.items():
            part = frame[frame["architecture"] == arch].sort_values("layer")
            assert list(trace["x"]) == part["layer"].tolist()
            assert _same(list(trace["y"]), part[quantity].tolist())
    held = plots.layer_components(frame, heldout=True)
    assert {t["meta"]["quantity"] for t in plots.trace_data(held)} == {"R_heldout", "M_heldout"}


def test_head_heatmaps_hold_every_head_value(tables):
    frame = tables["decompose_heads"]
    fig = plots.head_heatmaps(frame)
    assert len(fig.data) == 3 * frame["architecture"].nunique()
    for quantity in ("T", "R", "M"):
        for arch, trace in _traces(fig, quantity).items():
            part = frame[frame["architecture"] == arch]
            for row in part.itertuples():
                i = list(trace["y"]).index(row.layer)
                j = list(trace["x"]).index(row.head)
                assert trace["z"][i][j] == pytest.approx(getattr(row, quantity))


def test_probe_figure_draws_heldout_and_shuffled_r2(tables):
    frame = tables["probe_layers"]
    fig = plots.probe_r2(frame)
    for quantity in ("r2_heldout", "r2_shuffled"):
        for arch, trace in _traces(fig, quantity).items():
            part = frame[frame["architecture"] == arch].sort_values("layer")
            assert _same(list(trace["y"]), part[quantity].tolist())


def test_bos_figure_draws_overall_and_per_layer_fractions(tables):
    layers, overall = tables["bos_layers"], tables["bos_overall"]
    fig = plots.bos_fraction_removed(layers, overall)
    for arch, trace in _traces(fig, "fraction_removed (overall)").items():
        part = overall[overall["architecture"] == arch]
        assert list(trace["x"]) == part["replacement"].tolist()
        assert _same(list(trace["y"]), part["fraction_removed"].tolist())
    for rep in ("token", "mean", "random"):
        for arch, trace in _traces(fig, f"fraction_removed ({rep})").items():
            part = layers[(layers["architecture"] == arch) & (layers["replacement"] == rep)].sort_values("layer")
            assert _same(list(trace["y"]), part["fraction_removed"].tolist())
    # The paper's 40% is drawn as a reference line in every panel.
    assert [s["y0"] for s in fig.layout.shapes] == [plots.PAPER_C4_FRACTION] * 4


def test_fingerprint_figure_draws_spread_with_zero_as_a_gap(tables):
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


def test_sink_map_marks_sink_heads_and_top_sink_reading_heads(tables):
    sinks, reading = tables["sink_heads"], tables["sink_reading"]
    fig = plots.sink_heads_map(sinks, reading, top_reading=3)
    for arch, trace in _traces(fig, "is_sink").items():
        part = sinks[(sinks["architecture"] == arch) & sinks["is_sink"]]
        assert sorted(zip(trace["y"], trace["x"])) == sorted(zip(part["layer"], part["head"]))
    for arch, trace in _traces(fig, "sink_reading_top").items():
        top = reading[reading["architecture"] == arch].sort_values("rank").head(3)
        assert list(zip(trace["y"], trace["x"])) == list(zip(top["layer"], top["head"]))


def test_sink_rate_bars_are_in_percent(tables):
    frame = tables["sink_rate"]
    for arch, trace in _traces(plots.sink_rate_bars(frame), "sink_rate_percent").items():
        part = frame[frame["architecture"] == arch]
        assert _same(list(trace["y"]), [100 * v for v in part["sink_rate"]])


def test_sink_ablation_draws_R_before_and_after(tables):
    frame = tables["sink_ablation"]
    fig = plots.sink_ablation(frame)
    for kind in ("zero", "mean"):
        for arch, trace in _traces(fig, f"R_after ({kind})").items():
            part = frame[(frame["architecture"] == arch) & (frame["ablation"] == kind)].sort_values("layer")
            assert _same(list(trace["y"]), part["R_after"].tolist())


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
