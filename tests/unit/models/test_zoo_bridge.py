"""The controlled zoo on the bridge backend (TransformerBridge), on whichever TransformerLens is
installed: every test here is marked ``tl4``, so it runs on 4.x (no HookedTransformer) as well as
on 3.9. The converted model is checked against an independent reference, the Hugging Face model
built from the stored tensors; that this Hugging Face model computes what the trained
HookedTransformer computes is tests/unit/models/test_zoo_bridge_parity.py (3.x only)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from lens_position.analyses.decompose import check_identity, decompose
from lens_position.core.data import build_prompts
from lens_position.ground.errors import CorruptFileError, UnsupportedArchitectureError
from lens_position.models import backends, load_model
from lens_position.models.mini import MiniTransformer
from lens_position.models.zoo.architecture import build_model
from lens_position.models.zoo.hf import hf_model, hf_state_dict
from lens_position.models.zoo.recipe import VARIANTS, recipe_for
from lens_position.models.zoo.store import find
from lens_position.models.zoo.train import train

pytestmark = pytest.mark.tl4

CONVERTIBLE = [variant for variant, recipe in VARIANTS.items() if recipe.position != "learned"]
LEARNED = [variant for variant, recipe in VARIANTS.items() if recipe.position == "learned"]
T = 48  # beyond the window (32): the local layers' masks bite
LOGIT_TOL = 1e-4  # float32 forward noise (tests/helpers/parity.py)
PATTERN_TOL = 1e-5


@pytest.fixture(scope="module")
def bridged() -> dict[str, object]:
    return {variant: load_model(f"zoo:{variant}", backend="bridge") for variant in CONVERTIBLE}


def test_auto_loads_the_zoo_on_the_bridge_where_transformerlens_has_no_hooked_transformer():
    loaded = load_model("zoo:rope")
    assert loaded.spec.extra["backend"] == ("hooked" if backends.hooked_available() else "bridge")


@pytest.mark.parametrize("variant", CONVERTIBLE)
def test_the_bridge_spec_states_the_recipes_position_mechanism_and_provenance(variant, bridged):
    loaded, recipe, checkpoint = bridged[variant], recipe_for(variant), find(f"zoo:{variant}")
    spec = loaded.spec
    assert spec.extra["backend"] == "bridge" and loaded.backend.kind == "bridge"
    assert spec.layer_types == recipe.attn_types
    assert spec.window == (recipe.window if "local" in recipe.attn_types else None)
    assert spec.rope_kind == ("none" if recipe.position == "none" else
                              "ntk-aware" if recipe.ntk_alpha != 1.0 else "standard")
    assert spec.rotary_base == (None if recipe.position == "none" else recipe.final_rotary_base)
    assert (spec.n_layers, spec.n_heads, spec.d_model, spec.d_head, spec.n_ctx) == \
        (recipe.n_layers, recipe.n_heads, recipe.d_model, recipe.d_head, recipe.context)
    assert spec.tokenizer_prepends_bos == recipe.bos
    assert spec.weights_sha256 == checkpoint.meta["weights_sha256"]
    assert (spec.extra["zoo_variant"], spec.extra["zoo_seed"], spec.extra["recipe_sha256"]) == \
        (variant, 0, checkpoint.meta["recipe_sha256"])


@pytest.mark.parametrize("variant", CONVERTIBLE)
def test_the_bridge_computes_what_the_converted_hugging_face_model_computes(variant, bridged):
    loaded, recipe = bridged[variant], recipe_for(variant)
    prompts = build_prompts(loaded, N=2, T=T, source="natural", seed=1)
    reference_model = hf_model(recipe, load_file(str(find(f"zoo:{variant}").weights)))
    with torch.no_grad():
        reference = reference_model(prompts.tokens, output_attentions=True)
        logits = loaded.backend.forward(prompts.tokens)
    assert (logits - reference.logits).abs().max() < LOGIT_TOL
    names = [f"blocks.{layer}.attn.hook_{kind}" for layer in range(recipe.n_layers)
             for kind in ("pattern", "attn_scores")]
    cache = loaded.backend.run_with_cache(prompts.tokens, names)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    for layer, attention in enumerate(reference.attentions):
        assert (cache[f"blocks.{layer}.attn.hook_pattern"] - attention).abs().max() < PATTERN_TOL
        # the scores hook masks what the recipe masks: a local layer's query i sees keys i - window < j <= i
        window = recipe.window if recipe.attn_types[layer] == "local" else T
        visible = torch.isfinite(cache[f"blocks.{layer}.attn.hook_attn_scores"])
        assert torch.equal(visible, ((j <= i) & (j > i - window)).expand_as(visible)), layer


@pytest.mark.parametrize("variant", CONVERTIBLE)
def test_every_convertible_variant_decomposes_on_the_bridge(variant, bridged):
    loaded = bridged[variant]
    prompts = build_prompts(loaded, N=2, T=T, source="natural", seed=0)
    rows = check_identity(loaded, prompts)
    assert float(rows["max_abs_error_pattern"].max()) < PATTERN_TOL
    result = decompose(loaded, prompts, progress=False)
    assert len(result.heads) == loaded.spec.n_layers * loaded.spec.n_heads
    total = result.heads["R"] + result.heads["M"] + result.heads["C"]
    assert torch.allclose(torch.tensor(total.to_numpy()), torch.tensor(result.heads["total"].to_numpy()), atol=1e-9)


@pytest.mark.parametrize("variant", LEARNED)
def test_learned_positions_are_refused_on_the_bridge_and_load_by_default_on_either_line(variant):
    with pytest.raises(UnsupportedArchitectureError, match=r"learned absolute position.*backend='auto'"):
        load_model(f"zoo:{variant}", backend="bridge")
    loaded = load_model(f"zoo:{variant}")  # a HookedTransformer on 3.x, a MiniTransformer on 4.x
    assert loaded.spec.extra["backend"] == "hooked" and loaded.spec.rope_kind == "none"
    assert isinstance(loaded.model, MiniTransformer) != backends.hooked_available()
    prompts = build_prompts(loaded, source="random", T=T, N=4, seed=0)
    assert (check_identity(loaded, prompts)["max_abs_error_pattern"] < 1e-5).all()
    assert decompose(loaded, prompts, progress=False).heads["total"].notna().all()


def test_a_checkpoint_that_is_not_the_recipes_model_is_refused_not_converted():
    recipe = recipe_for("nope")
    parameters = load_file(str(find("zoo:nope").weights))
    moved = dict(parameters, **{"pos_embed.W_pos": parameters["pos_embed.W_pos"] + 1e-3})
    with pytest.raises(CorruptFileError, match="W_pos is not zero"):
        hf_state_dict(recipe, moved)
    with pytest.raises(CorruptFileError, match="has no blocks.3.mlp.b_in"):
        hf_state_dict(recipe, {k: v for k, v in parameters.items() if k != "blocks.3.mlp.b_in"})
    with pytest.raises(CorruptFileError, match="parameters the recipe's model does not"):
        hf_state_dict(recipe_for("rope"), parameters)  # NoPE's W_pos has no place in a RoPE model


def test_zoo_training_runs_on_either_line_and_is_bit_identical_on_a_rerun(tmp_path):
    """Training builds a HookedTransformer on 3.x and a MiniTransformer on 4.x; on one line, a rerun
    gives the same weights bit for bit."""
    import dataclasses
    import pydoc_data.topics

    from lens_position.models.zoo.corpus import corpus_of

    corpus = corpus_of([pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)][:40])
    tiny = dataclasses.replace(recipe_for("learned"), variant="tiny-learned", n_layers=1, attn_types=("global",),
                               d_model=16, n_heads=2, d_mlp=32, steps=4, extend_at=0, eval_every=2,
                               n_eval_sequences=2, corpus_sha256=corpus.sha256)
    first = train(tiny, work_dir=tmp_path / "a", corpus=corpus, progress=False)
    again = train(tiny, work_dir=tmp_path / "b", corpus=corpus, progress=False)
    assert set(first.parameters) == set(build_model(tiny).state_dict()) - {
        k for k in build_model(tiny).state_dict() if k.split(".")[-1] in ("IGNORE", "mask", "rotary_sin", "rotary_cos")}
    assert all(torch.equal(first.parameters[k], again.parameters[k]) for k in first.parameters)
    assert first.held_out_bits > 0
