"""Sink metrics under each published definition: each checked against its authors' computation where it
is public (Gu et al.'s through the sink rate already checked against their code, StreamingLLM's eviction
against a decoding loop with an evicting cache), against plain hook computations, and bad inputs refused."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.sink_definitions import DEFINITIONS, eviction_mask, sink_metric
from lens_position.analyses.sinks import sink_rate
from lens_position.core.data import build_document_prompts
from lens_position.ground.errors import BadInputError
from lens_position.models.tiny import tiny_hf_model
from tests.helpers.streaming_llm import evicting_decode_loss

pytestmark = pytest.mark.tl4


@pytest.mark.parametrize("condition", ["natural", "random", "repeated"])
def test_gu_is_the_sink_rate_on_each_of_gus_inputs(tiny_llama, condition):
    """Gu et al.'s three input conditions: documents, random tokens after the BOS, one token repeated
    without BOS."""
    ours = sink_metric(tiny_llama, definition="gu", condition=condition, N=6, progress=False).frame.iloc[0]
    gu = sink_rate(tiny_llama, conditions=(condition,), protocol="documents", T=64, N=6, progress=False).frame
    assert ours["value"] == gu["sink_rate"].iloc[0]
    assert (ours["value_lo"], ours["value_hi"]) == (gu["sink_rate_lo"].iloc[0], gu["sink_rate_hi"].iloc[0])
    assert ours["eps"] == 0.3 and ours["seq_len"] == 64 and ours["condition"] == condition


def test_given_prompts_are_labelled_as_given(tiny_llama):
    prompts = build_document_prompts(tiny_llama, T=16, N=3)
    frame = sink_metric(tiny_llama, prompts, definition="first_token_mass", progress=False).frame
    assert (frame["condition"] == "given").all()
    with pytest.raises(BadInputError, match="either prompts or a condition"):
        sink_metric(tiny_llama, prompts, condition="random", progress=False)


def test_barbero_thresholds_the_same_scores_at_eps_0_8(tiny_llama):
    prompts = build_document_prompts(tiny_llama, T=32, N=5)
    for eps in (0.05, 0.8):
        rate = sink_metric(tiny_llama, prompts, definition="gu", eps=eps, progress=False).frame["value"].iloc[0]
        assert rate == pytest.approx(sink_metric(tiny_llama, prompts, definition="barbero", eps=eps,
                                                 progress=False).frame["value"].iloc[0])
    assert sink_metric(tiny_llama, prompts, definition="barbero", progress=False).frame["eps"].iloc[0] == 0.8


def test_first_token_mass_is_the_mean_pattern_on_key_0_past_query_0(tiny_llama):
    prompts = build_document_prompts(tiny_llama, T=32, N=4)
    result = sink_metric(tiny_llama, prompts, definition="first_token_mass", progress=False)
    model = tiny_llama.backend.model
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(tiny_llama.spec.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(prompts.tokens, names_filter=lambda name: name in names)
    mass = torch.stack([cache[name][:, :, 1:, 0].double().mean((1, 2)) for name in names]).mean(0)
    np.testing.assert_allclose(result.per_prompt["first_token_mass"].to_numpy(), mass.numpy(), atol=1e-6)
    assert 0 <= result.frame["value_lo"].iloc[0] <= result.frame["value"].iloc[0] <= result.frame["value_hi"].iloc[0]


def test_eviction_equals_decoding_with_an_evicting_cache(tiny_llama):
    prompts = build_document_prompts(tiny_llama, T=48, N=2)
    result = sink_metric(tiny_llama, prompts, definition="eviction", window=12, sinks=2, progress=False)
    hf_model, _ = tiny_hf_model("tiny-llama")
    for row, ids in enumerate(prompts.tokens):
        for column, sinks in (("loss_window", 0), ("loss_window_sinks", 2)):
            reference = evicting_decode_loss(hf_model, ids, window=12, sinks=sinks, first=12)
            assert result.per_prompt[column].iloc[row] == pytest.approx(reference, abs=2e-4)
        dense = evicting_decode_loss(hf_model, ids, window=48, sinks=0, first=12)
        assert result.per_prompt["loss_dense"].iloc[row] == pytest.approx(dense, abs=2e-4)
    frame = result.frame.set_index("quantity")
    assert frame.loc["ppl_ratio", "value"] == pytest.approx(
        math.exp((result.per_prompt["loss_window"] - result.per_prompt["loss_window_sinks"]).mean()))


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 40), st.integers(1, 12), st.integers(0, 4))
def test_the_eviction_mask_keeps_the_window_and_the_first_keys(T, window, sinks):
    keep = eviction_mask(T, window, sinks)
    for i in range(T):
        kept = set(torch.nonzero(keep[i]).flatten().tolist())
        assert kept == {j for j in range(i + 1) if i - j < window or j < sinks}


@pytest.mark.parametrize("options, message", [
    ({"definition": "xiao"}, "unknown sink definition"), ({"eps": 1.5}, "eps"), ({"N": 0}, "N"),
    ({"definition": "eviction", "window": 100, "T": 64}, "window < T - 1"),
    ({"definition": "eviction", "window": 8, "sinks": 8, "T": 64}, "sinks < window"),
    ({"condition": "shuffled"}, "condition"), ({"condition": "repeated_bos"}, "condition"),
])
def test_bad_options_are_refused_by_name(tiny_llama, options, message):
    with pytest.raises(BadInputError, match=message):
        sink_metric(tiny_llama, progress=False, **options)


def test_every_definition_names_its_source():
    assert set(DEFINITIONS) == {"gu", "barbero", "first_token_mass", "eviction"}
    assert all(source for _, _, source in DEFINITIONS.values())
