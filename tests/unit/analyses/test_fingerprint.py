"""C5: the position-0 fingerprint depends on token 0 alone."""

import pytest
import torch

from lens_position.analyses.fingerprint import (
    auto_bos_policy,
    counterfactual_token0,
    fingerprint,
    position0_activations,
    residual_names,
)
from lens_position.analyses.patching import cache_activations
from lens_position.core.data import build_prompts
from lens_position.ground.errors import BadInputError


@pytest.mark.parametrize("name", ["tiny_llama", "tiny_gemma3"])
def test_auto_bos_fingerprint_is_identical_across_inputs_and_varying_token0_is_not(name, request):
    model = request.getfixturevalue(name)
    result = fingerprint(model, T=24, N=4, seed=0)
    frame = result.frame
    assert len(frame) == 2 * (model.model.cfg.n_layers + 1)
    auto = frame[frame["condition"] == "auto-bos"]
    varying = frame[frame["condition"] == "varying-token0"]
    assert auto["is_float_noise"].all()
    assert auto["cos_to_bos"].to_numpy() == pytest.approx(1.0, abs=1e-6)
    assert (varying["n_distinct_token0"] > 1).all()
    assert (varying["spread_relative"] > 0.1).all()
    assert (frame["norm"] > 0).all()
    assert result.provenance["options"]["bos_policy"]["auto-bos"] == auto_bos_policy(model)


@pytest.mark.parametrize("batch_size", [1, 2, 3])
def test_a_batch_size_holds_fewer_sequences_per_pass_with_the_same_fingerprint(tiny_gemma3, batch_size):
    passes = []
    hook = tiny_gemma3.model.embed.register_forward_pre_hook(lambda module, args: passes.append(args[0].shape[0]))
    try:
        batched = fingerprint(tiny_gemma3, T=24, N=5, seed=0, batch_size=batch_size, progress=False).frame
    finally:
        hook.remove()
    assert max(passes) == batch_size and sum(passes) == 2 * 5
    whole = fingerprint(tiny_gemma3, T=24, N=5, seed=0, progress=False).frame  # N <= the default: one pass
    assert batched["is_float_noise"].equals(whole["is_float_noise"])
    for column in ("norm", "cos_to_bos", "spread_relative"):
        assert batched[column].to_numpy() == pytest.approx(whole[column].to_numpy(), rel=1e-5, abs=1e-6), column


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, "2", True])
def test_a_batch_size_that_is_no_count_is_refused(tiny_llama, batch_size):
    with pytest.raises(BadInputError, match="batch_size"):
        fingerprint(tiny_llama, T=8, N=2, batch_size=batch_size, progress=False)


def test_bos_policy_follows_the_tokenizer(tiny_llama, tiny_gemma3):
    assert auto_bos_policy(tiny_llama) == "force"  # like SmolLM2: no BOS from the tokenizer
    assert auto_bos_policy(tiny_gemma3) == "tokenizer"  # like Gemma-3: prepends <bos>


def test_one_token_run_gives_the_fingerprint_of_any_longer_run(tiny_gemma3):
    prompts = build_prompts(tiny_gemma3, source="natural", T=20, N=3, bos="none", seed=2)
    names = residual_names(tiny_gemma3)
    full = cache_activations(tiny_gemma3, prompts, names)
    short = position0_activations(tiny_gemma3, prompts.tokens[:, 0], names)
    for name in names:
        torch.testing.assert_close(short[name][:, 0], full[name][:, 0], atol=1e-5, rtol=1e-5)


def test_counterfactual_token0(tiny_llama):
    with_bos = build_prompts(tiny_llama, source="natural", T=12, N=2, bos="force", seed=0)
    assert counterfactual_token0(tiny_llama, with_bos, "no-bos").tolist() == with_bos.tokens[:, 1].tolist()
    assert counterfactual_token0(tiny_llama, with_bos, "token:70").tolist() == [70, 70]
    assert counterfactual_token0(tiny_llama, with_bos, "token:a").tolist() == [3 + ord("a")] * 2
    without = build_prompts(tiny_llama, source="natural", T=12, N=2, bos="none", seed=0)
    with pytest.raises(BadInputError, match="bos='force'"):
        counterfactual_token0(tiny_llama, without, "no-bos")
    with pytest.raises(BadInputError, match="outside the vocabulary"):
        counterfactual_token0(tiny_llama, with_bos, "token:100000")
    with pytest.raises(BadInputError, match="not one"):
        counterfactual_token0(tiny_llama, with_bos, "token:abc")


@pytest.mark.slow
def test_smollm2_auto_bos_fingerprint_is_float_noise(smollm2):
    result = fingerprint(smollm2, T=32, N=3, seed=0)
    auto = result.frame[result.frame["condition"] == "auto-bos"]
    varying = result.frame[result.frame["condition"] == "varying-token0"]
    assert auto["is_float_noise"].all()
    assert (varying["spread_relative"].iloc[1:] > 1e-2).all()
