"""The three instruments (position-0 convergence, window-aware sinks, rotary bands) on zoo
models: small zoo-architecture decoders built in code from shrunk recipes (random weights,
seconds on a CPU), each number checked against the same quantity computed by hand from the
model's own activations, and the variants without rotary frequencies refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import replacement_embedding
from lens_position.analyses.rotary_bands import rotary_bands, rotary_frequencies
from lens_position.analyses.sinks import first_visible_keys, window_sinks
from lens_position.core.intervals import Bootstrap
from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models.zoo.architecture import build_model
from lens_position.models.zoo.recipe import VARIANTS
from lens_position.models.zoo.store import as_loaded_model

T, N, WINDOW = 24, 6, 8
FEW = Bootstrap(n_resamples=20)


def zoo_model(variant: str, **changes):
    """``variant``'s recipe at a test's size (2 layers, d_model 32, context 32, window 8), built in
    code with random weights; ``init_std`` 0.3 so that attention is far from uniform."""
    recipe = VARIANTS[variant]
    layers = recipe.attn_types[:1] + recipe.attn_types[-1:]  # window-mix keeps one local, one global
    sizes = dict(n_layers=2, d_model=32, n_heads=2, d_mlp=64, context=32, attn_types=layers, init_std=0.3,
                 window=WINDOW if recipe.window else None, extend_at=0, steps=2, warmup=1)
    recipe = dataclasses.replace(recipe, **{**sizes, **changes})
    return as_loaded_model(build_model(recipe), recipe, name=f"zoo:{variant}-test", source="test"), recipe


def prompts_of(loaded, seed: int = 0) -> torch.Tensor:
    """``N`` byte sequences of ``T`` tokens with the recipe's BOS (id 1) at position 0."""
    tokens = torch.randint(3, 259, (N, T), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = loaded.tokenizer.bos_token_id
    return tokens


@pytest.mark.parametrize("variant", ["rope", "window-mix", "learned", "nope"])
def test_convergence_on_one_token_sequences_is_position_0_of_the_full_prompts(variant):
    """The instrument runs one-token sequences; in every zoo mechanism (a window, learned
    positions added after the token embedding, none) that is what position 0 of a full prompt
    computes: its cosines equal the ones measured by hand on the whole prompts."""
    loaded, _ = zoo_model(variant)
    tokens = prompts_of(loaded)
    conv = position0_convergence(loaded, tokens, replacements=("mean", "random"), n_random=1, bootstrap=FEW,
                                 progress=False)
    hooked = loaded.model
    names = [f"blocks.{l}.hook_resid_post" for l in range(hooked.cfg.n_layers)]
    _, clean = hooked.run_with_cache(tokens, names_filter=names)
    for label, vector in (("mean", replacement_embedding(loaded, tokens, "mean")),
                          ("random:0", replacement_embedding(loaded, tokens, "random", seed=0))):
        def replace(activation, hook, vector=vector):
            activation[:, 0] = vector
            return activation

        with hooked.hooks(fwd_hooks=[("hook_embed", replace)]):
            _, replaced = hooked.run_with_cache(tokens, names_filter=names)
        measured = conv.per_replacement[conv.per_replacement["replacement"] == label].sort_values("layer")
        by_hand = [float(torch.cosine_similarity(replaced[name][0, 0].double(), clean[name][0, 0].double(), dim=0))
                   for name in names]
        assert measured["cosine"].tolist() == pytest.approx(by_hand, abs=1e-5), label
    assert conv.layers["layer_type"].tolist() == list(loaded.spec.layer_types)


def test_window_sinks_on_a_zoo_local_global_mix_are_the_patterns_read_by_hand():
    """Past the window (T > W) a local layer's window-aware score is the attention on each query's
    first visible key, Gu et al.'s the attention on position 0; in the global layer both are the
    same number."""
    loaded, recipe = zoo_model("window-mix")
    assert loaded.spec.layer_types == ("local", "global") and loaded.spec.layer_windows == (WINDOW, None)
    tokens = prompts_of(loaded)
    ws = window_sinks(loaded, tokens, bootstrap=FEW, progress=False)
    _, cache = loaded.model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    for layer, window in enumerate(loaded.spec.layer_windows):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # [batch, head, query, key]
        first = first_visible_keys(T, window)
        on_first = pattern.gather(-1, first.view(1, 1, -1, 1).expand(N, recipe.n_heads, -1, 1))[..., 0]
        rows = ws.heads[ws.heads["layer"] == layer].sort_values("head")
        assert rows["gu_score"].tolist() == pytest.approx(pattern[..., 0].mean((0, 2)).tolist(), abs=1e-6)
        assert rows["window_score"].tolist() == pytest.approx(on_first.mean((0, 2)).tolist(), abs=1e-6)
        if window is None:  # the same up to the float32 row sum the window-aware score divides by
            assert rows["window_score"].tolist() == pytest.approx(rows["gu_score"].tolist(), abs=1e-6)
        else:  # queries past the window cannot see position 0: Gu et al.'s score counts 0 for them
            assert (rows["window_score"] > rows["gu_score"]).all()
    assert set(ws.layer_types["layer_type"]) == {"local", "global"}


@pytest.mark.parametrize("variant", ["rope", "ntk", "window"])
def test_rotary_bands_on_zoo_models_split_the_decompositions_R_at_the_trained_base(variant):
    """The bands are the model's own frequencies (for ``ntk`` the extended base θ·α^(d/(d-2)),
    not the pre-training one), the bands plus the cross terms give the decomposition's R exactly,
    and the R' attribution's error is reported."""
    loaded, recipe = zoo_model(variant, extend_at=1 if variant == "ntk" else 0)
    tokens = prompts_of(loaded)
    half = recipe.d_head // 2
    expected = recipe.final_rotary_base ** (-torch.arange(half, dtype=torch.float64) * 2 / recipe.d_head)
    assert rotary_frequencies(loaded, 0).double().tolist() == pytest.approx(expected.tolist(), rel=1e-5)
    if variant == "ntk":
        assert recipe.final_rotary_base > recipe.rotary_base
    bands = rotary_bands(loaded, tokens, n_bands=2, batch_size=N, bootstrap=FEW, progress=False)
    reference = decompose(loaded, tokens, batch_size=N, bootstrap=FEW, progress=False).heads
    merged = bands.heads.merge(reference[["layer", "head", "R", "R_rf"]], on=["layer", "head"], suffixes=("", "_ref"))
    assert len(merged) == recipe.n_layers * recipe.n_heads
    assert merged["R"].tolist() == pytest.approx(merged["R_ref"].tolist(), abs=1e-9)
    assert merged["R_rf"].tolist() == pytest.approx(merged["R_rf_ref"].tolist(), abs=1e-9)
    # the bands are float64 sums of the rotated q and k, R is read from the model's float32 scores:
    # their round-off (relative 6e-8) bounds the agreement
    assert (merged["R"] > 1e-3).any()
    assert (merged["R_split_error"].abs() <= 1e-6 * merged["R"].abs().clip(lower=1e-3)).all()
    assert merged["R_rf_attribution_error"].notna().all()
    assert set(bands.layers["layer_type"]) == set(loaded.spec.layer_types)


@pytest.mark.parametrize("variant", ["nope", "learned"])
def test_rotary_bands_refuse_zoo_variants_without_rotary_frequencies(variant):
    """NoPE and learned absolute positions have no rotary frequencies: refused, and their spec says
    so (the pipeline's band step skips models whose ``rope_kind`` is "none")."""
    loaded, _ = zoo_model(variant)
    assert loaded.spec.rope_kind == "none"
    with pytest.raises(UnsupportedArchitectureError, match="no rotary embedding"):
        rotary_bands(loaded, prompts_of(loaded), n_bands=2, bootstrap=FEW, progress=False)
