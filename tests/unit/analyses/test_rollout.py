"""Attention rollout to position 0: the product of head-averaged patterns, checked against hand
computations, against Wu et al.'s convergence result, and against a plain-hook computation on a model."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.rollout import attention_rollout, rollout_step
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.models import load_model


def _uniform_causal(T: int) -> torch.Tensor:
    """Every query attends equally to the keys it can see: ``U[i, j] = 1 / (i + 1)`` for ``j <= i``."""
    return torch.tril(torch.ones(T, T, dtype=torch.float64)) / torch.arange(1, T + 1, dtype=torch.float64)[:, None]


def test_one_uniform_layer_sends_one_over_i_plus_one_to_position_0():
    T = 6
    product = rollout_step(torch.eye(T, dtype=torch.float64)[None], _uniform_causal(T)[None], residual=False)
    assert torch.allclose(product[0, :, 0], 1 / torch.arange(1, T + 1, dtype=torch.float64))
    with_residual = rollout_step(torch.eye(T, dtype=torch.float64)[None], _uniform_causal(T)[None], residual=True)
    expected = 0.5 / torch.arange(1, T + 1, dtype=torch.float64)
    expected[0] = 1.0  # query 0: half from attention (all on itself), half from the skip
    assert torch.allclose(with_residual[0, :, 0], expected)


@settings(max_examples=30, deadline=None)
@given(T=st.integers(2, 12), seed=st.integers(0, 10_000), floor=st.floats(0.05, 0.5))
def test_without_the_residual_path_rollout_converges_to_the_first_token(T, seed, floor):
    """Wu et al.'s result: causal patterns whose weights stay bounded below send everything to the
    first token as depth grows; with the residual path half of each state stays where it was."""
    g = torch.Generator().manual_seed(seed)
    product = torch.eye(T, dtype=torch.float64)[None]
    kept = product.clone()
    for _ in range(400):
        weights = torch.tril(torch.rand(T, T, generator=g, dtype=torch.float64) + floor)
        pattern = (weights / weights.sum(1, keepdim=True))[None]
        product = rollout_step(product, pattern, residual=False)
        kept = rollout_step(kept, pattern, residual=True)
    assert torch.allclose(product[0, :, 0], torch.ones(T, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(product.sum(-1), torch.ones(1, T, dtype=torch.float64))  # still row-stochastic
    assert torch.allclose(kept[0, :, 0], torch.ones(T, dtype=torch.float64), atol=1e-3)  # slower, but there too


@pytest.fixture(scope="module")
def llama():
    return load_model("tiny-llama")


def test_the_curve_matches_a_plain_hook_computation(llama):
    prompts = build_prompts(llama, source="random", T=12, N=4, bos="force")
    result = attention_rollout(llama, prompts, bootstrap=Bootstrap(n_resamples=200), progress=False)
    _, cache = llama.model.run_with_cache(prompts.tokens)
    n_layers = llama.spec.n_layers
    for residual, column in ((True, "flow_with_residual"), (False, "flow_without_residual")):
        product = torch.eye(12, dtype=torch.float64).repeat(4, 1, 1)
        for layer in range(n_layers):
            mean = cache[f"blocks.{layer}.attn.hook_pattern"].to(torch.float64).mean(1)
            if residual:
                mean = 0.5 * (mean + torch.eye(12, dtype=torch.float64))
            product = mean @ product
            assert result.layers.loc[layer, column] == pytest.approx(float(product[:, 1:, 0].mean()), abs=1e-9)
    for column in ("flow_with_residual", "flow_without_residual"):
        lo, hi = result.layers[f"{column}_lo"], result.layers[f"{column}_hi"]
        assert ((0 <= lo) & (lo <= result.layers[column]) & (result.layers[column] <= hi) & (hi <= 1)).all()


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 20), n_heads=st.integers(1, 4), layers=st.integers(1, 5), residual=st.booleans(),
       rows=st.integers(1, 7), seed=st.integers(0, 10_000))
def test_following_position_0s_column_alone_equals_the_whole_product(T, n_heads, layers, residual, rows, seed):
    """The reducer follows P_l[:, 0] as a vector (O(T²) per layer, read in blocks of query rows): the
    same column as the whole product of rollout_step, for any block size."""
    from lens_position.analyses import rollout

    g = torch.Generator().manual_seed(seed)
    product = torch.eye(T, dtype=torch.float64)[None].repeat(2, 1, 1)
    column = product[:, :, 0].clone()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rollout, "FLOW_ROWS", rows)
        for _ in range(layers):
            weights = torch.tril(torch.rand(2, n_heads, T, T, generator=g))
            pattern = (weights / weights.sum(-1, keepdim=True)).to(torch.float32)
            product = rollout_step(product, pattern.to(torch.float64).mean(1), residual)
            column = rollout.flow_step(column, pattern, residual)
            torch.testing.assert_close(column, product[:, :, 0], rtol=1e-12, atol=1e-12)
            both = rollout.flow_step(torch.stack([column, column], -1), pattern, (residual, not residual))
            torch.testing.assert_close(both[..., 0], rollout.flow_step(column, pattern, residual))
            torch.testing.assert_close(both[..., 1], rollout.flow_step(column, pattern, not residual))
