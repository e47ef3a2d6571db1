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
# # Mask versus residual (claims C1 and C2)
#
# RoPE puts only the offset `d = i - j` into a score `s[i, j]`, yet attention patterns carry
# absolute position. lens_position splits that absolute position, exactly, into
#
# * the **mask component** `M`: the causal softmax normaliser `z[i]` sums over the `i + 1` keys
#   `0..i`, so it depends on `i` even when every score depends only on the offset;
# * the **residual component** `R`: absolute position carried by the residual stream into the
#   scores themselves;
# * their **interaction** `C`, with `total = R + M + C`.
#
# That split references each query's scores to its own diagonal, `t = s - s[i, i]`. The claims are
# decided on a split that needs no reference (the mask-only counterfactual): `R'` and `M'`,
# held out (fitted on one half of the sequences, evaluated on the other), with bootstrap
# intervals: columns `R_rf_heldout`, `M_rf_heldout`, `total_heldout`, each with `_lo`/`_hi`.
#
# We first run the decomposition on hand-set toy models whose answer is known by construction
# (`lens_position.models.toy`), then on SmolLM2-135M (a tiny random model when `FAST`).

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
MODEL = "tiny-llama" if FAST else "smollm2-135m"
T_REAL, N_REAL = (32, 4) if FAST else (128, 16)
T_TOY, N_TOY = (24, 4) if FAST else (64, 8)

# %%
import numpy as np
import pandas as pd
import plotly.express as px
import plotly.io as pio
import torch

from lens_position.report import plots, takeaways
from lens_position.core.data import build_prompts
from lens_position.analyses.decompose import check_identity, decompose, self_referenced_scores
from lens_position.models import load_model
from lens_position.models.toy import offset_only_model, toy_tokens

pio.renderers.default = "plotly_mimetype+notebook"
COLUMNS = ["layer", "head", "total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout"]

# %% [markdown]
# ## 1. Offset-only scores: all of the absolute position is mask
#
# `offset_only_model` embeds every token to the same vector and writes nothing back to the
# residual stream, so queries and keys are the same at every position and RoPE makes the score a
# function of the offset alone: `s[i, j] = g(i - j)`. Let us look at the scores the model
# actually computes.

# %%
toy = offset_only_model(n_layers=1, n_heads=2)
tokens = toy_tokens(N_TOY, T_TOY, bos=False)
_, cache = toy.model.run_with_cache(tokens, names_filter=lambda name: name.endswith(("hook_attn_scores", "hook_pattern")))
scores = cache["blocks.0.attn.hook_attn_scores"][0, 0]  # [query, key], -inf above the diagonal
pattern = cache["blocks.0.attn.hook_pattern"][0, 0]

# g(d) read off the last query; every other query must agree with it at the same offset.
g = torch.stack([scores[T_TOY - 1, T_TOY - 1 - d] for d in range(T_TOY)])
deviation = max(float((scores[i, : i + 1] - g[: i + 1].flip(0)).abs().max()) for i in range(T_TOY))
print(f"max |s[i, j] - g(i - j)| over all pairs: {deviation:.2e}")

# %% [markdown]
# Because the scores depend only on the offset, the self-referenced scores
# `t[i, j] = s[i, j] - s[i, i]` do too, and the log-normaliser has a closed form:
# `z[i] = log sum_{d=0..i} exp(g(d) - g(0))`. The attention on the diagonal is
# `log A[i, i] = t[i, i] - z[i] = -z[i]`: it changes with the query position although every
# score is offset-only. That change is the mask component.

# %%
z_closed = torch.logcumsumexp(g - g[0], dim=0)
t, z = self_referenced_scores(scores[None, None])
print(f"max |z - closed form|           : {float((z[0, 0] - z_closed).abs().max()):.2e}")
print(f"max |log A[i, i] + z_closed[i]|  : {float((pattern.diagonal().log() + z_closed).abs().max()):.2e}")
px.line(pd.DataFrame({"query position i": np.arange(T_TOY), "A[i, i]": pattern.diagonal().numpy()}),
        x="query position i", y="A[i, i]", title="Attention to itself: offset 0, yet it depends on i")

# %%
offset_only = decompose(toy, tokens, progress=False)
offset_only.heads[COLUMNS]

# %% [markdown]
# `R` is zero to float precision (the toy computes in float64) and the whole `total` is `M`. The
# held-out values (coefficients fitted on half the sequences, evaluated on the other half) agree.

# %%
assert (offset_only.heads["R"].abs() < 1e-9).all()
assert np.allclose(offset_only.heads["total"], offset_only.heads["M"], atol=1e-9)

# %% [markdown]
# ## 2. The other ground truths
#
# * **Uniform attention** (all scores equal): `log A[i, j] = -log(i + 1)`; everything is mask.
# * **Sliding window** of `W` keys with offset-only scores: every query `i >= W - 1` sees exactly
#   the offsets `0..W-1`, so `z[i]` is constant and `M = 0`.
# * **A bonus on key 0**: the BOS token gets an extra embedding direction that the key projection
#   turns into a fixed score bonus `b` at position 0. That is absolute position delivered by the
#   residual stream, so `R > 0`; with `b = 0`, `R` returns to zero.

# %%
W = 8
cases = {
    "uniform": (offset_only_model(uniform=True), toy_tokens(N_TOY, T_TOY, bos=False), None),
    f"window W={W}, queries i >= W-1": (offset_only_model(window=W), toy_tokens(N_TOY, T_TOY, bos=False), (W - 1, T_TOY)),
    "key-0 bonus b=2": (offset_only_model(bos_bonus=2.0), toy_tokens(N_TOY, T_TOY, bos=True), None),
    "key-0 bonus b=0": (offset_only_model(bos_bonus=0.0), toy_tokens(N_TOY, T_TOY, bos=True), None),
}
rows = []
for name, (model, toks, query_range) in cases.items():
    heads = decompose(model, toks, query_range=query_range, progress=False).heads
    rows.append({"case": name, **heads[["total", "R", "M", "C"]].mean().to_dict()})
ground_truths = pd.DataFrame(rows).set_index("case")
ground_truths

# %%
assert ground_truths.loc["uniform", "R"] < 1e-9 and abs(ground_truths.loc["uniform", "total"] - ground_truths.loc["uniform", "M"]) < 1e-9
assert abs(ground_truths.loc[f"window W={W}, queries i >= W-1", "M"]) < 1e-9
assert ground_truths.loc["key-0 bonus b=2", "R"] > 0.01 and ground_truths.loc["key-0 bonus b=0", "R"] < 1e-9

# %% [markdown]
# ## 3. A real model
#
# Now the same measurement on a trained model. First a sanity check of the exact identity
# `log A = t - z` against the model's own `hook_pattern` (errors at float32 round-off), then
# the decomposition of every head. Each table starts with the numbers the claims are decided on,
# the held-out reference-free `R'` and `M'` with their 95% intervals; the in-sample
# self-referenced `R`, `M`, `C` (which add up to `total` exactly) follow.

# %%
loaded = load_model(MODEL)
prompts = build_prompts(loaded, source="natural", T=T_REAL, N=N_REAL, bos="force")
print(loaded.spec.name, "|", prompts.spec.bos, "BOS policy | tokens", tuple(prompts.tokens.shape))
identity = check_identity(loaded, prompts.tokens[:2])  # one row per layer
identity.drop(columns="layer").max().rename("largest error over all layers")

# %%
real = decompose(loaded, prompts, progress=False)
real.layers[["layer", "R_rf_heldout", "R_rf_heldout_lo", "R_rf_heldout_hi", "M_rf_heldout", "M_rf_heldout_lo",
             "M_rf_heldout_hi", "total_heldout", "total", "R", "M", "C"]]

# %%
assert np.allclose(real.heads["total"], real.heads["R"] + real.heads["M"] + real.heads["C"], atol=1e-6)
layers = real.layers
above = int((layers["R_rf_heldout_lo"] > layers["M_rf_heldout_hi"]).sum())
below = int((layers["R_rf_heldout_hi"] < layers["M_rf_heldout_lo"]).sum())
print(f"held-out R' above M' (disjoint intervals) in {above} of {len(layers)} layers, below in {below}; "
      f"summed over layers R'/(R'+M') = {layers['R_rf_heldout'].sum() / (layers['R_rf_heldout'] + layers['M_rf_heldout']).sum():.2f} "
      f"(in-sample self-referenced R/(R+M) = {layers['R'].sum() / (layers['R'] + layers['M']).sum():.2f})")
largest_M = layers.loc[layers["M_rf_heldout"].idxmax()]
print(f"layer with the largest M': {int(largest_M.layer)} (M' = {largest_M.M_rf_heldout:.3f} "
      f"[{largest_M.M_rf_heldout_lo:.3f}, {largest_M.M_rf_heldout_hi:.3f}])")
plots.layer_components(layers.assign(architecture=loaded.spec.name),
                       components=("total", "R_rf", "M_rf"))  # their held-out columns

# %%
plots.head_heatmaps(real.heads.assign(architecture=loaded.spec.name))

# %% [markdown]
# ### Which keys carry the residual component?
#
# Leaving key 0 (the BOS) out of the analysed pairs (`keys="no-bos"`; the normaliser still sums
# over every key) shows how much of the residual component lives in the scores on the sink
# position. The reference-free split needs every key of the normaliser in the analysed pairs, so
# with `keys="no-bos"` it is not computed (its columns are NaN): this comparison is on the
# self-referenced split, in-sample.

# %%
no_bos = decompose(loaded, prompts, keys="no-bos", progress=False)
assert no_bos.layers["R_rf_heldout"].isna().all()  # not defined without key 0: never read as a number
comparison = pd.DataFrame({
    "layer": real.layers["layer"],
    "R (all keys)": real.layers["R"],
    "R (keys 1..i)": no_bos.layers["R"],
    "M (all keys)": real.layers["M"],
    "M (keys 1..i)": no_bos.layers["M"],
})
share_on_key0 = 1 - comparison["R (keys 1..i)"].sum() / comparison["R (all keys)"].sum()
print(f"summed over layers, R over keys 1..i is {share_on_key0:.0%} lower than over all keys")
comparison

# %% [markdown]
# Every result carries its provenance: the model spec (with the weights' hash), the prompt spec
# (source, BOS policy, seed, corpus hash), the analysis options and the package versions.

# %%
print("model  :", real.provenance["model"]["name"], "weights sha256", real.provenance["model"]["weights_sha256"][:16])
print("data   :", {k: real.provenance["data"][k] for k in ("source", "T", "N", "bos", "seed", "corpus")})
print("options:", {k: real.provenance["options"][k] for k in ("query_range", "keys", "heldout")})

# %% [markdown]
# ## What the numbers show
#
# Built from the tables above (`lens_position.report.takeaways`): the toy ground truths, then the real
# model, and how it compares with the paper's claims C1 and C2 (verdicts from bootstrap
# intervals, by `lens_position.analyses.claims`).

# %%
toys = pd.concat([offset_only.heads[["total", "R", "M", "C"]].mean().rename("offset-only").to_frame().T, ground_truths])
tables = takeaways.result_tables(loaded.spec.name, loaded.spec.role, decomposition=real)
takeaways.Takeaway.join(
    "On the toy models, whose answer is known by construction (means over heads):",
    "\n".join(takeaways.ground_truth_sentences(toys)),
    takeaways.untrained_note(FAST),
    takeaways.components_sentence(real.layers, loaded.spec.name),
    f"Leaving key 0 out of the analysed pairs changes the in-sample, self-referenced R (summed over "
    f"layers) by {-share_on_key0:+.0%} (the reference-free split is not defined without key 0).",
    takeaways.claims_markdown(tables, ["C1", "C2"]),
)
