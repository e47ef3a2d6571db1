"""The decomposition's key-set check by reductions over rectangles (``shows_key_set``) says what the
cell-by-cell definition says (``visible_keys(scores) == key_set`` everywhere), for causal and
sliding-window key sets, any query range, every way a mask is written (``-inf`` or ``finfo.min``) and
every kind of departure: a masked cell made visible, a key-set cell masked, an infinity or a NaN
anywhere (a hidden key's NaN or +inf too, which the definition alone calls masked), in any prompt and
head; and the decomposition names the cell."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.engine.design import PairDesign, PositionBins
from lens_position.analyses.engine.statistics import check_key_set, shows_key_set, visible_keys
from lens_position.ground.errors import NonFiniteError, UnsupportedArchitectureError
from tests.helpers.design_strategies import key_set_shapes


@st.composite
def masked_scores(draw):
    length, window, start, stop, keys = draw(key_set_shapes())
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]))
    design = PairDesign.build(length, window, start, stop, keys, PositionBins())
    batch, heads = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    scores = (torch.randn(batch, heads, length, length, generator=generator) * 5).to(dtype)
    fill = draw(st.sampled_from([-torch.inf, torch.finfo(dtype).min]))
    rows = torch.zeros(length, length, dtype=torch.bool)
    rows[start:stop] = design.key_set
    # rows outside the query range are masked like the model would, but are never checked
    scores = scores.masked_fill(~rows, fill)
    n_changes = draw(st.integers(0, 3))
    for _ in range(n_changes):
        b, h = draw(st.integers(0, batch - 1)), draw(st.integers(0, heads - 1))
        i, j = draw(st.integers(0, length - 1)), draw(st.integers(0, length - 1))
        value = draw(st.sampled_from([torch.inf, -torch.inf, torch.nan, torch.finfo(dtype).min, 0.5, -1e4]))
        scores[b, h, i, j] = value
    return scores, design


@settings(max_examples=400, deadline=None)
@given(masked_scores())
def test_the_fast_check_agrees_with_the_cell_by_cell_definition(case):
    scores, design = case
    rows = scores[:, :, design.query_start:design.query_stop]
    shows = bool((visible_keys(rows) == design.key_set).all())
    # visible_keys calls NaN and +inf masked; hidden there, they still make the softmax row NaN
    hidden_non_finite = bool(((rows.isnan() | (rows == torch.inf)) & ~design.key_set).any())
    assert shows_key_set(scores, design) == (shows and not hidden_non_finite)


def test_each_departure_is_caught_at_every_cell_of_a_causal_and_a_window_layer():
    for window in (None, 5):
        design = PairDesign.build(40, window, 0, 40, "all", PositionBins())
        clean = torch.randn(1, 2, 40, 40).masked_fill(~design.key_set, -torch.inf)
        assert shows_key_set(clean, design)
        for i in range(40):
            for j in range(40):
                changed = clean.clone()
                changed[0, 1, i, j] = 0.25 if not design.key_set[i, j] else -torch.inf
                assert not shows_key_set(changed, design), (window, i, j)


@pytest.mark.parametrize("value", [torch.nan, torch.inf])
def test_a_hidden_keys_nan_or_inf_is_named(value):
    design = PairDesign.build(12, None, 0, 12, "all", PositionBins())
    scores = torch.randn(2, 3, 12, 12).masked_fill(~design.key_set, -torch.inf)
    scores[1, 2, 4, 9] = value
    with pytest.raises(NonFiniteError, match=r"layer 3, head 2, prompt 7: the score of query 4 on key 9 .*hides"):
        check_key_set(scores, design, 3, torch.tensor([6, 7]))


def test_a_mask_that_is_not_the_key_set_is_still_refused_as_the_models():
    design = PairDesign.build(12, None, 0, 12, "all", PositionBins())
    scores = torch.randn(2, 3, 12, 12)  # no mask at all
    with pytest.raises(UnsupportedArchitectureError, match="not the causal/sliding-window key set"):
        check_key_set(scores, design, 0)
