"""The position-0 instruments (massive activations and their interventions, sink origin, rollout)
against plain hook computations, on whichever TransformerLens line is installed (marked tl4: the
same checks run on 3.9's HookedTransformer and on 4.3's TransformerBridge, so both lines give the
model's own numbers)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens_position.analyses.massive import massive_activations, massive_intervention
from lens_position.analyses.sink_origin import sink_origin, sink_origin_tokens
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.ground.errors import BadInputError
from lens_position.models import load_model

pytestmark = pytest.mark.tl4

NONE = Bootstrap(n_resamples=0)
# tiny random models have no activation of 100 and 1000x the median: thresholds that find some
LOW = {"min_magnitude": 0.0, "min_ratio": 4.0}


@pytest.fixture(scope="module")
def gemma():
    model = load_model("tiny-gemma3")
    return model, build_prompts(model, T=24, N=6)


def _cache(model, tokens, suffix):
    _, cache = model.model.run_with_cache(tokens, names_filter=lambda name: name.endswith(suffix))
    return {name: cache[name].detach().double() for name in cache.keys()}


def test_the_massive_table_is_the_plain_hook_computation(gemma):
    model, prompts = gemma
    result = massive_activations(model, prompts, bootstrap=NONE, progress=False, **LOW)
    resid = _cache(model, prompts.tokens, "hook_resid_post")
    patterns = _cache(model, prompts.tokens, "hook_pattern")
    for layer in range(model.spec.n_layers):
        flat = resid[f"blocks.{layer}.hook_resid_post"].abs().flatten(1)
        row = result.layers.iloc[layer]
        assert row["top1"] == pytest.approx(float(flat.max(1).values.mean()), rel=1e-5)
        assert row["top3"] == pytest.approx(float(flat.topk(3, 1).values[:, 2].mean()), rel=1e-5)
        assert row["median_abs"] == pytest.approx(float(flat.median(1).values.mean()), rel=1e-5)
        massive = (flat >= 4.0 * flat.median(1).values[:, None])
        assert row["n_massive"] == pytest.approx(float(massive.sum(1).double().mean()))
        if layer == 0:
            continue
        previous = resid[f"blocks.{layer - 1}.hook_resid_post"].abs().flatten(2)
        read = []
        for p in range(len(prompts)):
            flat_p = previous[p].flatten()
            hits = (flat_p >= 4.0 * flat_p.median()).nonzero().flatten() // previous.shape[-1]
            keys = sorted(set(hits.tolist()))
            pattern = patterns[f"blocks.{layer}.attn.hook_pattern"][p]
            read.append(pattern[:, max(keys):, keys].sum(-1).mean(-1) if keys else torch.zeros(pattern.shape[0]))
        ours = result.readers[result.readers["layer"] == layer].sort_values("head")["attention_on_massive"]
        np.testing.assert_allclose(ours.to_numpy(), torch.stack(read).mean(0).numpy(), atol=1e-6)


def test_set_zero_is_the_plain_hook_intervention(gemma):
    model, prompts = gemma
    layer, entries = 1, [(0, 3), (2, 5)]
    result = massive_intervention(model, prompts, layer=layer, entries=entries, modes=["set_zero"],
                                  bootstrap=Bootstrap(n_resamples=20), progress=False)
    row = result.frame.iloc[0]

    def zero(resid, hook=None):
        for position, dim in entries:
            resid[:, position, dim] = 0.0
        return resid

    with torch.no_grad():
        base = float(model.model(prompts.tokens, return_type="loss"))
        zeroed = float(model.model.run_with_hooks(prompts.tokens, return_type="loss",
                                                  fwd_hooks=[(f"blocks.{layer}.hook_resid_post", zero)]))
    assert row["loss_base"] == pytest.approx(base, rel=1e-5)
    assert row["loss"] == pytest.approx(zeroed, rel=1e-5)
    assert row["loss_change_lo"] <= row["loss_change"] <= row["loss_change_hi"]
    assert np.isfinite(row["R_rf_change"]) and row["entries"] == "(0, 3); (2, 5)"


def test_set_mean_of_an_entry_that_never_varies_changes_nothing(gemma):
    model, prompts = gemma  # position 0 holds BOS in every prompt: its layer output is one vector
    result = massive_intervention(model, prompts, layer=0, entries=[(0, 7)], bootstrap=NONE, progress=False)
    mean = result.frame.set_index("intervention").loc["set_mean"]
    assert mean["loss_change"] == pytest.approx(0.0, abs=1e-9) and mean["sink_rate_change"] == 0.0
    assert mean["R_rf_change"] == pytest.approx(0.0, abs=1e-9)


def test_no_massive_activation_is_refused_with_the_route(gemma):
    model, prompts = gemma
    with pytest.raises(BadInputError, match="name layer= and entries="):
        massive_intervention(model, prompts, bootstrap=NONE, progress=False)
    with pytest.raises(BadInputError, match="out of range for a model of 6 layers"):
        massive_intervention(model, prompts, layer=99, entries=[(0, 1)], bootstrap=NONE, progress=False)
    with pytest.raises(BadInputError, match="modes"):
        massive_intervention(model, prompts, layer=0, entries=[(0, 1)], modes=["set_one"], progress=False)


def test_sink_origin_reads_the_models_attention_at_each_location(gemma):
    model, _ = gemma
    body = build_prompts(model, T=24, N=4, bos="none").tokens
    result = sink_origin(model, body, moved_to=6, eps=0.05, bootstrap=NONE, progress=False)
    tokens = sink_origin_tokens(body, model.tokenizer.bos_token_id, 6)
    for condition, location, keys in (("no_bos", "position0", [0]), ("bos_doubled", "bos", [0, 1]),
                                      ("bos_moved", "bos", [6])):
        pattern = _cache(model, tokens[condition], "hook_pattern")
        heads = result.heads[(result.heads["condition"] == condition) & (result.heads["location"] == location)]
        for layer in range(model.spec.n_layers):
            by_hand = pattern[f"blocks.{layer}.attn.hook_pattern"][:, :, max(keys):, keys].sum(-1).mean(-1).mean(0)
            ours = heads[heads["layer"] == layer].sort_values("head")["sink_score"].to_numpy()
            np.testing.assert_allclose(ours, by_hand.numpy(), atol=1e-6, err_msg=f"{condition} {location} {layer}")
    assert result.origin == "inconclusive"  # no intervals asked for: nothing is decided


def test_the_rollout_is_the_plain_hook_product(gemma):
    from lens_position.analyses.rollout import attention_rollout

    model, prompts = gemma
    result = attention_rollout(model, prompts, bootstrap=NONE, progress=False)
    patterns = _cache(model, prompts.tokens, "hook_pattern")
    n, length = prompts.tokens.shape
    for residual, column in ((True, "flow_with_residual"), (False, "flow_without_residual")):
        product = torch.eye(length, dtype=torch.float64).repeat(n, 1, 1)
        for layer in range(model.spec.n_layers):
            mean = patterns[f"blocks.{layer}.attn.hook_pattern"].mean(1)
            if residual:
                mean = 0.5 * (mean + torch.eye(length, dtype=torch.float64))
            product = mean @ product
            assert result.layers.loc[layer, column] == pytest.approx(float(product[:, 1:, 0].mean()), abs=1e-6)


def test_the_position_checks_catch_a_doubled_bos_on_this_line(gemma):
    import warnings

    from lens_position.core.position_check import check_positions
    from lens_position.core.positions import PositionWarning

    model, prompts = gemma
    assert check_positions(model, prompts).ok
    doubled = prompts.tokens.clone()
    doubled[:, 1] = model.spec.bos_token_id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = check_positions(model, doubled)
    assert not report.ok and any(issubclass(w.category, PositionWarning) for w in caught)
