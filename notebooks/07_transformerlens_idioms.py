# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # TransformerLens in, TransformerLens out
#
# You already work with TransformerLens: your own `HookedTransformer`, `run_with_cache`, an
# `ActivationCache`, `utils.get_act_name`, `get_act_patch_resid_pre`. lens_position takes all of
# them as they are:
#
# 1. a bare `HookedTransformer` (or a subclass) goes into every analysis, and its results carry the
#    weights' hash, its tokenizer and its BOS policy;
# 2. an `ActivationCache` from `run_with_cache` is a source for patches and sweeps;
# 3. hook names can be written as `get_act_name` writes them, or as the tuples a cache takes;
# 4. `get_act_patch_resid_pre(model, corrupted_tokens, clean_cache, patching_metric)` has
#    TransformerLens's signature and numbers, and `cache_activations` returns an
#    `ActivationCache`.
#
# `FAST` (`LENS_POSITION_FAST=1`, as CI sets) builds a small random grouped-query model in code;
# otherwise the notebook uses SmolLM2-135M's `HookedTransformer`, taken out of `load_model` and
# used bare.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"

# %%
import plotly.io as pio
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig
from transformer_lens.patching import get_act_patch_resid_pre as tl_get_act_patch_resid_pre
from transformer_lens.utilities import get_act_name

from lens_position import patching, plots
from lens_position.decompose import decompose
from lens_position.models import load_model

pio.renderers.default = "plotly_mimetype+notebook"

# %% [markdown]
# ## Your own model
#
# In fast mode: a config and random weights, with grouped-query attention (4 query heads sharing 2
# key/value heads), as a researcher would build one. Without it: the real SmolLM2-135M as a plain
# `HookedTransformer` (lens_position's loader built it; from here on it is used bare).

# %%
if FAST:
    cfg = HookedTransformerConfig(n_layers=3, d_model=64, n_ctx=64, d_head=16, n_heads=4, n_key_value_heads=2,
                                  d_vocab=100, act_fn="gelu", positional_embedding_type="rotary",
                                  normalization_type="RMS", model_name="my-tiny-gqa", seed=0)
    model = HookedTransformer(cfg)
    clean = torch.randint(1, 100, (4, 16), generator=torch.Generator().manual_seed(0))
else:
    model = load_model("smollm2-135m").model
    clean = model.to_tokens("The capital of France is Paris, and the capital of Italy is Rome", prepend_bos=True)
corrupted = clean.clone()
corrupted[:, 4] = clean[:, 7]  # one token changed, at position 4
print(type(model).__name__, tuple(clean.shape))

# %% [markdown]
# ## `run_with_cache`, and the decomposition on the bare model
#
# The cache is TransformerLens's own; index it by name, by `get_act_name`, or by tuple.

# %%
logits, clean_cache = model.run_with_cache(clean)
same = [clean_cache["blocks.1.hook_resid_pre"], clean_cache[get_act_name("resid_pre", 1)], clean_cache["resid_pre", 1]]
print("three ways to name resid_pre[1] give the same tensor:", all(torch.equal(same[0], x) for x in same))

result = decompose(model, clean, progress=False)
spec = result.provenance["model"]
print(f"{spec['name']}: weights sha256 {spec['weights_sha256'][:16]}..., class {spec['extra']['class']}, "
      f"BOS id {spec['bos_token_id']}, tokenizer prepends BOS: {spec['tokenizer_prepends_bos']}")
result.layers[["layer", "T", "R", "M"]].round(4)

# %% [markdown]
# ## A patch from an `ActivationCache`
#
# `resid_pre_patch(clean_cache, layer, position)` takes the clean run's residual stream at one
# (layer, position) into the corrupted run. A key patch takes one head's key: `head` is always a
# *query* head. lens_position runs grouped-query models with ungrouped key/value hooks (the same
# numbers, one key per query head), so the patch reaches that head only, whoever built the model.

# %%
def logit_diff(logits):
    """Mean logit of the clean run's next token at the last position minus that of token 7."""
    target = clean[:, -1] if not FAST else torch.full((clean.shape[0],), 3)
    return (logits[:, -2].gather(1, target[:, None]).squeeze(1) - logits[:, -2, 7]).mean()


patch = patching.resid_pre_patch(clean_cache, 1, 4)
key = patching.head_kv_patches(model, clean_cache, layer=1, head=3, position=4, parts=("k",))
base, resid, key_only = patching.run_patches(model, corrupted, [[], [patch], key], logit_diff)
print(f"metric: corrupted {base.item():.4f}, resid_pre[1][4] from the clean cache {resid.item():.4f}, "
      f"head 3's key at 4 {key_only.item():.4f}")
print("query head 3 reads the checkpoint's key/value head", patching.kv_head_of(model, 3))

# %% [markdown]
# ## `get_act_patch_resid_pre`, with TransformerLens's arguments
#
# The same call as TransformerLens's, the same numbers, computed by lens_position's batched,
# resumed engine.

# %%
ours = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, logit_diff)
reference = tl_get_act_patch_resid_pre(model, corrupted, clean_cache, logit_diff)
print(f"layers x positions {tuple(ours.shape)}; largest difference from TransformerLens: "
      f"{(ours - reference).abs().max().item():.1e}")

# %%
sweep = patching.resid_pre_sweep(model, corrupted, clean_cache, logit_diff)
plots.patching_sweep(sweep, token_labels=model.to_str_tokens(clean[0]) if not FAST else None,
                     metric_name="logit difference")

# %% [markdown]
# ## An `ActivationCache` back
#
# `cache_activations` runs once, keeps only the named activations (the pass stops after the
# last block it needs) and returns a TransformerLens `ActivationCache`, so its helpers work.

# %%
names = [get_act_name("resid_pre", layer) for layer in range(model.cfg.n_layers)]
cache = patching.cache_activations(model, clean, names)
print(type(cache).__name__, "with", len(cache), "activations; resid_pre[1] via a tuple:",
      tuple(cache["resid_pre", 1].shape))
torch.testing.assert_close(cache["resid_pre", 2], clean_cache["resid_pre", 2])

# %% [markdown]
# ## What this shows
#
# Every object above is TransformerLens's own: the model, the cache, the hook names and the
# patching call. The decomposition ran on the bare model and recorded what it was (weights hash,
# tokenizer, BOS), the patches took their values from the `ActivationCache`, and the sweep
# matched `transformer_lens.patching.get_act_patch_resid_pre` to float round-off.
