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
# # Three instruments: position-0 convergence, sinks under a window, position by rotary band
#
# 1. **Position-0 convergence (C4)**: replace the embedding at position 0 and follow the
#    position-0 state layer by layer against the unreplaced run. If it re-forms whatever the
#    vector, BOS replacement has nothing to remove; the generated sentence says whether that
#    accounts for the C4 result.
# 2. **Sinks under a sliding window**: Gu et al.'s sink score beside a window-aware one (the first
#    key each query can see) and attention on position 0 while it is visible, per layer type.
# 3. **Position by rotary band**: the residual component R split exactly over RoPE frequency
#    bands (plus cross-band terms), and R' attributed to bands by removing each one, on the
#    unscaled and the NTK-scaled model.

# %%
import os

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
STANDARD = "tiny-llama" if FAST else "smollm2-135m"
NTK = "tiny-llama" if FAST else "smollm2-135m-ntk"
SLIDING = "tiny-gemma3" if FAST else "gemma3-270m"
T, N = (24, 4) if FAST else (64, 8)
WINDOW_T = 40 if FAST else 640  # past Gemma-3's 512-key window (tiny-gemma3: 16)

# %%
import plotly.io as pio

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import window_sinks
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.models import load_model
from lens_position.report import plots, takeaways

pio.renderers.default = "plotly_mimetype+notebook"

# %% [markdown]
# ## 1. Position-0 convergence beside C4

# %%
loaded = load_model(STANDARD)
prompts = build_prompts(loaded, source="natural", T=T, N=N, bos=loaded.spec.auto_bos_policy, seed=0)
conv = position0_convergence(loaded, prompts)
bos = bos_replacement(loaded, prompts, query_range=(0, min(32, T)))
print(f"layers converged (cosine >= {1 - conv.tolerance:.2f}): {int(conv.layers['converged'].sum())} of "
      f"{len(conv.layers)}; held-out fraction of R' removed per replacement: "
      + ", ".join(f"{r.replacement} {r.fraction_removed_rf_heldout:+.0%}" for r in bos.overall.itertuples()))
conv.layers[["layer", "cosine", "cosine_lo", "cosine_hi", "rel_norm", "converged"]].round(3)

# %%
plots.convergence_c4(conv.layers.assign(architecture=STANDARD), bos.frame.assign(architecture=STANDARD))

# %% [markdown]
# Which sub-blocks close the gap in the replaced run itself (`closed_in_run`, relative to the
# state's norm), and how much patching each one from the unreplaced run closes after its block:

# %%
conv.restoration.pivot(index="layer", columns="component", values=["closed_in_run", "closed_here"]).round(2)

# %% [markdown]
# ## 2. Sinks under a sliding window

# %%
sliding = load_model(SLIDING)
window_prompts = build_prompts(sliding, source="natural", T=WINDOW_T, N=4, bos=sliding.spec.auto_bos_policy, seed=0)
ws = window_sinks(sliding, window_prompts)
ws.layer_types[["layer_type", "metric", "n_heads", "n_sink_heads", "sink_rate", "mean_score"]].round(4)

# %%
plots.window_sink_layers(ws.heads.assign(architecture=SLIDING))

# %% [markdown]
# ## 3. Position by rotary frequency band, unscaled and NTK-scaled

# %%
variants = {STANDARD: (STANDARD, {}), "NTK-aware": (NTK, {"ntk_alpha": 4.0} if FAST else {})}
band_results = {}
for name, (model_name, options) in variants.items():
    model = load_model(model_name, **options)
    band_prompts = build_prompts(model, source="natural", T=T, N=N, bos=model.spec.auto_bos_policy, seed=0)
    band_results[name] = rotary_bands(model, band_prompts, n_bands=4, batch_size=4,
                                      bootstrap=Bootstrap(n_resamples=100))
for name, result in band_results.items():
    print(f"{name}: max |bands + cross - R| = {result.heads['R_split_error'].abs().max():.1e}, "
          f"mean R' attribution error {result.heads['R_rf_attribution_error'].mean():+.3f} "
          f"(mean R' {result.heads['R_rf'].mean():.3f})")

# %%
import pandas as pd

plots.rotary_band_layers(pd.concat([r.layers.assign(architecture=name) for name, r in band_results.items()]))

# %% [markdown]
# ## What the numbers show
#
# Built from the results above (`lens_position.report.takeaways`): whether convergence accounts for
# the C4 result, how the sink heads count under each metric, and which band carries R; then claim
# C4 against the paper.

# %%
tables = takeaways.result_tables(STANDARD, loaded.spec.role, bos=bos)
takeaways.Takeaway.join(takeaways.untrained_note(FAST),
                        takeaways.convergence_sentence(conv.layers, bos.frame, bos.overall, STANDARD),
                        takeaways.window_sinks_sentence(ws.layer_types, SLIDING),
                        *[takeaways.rotary_bands_sentence(r.heads, r.layers, name) for name, r in band_results.items()],
                        takeaways.claims_markdown(tables, ["C4"]))
