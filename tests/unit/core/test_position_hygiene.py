"""Position hygiene: each mistake about position 0 or the position ids is caught, by class.

``lp.check_positions`` reports every check; the input door issues the warnings before any
analysis. Each test feeds one mistake (a doubled BOS, a missing BOS, BOS inside a row, left
padding, shifted position ids, a dropped first token) and checks it is named; property tests
draw the mistake's place and size, and clean prompts, at random.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import lens_position as lp
from lens_position.core.inputs import checked_prompts
from lens_position.ground.errors import BadInputError

BOS, EOS, PAD = 1, 2, 0  # the tiny models' tokenizer ids
_SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def llama():
    return lp.load_model("tiny-llama")  # its tokenizer prepends no BOS


@pytest.fixture(scope="module")
def gemma():
    return lp.load_model("tiny-gemma3")  # its tokenizer prepends BOS


def _clean(N: int, T: int, seed: int, bos: bool = True) -> torch.Tensor:
    """Token ids with no BOS, EOS or pad anywhere but BOS at position 0 (when ``bos``)."""
    tokens = torch.randint(3, 200, (N, T), generator=torch.Generator().manual_seed(seed))
    if bos:
        tokens[:, 0] = BOS
    return tokens


def _status(report, check: str) -> str:
    return report.frame.set_index("check").loc[check, "status"]


def test_clean_prompts_pass_every_check(llama):
    with warnings.catch_warnings():
        warnings.simplefilter("error", lp.PositionWarning)
        report = lp.check_positions(llama, _clean(3, 12, 0), position_ids=torch.arange(12))
    assert report.ok
    assert _status(report, "bos_doubled") == "ok" and _status(report, "position_ids") == "ok"


@_SETTINGS
@given(N=st.integers(1, 4), T=st.integers(3, 24), seed=st.integers(0, 10_000), data=st.data())
def test_a_doubled_bos_is_named_wherever_it_is(llama, N, T, seed, data):
    tokens = _clean(N, T, seed)
    rows = data.draw(st.lists(st.integers(0, N - 1), min_size=1, unique=True))
    tokens[rows, 1] = BOS
    with pytest.warns(lp.DoubledBosWarning, match="BOS .* twice"):
        report = lp.check_positions(llama, tokens)
    assert sorted(report.frame.set_index("check").loc["bos_doubled", "rows"]) == sorted(rows)
    with pytest.raises(BadInputError, match="twice"):
        lp.check_positions(llama, tokens, strict=True)


def test_a_missing_bos_is_named_where_the_tokenizer_puts_one(gemma, llama):
    tokens = _clean(2, 10, 1, bos=False)
    with pytest.warns(lp.MissingBosWarning, match="no BOS at position 0"):
        lp.check_positions(gemma, tokens)
    with warnings.catch_warnings():  # a tokenizer that prepends none: nothing to miss
        warnings.simplefilter("error", lp.PositionWarning)
        assert _status(lp.check_positions(llama, tokens), "bos_missing") == "not checked"


@_SETTINGS
@given(T=st.integers(4, 24), seed=st.integers(0, 10_000), data=st.data())
def test_bos_inside_a_row_is_named(llama, T, seed, data):
    tokens = _clean(2, T, seed)
    at = data.draw(st.integers(2, T - 1))
    tokens[1, at] = BOS
    with pytest.warns(lp.BosInsideWarning, match="after position 0"):
        report = lp.check_positions(llama, tokens)
    assert report.frame.set_index("check").loc["bos_inside", "rows"] == [1]


def test_left_padding_is_named_even_when_every_row_has_the_same_run(llama):
    tokens = _clean(3, 10, 2)
    tokens[:, :3] = PAD  # equal pad runs: the door's ragged-padding check cannot see these
    with pytest.warns(lp.PaddedStartWarning, match="left padding"):
        lp.check_positions(llama, tokens)


@_SETTINGS
@given(T=st.integers(2, 24), shift=st.integers(1, 50), row=st.integers(0, 2))
def test_position_ids_that_do_not_count_from_zero_are_refused(llama, T, shift, row):
    ids = torch.arange(T).repeat(3, 1)
    ids[row] += shift  # left padding of ``shift`` tokens, as a padded batch's position ids are
    with pytest.raises(BadInputError, match=r"do not count 0 \.\. T - 1"):
        lp.check_positions(llama, {"input_ids": _clean(3, T, 3), "position_ids": ids})


def test_a_dropped_first_token_is_refused_against_the_texts(llama):
    texts = ["the quick brown fox jumps over the lazy dog", "a second text that is long enough to cut"]
    checked = checked_prompts(llama, texts, bos="force")
    dropped = torch.cat([checked.tokens[:, :1], checked.tokens[:, 2:]], dim=1)  # BOS kept, first word lost
    with pytest.raises(BadInputError, match="not the start of their texts' tokens"):
        lp.check_positions(llama, dropped, texts=texts)
    assert lp.check_positions(llama, checked.tokens, texts=texts).ok


def test_the_input_door_warns_before_any_analysis(llama):
    """The door issues the warnings on token ids, and on strings the ones their BOS policy does
    not decide: a text that already starts with BOS, given BOS again, is a doubled BOS."""
    tokens = _clean(2, 10, 4)
    tokens[:, 1] = BOS
    with pytest.warns(lp.DoubledBosWarning):
        checked_prompts(llama, tokens)
    bos_text = llama.tokenizer.decode([BOS])
    with pytest.warns(lp.DoubledBosWarning):
        checked_prompts(llama, [bos_text + " the quick brown fox", bos_text + " a second text here"], bos="force")
    with warnings.catch_warnings():  # the policy none is deliberate: no missing-BOS warning
        warnings.simplefilter("error", lp.PositionWarning)
        checked_prompts(llama, ["the quick brown fox", "a second text here"], bos="none")


@pytest.mark.parametrize("route", ["decompose", "checked_prompts", "check_positions"])
def test_a_position_warning_names_the_researchers_own_line(route):
    from lens_position.analyses.decompose import decompose
    from lens_position.core.inputs import checked_prompts
    from lens_position.core.intervals import NO_INTERVALS
    from lens_position.core.position_check import check_positions
    from lens_position.core.positions import BosInsideWarning
    from lens_position.models.toy import random_model

    loaded = random_model(n_layers=1, d_vocab=50, seed=1)
    tokens = torch.randint(2, 50, (3, 10))
    tokens[1, 4] = loaded.spec.bos_token_id
    calls = {"decompose": lambda: decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False),
             "checked_prompts": lambda: checked_prompts(loaded, tokens),
             "check_positions": lambda: check_positions(loaded, tokens)}
    with pytest.warns(BosInsideWarning) as record:
        calls[route]()
    assert {w.filename for w in record if issubclass(w.category, BosInsideWarning)} == {__file__}
