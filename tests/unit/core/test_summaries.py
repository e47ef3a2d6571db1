"""What a researcher sees first: every result's short repr, HTML, summary() and top_heads(),
checked on one result of every analysis (tests/helpers/all_results.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
from all_results import all_results, instrument_results, results
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.core.columns import RECOMMENDED
from lens_position.ground.errors import BadInputError

SCREEN_LINES, SCREEN_COLUMNS = 30, 120
NAMES = list(results())
INSTRUMENTS = ("RotaryBands", "Position0Convergence", "WindowSinks")  # tests/helpers/all_results.py


def test_every_result_type_of_the_analyses_is_among_those_checked():
    import importlib
    import pkgutil

    import lens_position.analyses as analyses
    from lens_position.core.results import SavedResult

    for info in pkgutil.iter_modules(analyses.__path__):
        importlib.import_module(f"lens_position.analyses.{info.name}")

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    defined = {c.__name__ for c in subclasses(SavedResult) if c.__module__.startswith("lens_position.analyses")}
    checked = {*NAMES, *INSTRUMENTS}
    assert set(instrument_results()) == set(INSTRUMENTS)
    assert defined <= checked, f"result types whose printed summary no test checks: {sorted(defined - checked)}"
    for cls in subclasses(SavedResult):  # a @dataclass without repr=False would print every table in full
        if cls.__module__.startswith("lens_position.analyses"):
            assert cls.__repr__ is SavedResult.__repr__ or cls.__name__ == "Analysis", cls.__name__


@pytest.mark.parametrize("name", [*NAMES, *INSTRUMENTS])
def test_every_result_prints_at_most_a_screen_naming_what_it_measured_and_its_tables(name):
    result = results()[name] if name in NAMES else instrument_results()[name]
    text = repr(result)
    lines = text.splitlines()
    assert len(lines) <= SCREEN_LINES and max(map(len, lines)) <= SCREEN_COLUMNS, text
    assert f"{name}:" in text and result.WHAT in text
    for f in dataclasses.fields(result):
        if isinstance(getattr(result, f.name), pd.DataFrame):
            assert f".{f.name} (" in text
    assert "random-weight model" in text or name == "Comparison"  # the tiny model is untrained
    html = result._repr_html_()
    assert html.startswith("<div") or html.startswith("<p>")
    assert len(html) < 8000  # the 17,800-character dataclass repr is what this replaces


@pytest.mark.parametrize("name", NAMES)
def test_summary_is_a_small_tidy_frame_of_the_headline_numbers(name):
    result = results()[name]
    frame = result.summary()
    assert list(frame.columns) == ["quantity", "label", "value", "lo", "hi", "meaning"]
    assert len(frame) <= 12
    with_interval = frame.dropna(subset=["lo", "hi"])
    assert (with_interval["lo"] <= with_interval["hi"]).all()


def test_the_decomposition_headline_is_the_layer_mean_of_the_recommended_split_with_its_replicate_interval():
    result = results()["Decomposition"]
    frame = result.summary().set_index("quantity")
    assert list(frame.index) == ["R_rf_heldout", "M_rf_heldout", "total_heldout"]
    for column in frame.index:
        # independently: the mean over layers, and the percentiles of that mean over replicates
        assert frame.loc[column, "value"] == pytest.approx(result.heads[column].mean(), rel=1e-12)
        # held-out components get the percentile interval (lens_position.core.intervals)
        means = result.replicates.groupby("replicate")[column].mean().to_numpy()
        assert frame.loc[column, "lo"] == pytest.approx(np.quantile(means, 0.025), rel=1e-9)
        assert frame.loc[column, "hi"] == pytest.approx(np.quantile(means, 0.975), rel=1e-9)


@pytest.mark.parametrize("name", [n for n in NAMES if results()[n].HEADS is not None])
def test_top_heads_are_the_largest_by_the_ranking_column(name):
    result = results()[name]
    table, by = result.HEADS
    frame = getattr(result, table)
    top = result.top_heads(3)
    assert top.columns[list(top.columns).index(by)] == by and len(top) == min(3, len(frame))
    key = frame[by].abs() if by.endswith("_change") else frame[by]
    expected = np.sort(key.to_numpy(dtype=float))[::-1][:3]
    got = top[by].abs() if by.endswith("_change") else top[by]
    np.testing.assert_allclose(got.to_numpy(dtype=float), expected)


def test_top_heads_by_another_column_and_refusals():
    result = results()["Decomposition"]
    top = result.top_heads(2, by="M_rf_heldout")
    np.testing.assert_allclose(top["M_rf_heldout"], np.sort(result.heads["M_rf_heldout"])[::-1][:2])
    with pytest.raises(BadInputError, match="not a numeric column"):
        result.top_heads(2, by="layer_type")
    with pytest.raises(BadInputError, match="no per-head table"):
        results()["ProbeResult"].top_heads()


@settings(max_examples=25, deadline=None)
@given(st.one_of(st.integers(max_value=0), st.floats(), st.text(max_size=3), st.booleans()))
def test_top_heads_refuses_any_n_that_is_not_a_positive_integer(n):
    with pytest.raises(BadInputError, match="positive integer"):
        results()["Decomposition"].top_heads(n)


@pytest.mark.parametrize("name", NAMES)
def test_every_table_starts_with_its_identity_and_recommended_columns(name):
    result = results()[name]
    for f in dataclasses.fields(result):
        frame = getattr(result, f.name)
        if not isinstance(frame, pd.DataFrame):
            continue
        columns = list(frame.columns)
        recommended = [c for c in RECOMMENDED if c in columns]
        if recommended:
            others = [c for c in columns if c not in recommended and not c.endswith(("_lo", "_hi"))
                      and c not in ("condition", "replacement", "ablation", "patch_layer", "set", "claim",
                                    "quantity", "layer", "head", "position", "layer_type")]
            assert columns.index(recommended[0]) < min((columns.index(c) for c in others), default=len(columns))


def test_analysis_answers_with_the_recommended_numbers_and_saves_as_one_folder(tmp_path):
    analysis = results()["Analysis"]
    decomposition = results()["Decomposition"]
    # the same prompts: the decomposition inside is the plain one, number for number
    pd.testing.assert_frame_equal(analysis.decomposition.heads, decomposition.heads)
    r = analysis.summary().set_index("quantity").loc["R_rf_heldout", "value"]
    assert f"R' = {r:.3g}" in analysis.answer and "causal mask's" in analysis.answer
    assert "attention sink" in analysis.answer and "Replacing the BOS embedding" in analysis.answer
    assert analysis.answer.startswith("These numbers come from a small model with random weights")
    again = type(analysis).load(analysis.save(tmp_path / "analysis"))
    assert again.answer == analysis.answer
    pd.testing.assert_frame_equal(again.bos_replacement.overall, analysis.bos_replacement.overall)


def test_analysis_without_bos_says_that_bos_replacement_was_not_run():
    from lens_position.analyses.analyze import analyze
    from lens_position.core.data import build_prompts

    model = all_results()["model"]
    prompts = build_prompts(model, source="random", T=16, N=4, bos="none")
    analysis = analyze(model, prompts, progress=False)
    assert analysis.bos is None and analysis.bos_replacement is None
    assert "BOS replacement was not run" in analysis.answer


@pytest.mark.parametrize("name", NAMES)
def test_a_printed_summary_and_top_heads_fit_80_columns_with_every_value_and_interval(name):
    """print(result.summary()) in an 80-column terminal shows each headline value with its interval
    (counts as integers); top_heads() prints its ranking column with its interval, within 80 columns."""
    from lens_position.core.summaries import fmt

    result = results()[name]
    text = str(result.summary())
    assert all(len(line) <= 80 for line in text.splitlines()), text
    assert "..." not in text.splitlines()[0]
    for headline in result.headline():
        assert fmt(headline.estimate) in text, (headline.label, text)
        if headline.quantity == "is_sink":
            assert f"{int(headline.estimate.value)}" in text and ".000000" not in text
    if getattr(result, "HEADS", None):
        table = result.top_heads(3)
        printed = str(table)
        assert all(len(line) <= 80 for line in printed.splitlines()), printed
        by = result.HEADS[1]
        assert by in printed.splitlines()[0]
        assert isinstance(table, pd.DataFrame) and by in table.columns  # the frame keeps every column


def test_a_loaded_model_prints_a_few_lines_with_what_it_is():
    from lens_position.models import load_model

    model = load_model("tiny-gemma3")
    text = repr(model)
    assert len(text) <= 1000 and len(text.splitlines()) <= 6
    for fact in ("tiny-gemma3", "gemma3", "hooked", "6 layers x 4 heads", "window 16 on 5 of 6 layers", "float32",
                 model.spec.weights_sha256[:12], ".model"):
        assert fact in text, fact
    assert "Embed" not in text  # the module tree is .model's own repr
    assert model._repr_html_().startswith("<pre>")
