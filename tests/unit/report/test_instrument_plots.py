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


def _convergence(cosines, tolerance=0.02):
    return pd.DataFrame({"layer": range(len(cosines)), "cosine": cosines, "tolerance": tolerance,
                         "converged": [c >= 1 - tolerance for c in cosines]})


def _bos(fraction_per_layer, lo, hi):
    layers = pd.DataFrame([{"replacement": r, "layer": l, "fraction_removed_rf_heldout": f}
                           for r in ("token", "mean") for l, f in enumerate(fraction_per_layer)])
    overall = pd.DataFrame([{"replacement": r, "fraction_removed_rf_heldout": sum(fraction_per_layer) / len(
        fraction_per_layer), "fraction_removed_rf_heldout_lo": lo, "fraction_removed_rf_heldout_hi": hi}
        for r in ("token", "mean")])
    return layers, overall


def test_the_convergence_figure_draws_the_cosines_and_the_mean_fraction_per_layer():
    layers, _ = _bos([0.1, 0.3, 0.5], -0.1, 0.4)
    fig = plots.convergence_c4(_convergence([0.5, 0.99, 1.0]), layers)
    by_quantity = {trace.meta["quantity"]: trace for trace in fig.data}
    assert list(by_quantity["cosine"].y) == [0.5, 0.99, 1.0]
    assert list(by_quantity["converged_threshold"].y) == pytest.approx([0.98] * 3)
    assert list(by_quantity["fraction_removed_rf_heldout"].y) == pytest.approx([0.1, 0.3, 0.5])


@pytest.mark.parametrize("cosines,fractions,lo,hi,verdict", [
    ([0.5, 0.99, 1.0, 1.0], [0.0, 0.01, -0.02, 0.0], -0.05, 0.04, "convergence accounts for the C4 result"),
    ([0.5, 0.99, 1.0, 1.0], [0.5, 0.4, 0.6, 0.5], 0.3, 0.7, "convergence does not account for the C4 result"),
    ([0.5, 0.3, 0.2, 0.4], [0.8, 0.8, 0.9, 0.8], 0.7, 0.95, "the state does not re-form and the replacement removes"),
    ([0.5, 0.3, 0.2, 0.4], [0.0, 0.01, 0.0, 0.0], -0.05, 0.05, "the state does not re-form, yet the replacement "
                                                                "removes little"),
])
def test_the_convergence_sentence_follows_the_numbers(cosines, fractions, lo, hi, verdict):
    from lens_position.report.takeaways import convergence_sentence

    layers, overall = _bos(fractions, lo, hi)
    text = convergence_sentence(_convergence(cosines), layers, overall, "m")
    assert verdict in text
    n_converged = sum(c >= 0.98 for c in cosines)
    assert (f"{n_converged} of {len(cosines)} layers" if n_converged else "at any layer") in text


def test_the_window_sinks_sentence_counts_each_metric_and_reads_them():
    from lens_position.report.takeaways import window_sinks_sentence

    rows = [{"layer_type": kind, "metric": metric, "n_heads": 8, "n_sink_heads": n, "mean_score": score}
            for kind, metric, n, score in (("local", "gu", 1, 0.2), ("local", "window_aware", 4, 0.5),
                                           ("local", "visible", 2, 0.3), ("global", "gu", 3, 0.4),
                                           ("global", "window_aware", 3, 0.4), ("global", "visible", 3, 0.4))]
    text = window_sinks_sentence(pd.DataFrame(rows), "m")
    assert "local layers: 1 of 8 heads under Gu et al.'s metric, 4 window-aware, 2" in text
    assert "finds local sink heads Gu et al.'s misses" in text
    rows[1]["n_sink_heads"] = 1
    assert "do not move their sink" in window_sinks_sentence(pd.DataFrame(rows))


def test_the_rotary_bands_sentence_names_the_band_that_carries_r():
    from lens_position.report.takeaways import rotary_bands_sentence

    heads = pd.DataFrame({"R": [0.2], "R_cross": [-0.05], "R_split_error": [1e-9], "R_rf_attribution_error": [0.1],
                          "R_rf": [0.15]})
    layers = pd.DataFrame({"band_index": [0, 1], "band": ["band 0", "band 1"], "R_band": [0.05, 0.2]})
    text = rotary_bands_sentence(heads, layers)
    assert "rides mostly on band 1 (the slowest band)" in text and "1.0e-09" in text


def test_the_convergence_sentence_pools_before_dividing_and_says_when_a_fraction_is_not_defined():
    from lens_position.report.takeaways import convergence_sentence

    # two unconverged layers: R'_base 0.2 and 0.001 (near zero), replaced 0.18 and 0.003: per layer the
    # fractions are +10% and -200% (their mean -95%); pooled, 1 - 0.183 / 0.201 = +9%
    layers = pd.DataFrame([{"replacement": "token", "layer": layer, "fraction_removed_rf_heldout": 1 - after / before,
                            "R_rf_heldout_base": before, "R_rf_heldout_condition": after}
                           for layer, before, after in ((0, 1.0, 1.0), (1, 0.2, 0.18), (2, 0.001, 0.003))])
    overall = pd.DataFrame([{"replacement": "token", "fraction_removed_rf_heldout": 0.05,
                             "fraction_removed_rf_heldout_lo": 0.01, "fraction_removed_rf_heldout_hi": 0.09}])
    text = convergence_sentence(_convergence([1.0, 0.5, 0.5]), layers, overall, "m")
    assert "where it has not +9%" in text and "-95%" not in text
    # the overall fraction not defined (its base not resolved from 0): no verdict rests on it
    undefined = overall.assign(fraction_removed_rf_heldout=float("nan"), fraction_removed_rf_heldout_lo=float("nan"),
                               fraction_removed_rf_heldout_hi=float("nan"))
    text = convergence_sentence(_convergence([1.0, 0.5, 0.5]), layers, undefined, "m")
    assert "is not defined" in text and "accounts for" not in text.replace("whether convergence accounts", "")
