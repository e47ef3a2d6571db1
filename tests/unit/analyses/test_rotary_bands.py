"""Position by rotary frequency band against ground truths.

- ``band_model.one_band_model(p)``: offset-only scores plus a BOS key vector in rotated pair
  ``p`` alone, so every absolute signal lives in band ``p``: the exact split must put all of
  ``R`` in that band (every other band and every cross term float noise), and removing that
  band must leave ``R' = 0`` (what is left is offset-only).
- A band's removal is checked against an independent route: zeroing the band's query
  dimensions in a one-layer model (``W_O = 0``) removes exactly its scores, and
  :func:`decompose` of that model must give the same ``R'``.
- On a random float32 model with grouped-query attention and a sliding window, the bands
  plus the cross terms equal ``R`` to float round-off.
"""

import math

import pytest
import torch
from band_model import D_HEAD, ROTARY_DIM, one_band_model
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import decompose
from lens_position.analyses.rotary_bands import RotaryBands, frequency_bands, rotary_bands, rotary_frequencies
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

TOKENS = toy_tokens(6, 24, bos=True, seed=0)


@pytest.mark.parametrize("pair", [0, 3])
def test_an_absolute_signal_in_one_band_is_split_into_that_band_alone(pair):
    result = rotary_bands(one_band_model(pair), TOKENS, progress=False)
    heads = result.heads
    assert (heads["R"] > 1e-4).all()  # the ground truth has a residual component to split
    bands = result.bands
    own = bands[bands["band_index"] == pair].set_index("head")
    torch.testing.assert_close(torch.tensor(own["R_band"].to_numpy()), torch.tensor(heads["R"].to_numpy()),
                               rtol=1e-9, atol=1e-14)
    assert bands.loc[bands["band_index"] != pair, "R_band"].abs().max() < 1e-12
    assert result.cross["C_band"].abs().max() < 1e-12
    assert heads["R_split_error"].abs().max() < 1e-12
    assert heads["score_error"].max() < 1e-12
    # what is left without the band is offset-only: no reference-free residual component
    assert own["R_rf_without_band"].abs().max() < 1e-12
    torch.testing.assert_close(torch.tensor(own["R_rf_attribution"].to_numpy()),
                               torch.tensor(heads["R_rf"].to_numpy()), rtol=1e-9, atol=1e-14)


def test_the_attribution_error_is_the_sum_of_attributions_minus_r_prime():
    result = rotary_bands(one_band_model(1), TOKENS, progress=False)
    total = result.bands.groupby("head")["R_rf_attribution"].sum().to_numpy()
    torch.testing.assert_close(torch.tensor(result.heads["R_rf_attribution_error"].to_numpy()),
                               torch.tensor(total - result.heads["R_rf"].to_numpy()))


def test_removing_a_band_matches_decompose_of_the_model_without_that_band():
    band = 1
    model = one_band_model(band)
    result = rotary_bands(model, TOKENS, bootstrap=NO_INTERVALS, progress=False)
    dims = list(frequency_bands(model, 0)[band].dims)
    without = one_band_model(band)
    with torch.no_grad():
        without.model.blocks[0].attn.W_Q[:, :, dims] = 0.0
    reference = decompose(without, TOKENS, bootstrap=NO_INTERVALS, progress=False).heads
    rows = result.bands[result.bands["band_index"] == band].sort_values("head")
    torch.testing.assert_close(torch.tensor(rows["R_rf_without_band"].to_numpy()),
                               torch.tensor(reference["R_rf"].to_numpy()), rtol=1e-9, atol=1e-13)


def test_offset_only_scores_have_nothing_in_any_band():
    result = rotary_bands(offset_only_model(d_head=D_HEAD, n_heads=2), TOKENS, progress=False)
    assert result.bands["R_band"].abs().max() < 1e-12
    assert result.bands["R_rf_attribution"].abs().max() < 1e-12


def test_bands_plus_cross_terms_equal_r_on_a_random_model_with_gqa_and_a_window():
    model = random_model(n_layers=2, n_heads=4, n_kv_heads=2, d_head=8, window=6)
    tokens = torch.randint(0, 50, (6, 20), generator=torch.Generator().manual_seed(3))
    result = rotary_bands(model, tokens, n_bands=2, progress=False)
    heads = result.heads
    assert (heads["R"] > 1e-3).any()
    # the bands are float64 sums of the rotated q and k; R is read from the model's float32 scores,
    # whose round-off (relative 6e-8) bounds the agreement
    assert (heads["R_split_error"].abs() <= 1e-6 * heads["R"].abs().clip(lower=1e-3)).all()
    assert heads["score_error"].max() < 1e-4  # float32 scores against float64 band sums
    bands = result.bands
    assert bands["R_band_lo"].notna().all()
    assert (bands["R_band_lo"] <= bands["R_band_hi"]).all()


def test_frequencies_are_read_from_the_model_and_follow_the_rotary_base():
    base = 500.0
    model = offset_only_model(d_head=D_HEAD, rotary_base=base)
    expected = base ** (-torch.arange(ROTARY_DIM // 2, dtype=torch.float64) * 2 / ROTARY_DIM)
    torch.testing.assert_close(rotary_frequencies(model, 0), expected)
    bands = frequency_bands(model, 0, 2)
    assert [b.name for b in bands] == ["band 0", "band 1", "unrotated"]
    assert bands[0].inv_freq_min >= bands[1].inv_freq_max  # fastest first
    assert bands[1].wavelength_max == pytest.approx(2 * math.pi / float(expected[-1]))


@settings(max_examples=20, deadline=None)
@given(n_bands=st.integers(1, ROTARY_DIM // 2))
def test_bands_partition_the_head_dimensions(n_bands):
    bands = frequency_bands(offset_only_model(d_head=D_HEAD), 0, n_bands)
    dims = sorted(d for band in bands for d in band.dims)
    assert dims == list(range(D_HEAD))


@settings(max_examples=20, deadline=None)
@given(n_bands=st.one_of(st.integers(-3, 0), st.integers(ROTARY_DIM // 2 + 1, 40)))
def test_more_bands_than_pairs_or_none_are_refused(n_bands):
    with pytest.raises(BadInputError):
        frequency_bands(offset_only_model(d_head=D_HEAD), 0, n_bands)


def test_the_result_saves_and_loads(tmp_path):
    result = rotary_bands(one_band_model(0), TOKENS, bootstrap=NO_INTERVALS, progress=False)
    again = load_result(result.save(tmp_path / "bands"))
    assert isinstance(again, RotaryBands)
    assert again.bands.equals(result.bands) and again.heads.equals(result.heads)


@settings(max_examples=40, deadline=None)
@given(n_kv=st.sampled_from([1, 2, 4]), data=st.data())
def test_band_scores_read_block_by_block_equal_the_whole_tensor(n_kv, data):
    """The split's scores are computed one block at a time (never [band, batch, head, T, T] whole): any
    block gives every band's scores (target b) and the scores without them (target bands + b) equal to
    the same cells of the whole tensors where the model shows them, and the check against the model's
    scores reads them: a wrong scale is an error of the scores' size."""
    from lens_position.analyses.rotary_bands import Band, _BandSets, band_scores

    batch, T, n_heads, d = 2, 12, 4, 8
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 1000)))
    q, k = torch.randn(batch, T, n_heads, d, generator=generator), torch.randn(batch, T, n_kv, d, generator=generator)
    bands = [Band(name=f"band {i}", dims=dims, first_pair=0, stop_pair=0, inv_freq_min=0.0,
                  inv_freq_max=0.0) for i, dims in enumerate([(0, 4), (1, 5), (2, 3, 6, 7)])]
    whole = band_scores(q, k, bands, 2.0)  # [band, batch, head, q, k]
    fill = data.draw(st.sampled_from([-torch.inf, torch.finfo(torch.float32).min]))
    shown = torch.ones(T, T, dtype=torch.bool).tril()
    scores = whole.sum(0).to(torch.float32).masked_fill(~shown, fill)
    h0 = data.draw(st.integers(0, n_heads - 1))
    h1 = data.draw(st.integers(h0 + 1, n_heads))
    q0 = data.draw(st.integers(0, T - 1))
    q1 = data.draw(st.integers(q0 + 1, T))
    k0 = data.draw(st.integers(0, q1 - 1))
    k1 = data.draw(st.integers(k0 + 1, T))
    cells = (slice(None), slice(h0, h1), slice(q0, q1), slice(k0, k1))
    sets = _BandSets(q, k, scores, bands, 2.0)
    assert sets.shape == tuple(scores.shape)
    got = dict(sets.blocks(slice(h0, h1), slice(q0, q1), slice(k0, k1)))
    assert sorted(got) == list(range(2 * len(bands)))
    visible = shown[q0:q1, k0:k1]
    for b in range(len(bands)):
        torch.testing.assert_close(got[b][..., visible], whole[b][cells][..., visible], rtol=1e-6, atol=1e-5)
        without = scores.to(torch.float64)[cells] - whole[b][cells]
        torch.testing.assert_close(got[len(bands) + b][..., visible], without[..., visible], rtol=1e-6, atol=1e-5)
    assert sets.error < 1e-4 and sets.size == pytest.approx(float(scores[cells][..., visible].abs().max()))
    wrong = _BandSets(q, k, scores, bands, 1.0)  # another scale: the bands do not add up to the scores
    list(wrong.blocks(slice(h0, h1), slice(q0, q1), slice(k0, k1)))
    assert wrong.error == pytest.approx(sets.size)
