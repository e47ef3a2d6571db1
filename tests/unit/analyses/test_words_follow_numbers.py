"""Every sentence is a function of the numbers it quotes: drawn estimates and intervals, and the words
that go with them (sign, "little", "not resolved", "holds") checked against the numbers printed
beside them, and every percentage printed the one way (never past ±300%, never four digits)."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.claims import c4_fraction
from lens_position.analyses.sentences import (
    LITTLE,
    bos_direction,
    bos_sentence,
    components_sentence,
    convergence_sentence,
    how_much_removed,
)
from lens_position.core.intervals import PERCENT_LIMIT, Estimate, format_percent
from lens_position.core.summaries import fmt

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
PERCENT = re.compile(r"(?<![\w.])([+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?)%")


def percentages(text: str) -> list[float]:
    """Every number printed as a percentage in ``text`` (the "> 300%" forms count as 300)."""
    return [float(x) for x in PERCENT.findall(text)]


@given(finite, st.sampled_from([".3g", "+.0f", ".0f", ".1f", "+.1f"]))
def test_a_percentage_is_printed_within_300_and_above_its_resolution(fraction, spec):
    text = format_percent(fraction, spec)
    if fraction > PERCENT_LIMIT:
        assert text == "> 300%"
    elif fraction < -PERCENT_LIMIT:
        assert text == "< -300%"
    elif 0 < abs(fraction) < 1e-4:
        assert text in ("< 0.01%", "> -0.01%") and (text.startswith("<")) == (fraction > 0)
    else:
        value, = percentages(text)
        assert abs(value) <= 300.5 and "e" not in text.lower()
        assert abs(value - fraction * 100) <= 0.5 * 10 ** -int(spec[-2]) + 1e-9 if spec.endswith("f") else True
        if value == 0:
            assert text == "0%"  # a zero is unsigned


@given(finite, finite, finite)
def test_an_interval_never_prints_a_four_digit_percentage(value, a, b):
    lo, hi = min(a, b), max(a, b)
    for text in (fmt(Estimate(value, lo, hi, n=16), percent=True),
                 Estimate(value, lo, hi, n=16).format(".0f", percent=True)):
        assert all(abs(x) <= 300.5 for x in percentages(text)), text
        assert not re.search(r"\d{4,}(\.\d+)?%", text), text


intervals = st.tuples(st.floats(-3, 3), st.floats(0, 2), st.floats(0, 2)).map(
    lambda t: Estimate(t[0], t[0] - t[1], t[0] + t[2], n=16))


@given(intervals)
def test_how_much_removed_follows_the_interval(estimate):
    lo, hi = estimate.decision_bounds
    said = how_much_removed(estimate)
    assert said == ("little" if -LITTLE < lo and hi < LITTLE else "removes" if lo > 0 else "adds" if hi < 0
                    else "unresolved")


def _bos_tables(centres: list[float], spread: float, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """BOS replacement's overall, replicates and per-layer tables with these fractions of held-out R'."""
    rng = np.random.default_rng(seed)
    names = ["token", "mean", "random"][:len(centres)]
    draws = {name: centre + spread * rng.standard_normal(200) for name, centre in zip(names, centres)}
    column = "fraction_removed_rf_heldout"
    overall = pd.DataFrame({"replacement": names, column: centres,
                            f"{column}_lo": [np.quantile(draws[n], 0.025) for n in names],
                            f"{column}_hi": [np.quantile(draws[n], 0.975) for n in names],
                            "n_sequences": 16, "query_start": 0, "query_stop": 32})
    replicates = pd.concat([pd.DataFrame({"replacement": n, "replicate": np.arange(200), column: draws[n]})
                            for n in names], ignore_index=True)
    layers = pd.DataFrame([{"replacement": n, "layer": layer, column: c, "R_rf_heldout_base": 0.1,
                            "R_rf_heldout_replaced": 0.1 * (1 - c)} for n, c in zip(names, centres)
                           for layer in range(4)])
    return overall, replicates, layers


bos_draws = st.tuples(st.lists(st.floats(-1.5, 1.5), min_size=1, max_size=3), st.floats(0.001, 0.6),
                      st.integers(0, 2**16))


@settings(max_examples=150, deadline=None)
@given(bos_draws, st.integers(0, 4))
def test_the_convergence_sentence_says_little_only_of_a_little_interval(draw, n_converged):
    centres, spread, seed = draw
    overall, replicates, layers = _bos_tables(centres, spread, seed)
    convergence = pd.DataFrame({"layer": range(4), "converged": [k < n_converged for k in range(4)],
                                "cosine": 0.9, "tolerance": 0.05})
    text = convergence_sentence(convergence, layers, overall, "model A", replicates)
    _, _, mean = c4_fraction(overall, replicates)
    quoted = re.search(r"BOS replacement removes (.*?) of R' \(held-out\) \(mean over replacements", text)
    assert quoted and quoted.group(1) == fmt(mean, percent=True)  # the number the words rest on is the C4 mean
    lo, hi = mean.decision_bounds
    little, resolved = -LITTLE < lo and hi < LITTLE, lo > 0 or hi < 0
    assert ("removes little" in text or "little for the replacement" in text) == little
    assert ("not resolved at this N" in text) == (not little and not resolved)
    assert (": convergence accounts for the C4 result." in text) == (little and n_converged >= 2)
    if "replacement adds residual" in text:
        assert hi < 0
    if "replacement removes residual" in text:
        assert lo > 0


@settings(max_examples=150, deadline=None)
@given(bos_draws)
def test_bos_direction_and_bos_sentence_follow_each_replacements_interval(draw):
    centres, spread, seed = draw
    overall, replicates, _ = _bos_tables(centres, spread, seed)
    text = bos_direction(overall, "model A", replicates)
    bounds = [(float(r["fraction_removed_rf_heldout_lo"]), float(r["fraction_removed_rf_heldout_hi"]))
              for _, r in overall.iterrows()]
    bounds = [(min(lo, c), max(hi, c)) for (lo, hi), c in zip(bounds, centres)]  # what a verdict decides on
    if "Every replacement removes" in text:
        assert all(lo > 0 for lo, _ in bounds)
    if "Every replacement *adds*" in text:
        assert all(hi < 0 for _, hi in bounds)
    if "No replacement's change is resolved from 0" in text:
        assert all(lo <= 0 <= hi for lo, hi in bounds)
    if "No replacement removes" in text:
        assert all(lo <= 0 for lo, _ in bounds) and any(hi < 0 for _, hi in bounds)
    for sentence in (text, bos_sentence(overall, "model A", replicates)):
        assert all(abs(x) <= 300.5 for x in percentages(sentence))
    assert "queries 0–31 of 16 prompts" in bos_sentence(overall, "model A", replicates)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-0.05, 0.5), st.floats(0, 0.2), st.floats(0, 0.2)), min_size=1, max_size=6),
       st.integers(0, 2**16))
def test_the_components_sentence_splits_only_a_total_resolved_from_zero(layer_values, seed):
    rng = np.random.default_rng(seed)
    n_layers = len(layer_values)
    layers = pd.DataFrame({"layer": range(n_layers), "n_sequences": 16,
                           "total_heldout": [t for t, _, _ in layer_values],
                           "R_rf_heldout": [r for _, r, _ in layer_values],
                           "M_rf_heldout": [m for _, _, m in layer_values]})
    noise = 0.05 * rng.standard_normal((200, n_layers))
    replicates = pd.DataFrame([{"replicate": b, "layer": k, "total_heldout": layer_values[k][0] + noise[b, k],
                                "R_rf_heldout": layer_values[k][1] + noise[b, k] / 2,
                                "M_rf_heldout": layer_values[k][2] + noise[b, k] / 2}
                               for b in range(200) for k in range(n_layers)])
    text = components_sentence(layers, "model A", replicates, in_sample=False)
    quoted = re.search(r"accounts for (\S+) \[(\S+), (\S+)\] of the variance", text)
    assert quoted, text
    lo = float(quoted.group(2))
    assert ("not distinguishable from zero" in text) == (lo <= 0) or math.isclose(lo, 0, abs_tol=1e-3)
    assert all(abs(x) <= 300.5 for x in percentages(text)), text
