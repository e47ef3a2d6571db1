"""decompose(model, prompts, scores=cache) on what a TransformerLens user already has: an
ActivationCache from run_with_cache, its rotated q/k, or a {layer: scores} mapping. The numbers
are those of decompose(model, prompts); a cache that cannot give them is refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lens_position.analyses.decompose import COMPONENTS, decompose
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.ground.errors import BadInputError, NonFiniteError
from lens_position.models import load_model

BOOT = Bootstrap(n_resamples=20)
pytestmark = pytest.mark.tl4  # a TransformerBridge's ActivationCache too


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = load_model("tiny-llama")
    prompts = build_prompts(model, source="random", T=20, N=6, bos="force")
    _, cache = model.model.run_with_cache(prompts.tokens)
    reference = decompose(model, prompts, bootstrap=BOOT, progress=False)
    return model, prompts, cache, reference


def _assert_same(result, reference, atol=1e-10):
    columns = [c for c in reference.heads.columns if reference.heads[c].dtype.kind == "f"]
    assert {f"{c}_lo" for c in COMPONENTS} <= set(columns)  # the intervals are compared too
    np.testing.assert_allclose(result.heads[columns].to_numpy(float), reference.heads[columns].to_numpy(float),
                               rtol=0, atol=atol, equal_nan=True)
    np.testing.assert_allclose(result.layers[COMPONENTS].to_numpy(float), reference.layers[COMPONENTS].to_numpy(float),
                               rtol=0, atol=atol)


def test_an_activation_cache_gives_the_numbers_of_the_forward_pass(setup):
    model, prompts, cache, reference = setup
    result = decompose(model, prompts, scores=cache, bootstrap=BOOT, progress=False)
    _assert_same(result, reference)
    assert result.provenance["options"]["scores_from"] == "cached hook_attn_scores"


def test_a_layer_to_scores_mapping_gives_the_same_numbers_for_the_layers_asked(setup):
    model, prompts, cache, reference = setup
    scores = {layer: cache[f"blocks.{layer}.attn.hook_attn_scores"] for layer in (0, 2)}
    result = decompose(model, prompts, scores=scores, layers=(0, 2), bootstrap=BOOT, progress=False)
    part = decompose(model, prompts, layers=(0, 2), bootstrap=BOOT, progress=False)
    _assert_same(result, part)
    assert sorted(result.heads["layer"].unique()) == [0, 2]


def test_rotated_queries_and_keys_give_the_same_numbers(setup):
    model, prompts, cache, reference = setup
    rotated = {name: cache[name] for name in cache.keys() if name.endswith(("hook_rot_q", "hook_rot_k"))}
    result = decompose(model, prompts, scores=rotated, bootstrap=BOOT, progress=False)
    assert result.provenance["options"]["scores_from"] == "cached rotated q/k"
    _assert_same(result, reference, atol=1e-6)  # q.k formed here: float32 rounding of another einsum


def test_a_cache_without_the_scores_is_refused_naming_the_hook(setup):
    model, prompts, cache, _ = setup
    partial = {name: cache[name] for name in cache.keys() if not name.startswith("blocks.1.attn.")}
    with pytest.raises(BadInputError, match=r"layer\(s\) \[1\].*blocks\.1\.attn\.hook_attn_scores"):
        decompose(model, prompts, scores=partial, progress=False)


def test_scores_without_the_mask_are_refused_the_key_set_coming_from_the_model(setup):
    model, prompts, cache, _ = setup
    name = "blocks.0.attn.hook_attn_scores"
    unmasked = cache[name].clone()
    q = cache["blocks.0.attn.hook_rot_q"]
    k = cache["blocks.0.attn.hook_rot_k"]
    unmasked[:] = torch.einsum("bqhd,bkhd->bhqk", q, k) / model.model.cfg.attn_scale  # q.k, no mask
    with pytest.raises(BadInputError, match="without the mask applied"):
        decompose(model, prompts, scores={0: unmasked}, layers=[0], progress=False)


@pytest.mark.parametrize("bad", ["nan", "inf_in_key_set"])
def test_non_finite_scores_are_refused(setup, bad):
    model, prompts, cache, _ = setup
    scores = cache["blocks.1.attn.hook_attn_scores"].clone()
    scores[2, 1, 7, 3] = float("nan") if bad == "nan" else float("-inf")
    with pytest.raises(NonFiniteError, match="layer 1"):
        decompose(model, prompts, scores={1: scores}, layers=[1], progress=False)


@pytest.mark.parametrize("shape", ["fewer_prompts", "shorter", "heads", "no_batch"])
def test_scores_of_the_wrong_shape_are_refused(setup, shape):
    model, prompts, cache, _ = setup
    scores = cache["blocks.0.attn.hook_attn_scores"]
    scores = {"fewer_prompts": scores[:4], "shorter": scores[:, :, :10, :10], "heads": scores[:, :2],
              "no_batch": scores[0]}[shape]
    with pytest.raises(BadInputError, match="shape"):
        decompose(model, prompts, scores={0: scores}, layers=[0], progress=False)


def test_a_cache_of_other_prompts_is_refused(setup):
    model, prompts, cache, _ = setup
    others = build_prompts(model, source="random", T=20, N=6, bos="force", seed=1)
    with pytest.raises(BadInputError, match="not this model's on these prompts"):
        decompose(model, others, scores=cache, progress=False)


def test_a_cache_of_another_model_is_refused(setup):
    model, prompts, cache, _ = setup
    torch.manual_seed(1)
    other = load_model("tiny-llama")
    with pytest.raises(BadInputError, match="another model"):
        decompose(other, prompts, scores=cache, progress=False)
    scores = {layer: cache[f"blocks.{layer}.attn.hook_attn_scores"] for layer in range(3)}
    for block in other.model.blocks:  # the same architecture, other weights: seen by the fresh run
        block.attn.W_Q.data.mul_(1.5)
    with pytest.raises(BadInputError, match="not this model's"):
        decompose(other, prompts, scores=scores, progress=False)


def test_a_cache_without_a_batch_dimension_and_a_bare_tensor_are_refused(setup):
    model, prompts, cache, _ = setup
    single = build_prompts(model, source="random", T=20, N=1, bos="force")
    _, one = model.model.run_with_cache(single.tokens, remove_batch_dim=True)
    with pytest.raises(BadInputError, match="no batch dimension"):
        decompose(model, single, scores=one, progress=False)
    with pytest.raises(BadInputError, match="single tensor"):
        decompose(model, prompts, scores=cache["blocks.0.attn.hook_attn_scores"], progress=False)


def test_cached_scores_and_patches_together_are_refused(setup):
    model, prompts, cache, _ = setup
    hook = ("blocks.0.hook_resid_pre", lambda x, hook: x)
    with pytest.raises(BadInputError, match="forward pass"):
        decompose(model, prompts, scores=cache, fwd_hooks=[hook], progress=False)
