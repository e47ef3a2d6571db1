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
# # The controlled zoo: models that differ only in how they encode position
#
# SmolLM2 and Gemma-3 differ in data, size, tokenizer and training, so comparing their attention
# cannot say what the *position mechanism* does. The zoo can: small byte-level decoders trained
# under one recipe that varies only the position mechanism (standard RoPE, NTK-extended RoPE and
# its unscaled control, sliding windows, NoPE, learned absolute embeddings, RoPE without BOS),
# three seeds each, shipped in the package.
#
# 1. a recipe is a frozen dataclass; training one takes a minute;
# 2. the shipped checkpoints load by name, like any other model;
# 3. C3 read off them: paired differences between variants, with intervals over seeds.
#
# `FAST` trains fewer steps on a smaller text and decomposes fewer, shorter sequences.

# %%
import os
import tempfile
from pathlib import Path

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
T, N = (64, 4) if FAST else (128, 16)
WORKDIR = Path(tempfile.mkdtemp(prefix="lens_position_zoo_"))

# %%
import dataclasses

import pandas as pd
import plotly.io as pio

from lens_position.report import takeaways
from lens_position.core.data import build_prompts
from lens_position.analyses.decompose import decompose
from lens_position.models import load_model
from lens_position.report import zoo as c3
from lens_position.analyses.zoo.training import list_table
from lens_position.models.zoo.recipe import VARIANTS, recipe_for
from lens_position.models.zoo.store import checkpoints
from lens_position.analyses.zoo.sweep import (measured_sweep, measured_trajectory, sweep_sentence, trajectory_figure,
                                     trajectory_sentences)

pio.renderers.default = "plotly_mimetype+notebook"

# %% [markdown]
# ## 1. Recipes
#
# Every variant shares sizes, optimiser, schedule, token budget and data; the table shows the
# fields that differ from standard RoPE (the recipe hash goes into every checkpoint).

# %%
base = VARIANTS["rope"].to_dict()
pd.DataFrame([{"variant": name, **{k: v for k, v in recipe.to_dict().items() if base[k] != v and k != "variant"},
               "sha256": recipe.sha256()[:12]} for name, recipe in VARIANTS.items()]).astype(object).fillna("")

# %% [markdown]
# ## 2. Train a tiny variant in a minute
#
# `dataclasses.replace` makes a smaller recipe; `train` runs it (CPU by default, a GPU when one
# is present), with a progress bar, checkpoints and resume. The same recipe and seed give the
# same weights bit for bit on the same machine. In `FAST` mode the text is CPython's pydoc topics
# (a recipe names its corpus by hash, so the tiny recipe names that one).

# %%
from lens_position.models.zoo.corpus import corpus_of, training_split, unigram_bits_per_byte
from lens_position.models.zoo.store import load_zoo_model, save_checkpoint
from lens_position.models.zoo.train import train

if FAST:
    import pydoc_data.topics

    corpus = corpus_of([pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)])
else:
    corpus = training_split()
tiny = dataclasses.replace(recipe_for("ntk"), variant="my-ntk", n_layers=2, attn_types=("global",) * 2,
                           d_model=32, n_heads=2, d_mlp=64,
                           steps=40 if FAST else 200, extend_at=20 if FAST else 100, eval_every=10,
                           n_eval_sequences=8, corpus_sha256=corpus.sha256)
result = train(tiny, work_dir=WORKDIR / "work", corpus=corpus, progress=False)
again = train(tiny, work_dir=WORKDIR / "work-again", corpus=corpus, progress=False)
print("bit-identical retrain:", all((result.parameters[k] == again.parameters[k]).all() for k in result.parameters))
print(f"held-out {result.held_out_bits:.3f} bits/byte vs unigram {unigram_bits_per_byte(corpus):.3f}; "
      f"{result.tokens_per_second:.0f} tokens/s on {result.device}")
saved = save_checkpoint(WORKDIR / "zoo", result, corpus, unigram_bits_per_byte(corpus))
mine = load_zoo_model(saved.name, root=WORKDIR / "zoo")
print(mine.spec.name, mine.spec.rope_kind, "rotary base", mine.spec.rotary_base)

# %% [markdown]
# ## 3. The shipped zoo
#
# `lens-position zoo list` prints this table: held-out loss against the unigram baseline (bits
# per byte) and the sink rate of Gu et al. (fraction of heads whose mean attention on position 0
# exceeds 0.3).

# %%
table = list_table()
table

# %%
c3.loss_figure(checkpoints())

# %% [markdown]
# ### Did attention sinks form?
#
# Each checkpoint's JSON records its sink measurement (pydoc topics, T = 64, N = 32, ε = 0.3).
# If none formed, is the training budget why? `lens-position zoo sink-sweep` trains the standard
# RoPE recipe with more steps, a longer context, a wider model, another weight decay or less
# distinct text, and measures the same numbers; its three longest points (64× the steps, 39 M
# tokens: with and without learning-rate decay, and with weight decay 0.5, the last in five seeds)
# measure the sinks at every evaluation along training. The tables it measured ship with the package (rerunning the
# sweep takes hours of one core, so they are read here, not run).

# %%
print(c3.sinks_sentence(checkpoints()))
sweep = measured_sweep()
sweep[["point", "seed", "change", "tokens", "parameters", "context", "weight_decay", "train_text_bytes", "held_out_bits",
       "train_seconds", "sink_rate", "max_sink_score", "max_sink_score_by_layer"]]

# %%
trajectory = measured_trajectory()
for sentence in trajectory_sentences(trajectory):
    print(sentence)
trajectory_figure(trajectory)

# %% [markdown]
# ## 4. C3 from the zoo
#
# Decompose every shipped model (`load_model("zoo:ntk:seed1")` loads one by name), then answer
# each question by the per-seed paired difference between two variants: at the same seed they
# start from the same weights and see the same batches. `lens-position reproduce --models zoo`
# does the same inside the full reproduction (and runs C1–C5 on each model).

# %%
wanted = ["rope", "ntk", "ntk-control", "window", "nope", "learned"] if FAST else list(VARIANTS)
names = [c.name for c in checkpoints() if c.variant in wanted and (not FAST or c.seed < 2)]
frames = []
for name in names:
    loaded = load_model(name)
    prompts = build_prompts(loaded, T=T, N=N, bos="force", seed=0)
    frames.append(decompose(loaded, prompts, progress=False).layers.assign(model=name))
tables = {"decompose_layers": pd.concat(frames, ignore_index=True)}
models = c3.models_table(tables)
answer = c3.answers(models)
answer[["question", "a", "b", "metric", "a_mean", "b_mean", "difference", "low", "high", "n_seeds", "verdict"]]

# %%
c3.depth_figure(tables)

# %% [markdown]
# ## What the numbers show
#
# Built from the numbers computed above (rerun the notebook and they follow the data): the zoo's
# answers come from paired seed differences, not from the paper's claims table.

# %%
shipped = table[table["variant"].isin(VARIANTS)]
below = bool((shipped["held_out_bits"] < shipped["unigram_bits"]).all())
points = [
    f"{len(shipped)} shipped models, {shipped['variant'].nunique()} variants; held-out loss "
    f"{shipped['held_out_bits'].min():.2f}–{shipped['held_out_bits'].max():.2f} bits/byte against the unigram "
    f"baseline's {shipped['unigram_bits'].iloc[0]:.2f}: every model is "
    + ("below it." if below else "not below it."),
    c3.sinks_sentence(checkpoints()),
    sweep_sentence(sweep),
    *trajectory_sentences(trajectory),
]
for r in answer.itertuples():
    if r.n_seeds == 0:
        continue
    interval = f" [{r.low:+.4f}, {r.high:+.4f}]" if pd.notna(r.low) else ""
    points.append(f"{r.question} ({r.a} − {r.b}, {r.metric}): {r.difference:+.4f}{interval} over {r.n_seeds} "
                  f"paired seeds, **{r.verdict}**.")
takeaways.Takeaway.join("\n".join(f"- {p}" for p in points))
