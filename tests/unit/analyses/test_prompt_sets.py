"""The claims' numbers on independent prompt sets: disjoint sets, and a between-set spread that
agrees with the bootstrap interval on synthetic scores whose spread is known."""

import numpy as np
import pytest
import torch
from synthetic_scores import LENGTH, synthetic_scores

from lens_position.analyses.claims import claims_table
from lens_position.analyses.decompose import decompose
from lens_position.analyses.prompt_sets import SET_COLUMNS, SUMMARY_COLUMNS, between_sets, disjoint_prompt_sets
from lens_position.core.columns import display_order
from lens_position.core.intervals import Bootstrap
from lens_position.models.toy import offset_only_model, toy_tokens


def test_natural_prompt_sets_share_no_corpus_window(tiny_llama):
    sets = disjoint_prompt_sets(tiny_llama, 3, T=24, N=4, seed=5)
    starts = [set(p.spec.window_starts) for p in sets]
    assert [len(s) for s in starts] == [4, 4, 4]
    assert not (starts[0] & starts[1]) and not (starts[0] & starts[2]) and not (starts[1] & starts[2])
    rows = torch.cat([p.tokens for p in sets])
    assert len({tuple(r.tolist()) for r in rows}) == 12
    assert [p.spec.extra["prompt_set"] for p in sets] == [f"{k} of 3, disjoint windows" for k in (1, 2, 3)]


def test_random_prompt_sets_are_independent_draws(tiny_llama):
    sets = disjoint_prompt_sets(tiny_llama, 2, T=24, N=4, source="random", seed=7)
    assert [p.spec.seed for p in sets] == [7, 8]
    assert not torch.equal(sets[0].tokens, sets[1].tokens)


def test_between_set_spread_agrees_with_the_bootstrap_on_synthetic_scores():
    """20 independent sets of 16 sequences of synthetic scores (a key-0 bonus that varies between
    sequences): the standard deviation of the 20 estimates matches the one each set's bootstrap
    interval predicts, for the numbers of C1 (held-out T) and C2 (R', M'): the ratio's 95%
    interval contains 1. Measured (between-set SD / bootstrap SD): T 0.0186 / 0.0221 = 0.84
    [0.64, 1.23], R' 0.0174 / 0.0209 = 0.84 [0.64, 1.22], M' 0.0028 / 0.0031 = 0.90 [0.68, 1.31]."""
    model = offset_only_model(n_heads=1)
    decompositions = [decompose(model, toy_tokens(16, LENGTH, bos=False), fwd_hooks=[synthetic_scores(500 + k)],
                                bootstrap=Bootstrap(n_resamples=200), batch_size=16, progress=False)
                      for k in range(20)]
    result = between_sets(decompositions, name="synthetic")
    assert list(result.sets.columns) == display_order(SET_COLUMNS)
    assert list(result.spread.columns) == display_order(SUMMARY_COLUMNS)
    summary = result.spread.set_index("quantity")
    print(summary[["between_sd", "bootstrap_sd", "sd_ratio", "sd_ratio_lo", "sd_ratio_hi"]].to_string())
    assert list(summary.index) == ["total_heldout", "R_rf_heldout", "M_rf_heldout"]
    for quantity in ("total_heldout", "R_rf_heldout", "M_rf_heldout"):
        row = summary.loc[quantity]
        assert row.between_sd > 0 and row.n_sets == 20
        assert row.sd_ratio_lo <= 1.0 <= row.sd_ratio_hi, (quantity, row.sd_ratio)
    # each set's numbers are the claims' own: C1's estimate on set 1 is the claims table's value
    first = decompositions[0]
    tag = {"architecture": "synthetic", "role": "standard"}
    table = claims_table({"decompose_layers": first.layers.assign(**tag),
                          "decompose_replicates": first.replicates.assign(**tag)})
    c1 = table[(table.claim == "C1") & (table.architecture == "synthetic")].iloc[0]
    set1 = result.sets[(result.sets["set"] == 1) & (result.sets["quantity"] == "total_heldout")].iloc[0]
    assert (set1.value, set1.lo, set1.hi, set1.verdict) == (pytest.approx(c1.value), pytest.approx(c1.value_lo),
                                                            pytest.approx(c1.value_hi), c1.verdict)
    assert result.provenance["intervals"]["n_resamples"] == 200 and len(result.provenance["sets"]) == 20


def test_a_bootstrap_too_narrow_for_the_spread_between_sets_is_flagged():
    """Sets whose sequences share one bonus but whose bonus differs between sets: the bootstrap
    (within a set) sees almost no spread, the sets differ a lot; the ratio's interval lies above 1."""
    model = offset_only_model(n_heads=1)
    decompositions = []
    for k in range(8):
        def hook(scores, hook, k=k):
            n, h, q, key = scores.shape
            d = (torch.arange(q)[:, None] - torch.arange(key)[None, :]).clamp(min=0)
            values = -0.15 * d.to(torch.float64) + (0.5 + 0.2 * k) * (torch.arange(key) == 0)
            noise = 0.5 * torch.randn(n, h, q, key, generator=torch.Generator().manual_seed(k), dtype=torch.float64)
            return torch.where(torch.isfinite(scores), (values + noise).to(scores.dtype), scores)
        decompositions.append(decompose(model, toy_tokens(16, LENGTH, bos=False),
                                        fwd_hooks=[("blocks.0.attn.hook_attn_scores", hook)],
                                        bootstrap=Bootstrap(n_resamples=100), batch_size=16, progress=False))
    summary = between_sets(decompositions).spread.set_index("quantity")
    assert summary.loc["R_rf_heldout", "sd_ratio_lo"] > 1.0
    assert np.isfinite(summary["sd_ratio"]).all()


@pytest.mark.parametrize("p, k, expected", [
    (0.975, 1, 5.023886), (0.025, 1, 0.000982069), (0.975, 3, 9.348404), (0.025, 3, 0.215795),
    (0.025, 10, 3.246973), (0.975, 30, 46.979242),
])
def test_chi_square_quantiles_match_the_tables(p, k, expected):
    """The quantiles behind the sd_ratio interval, against published chi-square tables: exact
    also at one degree of freedom, where the Wilson–Hilferty approximation goes negative."""
    from lens_position.analyses.prompt_sets import _chi_square_quantile

    assert _chi_square_quantile(p, k) == pytest.approx(expected, rel=1e-5)


def test_two_prompt_sets_give_a_finite_ratio_interval():
    """K = 2 (one degree of freedom) is the smallest comparison: its interval is wide but finite."""
    model = offset_only_model(n_heads=1)
    decompositions = [decompose(model, toy_tokens(8, LENGTH, bos=False, seed=k),
                                fwd_hooks=[synthetic_scores(k)],
                                bootstrap=Bootstrap(n_resamples=50), batch_size=8, progress=False)
                      for k in range(2)]
    summary = between_sets(decompositions).spread
    assert (summary["n_sets"] == 2).all()
    assert np.isfinite(summary[["sd_ratio_lo", "sd_ratio_hi"]].to_numpy()).all()
    assert (summary["sd_ratio_lo"] <= summary["sd_ratio"]).all()
    assert (summary["sd_ratio"] <= summary["sd_ratio_hi"]).all()
