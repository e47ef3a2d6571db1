"""The zoo on both backends: every variant's checkpoint as the HookedTransformer it was trained
as and as the converted Hugging Face model behind a TransformerBridge
(:mod:`lens_position.models.zoo.hf`) gives the same numbers on the same tokens, within the float32
tolerances of tests/helpers/parity.py. TransformerLens 3.x only (it needs HookedTransformer);
what the bridge does on 4.x is tests/unit/models/test_zoo_bridge.py."""

from __future__ import annotations

import re

import pytest
import torch
from parity import TOLERANCES

from lens_position.analyses.decompose import decompose
from lens_position.core.data import build_prompts
from lens_position.models import load_model
from lens_position.models.zoo.recipe import VARIANTS

CONVERTIBLE = [variant for variant, recipe in VARIANTS.items() if recipe.position != "learned"]
T = 64  # twice the window (32): local layers mask half the keys of the last query
DECOMPOSITION = re.compile(r"^(total|R|M|C|R_rf|M_rf|C_rf)(_heldout)?(_lo|_hi)?$")


@pytest.fixture(scope="module", params=CONVERTIBLE)
def both(request) -> dict[str, dict]:
    out = {}
    for backend in ("hooked", "bridge"):
        loaded = load_model(f"zoo:{request.param}", backend=backend)
        assert loaded.spec.extra["backend"] == backend
        prompts = build_prompts(loaded, N=4, T=T, source="natural", seed=0)
        names = [f"blocks.{layer}.attn.hook_{kind}" for layer in range(loaded.spec.n_layers)
                 for kind in ("attn_scores", "pattern")]
        with torch.no_grad():
            logits = loaded.backend.forward(prompts.tokens)
        out[backend] = dict(loaded=loaded, prompts=prompts, logits=logits,
                            cache=loaded.backend.run_with_cache(prompts.tokens, names))
    assert torch.equal(out["hooked"]["prompts"].tokens, out["bridge"]["prompts"].tokens)
    return out


def test_the_specs_agree(both):
    a, b = both["hooked"]["loaded"].spec, both["bridge"]["loaded"].spec
    for field in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "n_ctx", "rope_kind", "rotary_base",
                  "rotary_base_local", "ntk_alpha", "window", "layer_types", "layer_windows", "role",
                  "tokenizer_prepends_bos", "bos_token_id", "weights_sha256", "source"):
        assert getattr(a, field) == getattr(b, field), field
    for key in ("zoo_variant", "zoo_seed", "position", "recipe_sha256", "extend_at", "pretrain_rotary_base",
                "held_out_bits_per_byte", "d_vocab"):
        assert a.extra[key] == b.extra[key], key


def test_logits_scores_and_patterns_agree(both):
    assert (both["hooked"]["logits"] - both["bridge"]["logits"]).abs().max() < TOLERANCES["logits"]
    for name, hooked in both["hooked"]["cache"].items():
        bridged = both["bridge"]["cache"][name]
        visible = torch.isfinite(hooked)
        assert torch.equal(visible, torch.isfinite(bridged)), name  # the same causal and window masks
        key = "attention pattern" if name.endswith("pattern") else "attention scores (visible keys)"
        assert (hooked[visible] - bridged[visible]).abs().max() < TOLERANCES[key], name


def test_the_decomposition_agrees_column_by_column(both):
    a, b = (decompose(both[k]["loaded"], both[k]["prompts"], progress=False) for k in ("hooked", "bridge"))
    for frame in ("heads", "layers"):
        columns = [c for c in getattr(a, frame).columns if DECOMPOSITION.match(c)]
        assert {"total", "R_rf", "R_heldout", "M_rf_heldout_lo"} <= set(columns)
        difference = (getattr(a, frame)[columns].reset_index(drop=True)
                      - getattr(b, frame)[columns].reset_index(drop=True)).abs().max().max()
        assert float(difference) < TOLERANCES["decomposition columns (T, R, M, C, both splits, held-out, intervals)"]
