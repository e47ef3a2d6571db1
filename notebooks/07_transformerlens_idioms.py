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
# The notebook runs on the TransformerLens you have. On 3.x the model is a `HookedTransformer`; on
# 4.x, which removed that class, it is a `TransformerBridge` in compatibility mode (the 3.x hook
# names), and everything below takes it the same way. `FAST` (`LENS_POSITION_FAST=1`, as CI sets)
# uses a small random grouped-query model built in code (on 3.x from a `HookedTransformerConfig`,
# on 4.x the tiny Llama of `load_model("tiny-llama")`); otherwise SmolLM2-135M, taken out of
# `load_model` and used bare.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"

# %%
import importlib.metadata

import plotly.io as pio
import torch
from transformer_lens.patching import get_act_patch_resid_pre as tl_get_act_patch_resid_pre
from transformer_lens.utilities import get_act_name

from lens_position.analyses import patching
from lens_position.report import plots, takeaways
from lens_position.analyses.decompose import decompose
from lens_position.core.data import build_prompts
from lens_position.models import load_model
from lens_position.models.backends import hooked_available

pio.renderers.default = "plotly_mimetype+notebook"
HOOKED = hooked_available()  # TransformerLens 3.x; on 4.x the model class is TransformerBridge
if HOOKED:
    from transformer_lens import HookedTransformer, HookedTransformerConfig
print("TransformerLens", importlib.metadata.version("transformer_lens"), "->",
      "HookedTransformer" if HOOKED else "TransformerBridge")

# %% [markdown]
# ## Your own model
#
# In fast mode: random weights with grouped-query attention (4 query heads sharing 2 key/value
# heads), on 3.x a config as a researcher would build one. Without it: the real SmolLM2-135M as a
# plain `HookedTransformer` or `TransformerBridge` (lens_position's loader built it and remembers its
# spec, so results name the model it was loaded as; from here on it is used bare), with a short
# prompt for the patching sweeps and 8 windows of text, as a token tensor, for the decomposition.

# %%
if FAST and HOOKED:
    cfg = HookedTransformerConfig(n_layers=3, d_model=64, n_ctx=64, d_head=16, n_heads=4, n_key_value_heads=2,
                                  d_vocab=100, act_fn="gelu", positional_embedding_type="rotary",
                                  normalization_type="RMS", model_name="my-tiny-gqa", seed=0)
    model = HookedTransformer(cfg)
elif FAST:
    model = load_model("tiny-llama").model  # a TransformerBridge, booted in compatibility mode
if FAST:
    clean = torch.randint(1, min(100, model.cfg.d_vocab), (4, 16), generator=torch.Generator().manual_seed(0))
    texts = clean
else:
    model = load_model("smollm2-135m").model
    clean = model.to_tokens("Paris is in France and Rome is in Italy", prepend_bos=True)  # short: the
    # TransformerLens sweep below makes one forward pass per (layer, position)
    # the decomposition needs many positions and several sequences (its held-out half and its intervals
    # resample whole sequences): 8 windows of 64 tokens of text, BOS first, as a plain token tensor
    texts = build_prompts(model, source="natural", T=64, N=8, bos="force", seed=0).tokens
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

result = decompose(model, texts, progress=False)  # the bare model and a token tensor
spec = result.provenance["model"]
# a model built in code is described by its class; one lens_position loaded keeps its load's spec
origin = f"class {spec['extra']['class']}" if "class" in spec["extra"] else f"loaded from {spec['source']}"
print(f"{spec['name']}: weights sha256 {spec['weights_sha256'][:16]}..., {origin}, "
      f"BOS id {spec['bos_token_id']}, tokenizer prepends BOS: {spec['tokenizer_prepends_bos']}")
result.layers[["layer", "R_rf_heldout", "R_rf_heldout_lo", "R_rf_heldout_hi", "M_rf_heldout", "total_heldout",
               "total", "R", "M"]].round(4)

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
sweep_difference = (ours - reference).abs().max().item()
print(f"layers x positions {tuple(ours.shape)}; largest difference from TransformerLens: {sweep_difference:.1e}")

# %% [markdown]
# `resid_pre_sweep` takes the same arguments and can sweep a subset of layers (here every few);
# the heatmap keeps their real indices.

# %%
sweep = patching.resid_pre_sweep(model, corrupted, clean_cache, logit_diff,
                                 layers=list(range(0, model.cfg.n_layers, max(1, model.cfg.n_layers // 6))))
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
cache_difference = max((cache["resid_pre", layer] - clean_cache["resid_pre", layer]).abs().max().item()
                       for layer in range(model.cfg.n_layers))
torch.testing.assert_close(cache["resid_pre", 2], clean_cache["resid_pre", 2])

# %% [markdown]
# ## What the numbers show
#
# Every object above is TransformerLens's own: the model, the cache, the hook names and the
# patching call. Built from the numbers above (`lens_position.report.takeaways`): how close our results
# are to TransformerLens's, what the decomposition of the bare model recorded, and what it says
# about claims C1 and C2 on these sequences (verdicts from bootstrap intervals, by
# `lens_position.analyses.claims`).

# %%
tables = takeaways.result_tables(spec["name"], "standard", decomposition=result)
takeaways.Takeaway.join(
    takeaways.untrained_note(FAST),
    takeaways.agreement_sentence("lens_position's `get_act_patch_resid_pre`",
                                 "`transformer_lens.patching.get_act_patch_resid_pre`", sweep_difference, 1e-4),
    takeaways.agreement_sentence("The `ActivationCache` from `cache_activations`", "`run_with_cache`'s",
                                 cache_difference, 1e-5),
    f"The decomposition of the bare `{type(model).__name__}` recorded its weights' hash "
    f"({spec['weights_sha256'][:12]}...), its BOS id ({spec['bos_token_id']}) and whether its tokenizer prepends a BOS ({spec['tokenizer_prepends_bos']}).",
    takeaways.components_sentence(result.layers, spec["name"]),
    takeaways.claims_markdown(tables, ["C1", "C2"]),
)
