"""Published numbers beside a run's own: every number in the table is the run's (or the paper's),
read off the tables it was given, and a run that measured none of the published measures shows none."""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.leakage import PUBLISHED
from lens_position.analyses.published import LEAKAGE, PUBLISHED_SINKS, published_beside_ours
from lens_position.report.html import published_html

pytestmark = pytest.mark.tl4


def _heads(model: str, significant: list[bool], gaps: list[float]) -> pd.DataFrame:
    n = len(significant)
    return pd.DataFrame({"model": model, "layer": [h // 2 for h in range(n)], "head": [h % 2 for h in range(n)],
                         "significant": significant, "leakage_gap": gaps,
                         "leakage_gap_lo": [g - 0.01 for g in gaps], "leakage_gap_hi": [g + 0.01 for g in gaps]})


def _rates(model: str, protocol: str = "documents") -> pd.DataFrame:
    return pd.DataFrame({"model": model, "condition": ["natural", "random"], "sink_rate": [0.761, 0.5],
                         "sink_rate_lo": [0.70, 0.4], "sink_rate_hi": [0.80, 0.6], "seq_len": 64, "N": 16,
                         "protocol": protocol})


def test_the_runs_numbers_are_read_off_its_tables():
    tables = {"leakage_heads": pd.concat([_heads("a", [True, False, True, False], [0.01, 0.2, 0.05, -0.1]),
                                          _heads("b", [False] * 4, [0.0, 0.0, 0.3, 0.0])]),
              "leakage_seeds": pd.DataFrame({"model": ["a", "a"], "jaccard": [0.5, 0.25]}),
              "sink_rate": _rates("a")}
    frame = published_beside_ours(tables).set_index(["measure", "model"])
    a = frame.loc[(LEAKAGE, "a")]
    assert not a["published"]
    assert a["value"] == "2 of 4 heads (50%); L0H1 +0.200 [+0.190, +0.210]; overlap of the seeds' sets (Jaccard) 0.38"
    assert frame.loc[(LEAKAGE, "b"), "value"].startswith("0 of 4 heads (0%); L1H0 +0.300")
    assert frame.loc[(LEAKAGE, "Llama-3.2-1B"), "value"].startswith(f"{sum(PUBLISHED.significant_per_layer)} of 512")
    rate = frame.loc[(PUBLISHED_SINKS[0][0], "a")]
    assert rate["value"] == "76.1% [70.0, 80.0]" and "64 tokens of 16 documents" in rate["inputs"]
    assert len(frame.xs("a", level="model")) == 2  # one leakage row and the natural condition's rate


def test_a_rate_on_the_runs_own_text_says_its_inputs_differ():
    frame = published_beside_ours({"sink_rate": _rates("a", protocol="windows")})
    ours = frame[~frame["published"]].iloc[0]
    assert "not Gu et al.'s documents" in ours["inputs"] and "other inputs" in ours["comparable"]


def test_a_run_without_the_measures_shows_only_the_papers_and_no_report_section():
    frame = published_beside_ours({})
    assert frame["published"].all() and len(frame) == 1 + len(PUBLISHED_SINKS)
    assert published_html({}) == ""


def test_the_report_section_escapes_and_shows_every_row():
    tables = {"leakage_heads": _heads("<b>x</b>", [True, True], [0.1, 0.2]), "sink_rate": _rates("<b>x</b>")}
    section = published_html(tables)
    assert section.startswith('<section id="published">') and "<b>x</b>" not in section
    assert section.count("<tr class=") == len(published_beside_ours(tables))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.floats(-1, 1, allow_nan=False)), min_size=1, max_size=30))
def test_the_count_and_the_largest_gap_are_the_tables(heads):
    significant, gaps = [s for s, _ in heads], [g for _, g in heads]
    row = published_beside_ours({"leakage_heads": _heads("m", significant, gaps)}).query("model == 'm'").iloc[0]
    assert row["value"].startswith(f"{sum(significant)} of {len(heads)} heads")
    assert f"{max(gaps):+.3f} [" in row["value"]


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 4), st.lists(st.booleans(), min_size=2, max_size=12))
def test_a_sweeps_tables_count_each_head_once_per_condition(n_seeds, significant):
    """A sweep stacks each seed's tables with a ``seed`` column: every head is counted once per seed, not
    once per stacked row ("0 of 24 heads" for a 12-head model)."""
    stacked = pd.concat([_heads("m", significant, [0.1] * len(significant)).assign(seed=seed)
                         for seed in range(n_seeds)], ignore_index=True)
    rates = pd.concat([_rates("m").assign(seed=seed) for seed in range(n_seeds)], ignore_index=True)
    frame = published_beside_ours({"leakage_heads": stacked, "sink_rate": rates})
    ours = frame[(frame["measure"] == LEAKAGE) & ~frame["published"]]
    assert list(ours["model"]) == [f"m (seed {seed})" for seed in range(n_seeds)]
    assert all(v.startswith(f"{sum(significant)} of {len(significant)} heads") for v in ours["value"])
    assert len(frame[(frame["measure"] == PUBLISHED_SINKS[0][0]) & ~frame["published"]]) == n_seeds


def test_the_published_sink_rates_do_not_claim_the_same_inputs():
    frame = published_beside_ours({"sink_rate": _rates("a")})
    assert not frame["comparable"].str.contains("same inputs").any()
    assert frame["comparable"].str.contains("other documents").any()
