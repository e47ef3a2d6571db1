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
# # The position-0 audit: what sits at position 0, and where the sink comes from
#
# Before reading a model's sinks, ask what its position 0 is:
#
# 1. **Are the positions what you think?** `check_positions` finds a doubled BOS, a missing one,
#    left padding and shifted position ids before an analysis reads them.
# 2. **Where does the sink come from?** `sink_origin` runs the same texts with BOS, without it,
#    moved, doubled and replaced, and decides from intervals whether the sink is made by position 0
#    (position-driven) or by the BOS token (BOS-driven).
# 3. **What does position 0 carry?** `massive_activations` finds Sun et al.'s massive activations,
#    the heads that read them, and what setting them to zero or to their mean does.
# 4. **How much flows from position 0?** `attention_rollout` follows attention through the layers.
#
# Then the reason it matters: BOS replacement (claim C4) can only remove what the BOS made.
# On SmolLM2-135M and Gemma-3-270M, 16 texts of 64 tokens: a few minutes on a CPU.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
MODELS = ("tiny-llama", "tiny-gemma3") if FAST else ("smollm2-135m", "gemma3-270m")
T, N = (24, 6) if FAST else (64, 16)

# %%
import warnings

import pandas as pd
import plotly.io as pio

import lens_position as lp
from lens_position.pipeline.steps.rollout import rollout_figure
from lens_position.report import plots, takeaways

pio.renderers.default = "plotly_mimetype+notebook"
models = {name: lp.load_model(name) for name in MODELS}
prompts = {name: lp.build_prompts(model, T=T, N=N, bos=model.spec.auto_bos_policy, seed=0)
           for name, model in models.items()}

# %% [markdown]
# ## 1. Check the positions first
#
# Every analysis runs these checks on its prompts; `check_positions` runs them alone and returns
# what it found. Here, the prompts as built, then the same prompts with the BOS doubled, a mistake
# that makes position 1 a second sink.

# %%
name, model = next(iter(models.items()))
print(lp.check_positions(model, prompts[name]))
bos_id = model.spec.bos_token_id
tokens = prompts[name].tokens
if bos_id is not None:
    doubled = tokens.clone()
    doubled[:, 1] = bos_id
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        lp.check_positions(model, doubled)
    for warning in caught:
        print(f"{warning.category.__name__}: {warning.message}")

# %% [markdown]
# ## 2. Where the sink comes from
#
# Gu et al.'s sink rate (the share of prompt × layer × head whose attention on a location, averaged
# over queries, exceeds ε = 0.3) at position 0, at the BOS wherever it is and at the first
# delimiter, under seven conditions. The verdict reads the share of the with-BOS rate at position 0
# that stays without BOS (`kept`, a paired interval over the same texts).

# %%
origins = {name: lp.sink_origin(model, T=T, N=N, seed=0, progress=False) for name, model in models.items()}
pd.concat({name: o.verdict for name, o in origins.items()})

# %%
plots.sink_origin_bars(pd.concat([o.frame.assign(architecture=name) for name, o in origins.items()]))

# %% [markdown]
# Where the sink sits in each condition (rates in %, `nan` where the location does not exist):

# %%
pd.concat({name: o.frame.pivot(index="condition", columns="location", values="sink_rate").mul(100).round(1)
           for name, o in origins.items()})

# %% [markdown]
# ## 3. Massive activations
#
# Per layer, the largest |activation| of the block's output and its ratio to the median; Sun et al.
# call an entry massive at 100 and 1000x the median. Where a layer's output holds them in half the
# prompts, `massive_intervention` sets them to zero and to their mean at that layer and measures the
# change of the sink rate, of R' and of the next-token loss.

# %%
massive, effects = {}, {}
for name, model in models.items():
    massive[name] = found = lp.massive_activations(model, prompts[name], progress=False)
    layer = found.first_layer()
    print(f"{name}: first layer with massive activations in half the prompts: {layer}")
    if layer is not None:
        effects[name] = lp.massive_intervention(model, prompts[name], massive=found, progress=False).frame
pd.concat({name: m.layers[["layer", "top1", "median_abs", "ratio", "top1_position", "top1_dim"]]
           for name, m in massive.items()}).round(1)

# %%
plots.massive_layers(pd.concat([m.layers.assign(architecture=name) for name, m in massive.items()]))

# %% [markdown]
# The heads that read the massive positions most (attention on them, mean over queries):

# %%
pd.concat({name: m.readers.sort_values("attention_on_massive", ascending=False).head(5)
           for name, m in massive.items()})

# %% [markdown]
# ## 4. Attention rollout to position 0
#
# The share of each query's input that has flowed from position 0 after each layer: through the
# head-averaged attention alone (which converges to the first token as depth grows, Wu et al. 2025)
# and with the residual path (each layer mixed half and half with the identity).

# %%
rollouts = {name: lp.attention_rollout(model, prompts[name], progress=False) for name, model in models.items()}
rollout_figure(pd.concat([r.layers.assign(architecture=name) for name, r in rollouts.items()]))  # the report's figure

# %% [markdown]
# ## 5. Why it matters for C4
#
# BOS replacement swaps the BOS embedding for another vector and measures how much of R' goes
# (early queries). A model whose sink is made by position 0 keeps it whatever sits there.

# %%
bos = {name: lp.bos_replacement(model, prompts[name], query_range=(0, min(32, T)), progress=False)
       for name, model in models.items()}
pd.concat({name: b.overall[["replacement", "fraction_removed_rf_heldout", "fraction_removed_rf_heldout_lo",
                            "fraction_removed_rf_heldout_hi"]] for name, b in bos.items()}).round(3)

# %% [markdown]
# ## What the numbers show
#
# Built from the results above (`lens_position.report.takeaways`): each model's sink origin, its
# largest activation and what zeroing it did, its rollout, then claim C4 against the paper.

# %%
tables = takeaways.stack_tables(*[takeaways.result_tables(name, model.spec.role, bos=bos[name])
                                  for name, model in models.items()])
takeaways.Takeaway.join(
    takeaways.untrained_note(FAST),
    [takeaways.origin_sentence(o.verdict, name) for name, o in origins.items()],
    [s for name, m in massive.items() for s in takeaways.massive_sentences(m.layers, effects.get(name), name)],
    [r.sentence(name) for name, r in rollouts.items()],
    takeaways.claims_markdown(tables, ["C4"]))
