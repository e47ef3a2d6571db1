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
# # Quickstart: one model, one decomposition, one figure
#
# Load a model, build a prompt set, split the absolute position in every attention head into
# its **residual** component R' (carried by the residual stream) and its **mask** component M'
# (the causal softmax normaliser), and plot both per layer. The numbers to read first are the
# held-out, reference-free ones the claims use (`R_rf_heldout`, `M_rf_heldout`, with
# `total_heldout`); the [concepts page](../docs/concepts.md) defines every number and the
# [column reference](../docs/columns.md) lists every column.
#
# `FAST` (set by the environment variable `LENS_POSITION_FAST=1`, as CI does) swaps the real
# SmolLM2-135M for a tiny random model built in code, so the notebook runs in seconds.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
MODEL = "tiny-llama" if FAST else "smollm2-135m"
T, N = (32, 4) if FAST else (128, 16)

# %%
import plotly.io as pio

from lens_position.report import plots, takeaways
from lens_position.core.data import build_prompts
from lens_position.analyses.decompose import decompose
from lens_position.models import load_model

pio.renderers.default = "plotly_mimetype+notebook"

loaded = load_model(MODEL)  # HookedTransformer + tokenizer + ModelSpec
prompts = build_prompts(loaded, source="natural", T=T, N=N, bos="force")  # N sequences of T tokens
result = decompose(loaded, prompts, progress=False)
result  # what was measured, on what, R', M' and the total with 95% intervals, where the tables are

# %%
result.layers[["layer", "R_rf_heldout", "M_rf_heldout", "total_heldout"]]  # fractions of Var(log A), mean over heads

# %% [markdown]
# Held out means fitted on one half of the sequences and evaluated on the other; reference-free
# means the mask's part is what the causal mask does to the offset-only part of the scores. The
# in-sample, self-referenced split stays available (`total = R + M + C` exactly in every row).
# `result.top_heads(5)` gives the heads with the largest R'.

# %%
plots.layer_components(result.layers.assign(architecture=loaded.spec.name))

# %% [markdown]
# ## What the numbers show
#
# The text below is built from the tables above (`lens_position.report.takeaways`); the comparison
# with the paper's claims C1 and C2, with verdicts decided from bootstrap intervals, comes from
# `lens_position.analyses.claims`, where the paper's numbers are written once.

# %%
tables = takeaways.result_tables(loaded.spec.name, loaded.spec.role, decomposition=result)
takeaways.Takeaway.join(takeaways.untrained_note(FAST),
                        takeaways.components_sentence(result.layers, loaded.spec.name, result.replicates),
                        takeaways.claims_markdown(tables, ["C1", "C2"]))
