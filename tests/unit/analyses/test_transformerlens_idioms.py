"""TransformerLens in, TransformerLens out: a researcher's own HookedTransformer (or subclass),
their ActivationCache and get_act_name names work wherever lens_position takes a model, a source
activation or a hook name, and mean the same thing for every loader."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.analyses.decompose import decompose
from lens_position.models.spec import as_loaded


def _grouped_model(seed: int = 0) -> HookedTransformer:
    torch.manual_seed(seed)
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4, n_key_value_heads=2,
                                  d_vocab=60, act_fn="gelu", positional_embedding_type="rotary",
                                  normalization_type="RMS", model_name="my-gqa", seed=seed)
    return HookedTransformer(cfg)


class MyHooked(HookedTransformer):
    """A researcher's subclass (as HookedSAETransformer is)."""


def test_bare_model_gets_weights_hash_class_and_bos_in_provenance():
    model = _grouped_model()
    tokens = torch.randint(1, 60, (3, 12), generator=torch.Generator().manual_seed(0))
    result = decompose(model, tokens, progress=False)
    spec = result.provenance["model"]
    assert spec["name"] == "my-gqa" and spec["source"].startswith("custom:")
    assert spec["weights_sha256"] and len(spec["weights_sha256"]) == 64
    assert spec["extra"]["class"].endswith("HookedTransformer") and "bos_token_id" in spec
    with torch.no_grad():
        model.W_E[0, 0] += 1.0  # another model now: another hash
    assert as_loaded(model).spec.weights_sha256 != spec["weights_sha256"]


def test_subclass_of_hooked_transformer_is_accepted():
    model = MyHooked(_grouped_model().cfg)
    tokens = torch.randint(1, 60, (2, 10), generator=torch.Generator().manual_seed(1))
    result = decompose(model, tokens, progress=False)
    assert len(result.heads) == 2 * 4
    assert as_loaded(model).spec.extra["class"].endswith("MyHooked")


@pytest.mark.fault(area="your model", given="a grouped-query HookedTransformer (ungroup_grouped_query_attention "
                                            "False) analysed, then used again by its owner",
                   happens="its flag is False again after the analysis (its own hook_v patches keep their meaning); "
                           "lens_position's passes see one key/value per query head, with the same numbers")
def test_a_grouped_model_keeps_its_setting_and_the_passes_see_one_key_per_query_head():
    model = _grouped_model()
    tokens = torch.randint(1, 60, (2, 10), generator=torch.Generator().manual_seed(2))
    grouped_logits, grouped = model.run_with_cache(tokens)
    assert grouped["blocks.0.attn.hook_k"].shape[2] == 2
    loaded = as_loaded(model)
    decompose(loaded, tokens, progress=False)
    assert model.cfg.ungroup_grouped_query_attention is False
    _, again = model.run_with_cache(tokens)
    assert again["blocks.0.attn.hook_k"].shape[2] == 2  # the owner's layout, as before
    names = ["blocks.0.attn.hook_k", "blocks.1.attn.hook_pattern"]
    ours = loaded.backend.run_with_cache(tokens, names)
    assert ours["blocks.0.attn.hook_k"].shape[2] == 4 and model.cfg.ungroup_grouped_query_attention is False
    torch.testing.assert_close(ours["blocks.1.attn.hook_pattern"], grouped["blocks.1.attn.hook_pattern"])
    torch.testing.assert_close(loaded.backend.forward(tokens), grouped_logits, rtol=0, atol=1e-5)


def _metric(logits):
    return logits[:, -1, 3].mean() - logits[:, -1, 7].mean()


def _pair():
    clean = torch.randint(1, 60, (2, 9), generator=torch.Generator().manual_seed(3))
    corrupted = clean.clone()
    corrupted[:, 2] = 5
    return clean, corrupted


def test_get_act_patch_resid_pre_takes_transformerlens_arguments_and_gives_its_numbers():
    from transformer_lens.patching import get_act_patch_resid_pre as tl_get_act_patch_resid_pre

    from lens_position.analyses.patching import get_act_patch_resid_pre

    model = _grouped_model(seed=4)
    clean, corrupted = _pair()
    _, clean_cache = model.run_with_cache(clean)
    ours = get_act_patch_resid_pre(model, corrupted_tokens=corrupted, clean_cache=clean_cache,
                                   patching_metric=_metric)
    reference = tl_get_act_patch_resid_pre(model, corrupted, clean_cache, _metric)
    assert ours.shape == (2, 9)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)
    assert (ours[0, 2] - ours[0, 0]).abs() > 1e-4  # the patch at the corrupted position matters


def test_activation_cache_is_a_source_for_every_patch_constructor():
    from lens_position.analyses import patching

    model = _grouped_model(seed=5)
    clean, corrupted = _pair()
    _, cache = model.run_with_cache(clean)
    from_cache = patching.resid_pre_patch(cache, 1, 2)
    from_stack = patching.resid_pre_patch(patching.resid_pre_stack(model, clean), 1, 2)
    torch.testing.assert_close(from_cache.value, from_stack.value)
    (k,) = patching.head_kv_patches(model, cache, layer=0, head=1, position=0, parts=("k",))
    # the cache was taken on the grouped model: query head 1 reads its key/value head 0
    assert cache["blocks.0.attn.hook_k"].shape[2] == 2 and patching.kv_head_of(model, 1) == 0
    torch.testing.assert_close(k.value, cache["blocks.0.attn.hook_k"][:, 0, 0])
    sweep = patching.resid_pre_sweep(model, corrupted, cache, _metric, layers=[1])
    assert sweep.values.shape == (1, 9)


def test_a_grouped_cache_taken_before_ungrouping_patches_the_same_query_head():
    from lens_position.analyses import patching

    model = _grouped_model(seed=6)
    clean, _ = _pair()
    _, grouped = model.run_with_cache(clean)  # hook_k: 2 key/value heads
    assert grouped["blocks.1.attn.hook_k"].shape[2] == 2
    from_grouped = patching.head_kv_patches(model, grouped, layer=1, head=3, position=4)
    model.set_ungroup_grouped_query_attention(True)  # the owner's choice: 4 heads at hook_k
    _, ungrouped = model.run_with_cache(clean)
    from_ungrouped = patching.head_kv_patches(model, ungrouped, layer=1, head=3, position=4)
    for a, b in zip(from_grouped, from_ungrouped):
        assert a.head == b.head == 3
        torch.testing.assert_close(a.value, b.value)


@pytest.mark.parametrize("name,full", [
    ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_pre"), (("resid_pre", 1), "blocks.1.hook_resid_pre"),
    ("k0", "blocks.0.attn.hook_k"), (("pattern", 1, "attn"), "blocks.1.attn.hook_pattern")])
def test_get_act_name_names_are_accepted_by_patches(name, full):
    from transformer_lens.utilities import get_act_name

    from lens_position.analyses import patching

    assert patching.Patch(name, 0.0, position=0).hook_name == full
    assert patching.act_name(get_act_name("resid_pre", 1)) == "blocks.1.hook_resid_pre"


def test_an_unknown_hook_name_is_a_clear_error():
    from lens_position.analyses import patching
    from lens_position.ground.errors import BadInputError

    model = _grouped_model(seed=7)
    clean, _ = _pair()
    with pytest.raises(BadInputError, match="no hook named"):
        patching.run_patches(model, clean, [[patching.Patch("no_such_thing", 0.0)]], _metric)


def test_cache_activations_returns_an_activation_cache_with_its_helpers():
    from transformer_lens import ActivationCache

    from lens_position.analyses import patching

    model = _grouped_model(seed=8)
    clean, _ = _pair()
    names = [("resid_pre", layer) for layer in range(2)] + ["ln_final.hook_normalized", "blocks.1.hook_resid_post"]
    cache = patching.cache_activations(model, clean, names)
    assert isinstance(cache, ActivationCache)
    _, reference = model.run_with_cache(clean)
    torch.testing.assert_close(cache["resid_pre", 1], reference["resid_pre", 1])
    torch.testing.assert_close(cache["resid_post", -1], reference["resid_post", -1])
    assert sorted(cache.keys()) == sorted(["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre",
                                           "ln_final.hook_normalized", "blocks.1.hook_resid_post"])
    stacked = cache.stack_activation("resid_pre")
    assert stacked.shape[0] == 2


def test_run_patches_reads_hooks_named_as_transformerlens_names_them():
    from lens_position.analyses import patching

    model = _grouped_model(seed=9)
    clean, _ = _pair()
    (pattern,) = patching.run_patches(model, clean, [[]], lambda acts: acts["blocks.1.attn.hook_pattern"],
                                      read=[("pattern", 1, "attn")])
    _, cache = model.run_with_cache(clean)
    torch.testing.assert_close(pattern, cache["pattern", 1])
