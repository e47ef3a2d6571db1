"""TransformerLens in, TransformerLens out: a researcher's own HookedTransformer (or subclass),
their ActivationCache and get_act_name names work wherever lens_position takes a model, a source
activation or a hook name, and mean the same thing for every loader."""

from __future__ import annotations

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.decompose import decompose
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


def test_grouped_query_model_is_run_ungrouped_with_the_same_numbers():
    model = _grouped_model()
    tokens = torch.randint(1, 60, (2, 10), generator=torch.Generator().manual_seed(2))
    grouped_logits, grouped = model.run_with_cache(tokens)
    assert grouped["blocks.0.attn.hook_k"].shape[2] == 2
    as_loaded(model)
    logits, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.attn.hook_k"].shape[2] == 4  # one key per query head, as load_model's
    torch.testing.assert_close(logits, grouped_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(cache["blocks.1.attn.hook_pattern"], grouped["blocks.1.attn.hook_pattern"])
