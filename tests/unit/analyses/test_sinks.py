"""Sink heads and sink-reading heads against a hand-set ground truth.

The ground-truth model (three attention-only layers, two heads each, float64):

- every token embeds to a "content" direction ``e0``; the BOS token also to a "BOS marker"
  ``e1``;
- head (1, 0) is the designed **sink-reading head**: its key reads the BOS marker (a fixed
  bonus ``b`` on the score of key 0 when key 0 is BOS), so it attends to position 0 with
  the position-dependent weight ``A[i, 0] = e^b / (e^b + i)``; its value reads the BOS
  marker and ``W_O`` writes the result into a direction ``e2``. After layer 1 the residual
  stream therefore carries ``e2[i] = A[i, 0]``, an absolute-position signal that came from
  position 0;
- head (2, 0) reads ``e2`` into its query, so its scores are ``e2[i] * g(i - j)``: it has a
  residual component ``R > 0`` carried entirely by head (1, 0);
- every other head has offset-only scores (random rotated query/key from ``e0``) and
  writes nothing.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sink_model import BONUS, sink_reading_model

from lens_position.analyses import sinks
from lens_position.analyses.decompose import decompose
from lens_position.core.columns import display_order
from lens_position.core.inputs import check_prompts
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import BOS_TOKEN_ID, toy_tokens


@pytest.fixture(scope="module")
def model():
    return sink_reading_model()


@pytest.fixture(scope="module")
def tokens():
    return toy_tokens(6, 32, bos=True, seed=0)


def test_the_designed_sink_head_has_the_closed_form_sink_score(model, tokens):
    result = sinks.sink_heads(model, tokens)
    expected = sum(math.exp(BONUS) / (math.exp(BONUS) + i) for i in range(32)) / 32
    assert result.scores[1, 0].item() == pytest.approx(expected, abs=1e-9)
    assert result.frame.set_index(["layer", "head"]).loc[(1, 0), "is_sink"]
    assert list(result.frame.columns[:4]) == ["layer", "head", "layer_type", "sink_score"]
    assert result.sink_rate_pooled == pytest.approx(result.frame["is_sink"].mean())
    assert result.provenance["options"]["eps"] == 0.3


def test_uniform_heads_have_sink_score_equal_to_the_mean_of_one_over_i_plus_one(tokens):
    uniform = sink_reading_model(bonus=0.0)
    with torch.no_grad():
        for block in uniform.model.blocks:
            block.attn.W_Q.zero_()
    scores = sinks.sink_scores(uniform, check_prompts(uniform, tokens), query_range=(4, 20))
    expected = sum(1 / (i + 1) for i in range(4, 20)) / 16
    torch.testing.assert_close(scores, torch.full_like(scores, expected))


def test_designed_sink_reading_head_is_found_and_ranked_first(model, tokens):
    result = sinks.sink_reading_heads(model, tokens, query_range=(0, 32), n_ablate=1)
    first = result.frame.iloc[0]
    assert (first["layer"], first["head"], first["reading_rank"]) == (1, 0, 1)
    # with BOS gone from its key and value, the head attends uniformly and outputs nothing
    assert first["R_base"] > 0.05
    assert first["R_patched"] == pytest.approx(0.0, abs=1e-10)
    assert first["output_change"] == pytest.approx(1.0, abs=1e-12)
    # no other head reads position 0's fingerprint: its own key/value patch changes nothing
    others = result.frame.iloc[1:]
    assert others["R_change"].abs().max() < 1e-10
    assert others["output_change"].abs().max() < 1e-10
    assert list(result.frame.columns) == display_order([
        "layer", "head", "layer_type", "output_change", "R_base", "R_patched", "R_change", "R_heldout_change",
        "R_change_lo", "R_change_hi", "R_heldout_change_lo", "R_heldout_change_hi", "reading_rank"])
    # paired intervals over sequences: the reader's change excludes 0, the others' is 0 in every replicate.
    # Every sequence loses the same R here, so the (bias-corrected) interval is the estimate to round-off.
    assert first["R_change_hi"] < 0
    assert (first["R_change_lo"], first["R_change_hi"]) == (pytest.approx(first["R_change"], abs=1e-12),
                                                            pytest.approx(first["R_change"], abs=1e-12))
    assert first["R_heldout_change_hi"] < 0
    assert others[["R_change_lo", "R_change_hi"]].abs().max().max() < 1e-10
    assert result.provenance["options"]["intervals"]["n_resamples"] == 200
    assert "paired" in result.provenance["options"]["intervals"]["pairing"]


def test_ablating_the_sink_reading_head_removes_the_residual_component_it_carried(model, tokens):
    result = sinks.sink_reading_heads(model, tokens, query_range=(0, 32), n_ablate=1)
    assert result.ablated == [(1, 0)]
    heads = result.ablation_heads.set_index(["ablation", "layer", "head"])
    for kind in ("zero", "mean"):
        carried = heads.loc[(kind, 2, 0)]
        assert carried["R_before"] > 1e-3  # far above float noise (1e-10)
        assert carried["R_after"] == pytest.approx(0.0, abs=1e-10)
        assert carried["R_change_hi"] < 0  # every sequence loses the same R: the interval is the estimate
        assert (carried["R_change_lo"], carried["R_change_hi"]) == (pytest.approx(carried["R_change"], abs=1e-12),
                                                                    pytest.approx(carried["R_change"], abs=1e-12))
        # heads that never read e2 keep their R
        untouched = heads.loc[(kind, 2, 1)]
        assert untouched["R_after"] == pytest.approx(untouched["R_before"], abs=1e-12)
    layers = result.ablation.set_index(["ablation", "layer"])
    assert layers.loc[("zero", 2), "R_after"] < layers.loc[("zero", 2), "R_before"]
    assert layers.loc[("zero", 2), "R_change_hi"] < 0 <= layers.loc[("zero", 0), "R_change_hi"]
    assert list(result.ablation.columns) == display_order([
        "ablation", "layer", "R_before", "R_after", "R_heldout_before", "R_heldout_after", "R_change", "R_change_lo",
        "R_change_hi", "R_heldout_change", "R_heldout_change_lo", "R_heldout_change_hi"])
    assert list(result.ablation_heads.columns) == display_order(["layer", "head", "ablation", "ablated", "R_before",
                                                                 "R_after", "R_change", "R_change_lo", "R_change_hi"])


def test_own_position0_patches_keep_every_block_on_the_base_residual_stream(model, tokens):
    patches = sinks.own_position0_patches(model, check_prompts(model, tokens), "no-bos")
    patched = decompose(model, tokens, patches=patches,
                        batch_size=4, progress=False)
    # head (2, 0) reads e2 from the pinned base residual: its R is untouched by the
    # removal of BOS from layer 1's key/value
    base = decompose(model, tokens, batch_size=4, progress=False)
    r = lambda d: d.heads.set_index(["layer", "head"]).loc[(2, 0), "R"]  # noqa: E731
    assert r(patched) == pytest.approx(r(base), abs=1e-12)


def test_counterfactuals_are_checked(model, tokens):
    with pytest.raises(BadInputError, match="do not start with BOS"):
        sinks.sink_reading_heads(model, toy_tokens(2, 8, bos=False), query_range=(0, 8))
    with pytest.raises(BadInputError, match="change nothing"):
        sinks.sink_reading_heads(model, tokens, counterfactual=f"token:{BOS_TOKEN_ID}")
    with pytest.raises(BadInputError, match="unknown counterfactual"):
        sinks.sink_reading_heads(model, tokens, counterfactual="shuffle")
    with pytest.raises(BadInputError, match="selects no queries"):
        sinks.sink_scores(model, check_prompts(model, tokens), query_range=(40, 50))


def test_sink_rate_reports_every_condition(tiny_gemma3):
    result = sinks.sink_rate(tiny_gemma3, T=16, N=4, seed=0, protocol="documents")
    frame = result.frame
    assert list(frame["condition"]) == ["natural", "random", "repeated", "repeated_bos"]
    assert list(frame.columns[:5]) == ["condition", "sink_rate", "sink_rate_lo", "sink_rate_hi", "sink_rate_pooled"]
    n_heads = tiny_gemma3.model.cfg.n_layers * tiny_gemma3.model.cfg.n_heads
    assert (frame["n_heads"] == n_heads).all()
    assert frame["sink_rate_pooled"].to_numpy() == pytest.approx((frame["n_sink_heads"] / n_heads).to_numpy())
    per_condition = result.heads.groupby("condition")["is_sink"].mean()
    assert per_condition["random"] == pytest.approx(frame.set_index("condition").loc["random", "sink_rate_pooled"])
    assert (frame["sink_rate_lo"] <= frame["sink_rate"] + 1e-12).all()
    assert (frame["sink_rate"] <= frame["sink_rate_hi"] + 1e-12).all()
    assert set(result.provenance["data"]) == {"natural", "random", "repeated", "repeated_bos"}
    # Gu et al.'s inputs: the first T tokens of whole documents, with the tokenizer's own BOS (Gemma-3 prepends it)
    natural = result.provenance["data"]["natural"]
    assert natural["position0"] == "bos" and "documents" in natural["extra"]["protocol"]
    # their repeated condition: one token repeated from position 0, no BOS; the BOS-first variant under its own name
    by_condition = frame.set_index("condition")
    assert (by_condition.loc["repeated", "position0"], by_condition.loc["repeated", "bos"]) == ("content", "none")
    assert by_condition.loc["repeated_bos", "position0"] == "bos"


@pytest.mark.parametrize("protocol", ["documents", "windows"])
def test_gu_repeated_condition_is_one_token_repeated_without_bos(tiny_llama, protocol):
    sets = sinks.sink_rate_prompts(tiny_llama, T=12, N=5, seed=3, protocol=protocol)
    repeated, after_bos = sets["repeated"].tokens, sets["repeated_bos"].tokens
    assert (repeated == repeated[:, :1]).all()  # every position holds the row's one token, position 0 too
    assert (after_bos[:, 0] == tiny_llama.spec.bos_token_id).all() and (after_bos[:, 1:] == after_bos[:, 1:2]).all()
    assert (repeated[:, 0] != tiny_llama.spec.bos_token_id).all()


@pytest.mark.parametrize("conditions", ["repeated", (), ("natural", "natural"), ("natural", "shuffled"),
                                        ("repeated-bos",)])
def test_sink_rate_conditions_are_checked(tiny_llama, conditions):
    with pytest.raises(BadInputError, match="condition"):
        sinks.sink_rate(tiny_llama, conditions=conditions, T=8, N=2, progress=False)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_gu_repeated_condition_gives_gu_et_als_zero_on_the_embedded_models(name, request):
    """Gu et al. report a sink rate of 0.00 for repeated tokens on Mistral-7B, Llama-2-7B and
    Llama-3-8B; their input (one token repeated, no BOS) gives exactly 0 here too, while the same
    tokens after a BOS sink."""
    loaded = request.getfixturevalue(name)
    frame = sinks.sink_rate(loaded, conditions=("repeated", "repeated_bos"), T=64, N=16, protocol="documents",
                            progress=False).frame.set_index("condition")
    assert frame.loc["repeated", "sink_rate"] == 0.0
    assert frame.loc["repeated_bos", "sink_rate"] > 0.2


def test_sink_rate_thresholds_each_prompt_then_averages_as_gu_et_al(model):
    """Gu et al. (eval_sink_open_source.py) threshold every prompt's score, then average the 0/1
    outcomes; averaging the scores over prompts first (the pooled rate) is a different number."""
    tokens = toy_tokens(8, 32, bos=True, seed=1)
    tokens[1::2, 0] = 2  # half the prompts without BOS: the sink-reading head sinks on the others only
    result = sinks.sink_heads(model, tokens, eps=0.3)
    _, cache = model.model.run_with_cache(tokens, names_filter=lambda name: name.endswith("hook_pattern"))
    per_prompt = torch.stack([cache[f"blocks.{layer}.attn.hook_pattern"][:, :, :, 0].mean(-1)
                              for layer in range(3)], dim=1)  # [prompt, layer, head], independent of sinks.py
    assert result.sink_rate == pytest.approx(float((per_prompt > 0.3).double().mean()))
    assert result.sink_rate_pooled == pytest.approx(float((per_prompt.mean(0) > 0.3).double().mean()))
    assert result.sink_rate_pooled - result.sink_rate == pytest.approx(0.5 / 6)  # head (1, 0): 1 pooled, 1/2 per prompt
    lo, hi = result.frame.loc[0, ["sink_score_lo", "sink_score_hi"]]
    assert lo <= result.frame.loc[0, "sink_score"] <= hi


def test_a_sink_score_that_never_varies_has_an_interval_of_zero_width(model, tokens):
    frame = sinks.sink_heads(model, tokens).frame  # every prompt starts with BOS: offset-only heads are exact
    offset_only = frame[(frame["layer"] == 0)]
    assert (offset_only["sink_score_hi"] - offset_only["sink_score_lo"]).abs().max() < 1e-12


@pytest.mark.slow
def test_smollm2_has_sink_heads_on_natural_text(smollm2):
    result = sinks.sink_rate(smollm2, conditions=("natural",), T=64, N=4, bos="force")
    assert 0 < result.frame["sink_rate"].iloc[0] <= 1


def test_decompose_analyses_the_forward_pass_without_changing_it(model, tokens):
    # Every intervention here reads R off decompose's pass, so that pass must be the model's
    # own: the analysis hooks may read the scores but never write them (float64 included:
    # there ``scores.to(torch.float64)`` is the scores tensor itself, not a copy, so an
    # in-place ``masked_fill_`` on it would rewrite the attention the model then applies).
    seen = {}

    def record(activation, hook):
        seen[hook.name] = activation.detach().clone()

    name = "blocks.2.hook_resid_pre"
    decompose(model, tokens, fwd_hooks=[(name, record)], batch_size=len(tokens), progress=False)
    with torch.no_grad():
        _, cache = model.model.run_with_cache(tokens, names_filter=name)
    torch.testing.assert_close(seen[name], cache[name], atol=1e-12, rtol=0)


@given(st.lists(st.floats(0.0, 1.0), min_size=4, max_size=9), st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_a_probability_interval_stays_inside_0_and_1(values, seed):
    """The small-sample widening stretches an interval; a probability's interval is put back on [0, 1]."""
    from lens_position.core.intervals import PROBABILITY, Bootstrap, bootstrap_mean

    mean, lo, hi = bootstrap_mean(np.array(values), Bootstrap(n_resamples=200, seed=seed), PROBABILITY)
    assert 0.0 <= lo <= mean + 1e-12 and mean - 1e-12 <= hi <= 1.0


def test_sink_score_and_sink_rate_intervals_are_probabilities(tiny_llama):
    layers, heads = tiny_llama.spec.n_layers, tiny_llama.spec.n_heads
    tokens = torch.randint(3, 200, (4, 8), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = tiny_llama.spec.bos_token_id
    scores = torch.full((4, layers, heads), 0.999, dtype=torch.float64)
    scores[0] = 0.6  # one prompt far below the others: the widened interval would pass 1
    frame = sinks.sink_heads(tiny_llama, tokens, scores=scores, progress=False).frame
    assert (frame["sink_score_hi"] <= 1.0).all() and (frame["sink_score_lo"] >= 0.0).all()
    assert (frame["sink_score_hi"] == 1.0).any()


def test_the_patched_run_keeps_only_the_measured_queries_of_hook_z(monkeypatch):
    """At long T the detector's memory is what it keeps per layer: the patched run's ``hook_z`` is kept
    at the measured queries only (``query_range``), not ``layers x T x d_model``; the base run's
    ``hook_z`` stays whole (the mean ablation averages it over every position)."""
    kept = []
    result = sinks.WholeActivations.result

    def spy(self):
        out = result(self)
        kept.append({name: tuple(value.shape) for name, value in out.items()})
        return out

    monkeypatch.setattr(sinks.WholeActivations, "result", spy)
    sinks.sink_reading_heads(sink_reading_model(), toy_tokens(3, 24, bos=True, seed=2), query_range=(2, 10),
                             n_ablate=0, progress=False)
    z_only = [shapes for shapes in kept if shapes and all(name.endswith("hook_z") for name in shapes)]
    assert len(z_only) == 1 and all(shape[1] == 8 for shape in z_only[0].values())
    base = [shapes for shapes in kept if any(name.endswith("hook_resid_pre") for name in shapes)]
    assert base and all(shape[1] == 24 for name, shape in base[0].items() if name.endswith("hook_z"))
