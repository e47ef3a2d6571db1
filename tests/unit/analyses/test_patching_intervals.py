"""Per-cell uncertainty of a patching sweep: per-prompt values, bootstrap intervals over whole
prompts and sign-flip p-values, checked on a synthetic model whose true effect is a closed form."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.analyses import patching
from lens_position.core.intervals import Bootstrap, benjamini_hochberg, sign_flip_pvalue
from lens_position.ground.errors import BadInputError

READ_LOGIT = 3
TARGET_TOKENS = torch.arange(2, 10)
SOURCE_TOKENS = torch.arange(10, 18)


def _residual_only_model() -> HookedTransformer:
    """Attention and MLP write nothing, there is no final norm: the logits at a position are
    ``W_E[token] @ W_U + b_U``, so patching ``resid_pre[0]`` at the last position from a source
    token ``s`` into a target token ``t`` changes the read logit by ``(W_E[s] - W_E[t]) @ W_U[:, k]``."""
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=20, act_fn="relu",
                                  positional_embedding_type="rotary", normalization_type=None)
    model = HookedTransformer(cfg)
    with torch.no_grad():
        for name in ("W_O", "b_O"):
            getattr(model.blocks[0].attn, name).zero_()
        for name in ("W_out", "b_out"):
            getattr(model.blocks[0].mlp, name).zero_()
    return model


def _read_logit(model, tokens):
    return (model.W_E[tokens] @ model.W_U[:, READ_LOGIT]).detach()


def last_logit(logits):
    return logits[:, -1, READ_LOGIT]  # one value per prompt: reduce="none"


def _draw(n_prompts: int, seed: int, source_tokens=SOURCE_TOKENS):
    generator = torch.Generator().manual_seed(seed)
    target = TARGET_TOKENS[torch.randint(len(TARGET_TOKENS), (n_prompts, 3), generator=generator)]
    source = target.clone()
    source[:, -1] = source_tokens[torch.randint(len(source_tokens), (n_prompts,), generator=generator)]
    return target, source


def test_cells_carry_per_prompt_values_baseline_and_their_effects():
    model = _residual_only_model()
    target, source = _draw(6, seed=0)
    sweep = patching.resid_pre_sweep(model, target, source, last_logit, reduce="none", progress=False)
    assert sweep.values.shape == (1, 3, 6) and not sweep.reduced
    expected = _read_logit(model, source[:, -1]) - _read_logit(model, target[:, -1])
    torch.testing.assert_close(sweep.effect()[0, 2], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(sweep.baseline, _read_logit(model, target[:, -1]) + model.b_U[READ_LOGIT].detach(),
                               atol=1e-5, rtol=0)
    # positions before the last cannot change the last logit (causal attention; here nothing mixes)
    assert sweep.effect()[0, :2].abs().max() < 1e-5
    row = sweep.frame.set_index("position").loc[2]
    assert row["effect_lo"] <= row["effect"] <= row["effect_hi"]
    assert row["effect"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert set(sweep.frame.columns) >= {"metric", "metric_lo", "metric_hi", "effect", "effect_lo", "effect_hi",
                                        "p_value"}


def test_interval_coverage_of_the_true_effect_is_near_its_level():
    model = _residual_only_model()
    true_effect = float(_read_logit(model, SOURCE_TOKENS).mean() - _read_logit(model, TARGET_TOKENS).mean())
    spread = float((_read_logit(model, SOURCE_TOKENS)[:, None] - _read_logit(model, TARGET_TOKENS)[None]).std())
    n_prompts, n_experiments = 10, 300
    covered, covered_wrong = 0, 0
    bootstrap = Bootstrap(n_resamples=400)
    for seed in range(n_experiments):
        target, source = _draw(n_prompts, seed=seed)
        frame = patching.resid_pre_sweep(model, target, source, last_logit, positions=[2], reduce="none",
                                         bootstrap=bootstrap, progress=False).frame
        lo, hi = float(frame["effect_lo"].iloc[0]), float(frame["effect_hi"].iloc[0])
        covered += lo <= true_effect <= hi
        # a value 1.5 standard errors off: an interval that covers everything would cover it too
        wrong = true_effect + 1.5 * spread / n_prompts ** 0.5
        covered_wrong += lo <= wrong <= hi
    # 95% intervals; binomial sd of the coverage over 300 experiments is 1.3 points
    assert 0.90 <= covered / n_experiments <= 0.99
    assert covered_wrong / n_experiments < 0.8


def test_p_values_hold_their_level_under_no_effect_and_find_a_real_one():
    model = _residual_only_model()
    # a real effect: source tokens among the 4 with the highest read logit, target tokens in
    # TARGET_TOKENS (all with lower ones), so every prompt's effect is positive
    ranked = _read_logit(model, torch.arange(20)).argsort(descending=True)
    high = ranked[:4]
    assert _read_logit(model, high).min() > _read_logit(model, TARGET_TOKENS[~torch.isin(TARGET_TOKENS, high)]).max()
    null, real = [], []
    for seed in range(100):
        target, source = _draw(10, seed=seed, source_tokens=TARGET_TOKENS)  # s, t exchangeable: no effect
        null.append(float(patching.resid_pre_sweep(model, target, source, last_logit, positions=[2], reduce="none",
                                                   progress=False).frame["p_value"].iloc[0]))
        target, source = _draw(10, seed=seed, source_tokens=high)
        keep = ~torch.isin(target[:, -1], high)
        target, source = target[keep], source[keep]
        real.append(float(patching.resid_pre_sweep(model, target, source, last_logit, positions=[2], reduce="none",
                                                   progress=False).frame["p_value"].iloc[0]))
    # an exact test rejects at most 5% of the time under the null; 100 draws: sd 2.2 points
    assert np.mean(np.array(null) <= 0.05) <= 0.10
    # all effects positive: only the all-plus and all-minus sign vectors reach the observed mean
    assert max(real) <= 2 / 2 ** 7


def test_exact_sign_flip_pvalue_is_the_share_of_sign_vectors_as_extreme():
    # effects 1, 2, 3: of the 8 sign vectors only (+,+,+) and (-,-,-) reach |mean| = 2
    assert sign_flip_pvalue(np.array([1.0, 2.0, 3.0])) == pytest.approx(2 / 8)
    assert sign_flip_pvalue(np.zeros((4, 2))).tolist() == [1.0, 1.0]
    assert np.isnan(sign_flip_pvalue(np.array([1.0])))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=20))
def test_sign_flip_pvalue_is_a_probability_and_sign_symmetric(effects):
    values = np.array(effects)
    p = float(sign_flip_pvalue(values))
    assert 0 < p <= 1
    assert float(sign_flip_pvalue(-values)) == pytest.approx(p)


def test_intervals_need_per_prompt_values_and_a_metric_of_the_right_shape():
    model = _residual_only_model()
    target, source = _draw(4, seed=0)
    scalar = patching.resid_pre_sweep(model, target, source, lambda logits: last_logit(logits).mean(), progress=False)
    with pytest.raises(BadInputError, match="reduce='none'"):
        scalar.bootstrap_ci()
    with pytest.raises(BadInputError, match="one value per target prompt"):
        patching.resid_pre_sweep(model, target, source, lambda logits: last_logit(logits).mean(), reduce="none",
                                 progress=False)
    with pytest.raises(BadInputError, match="a scalar"):
        patching.resid_pre_sweep(model, target, source, last_logit, progress=False)
    with pytest.raises(BadInputError, match="at least 2 prompts"):
        patching.resid_pre_sweep(model, target[:1], source[:1], last_logit, reduce="none", progress=False)


def test_the_interval_figure_marks_exactly_the_cells_with_bh_q_below_five_percent():
    from lens_position.report import plots

    model = _residual_only_model()
    target, source = _draw(8, seed=1)
    sweep = patching.resid_pre_sweep(model, target, source, last_logit, reduce="none", progress=False)
    fig = plots.patching_sweep_intervals(sweep)
    marks = {(x, y) for x, y in zip(fig.data[1].x, fig.data[1].y)}
    frame = sweep.frame
    assert np.allclose(frame["q_value"], benjamini_hochberg(frame["p_value"].to_numpy()))
    expected = {(int(r.position), int(r.layer)) for r in frame.itertuples() if r.q_value < 0.05}
    assert marks == expected and len(expected) == 1  # position 2 moves the last logit, 0 and 1 cannot
    assert fig.data[1].meta["quantity"] == "bh_discovery"
    # a frame saved without q-values: computed from its p-values, among the whole sweep
    assert {(x, y) for x, y in zip(*(plots.patching_sweep_intervals(frame.drop(columns=["q_value"])).data[1][axis]
                                     for axis in ("x", "y")))} == expected
    assert fig.data[0].meta["quantity"] == "effect"
    assert [v for row in fig.data[0].z for v in row] == pytest.approx(frame.sort_values(["layer", "position"])
                                                                       ["effect"].tolist())
    with pytest.raises(BadInputError, match="effect_lo"):
        plots.patching_sweep_intervals(frame.drop(columns=["effect_lo"]))
