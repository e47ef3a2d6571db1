"""The window-aware sink metric against the hand-set model of ``window_sink_model`` (its
docstring: a head that sinks on each window's first key, one that sinks on the absolute first
token, a uniform head; one sliding-window layer and one causal layer). Expected values are
computed from the closed-form scores, not from the model."""

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from window_sink_model import WINDOW, closed_form_pattern, window_sink_model

from lens_position.analyses import sinks
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel
from lens_position.models.toy import toy_tokens

T = 32


@pytest.fixture(scope="module")
def model():
    return window_sink_model()


@pytest.fixture(scope="module")
def result(model):
    return sinks.window_sinks(model, toy_tokens(4, T, bos=True, seed=1), progress=False)


def _expected(window):
    """Both scores of the three heads from the closed-form pattern: [head] each."""
    pattern = closed_form_pattern(T, window)
    first = sinks.first_visible_keys(T, window)
    on_first = pattern[:, torch.arange(T), first]
    return pattern[:, :, 0].mean(-1), on_first.mean(-1)


def test_the_hand_set_model_makes_the_closed_form_pattern(model):
    _, cache = model.model.run_with_cache(toy_tokens(1, T, bos=True))
    for layer, window in ((0, WINDOW), (1, None)):
        torch.testing.assert_close(cache[f"blocks.{layer}.attn.hook_pattern"][0], closed_form_pattern(T, window))


@pytest.mark.parametrize("layer,window", [(0, WINDOW), (1, None)])
def test_both_scores_equal_the_closed_form(result, layer, window):
    gu, aware = _expected(window)
    rows = result.heads[result.heads["layer"] == layer].sort_values("head")
    torch.testing.assert_close(torch.tensor(rows["gu_score"].to_numpy()), gu)
    torch.testing.assert_close(torch.tensor(rows["window_score"].to_numpy()), aware)


def test_a_head_sinking_on_the_window_first_key_is_a_sink_only_under_the_window_aware_metric(result):
    head = result.heads.set_index(["layer", "head"]).loc[(0, 0)]
    assert head["window_score"] > 0.99 and head["past_score"] > 0.99
    # Gu et al. count the zeros of the queries past the window: at most W of T queries see position 0
    assert head["gu_score"] <= WINDOW / T + 1e-12
    assert head["is_sink_window"] and not head["is_sink_gu"]


def test_a_head_sinking_on_the_absolute_first_token_scores_the_same_under_both_in_a_causal_layer(result):
    head = result.heads.set_index(["layer", "head"]).loc[(1, 1)]
    assert head["gu_score"] == pytest.approx(head["window_score"], abs=1e-15)
    assert head["gu_score"] > 0.9 and head["is_sink_gu"] and head["is_sink_window"]
    # in the window layer it sinks while position 0 is visible and is uniform past the window
    local = result.heads.set_index(["layer", "head"]).loc[(0, 1)]
    assert local["visible_score"] > 0.99
    assert local["past_score"] == pytest.approx(1 / WINDOW, abs=1e-12)


def test_a_uniform_head_scores_its_chance_level(result):
    for layer in (0, 1):
        head = result.heads.set_index(["layer", "head"]).loc[(layer, 2)]
        assert head["window_score"] == pytest.approx(head["uniform_score"], abs=1e-12)
    assert result.heads.loc[0, "uniform_score"] == pytest.approx(
        sum(1 / min(i + 1, WINDOW) for i in range(T)) / T)


def test_global_layers_give_both_metrics_the_same_numbers_and_gu_matches_sink_heads(model, result):
    global_rows = result.layer_types[result.layer_types["layer_type"] == "global"].set_index("metric")
    assert global_rows.loc["gu", "sink_rate"] == global_rows.loc["window_aware", "sink_rate"]
    reference = sinks.sink_heads(model, toy_tokens(4, T, bos=True, seed=1), progress=False)
    torch.testing.assert_close(torch.tensor(result.heads["gu_score"].to_numpy()),
                               torch.tensor(reference.frame["sink_score"].to_numpy()))


def test_per_layer_type_counts_read_the_heads(result):
    local = result.layer_types[result.layer_types["layer_type"] == "local"].set_index("metric")
    heads = result.heads[result.heads["layer"] == 0]
    assert local.loc["gu", "n_sink_heads"] == int(heads["is_sink_gu"].sum())
    assert local.loc["window_aware", "n_sink_heads"] == int(heads["is_sink_window"].sum())


def test_a_spec_whose_window_disagrees_with_the_mask_is_refused(model):
    wrong = LoadedModel(model=model.model, tokenizer=None, spec=dataclasses.replace(model.spec, window=2))
    with pytest.raises(BadInputError, match="outside the keys"):
        sinks.window_sinks(wrong, toy_tokens(2, T, bos=True), progress=False)


def test_the_result_saves_and_loads(result, tmp_path):
    again = load_result(result.save(tmp_path / "window_sinks"))
    assert isinstance(again, sinks.WindowSinks)
    assert again.heads.equals(result.heads) and again.layer_types.equals(result.layer_types)


def test_intervals_switch_off(model):
    out = sinks.window_sinks(model, toy_tokens(3, 8, bos=True), bootstrap=NO_INTERVALS, progress=False)
    assert out.heads["window_score_lo"].isna().all()


@settings(max_examples=60, deadline=None)
@given(length=st.integers(1, 300), window=st.one_of(st.none(), st.integers(1, 300)))
def test_the_first_visible_key_is_the_oldest_key_a_query_sees(length, window):
    first = sinks.first_visible_keys(length, window)
    queries = torch.arange(length)
    assert bool((first <= queries).all()) and bool((first >= 0).all())
    if window is not None:
        assert bool((queries - first + 1 <= window).all())  # f(i) is in the window
        older = first - 1
        assert bool(((older < 0) | (queries - older + 1 > window)).all())  # the key before is not
    else:
        assert bool((first == 0).all())


@settings(max_examples=40, deadline=None)
@given(T=st.integers(2, 40), window=st.one_of(st.none(), st.integers(1, 40)), rows=st.integers(1, 7),
       data=st.data())
def test_the_scores_read_in_blocks_of_queries_equal_those_read_whole(T, window, rows, data):
    """The window-aware scores read a pattern in blocks of query rows (never a float64 copy of the whole
    [head, T, T]): any block size gives the numbers of one block, and a leak outside the keys is seen
    in any block."""
    start = data.draw(st.integers(0, T - 1))
    stop = data.draw(st.integers(start + 1, T))
    first = sinks.first_visible_keys(T, window)
    keys, queries = torch.arange(T), torch.arange(T)
    visible = (keys[None] >= first[:, None]) & (keys[None] <= queries[:, None])
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 99)))
    pattern = torch.randn(2, 3, T, T, generator=generator).masked_fill(~visible, -torch.inf).softmax(-1)
    reducer = sinks.WindowSinkReducer.__new__(sinks.WindowSinkReducer)
    reducer.length, reducer.start, reducer.stop = T, start, stop

    def read(block_rows, p):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sinks, "_WINDOW_ROWS", block_rows)
            return reducer._read(p, sinks.first_visible_keys(T, window, start, stop))

    whole, blocked = read(10_000, pattern), read(rows, pattern)
    for a, b in zip(whole[:3], blocked[:3]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert whole[3] == blocked[3] == 0.0
    direct = pattern[:, :, start:stop].to(torch.float64).masked_fill(~visible[start:stop], 0.0)
    torch.testing.assert_close(blocked[1], direct.sum(-1), rtol=1e-12, atol=1e-12)  # the mass on the visible keys
    torch.testing.assert_close(blocked[2], direct[..., 0], rtol=0, atol=0)
    leak = pattern.clone()
    hidden = (~visible[start:stop]).nonzero()
    if len(hidden):
        q, k = hidden[data.draw(st.integers(0, len(hidden) - 1))].tolist()
        leak[1, 2, start + q, k] = 0.25
        assert read(rows, leak)[3] == pytest.approx(0.25)
