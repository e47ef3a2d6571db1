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
# # Architectures side by side (claim C3)
#
# The balance between the residual and the mask component depends on the architecture:
#
# * **standard RoPE** (SmolLM2-135M, θ = 100 000): the reference;
# * **NTK-scaled RoPE**: the same weights with the rotary base stretched at load, NTK-aware
#   (θ' = θ·α^(d/(d-2)), α = 4) or Llama-3-style NTK-by-parts. The claim: scaling *suppresses*
#   the residual component;
# * **sliding window** (Gemma-3-270M: five local layers of window 512, then one global): the
#   claim is that the residual component *accumulates with depth*. The window only bites when
#   the sequence is longer than it, so this model needs `T > 512`; local layers then see exactly
#   `W` keys for queries `i >= W - 1`, and their mask component vanishes there.
#
# A second, independent view is a ridge probe from the residual stream to `log(i + 1)`: if
# absolute position accumulates with depth, the probe's held-out R² should rise with the layer.
#
# `FAST` swaps in tiny random models with the same three mechanisms (the NTK variant is the tiny
# Llama loaded with `ntk_alpha=4`; the tiny Gemma-3 has window 16), so the numbers then say
# nothing about the claim: they only exercise the code.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
if FAST:
    ARCHITECTURES = {  # label: (registry name, load options, T)
        "standard RoPE": ("tiny-llama", {}, 32),
        "NTK-aware RoPE": ("tiny-llama", {"ntk_alpha": 4.0}, 32),
        "sliding window": ("tiny-gemma3", {}, 40),
    }
    N = 4
else:
    ARCHITECTURES = {
        "standard RoPE": ("smollm2-135m", {}, 128),
        "NTK-aware RoPE": ("smollm2-135m-ntk", {}, 128),
        "NTK-by-parts RoPE": ("smollm2-135m-ntk-parts", {}, 128),
        "sliding window": ("gemma3-270m", {}, 640),
    }
    N = 8

# %%
import numpy as np
import pandas as pd
import plotly.io as pio

from lens_position.report import plots, takeaways
from lens_position.core.data import build_prompts
from lens_position.analyses.decompose import decompose
from lens_position.analyses.length_sweep import length_sweep
from lens_position.models import load_model
from lens_position.analyses.probes import position_probe

pio.renderers.default = "plotly_mimetype+notebook"

# %% [markdown]
# One loop: load, build prompts with an explicit BOS at position 0, decompose, probe. Results are
# stacked into tidy frames with an `architecture` column, which is what every plot function takes.
#
# The sliding-window model runs at a longer `T` than the others, and every component shrinks as `T`
# grows: two models compared at different `T` would be compared as much on `T` as on their
# position mechanism. So each model is also decomposed at every length any of them uses (a length
# sweep, `LENGTHS`), and the claims compare two architectures only at a length both were measured
# at (the window question beyond the window).

# %%
LENGTHS = sorted({T for _, _, T in ARCHITECTURES.values()})
layer_frames, head_frames, probe_frames, sweep_frames, specs, tables = [], [], [], [], {}, []
for label, (name, options, T) in ARCHITECTURES.items():
    loaded = load_model(name, **options)
    specs[label] = loaded.spec
    prompts = build_prompts(loaded, source="natural", T=T, N=N, bos="force")
    result = decompose(loaded, prompts, progress=False)
    probe = position_probe(loaded, prompts, progress=False)
    sweep = length_sweep(loaded, LENGTHS, N=N, progress=False)
    layer_frames.append(result.layers.assign(architecture=label, depth=result.layers["layer"] / loaded.spec.n_layers))
    head_frames.append(result.heads.assign(architecture=label))
    probe_frames.append(probe.layers.assign(architecture=label))
    sweep_frames.append(sweep.by_length.assign(architecture=label))
    tables.append(takeaways.result_tables(label, loaded.spec.role, decomposition=result, probe=probe,
                                          length_sweep=sweep))
    del loaded, result
layers = pd.concat(layer_frames, ignore_index=True)
heads = pd.concat(head_frames, ignore_index=True)
probes = pd.concat(probe_frames, ignore_index=True)

pd.DataFrame({label: {"model": s.name, "rope": s.rope_kind, "rotary base": s.rotary_base,
                      "window": s.window, "layers": s.n_layers} for label, s in specs.items()}).T

# %% [markdown]
# ## The components, per architecture
#
# Mean over all heads of all layers (fractions of Var(log A)): first the numbers the claims are
# decided on, the held-out reference-free `R'` and `M'` with `total_heldout`, then the in-sample
# self-referenced `R`, `M`, `C` (which add up to `total`):

# %%
summary = layers.groupby("architecture", sort=False)[["R_rf_heldout", "M_rf_heldout", "total_heldout",
                                                      "total", "R", "M", "C"]].mean()
summary["R' / (R' + M')"] = summary["R_rf_heldout"] / (summary["R_rf_heldout"] + summary["M_rf_heldout"])
for component in ("R_rf_heldout", "M_rf_heldout"):
    summary[f"{component} / standard RoPE's"] = summary[component] / summary.loc["standard RoPE", component]
summary

# %% [markdown]
# C3 is decided on the residual share `R' / (R' + M')`: below standard RoPE's for the NTK-scaled
# variants. The two ratios to standard RoPE say where a change in the share comes from: less
# residual component, or more mask component. These are point values; the verdict at the end of the
# notebook compares the architectures with bootstrap intervals of the differences.

# %%
standard, share = summary.loc["standard RoPE"], "R' / (R' + M')"
for label, row in summary.drop(index="standard RoPE").iterrows():
    print(f"{label}: R'/(R'+M') {row[share]:.3f} against standard RoPE's {standard[share]:.3f}; "
          f"R' x{row['R_rf_heldout'] / standard['R_rf_heldout']:.3f}, M' x{row['M_rf_heldout'] / standard['M_rf_heldout']:.3f}")

# %%
plots.layer_components(layers)  # held-out R', M' (reference-free) beside the self-referenced R, M

# %% [markdown]
# ## Depth: does the residual component accumulate?
#
# Held-out `R'` in the first and the second half of the network, and the slope of `R'` against
# relative depth (`layer / n_layers`), per architecture:

# %%
layers["half"] = (layers["depth"] >= 0.5).map({False: "first half", True: "second half"})
by_half = layers.pivot_table(index="architecture", columns="half", values="R_rf_heldout", sort=False)
by_half["slope of R' per unit depth"] = [
    np.polyfit(g["depth"], g["R_rf_heldout"], 1)[0] for _, g in layers.groupby("architecture", sort=False)
]
by_half

# %%
for label, row in by_half.iterrows():
    trend = "rises" if row["slope of R' per unit depth"] > 0 else "falls"
    print(f"{label}: R' {trend} with depth ({row['first half']:.3f} in the first half, {row['second half']:.3f} in the second)")

# %% [markdown]
# ## Local and global layers of the sliding-window model
#
# In local layers, queries past the window all see `W` keys, so their mask component comes only
# from the first `W - 1` queries; global layers keep the full causal normaliser.

# %%
layers[layers["architecture"] == "sliding window"][["layer", "layer_type", "R_rf_heldout", "R_rf_heldout_lo",
                                                    "R_rf_heldout_hi", "M_rf_heldout", "M_rf_heldout_lo",
                                                    "M_rf_heldout_hi", "total_heldout", "R", "M", "C"]]

# %% [markdown]
# ## The probe view
#
# Held-out R² of a ridge probe from `resid_pre[l]` to `log(i + 1)`, and the same probe trained on
# shuffled positions as a control.

# %%
plots.probe_r2(probes)

# %%
probes.pivot_table(index="layer", columns="architecture", values="r2_heldout", sort=False)

# %% [markdown]
# ## The same models at the same lengths
#
# Each component, mean over layers and heads, for every model at every length of the sweep: the
# comparison between architectures is read along a column (one `T`), never across columns.

# %%
by_length = pd.concat(sweep_frames, ignore_index=True)
by_length.pivot_table(index="architecture", columns=["quantity", "seq_len"], values="value", sort=False).round(4)

# %% [markdown]
# ## What the numbers show
#
# Built from the tables above (`lens_position.report.takeaways`): the components and the probe per
# architecture, then claim C3 against the paper (verdicts from bootstrap intervals of the
# differences between architectures, by `lens_position.analyses.claims`).

# %%
takeaways.Takeaway.join(
    takeaways.untrained_note(FAST),
    [takeaways.components_sentence(g, label) for label, g in layers.groupby("architecture", sort=False)],
    takeaways.probe_sentences(probes),
    takeaways.claims_markdown(takeaways.stack_tables(*tables), ["C3"]),
)
