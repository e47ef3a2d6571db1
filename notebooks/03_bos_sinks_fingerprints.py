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
# # BOS, sinks and fingerprints (claims C4 and C5)
#
# Under causal attention, position 0 attends only to itself. Its activation at every layer is
# therefore a closed dynamical system driven by one thing: the token at position 0. This
# notebook follows that trajectory from the embedding to the heads that read it.
#
# 1. **BOS replacement (C4)**: replace the BOS embedding before the forward pass and measure the
#    fraction of the residual component that disappears at early queries (the paper: ~40%).
# 2. **Sink heads**: heads whose mean attention on position 0 exceeds ε = 0.3, and the model's
#    sink rate on natural text, random tokens and repeated tokens.
# 3. **Sink-reading heads**: heads whose output or `R` moves when only *their own* key and value
#    at position 0 are patched with a counterfactual fingerprint; then we ablate them.
# 4. **The fingerprint (C5)**: the spread of `resid[:, 0]` across inputs, with BOS (it must be
#    float noise) and with a varying token 0.
#
# SmolLM2's tokenizer does not prepend a BOS, so every prompt set here forces one
# (`bos="force"`, token `<|im_start|>`); the policy is recorded in each result's provenance.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
MODEL = "tiny-llama" if FAST else "smollm2-135m"
T, N = (24, 2) if FAST else (64, 16)
EARLY = (0, 16) if FAST else (0, 32)  # early queries, where C4 is measured (i < 32)

# %%
import plotly.io as pio

from lens_position.report import plots, takeaways
from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.claims import PAPER
from lens_position.core.data import build_prompts
from lens_position.analyses.fingerprint import fingerprint
from lens_position.models import load_model
from lens_position.analyses.sinks import sink_heads, sink_rate, sink_reading_heads
from lens_position.analyses.trajectory import trajectory_patching

pio.renderers.default = "plotly_mimetype+notebook"

loaded = load_model(MODEL)
label = loaded.spec.name
prompts = build_prompts(loaded, source="natural", T=T, N=N, bos="force")
print(label, "| BOS id", prompts.spec.first_token_id, "| tokens", tuple(prompts.tokens.shape))

# %% [markdown]
# ## 1. BOS replacement (C4)
#
# Three replacements for the embedding at position 0: another token's embedding (`token`), the
# mean embedding over the vocabulary (`mean`), and a random vector with the BOS embedding's norm
# (`random`). C4 is decided on the held-out reference-free residual component:
# `fraction_removed_rf_heldout = 1 - R'_replaced / R'_base` (held-out `R'`), per layer and over all
# layers, with its interval; negative means the replacement *added* residual component. The
# in-sample self-referenced `fraction_removed` (of `R`) is shown beside it.

# %%
bos = bos_replacement(loaded, prompts, query_range=EARLY)
measured = ", ".join(f"{row.replacement}: {row.fraction_removed_rf_heldout:+.1%} "
                     f"[{row.fraction_removed_rf_heldout_lo:+.1%}, {row.fraction_removed_rf_heldout_hi:+.1%}]"
                     for row in bos.overall.itertuples())
print(f"fraction of held-out R' removed at queries {EARLY[0]}..{EARLY[1] - 1}: paper about "
      f"{PAPER.c4_fraction_removed:.0%}; measured {measured}")
bos.overall[["replacement", "fraction_removed_rf_heldout", "fraction_removed_rf_heldout_lo",
             "fraction_removed_rf_heldout_hi", "R_rf_heldout_base", "R_rf_heldout_condition", "fraction_removed_rf",
             "fraction_removed"]]

# %%
plots.bos_fraction_removed(bos.frame.assign(architecture=label), bos.overall.assign(architecture=label))

# %% [markdown]
# ## 2. Sink heads and the sink rate
#
# A head's sink score is its mean attention on position 0 over prompts and queries. Gu et al.
# measure the sink rate (percentage of heads above ε = 0.3) with `T = 64` tokens; we do the same
# on the three data conditions, with the default BOS policy, `"force"` (BOS at position 0 on every
# model, as everywhere in lens_position: the tokenizers disagree on whether to add it themselves).

# %%
sinks = sink_heads(loaded, prompts)
print(f"sink heads: {int(sinks.frame['is_sink'].sum())} of {len(sinks.frame)} (rate {sinks.sink_rate:.1%})")
sinks.frame.sort_values("sink_score", ascending=False).head(8)

# %%
rates = sink_rate(loaded, T=T, N=N)
rates.frame[["condition", "sink_rate", "n_sink_heads", "n_heads", "eps", "seq_len", "N", "bos"]]

# %%
plots.sink_rate_bars(rates.frame.assign(architecture=label))

# %% [markdown]
# ## 3. Sink-reading heads
#
# For every head, patch only its own key and value at position 0 with what the text *without*
# BOS would put there (`counterfactual="no-bos"`), every block still reading the unpatched
# residual stream. `output_change` is the relative change of the head's output; `R_change` the
# change of its residual component. The top-ranked heads are then ablated (zero and mean), and
# we compare `R` per layer before and after.

# %%
reading = sink_reading_heads(loaded, prompts, counterfactual="no-bos", query_range=EARLY)
reading.frame.sort_values("reading_rank").head(8)

# %%
plots.sink_heads_map(sinks.frame.assign(architecture=label), reading.frame.assign(architecture=label),
                     eps=sinks.eps)

# %%
print("ablated heads (layer, head):", reading.ablated)
plots.sink_ablation(reading.ablation.assign(architecture=label))

# %% [markdown]
# ### Position-0 trajectory patching
#
# The same counterfactual, applied to the whole residual stream at position 0 from layer `l` on:
# which downstream heads change their pattern and their `R`?

# %%
trajectory = trajectory_patching(loaded, prompts, counterfactual="no-bos", query_range=EARLY,
                                 layers=[0, loaded.spec.n_layers // 2])
trajectory.frame.sort_values("pattern_change", ascending=False).head(8)

# %% [markdown]
# ## 4. The fingerprint (C5)
#
# With the same BOS at position 0 for every input, `resid[:, 0]` must be the same vector at every
# layer (spread at float noise): nothing after position 0 can reach it. Without BOS, token 0 varies
# and so does the fingerprint.

# %%
fp = fingerprint(loaded, T=T, N=N)
auto, varying = (fp.frame[fp.frame["condition"] == c].sort_values("layer") for c in ("auto-bos", "varying-token0"))
print(f"auto-BOS: largest relative spread over layers {auto['spread_relative'].max():.1e} "
      f"(float noise at every layer: {bool(auto['is_float_noise'].all())})")
print(f"varying token 0: smallest relative spread {varying['spread_relative'].min():.2f}; cosine to the BOS "
      f"fingerprint {varying['cos_to_bos'].iloc[0]:+.2f} at the embedding, {varying['cos_to_bos'].iloc[-1]:+.2f} after the last layer")
fp.frame.pivot_table(index="layer", columns="condition", values=["spread_relative", "norm", "cos_to_bos"])

# %%
assert auto["is_float_noise"].all()
plots.fingerprint_layers(fp.frame.assign(architecture=label))

# %% [markdown]
# ## What the numbers show
#
# Built from the results above (`lens_position.report.takeaways`): which way BOS replacement moved the
# residual component, then claims C4 and C5 against the paper (verdicts from bootstrap intervals,
# by `lens_position.analyses.claims`, where the paper's ~40% is written once).

# %%
tables = takeaways.result_tables(label, loaded.spec.role, bos=bos, sinks=sinks, fingerprint=fp, reading=reading)
takeaways.Takeaway.join(takeaways.untrained_note(FAST),
                        takeaways.bos_direction(bos.overall, label),
                        takeaways.claims_markdown(tables, ["C4", "C5"]))
