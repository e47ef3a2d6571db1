"""Positional leakage (ΔR²): what it sees and does not see, shown on hand-set ground truths, and the
properties of the authors' procedure that a comparison with their numbers must know."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses import leakage_stats as stats
from lens_position.analyses.leakage import leakage_texts, positional_leakage
from lens_position.core.intervals import benjamini_hochberg
from lens_position.ground.errors import BadInputError

pytestmark = pytest.mark.tl4
T = 64
QUERY = torch.arange(T, dtype=torch.float64)[:, None].expand(T, T)
KEY = torch.arange(T, dtype=torch.float64)[None, :].expand(T, T)


def _noise(seed, size=0.1):
    return size * torch.randn(T, T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _delta_r2(scores):
    return float(stats.scores_leakage(scores[None], np.random.default_rng(0))[0, 2])


def _pattern(scores):
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~causal, -torch.inf), dim=-1)


def test_a_per_query_ramp_has_large_leakage_and_no_effect_on_attention():
    noise = _noise(0)
    ramp = noise + 0.5 * QUERY
    assert _delta_r2(ramp) > 0.5 and abs(_delta_r2(noise)) < 0.01
    torch.testing.assert_close(_pattern(ramp), _pattern(noise), atol=1e-12, rtol=0)


def test_a_key_ramp_and_a_relative_ramp_attend_alike_but_only_one_leaks():
    """Within a query row ``c j = c i - c (i - j)``: the same pattern as a relative ramp, yet ΔR² calls it absolute."""
    noise = _noise(1)
    key_ramp, relative_ramp = noise + 0.5 * KEY, noise - 0.5 * (QUERY - KEY)
    torch.testing.assert_close(_pattern(key_ramp), _pattern(relative_ramp), atol=1e-12, rtol=0)
    assert _delta_r2(key_ramp) > 0.5
    assert abs(_delta_r2(relative_ramp)) < 1e-3


def test_a_key0_bonus_that_takes_the_attention_barely_leaks():
    bonus = _noise(2) + 8.0 * (KEY == 0)
    assert float(_pattern(bonus)[1:, 0].mean()) > 0.9
    assert _delta_r2(bonus) < 0.1


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_any_function_of_the_offset_alone_has_no_leakage(seed):
    """ΔR² reads the scores before the softmax: a relative-only head (whose absolute signal is all mask
    component M') never shows leakage, whatever its profile. ΔR² is not exactly zero: a non-linear
    profile leaves a residual shared by every pair at one offset, so the extra query term fits ~T
    clusters by chance on the training pairs and pays for it on the held-out ones (a held-out penalty,
    always negative; over 400 profiles it ranged from -0.015 to +2e-5)."""
    profile = torch.randn(T, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    scores = profile[(QUERY - KEY).clamp(min=0).long()] + _noise(seed % 1000, 0.05)
    assert -0.05 < _delta_r2(scores) < 1e-3


def test_the_authors_step_finds_heads_on_pure_noise_where_benjamini_hochberg_does_not():
    runs = [np.random.default_rng(seed).uniform(size=512) for seed in range(200)]
    authors = [int((stats.authors_qvalues(p) <= 0.05).sum()) for p in runs]
    textbook = [int((benjamini_hochberg(p) <= 0.05).sum()) for p in runs]
    assert min(authors) > 0  # every run declares heads significant
    assert np.mean([n > 0 for n in textbook]) <= 0.12  # about alpha of the runs declare any


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=40))
def test_the_authors_step_equals_benjamini_hochberg_only_on_sorted_input(p_values):
    p = np.sort(np.asarray(p_values))
    np.testing.assert_allclose(stats.authors_qvalues(p), np.minimum.accumulate((p * len(p) / np.arange(1, len(p) + 1))
                                                                               [::-1])[::-1], atol=1e-15)


def test_the_authors_bands_split_one_rotate_half_frequency_over_two_bands():
    """Hugging Face Llama pairs dimension p with p + d/2; the authors' bands take (2p, 2p+1)."""
    d_head, n_pairs = 64, 32
    q, k = torch.zeros(T, d_head), torch.zeros(T, d_head)
    angle = torch.arange(T, dtype=torch.float32)
    for x in (q, k):  # all of the score in the fastest frequency, pair 0 = dimensions 0 and 32
        x[:, 0], x[:, 32] = torch.cos(angle), torch.sin(angle)
    authors = stats.band_energy_shares(q, k, stats.authors_band_dims(n_pairs), causal=False)
    own = stats.band_energy_shares(q, k, [tuple(d for p in range(a, a + 4) for d in (p, p + 32))
                                          for a in range(0, 32, 4)], causal=False)
    assert own[0] == pytest.approx(1.0)
    assert authors[0] + authors[5] == pytest.approx(1.0)
    assert authors[0] == pytest.approx(0.5, abs=0.02)


def test_at_sixteen_sequences_the_significant_set_depends_on_the_draw():
    """512 heads, a quarter with a small true gap (0.6 of one sequence's spread): the textbook step
    on two draws of 16 sequences keeps sets that overlap far from fully."""
    rng = np.random.default_rng(0)
    effect = np.where(np.arange(512) % 4 == 0, 0.6, 0.0)
    sets = []
    for _ in range(2):
        diffs = effect + rng.standard_normal((16, 512))
        q = benjamini_hochberg(stats.one_sided_sign_flip(diffs, 5000, 0))
        sets.append(set(np.flatnonzero(q <= 0.05)))
    assert sets[0] and sets[1]
    assert stats.jaccard(*sets) < 0.8


def test_one_sided_sign_flip_is_exact_for_few_units():
    effects = np.array([[1.0], [2.0], [3.0]])
    assert stats.one_sided_sign_flip(effects, 100, 0)[0] == pytest.approx(1 / 8)


def test_leakage_texts_are_plain_sentences():
    texts = leakage_texts()
    assert len(texts) >= 100
    assert all(15 <= len(t.split()) <= 45 and t[-1] in ".!?" and "`" not in t for t in texts)


@pytest.mark.parametrize("options, message", [
    ({"mode": "paper"}, "mode="), ({"alpha": 0}, "alpha"), ({"alpha": 1.5}, "alpha"), ({"n_samples": 1}, "n_samples"),
    ({"max_length": 4}, "max_length"), ({"layers": [7]}, "layer"), ({"n_seeds": 0}, "n_seeds"),
])
def test_bad_options_are_refused_by_name(tiny_llama, options, message):
    with pytest.raises(BadInputError, match=message):
        positional_leakage(tiny_llama, leakage_texts()[:4], progress=False, **options)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.text(alphabet="ab ", max_size=6), min_size=1, max_size=3))
def test_texts_too_short_for_a_held_out_fit_are_refused(tiny_llama, texts):
    with pytest.raises(BadInputError, match="fewer than|at least one"):
        positional_leakage(tiny_llama, texts, mode="authors", n_samples=2, progress=False)


def test_corrected_mode_needs_as_many_distinct_texts_as_samples(tiny_llama):
    with pytest.raises(BadInputError, match="distinct texts"):
        positional_leakage(tiny_llama, leakage_texts()[:3], n_samples=4, progress=False)


def test_corrected_mode_reports_the_overlap_of_seeds_and_a_calibrated_interval(tiny_llama):
    result = positional_leakage(tiny_llama, leakage_texts()[:8], n_samples=6, n_seeds=2, n_perm=200, progress=False)
    assert len(result.seeds) == 1 and 0 <= result.seeds["jaccard"].iloc[0] <= 1
    heads = result.heads
    assert set(heads["significant_share"]) <= {0.0, 0.5, 1.0}
    assert (heads["leakage_gap_lo"] <= heads["leakage_gap"]).all()
    assert (heads["leakage_gap"] <= heads["leakage_gap_hi"]).all()
    assert set(result.bands["band"]) <= {f"band {k}" for k in range(10)} | {"unrotated"}
    shares = result.bands.groupby(["layer", "head"])["energy_share"].sum()
    np.testing.assert_allclose(shares.to_numpy(), 1.0, atol=1e-9)


def test_the_published_table_puts_the_authors_run_first_and_ours_beside_it(tiny_llama):
    from lens_position.analyses.leakage import PUBLISHED, published_table

    ours = positional_leakage(tiny_llama, leakage_texts()[:6], mode="authors", n_samples=4, n_perm=100,
                              progress=False)
    table = published_table({"tiny-llama": ours})
    first = table.iloc[0]
    assert (first["n_significant"], first["n_heads"], first["top_head"]) == (85, 512, "L5H24")
    assert first["leakage_gap"] == PUBLISHED.top_gap[0]
    row = table.iloc[1]
    assert row["n_heads"] == 12 and row["mode"] == "authors" and row["n_samples"] == 4
    assert row["n_significant"] == int(ours.heads["significant"].sum())
