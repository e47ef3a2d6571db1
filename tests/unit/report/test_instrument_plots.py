"""The window-aware sink and rotary-band figures draw exactly the numbers of their tables."""

import pandas as pd
import pytest

from lens_position.ground.errors import BadInputError
from lens_position.report import plots


def _sink_heads():
    rows = []
    for arch in ("a", "b"):
        for layer, kind in ((0, "local"), (1, "global")):
            for head in range(2):
                rows.append({"architecture": arch, "layer": layer, "head": head, "layer_type": kind,
                             "gu_score": 0.1 * (layer + 1) + head * 0.01, "window_score": 0.5 + 0.1 * head,
                             "visible_score": 0.3 + layer * 0.1})
    return pd.DataFrame(rows)


def test_window_sink_figure_draws_the_layer_means_of_each_metric():
    heads = _sink_heads()
    fig = plots.window_sink_layers(heads)
    for trace in fig.data:
        group, column = trace.meta["group"], trace.meta["quantity"]
        expected = heads[heads["architecture"] == group].groupby("layer")[column].mean().tolist()
        assert list(trace.y) == pytest.approx(expected)
    symbols = fig.data[0].marker.symbol
    assert list(symbols) == ["circle", "diamond"]


def test_rotary_band_figure_draws_every_band_and_both_quantities():
    layers = pd.DataFrame([{"architecture": "a", "layer": l, "band": f"band {b}", "band_index": b,
                            "R_band": 0.01 * l + b, "R_rf_attribution": -0.02 * b + l}
                           for l in range(3) for b in range(2)])
    fig = plots.rotary_band_layers(layers)
    assert len(fig.data) == 4
    for trace in fig.data:
        column, band = trace.meta["quantity"].split(" (")
        band = band.rstrip(")")
        assert list(trace.y) == pytest.approx(layers[layers["band"] == band].sort_values("layer")[column].tolist())


def test_a_frame_without_the_columns_is_refused():
    with pytest.raises(BadInputError):
        plots.rotary_band_layers(pd.DataFrame({"layer": [0]}))
    with pytest.raises(BadInputError):
        plots.window_sink_layers(pd.DataFrame({"layer": [0]}))
