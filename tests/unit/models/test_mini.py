"""MiniTransformer computes what a HookedTransformer computes: every toy model of
lens_position.models.toy built both ways with the same weights, every hook the HookedTransformer
fires compared (TransformerLens 3.x: the reference class exists only there)."""

from __future__ import annotations

import pytest
import torch

from lens_position.analyses.decompose import decompose
from lens_position.ground.errors import BadInputError
from lens_position.models import toy
from lens_position.models.backends import backend_for, hooked_available
from lens_position.models.mini import MiniConfig, MiniTransformer
from lens_position.models.toy import random_model, toy_tokens
from lens_position.models.zoo.recipe import VARIANTS

pytestmark = pytest.mark.skipif(not hooked_available(), reason="the reference HookedTransformer is TransformerLens 3.x")

BUILDERS = {
    "offset_only": lambda: toy.offset_only_model(n_heads=2),
    "offset_only_gqa_bonus": lambda: toy.offset_only_model(n_heads=4, n_kv_heads=2, bos_bonus=2.0, n_layers=2),
    "offset_only_window": lambda: toy.offset_only_model(window=5, rotary_base=500.0),
    "random_local_global": lambda: toy.random_model(),
    "random_no_gqa": lambda: toy.random_model(n_kv_heads=None, attn_types=None, window=None),
    **{f"sink_{kind}": (lambda kind=kind: toy.sink_origin_model(kind)) for kind in toy.SINK_KINDS},
}


def _both(builder, monkeypatch):
    reference = builder()
    monkeypatch.setattr(toy, "hooked_available", lambda: False)
    mini = builder()
    monkeypatch.undo()
    assert isinstance(mini.model, MiniTransformer) and not isinstance(reference.model, MiniTransformer)
    missing, unexpected = mini.model.load_state_dict(reference.model.state_dict(), strict=False)
    assert not missing, missing
    assert all(name.split(".")[-1] in ("IGNORE", "mask", "rotary_sin", "rotary_cos") for name in unexpected), unexpected
    return reference, mini


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.parametrize("ungroup", [False, True])
def test_every_hook_the_hooked_transformer_fires_holds_the_same_numbers(name, ungroup, monkeypatch):
    reference, mini = _both(BUILDERS[name], monkeypatch)
    for model in (reference.model, mini.model):
        model.cfg.ungroup_grouped_query_attention = ungroup and bool(model.cfg.n_key_value_heads)
    tokens = toy_tokens(3, 20, d_vocab=int(reference.model.cfg.d_vocab), seed=1)
    logits_ref, cache_ref = reference.model.run_with_cache(tokens)
    logits_mini, cache_mini = mini.model.run_with_cache(tokens)
    tolerance = 1e-12 if reference.model.cfg.dtype == torch.float64 else 1e-5
    torch.testing.assert_close(logits_mini, logits_ref, atol=tolerance, rtol=tolerance)
    fired = set(cache_ref.cache_dict)
    assert fired == set(cache_mini.cache_dict), fired ^ set(cache_mini.cache_dict)
    for hook in fired:
        torch.testing.assert_close(cache_mini[hook], cache_ref[hook], atol=tolerance, rtol=tolerance, msg=hook)
    assert set(mini.model.hook_dict) <= set(reference.model.hook_dict)
    for what in ("loss", None):
        a, b = reference.model(tokens, return_type=what), mini.model(tokens, return_type=what)
        assert (a is None and b is None) or torch.allclose(a, b, atol=tolerance)
    mid = reference.model(tokens, stop_at_layer=1)
    torch.testing.assert_close(mini.model(tokens, stop_at_layer=1), mid, atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(mini.model(mid, start_at_layer=1), reference.model(mid, start_at_layer=1),
                               atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("name", ["offset_only_gqa_bonus", "random_local_global"])
def test_the_spec_and_the_backend_read_the_same_facts(name, monkeypatch):
    reference, mini = _both(BUILDERS[name], monkeypatch)
    assert mini.spec == reference.spec.__class__(**{**reference.spec.__dict__, "extra": mini.spec.extra})
    ref_backend, mini_backend = backend_for(reference.model), backend_for(mini.model)
    assert mini_backend.kind == "hooked"
    for layer in range(reference.spec.n_layers):
        a, b = ref_backend.rotary_layout(layer), mini_backend.rotary_layout(layer)
        torch.testing.assert_close(a.frequencies, b.frequencies)
        assert (a.adjacent_pairs, a.rotary_dim, a.scale) == (b.adjacent_pairs, b.rotary_dim, b.scale)
    tokens = toy_tokens(4, 24, d_vocab=reference.spec.extra.get("d_vocab", int(reference.model.cfg.d_vocab)), seed=2)
    a = decompose(reference, tokens, progress=False).heads
    b = decompose(mini, tokens, progress=False).heads
    torch.testing.assert_close(torch.tensor(b["total"].to_numpy()), torch.tensor(a["total"].to_numpy()),
                               atol=1e-6, rtol=1e-5)


def test_random_model_on_the_mini_line_is_seeded():
    def built(seed):
        return toy.new_toy_model(dict(n_layers=1, d_model=8, d_head=4, n_heads=2, n_ctx=16, d_vocab=10, d_mlp=16,
                                      normalization_type="RMS", init_weights=True, initializer_range=0.3, seed=seed),
                                 what="a test model", line="mini")
    a, b, c = built(0), built(0), built(1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.blocks[0].attn.W_Q, c.blocks[0].attn.W_Q)
    assert random_model().spec.n_layers == 2


@pytest.mark.parametrize("bad", [dict(normalization_type="LN"), dict(positional_embedding_type="alibi"),
                                 dict(attn_only=False), dict(attn_types=["local"])])
def test_a_configuration_it_cannot_compute_is_refused(bad):
    base = dict(n_layers=1, d_model=4, d_head=4, n_heads=1, n_ctx=8, d_vocab=8, attn_only=True)
    with pytest.raises(BadInputError):
        MiniTransformer(MiniConfig(**{**base, **bad}))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_zoo_variant_computes_the_same_as_a_mini_transformer(variant, monkeypatch):
    """What TransformerLens 4.x trains and loads (zoo:learned, zoo training) is what 3.x does: each
    shipped checkpoint in a MiniTransformer gives the HookedTransformer's logits and patterns."""
    from safetensors.torch import load_file

    from lens_position.models import backends, load_model
    from lens_position.models.zoo import architecture
    from lens_position.models.zoo.store import find

    reference = load_model(f"zoo:{variant}", backend="hooked")
    monkeypatch.setattr(backends, "hooked_available", lambda: False)
    mini = architecture.build_model(find(f"zoo:{variant}").recipe, initialise=False)
    monkeypatch.undo()
    assert isinstance(mini, MiniTransformer)
    architecture.load_parameters(mini, load_file(str(find(f"zoo:{variant}").weights)))
    tokens = toy_tokens(2, 48, d_vocab=int(reference.model.cfg.d_vocab), seed=4)
    names = lambda name: name.endswith(("hook_pattern", "hook_resid_post"))  # noqa: E731
    logits_ref, cache_ref = reference.model.run_with_cache(tokens, names_filter=names)
    logits_mini, cache_mini = mini.run_with_cache(tokens, names_filter=names)
    torch.testing.assert_close(logits_mini, logits_ref, atol=1e-4, rtol=1e-4)
    for hook in cache_ref.cache_dict:
        torch.testing.assert_close(cache_mini[hook], cache_ref[hook], atol=1e-4, rtol=1e-4, msg=hook)
