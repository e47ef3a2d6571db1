"""Prefix reuse: a patch at (layer l, position p) leaves positions < p unchanged, so a sweep that
computes only positions >= p (the target run's keys and values for the others) gives the numbers
of TransformerLens's full-length sweeps, with rotary positions, grouped-query attention, sliding
windows and learned absolute position embeddings; models that cannot do it fall back or refuse."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens import patching as tl_patching

from lens_position.analyses import patching
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import random_model


def late_and_early_logits(logits):
    # reads an early position too: the reused prefix's logits must be the target run's
    return logits[:, -1, 3].mean() - logits[:, -2, 7].mean() + logits[:, 2, 5].mean()


def _pair(d_vocab: int, n: int = 3, length: int = 12, seed: int = 0):
    target = torch.randint(2, d_vocab, (n, length), generator=torch.Generator().manual_seed(seed))
    source = target.clone()
    source[:, 0] = (source[:, 0] + 1) % d_vocab
    source[:, length // 2] = (source[:, length // 2] + 3) % d_vocab
    return target, source


def _learned_position_model() -> HookedTransformer:
    torch.manual_seed(5)
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4, d_vocab=50,
                                  act_fn="gelu", positional_embedding_type="standard", normalization_type="LN")
    return HookedTransformer(cfg)


MODELS = {
    "gqa-sliding-rotary": lambda: random_model(n_layers=3, attn_types=("local", "global", "local"), window=5, seed=1),
    "learned-positions": _learned_position_model,
}
TL_TWINS = [
    ("resid_pre", tl_patching.get_act_patch_resid_pre, patching.get_act_patch_resid_pre),
    ("attn_out", tl_patching.get_act_patch_attn_out, patching.get_act_patch_attn_out),
    ("z", tl_patching.get_act_patch_attn_head_out_by_pos, patching.get_act_patch_attn_head_out_by_pos),
]


def _hooked(model):
    return getattr(model, "model", model)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("activation,theirs,ours", TL_TWINS, ids=[t[0] for t in TL_TWINS])
def test_prefix_reuse_gives_transformerlens_numbers(model_name, activation, theirs, ours):
    model = MODELS[model_name]()
    hooked = _hooked(model)
    target, source = _pair(hooked.cfg.d_vocab)
    _, cache = hooked.run_with_cache(source)
    reference = theirs(hooked, target, cache, late_and_early_logits)
    reused = ours(model, target, cache, late_and_early_logits, batch_size=5, reuse_prefix=True)
    full = ours(model, target, cache, late_and_early_logits, batch_size=5, reuse_prefix=False)
    torch.testing.assert_close(reused, reference, atol=1e-5, rtol=0)
    torch.testing.assert_close(full, reference, atol=1e-5, rtol=0)
    assert (reference - reference.flatten()[0]).abs().max() > 1e-3  # the cells differ: a real sweep


def test_prefix_reuse_computes_fewer_token_layers_and_the_floor_at_batch_one():
    model = MODELS["gqa-sliding-rotary"]()
    target, source = _pair(50, n=2)
    n_layers, (n_rows, n_pos) = 3, target.shape
    reused = patching.resid_pre_sweep(model, target, source, late_and_early_logits, batch_size=n_rows,
                                      reuse_prefix=True, progress=False)
    full = patching.resid_pre_sweep(model, target, source, late_and_early_logits, batch_size=n_rows,
                                    reuse_prefix=False, progress=False)
    floor = patching.min_token_layers(range(n_layers), range(n_pos), n_rows, n_pos, n_layers)
    # one condition per pass: every pass computes exactly what its patch can change
    assert reused.provenance["options"]["token_layers"] == floor
    # without reuse each of the n_pos cells of layer l computes all n_pos positions of n_layers - l blocks
    assert full.provenance["options"]["token_layers"] == n_rows * n_pos * n_pos * sum(
        n_layers - l for l in range(n_layers))
    assert floor < full.provenance["options"]["token_layers"] * 0.6
    assert reused.provenance["options"]["reuse_prefix"] and not full.provenance["options"]["reuse_prefix"]
    torch.testing.assert_close(reused.values, full.values, atol=1e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 11)), min_size=1, max_size=20),
       st.integers(1, 40))
def test_any_plan_covers_every_condition_once_within_the_batch(starts, batch_size):
    n_rows = 2
    plan = patching.plan_passes(starts, n_rows, 12, batch_size)
    covered = sorted(i for step in plan for i in step.conditions)
    assert covered == list(range(len(starts)))
    for step in plan:
        assert len(step.conditions) <= max(1, batch_size // n_rows)
        assert all(starts[i][0] == step.layer and starts[i][1] >= step.position for i in step.conditions)
        assert step.position == min(starts[i][1] for i in step.conditions)


def test_a_key_value_patch_at_a_position_matches_the_full_computation():
    model = MODELS["gqa-sliding-rotary"]()
    target, source = _pair(50)
    store = patching.cache_activations(model, source, ["blocks.1.attn.hook_k", "blocks.1.attn.hook_v",
                                                       "blocks.2.attn.hook_q"])
    conditions = [patching.head_kv_patches(model, store, layer=1, head=h, position=p)
                  for h in (0, 3) for p in (0, 4, 11)]
    conditions += [[patching.Patch("blocks.2.attn.hook_q", store["blocks.2.attn.hook_q"][:, 7, 1], position=7, head=1)]]
    reused = patching.run_patches(model, target, conditions, lambda logits: logits, reuse_prefix=True, progress=False)
    full = patching.run_patches(model, target, conditions, lambda logits: logits, reuse_prefix=False, progress=False)
    torch.testing.assert_close(reused, full, atol=1e-5, rtol=0)
    assert (full[-1] - full[0]).abs().max() > 1e-3


def test_models_that_cannot_reuse_fall_back_or_refuse():
    torch.manual_seed(0)
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_ctx=16, d_head=4, n_heads=4, d_vocab=20,
                                  act_fn="relu", positional_embedding_type="shortformer")
    model = HookedTransformer(cfg)
    assert "shortformer" in patching.prefix_reuse_unsupported(model)
    target, source = _pair(20, length=6)
    with pytest.raises(BadInputError, match="cannot reuse the target run's prefix"):
        patching.resid_pre_sweep(model, target, source, late_and_early_logits, reuse_prefix=True, progress=False)
    fallback = patching.resid_pre_sweep(model, target, source, late_and_early_logits, progress=False)
    assert not fallback.provenance["options"]["reuse_prefix"]
    rotary = MODELS["gqa-sliding-rotary"]()
    with pytest.raises(BadInputError, match="reads hooks"):
        patching.run_patches(
            rotary,
            target,
            [[]],
            lambda acts: acts["blocks.0.hook_resid_post"],
            read=["blocks.0.hook_resid_post"],
            reuse_prefix=True,
        )
    with pytest.raises(TypeError, match="expected a LoadedModel"):
        patching.prefix_reuse_unsupported(torch.nn.Linear(2, 2))


def test_hooks_are_removed_after_a_reusing_pass_fails():
    model = MODELS["gqa-sliding-rotary"]()
    target, source = _pair(50)

    def failing(logits):
        raise RuntimeError("metric failed")

    with pytest.raises(RuntimeError, match="metric failed"):
        patching.resid_pre_sweep(model, target, source, failing, reuse_prefix=True, progress=False)
    assert all(not hp._forward_hooks for hp in model.model.hook_dict.values())


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["resid_pre", "attn_out", "z"])
def test_prefix_reuse_gives_transformerlens_numbers_on_smollm2(smollm2, activation):
    from lens_position.core.data import build_prompts

    target = build_prompts(smollm2, source="natural", T=12, N=2, bos="force", seed=0).tokens
    source = target.clone()
    source[:, 5] = (source[:, 5] + 1) % smollm2.model.cfg.d_vocab
    hooked = smollm2.model
    layers = [0, 14, 29]
    names = [patching.SWEPT_ACTIVATIONS[activation].format(layer=l) for l in layers]
    _, cache = hooked.run_with_cache(source, names_filter=lambda n: n in names)
    reused = patching.activation_sweep(smollm2, target, cache, late_and_early_logits, activation, layers=layers,
                                       reuse_prefix=True, progress=False)
    assert reused.provenance["options"]["reuse_prefix"]
    # TransformerLens's functions sweep every layer (960 forward passes for z): cells of the swept
    # layers are computed here as they compute them, one full forward pass with one hook each; for z,
    # every position of one head per layer (a different head each layer) and every head at the
    # changed position and the last one
    per_head = activation == "z"
    assert reused.values.shape == (len(layers), target.shape[1], *([hooked.cfg.n_heads] if per_head else []))
    for i, name in enumerate(names):
        for p, h in _cells(hooked, activation, target.shape[1], i):
            tl = _tl_cell(hooked, target, cache, name, p, h, late_and_early_logits)
            torch.testing.assert_close(reused.values[(i, p, h) if per_head else (i, p)], tl, atol=2e-4, rtol=0)


def _cells(hooked, activation, T, layer_index):
    if activation != "z":
        return [(p, None) for p in range(T)]
    head = (4 * layer_index) % hooked.cfg.n_heads
    return sorted({(p, head) for p in range(T)} | {(p, h) for p in (5, T - 1) for h in range(hooked.cfg.n_heads)})


def _tl_cell(hooked, target, cache, name, position, head, metric):
    """One cell as TransformerLens's patching computes it: a full forward pass with one hook."""
    def hook(activation, hook):
        if head is None:
            activation[:, position] = cache[name][:, position]
        else:
            activation[:, position, head] = cache[name][:, position, head]
        return activation

    with torch.no_grad():
        return metric(hooked.run_with_hooks(target, fwd_hooks=[(name, hook)]))
