"""The reference-free split (mask-only counterfactual) against its ground truths, and an
explicit least-squares reference of it.

``lam = g(i - j) - logsumexp_{K(i)} g`` with ``g`` the offset-only fit of ``t`` up to one
constant per query; ``M' = Var(abs lam)/V``, ``R' = Var(abs log A - abs lam)/V``,
``C' = 2 Cov(abs lam, abs log A - abs lam)/V``, so ``T = R' + M' + C'``.
Scores are injected through ``fwd_hooks`` where the ground truth needs a term the toy models
do not make (a key term ``a(j)``).
"""

import numpy as np
import pytest
import torch

from lens_position.analyses.decompose import PairDesign, PositionBins, decompose
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

LENGTH = 40


def add_key_term(a: torch.Tensor):
    """A hook adding ``a(j)`` to every visible score of key ``j``."""

    def hook(scores, hook):
        return scores + a[: scores.shape[-1]].to(scores.dtype)  # -inf stays -inf

    return ("blocks.0.attn.hook_attn_scores", hook)


def test_offset_only_scores_have_zero_reference_free_residual_component():
    heads = decompose(offset_only_model(n_heads=2), toy_tokens(4, LENGTH, bos=False), progress=False).heads
    assert (heads.R_rf.abs() < 1e-10).all() and (heads.R_rf_heldout.abs() < 1e-10).all()
    assert (heads.C_rf.abs() < 1e-10).all()
    np.testing.assert_allclose(heads.M_rf, heads["total"], rtol=1e-9)
    assert (heads.M_rf > 0.01).all()


def test_a_key_term_in_a_full_sliding_window_has_no_mask_component():
    """The key count never changes, so the mask can do nothing: M' = 0, R' = T. The
    self-referenced split puts a(j) - a(i) into t and inflates both R and M (issue 10)."""
    window = 6
    a = torch.randn(LENGTH, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    heads = decompose(offset_only_model(window=window), toy_tokens(4, LENGTH, bos=False),
                      query_range=(window - 1, LENGTH), fwd_hooks=[add_key_term(a)], progress=False).heads
    assert (heads["total"] > 0.05).all()
    assert (heads.M_rf.abs() < 1e-10).all() and (heads.M_rf_heldout.abs() < 1e-10).all()
    np.testing.assert_allclose(heads.R_rf, heads["total"], rtol=1e-9)
    assert (heads.M > 0.05).all() and (heads.R > heads["total"]).all()  # what the self-referenced split says


def test_a_linear_key_term_is_exactly_relative():
    """a(j) = c j = c i - c (i - j): a per-query constant plus an offset term."""
    a = 0.3 * torch.arange(LENGTH, dtype=torch.float64)
    heads = decompose(offset_only_model(), toy_tokens(4, LENGTH, bos=False), fwd_hooks=[add_key_term(a)],
                      progress=False).heads
    assert (heads.R_rf.abs() < 1e-10).all() and (heads.R_rf_heldout.abs() < 1e-10).all()
    np.testing.assert_allclose(heads.M_rf, heads["total"], rtol=1e-9)
    assert (heads["total"] > 1e-4).all()


def test_uniform_scores_are_all_mask():
    heads = decompose(offset_only_model(uniform=True), toy_tokens(3, LENGTH, bos=False), progress=False).heads
    assert (heads.R_rf.abs() < 1e-12).all() and (heads.C_rf.abs() < 1e-12).all()
    np.testing.assert_allclose(heads.M_rf, heads["total"], rtol=1e-12)


def test_key0_bonus_gives_reference_free_residual_that_vanishes_without_it():
    tokens = toy_tokens(6, LENGTH, bos=True)
    with_bonus = decompose(offset_only_model(bos_bonus=2.0), tokens, progress=False).heads
    assert (with_bonus.R_rf > 0.01).all() and (with_bonus.R_rf_heldout > 0.01).all()
    without = decompose(offset_only_model(bos_bonus=0.0), tokens, progress=False).heads
    assert (without.R_rf.abs() < 1e-10).all()


def test_both_splits_add_up_to_the_same_total():
    heads = decompose(random_model(), torch.randint(0, 50, (6, 32), generator=torch.Generator().manual_seed(0)),
                      progress=False).heads
    np.testing.assert_allclose(heads.R_rf + heads.M_rf + heads.C_rf, heads["total"], atol=1e-12)
    np.testing.assert_allclose(heads.R_rf_heldout + heads.M_rf_heldout + heads.C_rf_heldout, heads.total_heldout,
                               atol=1e-12)


def test_reference_free_split_equals_an_explicit_least_squares_reference():
    """The streamed coordinates against lstsq on the explicit design matrix, pair by pair."""
    loaded = random_model(n_layers=1, attn_types=("global",), window=None, n_heads=2, n_kv_heads=1)
    tokens = torch.randint(0, 50, (5, 24), generator=torch.Generator().manual_seed(2))
    query_range = (3, 24)
    heads = decompose(loaded, tokens, query_range=query_range, progress=False).heads
    loaded.model.cfg.ungroup_grouped_query_attention = True  # the scores exactly as lens_position's own passes
    _, cache = loaded.model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_attn_scores")
    scores64 = cache["blocks.0.attn.hook_attn_scores"].to(torch.float64)
    scores, row_lse = scores64.numpy(), torch.logsumexp(scores64, dim=-1).numpy()  # -inf outside K(i)
    design = PairDesign.build(24, None, *query_range, "all", PositionBins())
    x = design.dense().numpy()
    x_rel = x[:, design.relative.numpy()]
    q, k = design.query.numpy(), design.key.numpy()
    d = q - k
    fe = np.zeros((len(q), 24 + 24))
    fe[np.arange(len(q)), d] = 1
    fe[np.arange(len(q)), 24 + q] = 1

    def absolute(y):  # y: [sequence, pair] -> abs part on one sequence's pairs, fitted on all
        xs, xr, ys = np.tile(x, (len(y), 1)), np.tile(x_rel, (len(y), 1)), y.reshape(-1)
        return x @ np.linalg.lstsq(xs, ys, rcond=None)[0] - x_rel @ np.linalg.lstsq(xr, ys, rcond=None)[0]

    for head in range(2):
        s = scores[:, head]
        t = s[:, q, k] - s[:, q, q]
        log_a = s[:, q, k] - row_lse[:, head][:, q]
        coef = np.linalg.lstsq(np.tile(fe, (len(t), 1)), t.reshape(-1), rcond=None)[0]
        g = coef[:24]
        lse = np.array([np.log(np.exp(g[: i + 1]).sum()) for i in range(24)])
        lam = g[d] - lse[q]
        abs_log_a, abs_lam = absolute(log_a), absolute(lam[None])
        v = log_a.var()
        residual = abs_log_a - abs_lam
        assert heads.M_rf[head] == pytest.approx(abs_lam.var() / v, rel=1e-8)
        assert heads.R_rf[head] == pytest.approx(residual.var() / v, rel=1e-8)
        assert heads.C_rf[head] == pytest.approx(2 * np.cov(abs_lam, residual, bias=True)[0, 1] / v,
                                                 rel=1e-6, abs=1e-10)
