"""The takeaways the notebooks end with follow the numbers they are given: the same call on
other numbers says other things, and the comparison with the paper is the claims' own."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from fake_results import fake_results
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from lens_position.analyses.claims import CLAIMS, FAILS, HOLDS, INCONCLUSIVE, PAPER, claims_table
from lens_position.report import takeaways


def _numbers(text: str) -> list[str]:
    return re.findall(r"[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?%?", text)


def test_claims_markdown_renders_the_claims_verdicts_measurements_and_explanations():
    tables = fake_results()
    text = takeaways.claims_markdown(tables, ["C1", "C2", "C3", "C4", "C5"])
    claims = claims_table(tables)
    for claim in CLAIMS:
        assert claim.statement in text
    for _, row in claims[claims["architecture"] != "overall"].iterrows():
        assert f"- {row['architecture']}: **{row['verdict']}**. Measured: {row['measured']}." in text
    # only the claims asked for
    assert set(re.findall(r"\*\*(C\d)\.\*\*", takeaways.claims_markdown(tables, ["C4"]))) == {"C4"}
    with pytest.raises(KeyError, match="C9"):
        takeaways.claims_markdown(tables, ["C9"])


def test_claims_markdown_changes_with_the_numbers():
    """The same call on results where C4 fails (90% removed instead of 40%) says so, with the
    claims' explanation and the measured fraction."""
    holding = takeaways.claims_markdown(fake_results(), ["C4"])
    failing = takeaways.claims_markdown(fake_results(failing=True), ["C4"])
    assert f"**{HOLDS}**" in holding and f"**{FAILS}**" not in holding
    assert f"**{FAILS}**" in failing and f"**{HOLDS}**" not in failing
    explanations = claims_table(fake_results(failing=True)).query("claim == 'C4' and architecture != 'overall'")
    for explanation in explanations["explanation"]:
        assert explanation and explanation in failing
    assert "90%" in failing and "90%" not in holding
    assert f"{PAPER.c4_fraction_removed:.0%}" in failing  # the paper's number, from claims.PAPER


def test_verdicts_is_a_lookup_of_the_claims():
    lookup = takeaways.verdicts(fake_results(failing=True), ["C3", "C4"])
    assert lookup[("C4", "overall")] == FAILS
    assert {claim for claim, _ in lookup} == {"C3", "C4"}


def _overall(fractions, half_width=0.05):
    return pd.DataFrame({"replacement": ["token", "mean", "random"][:len(fractions)],
                         "fraction_removed_rf": fractions,
                         "fraction_removed_rf_lo": [f - half_width for f in fractions],
                         "fraction_removed_rf_hi": [f + half_width for f in fractions]})


@pytest.mark.parametrize("fractions, says", [
    ([0.35, 0.40, 0.45], "Every replacement removes residual component"),
    ([-0.20, -0.30, -0.10], "Every replacement *adds* residual component"),
    ([-0.02, 0.01, -0.03], "No replacement's change is resolved from 0"),
    ([-0.02, -0.12, -0.03], "No replacement removes residual component"),
    ([0.40, -0.30, 0.00], "The replacements disagree"),
])
def test_bos_direction_follows_the_sign_of_the_intervals(fractions, says):
    text = takeaways.bos_direction(_overall(fractions), "model A")
    assert says in text
    for fraction in fractions:
        assert (f"{fraction * 100:+.0f}%" if fraction else "0%") in text  # no sign on a zero
    assert f"mean over replacements {np.mean(fractions):+.0%}" in text
    assert f"about {PAPER.c4_fraction_removed:.0%} removed" in text


def test_bos_direction_without_intervals_uses_the_point_values():
    overall = pd.DataFrame({"replacement": ["token"], "fraction_removed": [-0.02]})
    text = takeaways.bos_direction(overall)
    assert "R (self-referenced) at early queries" in text and "*adds*" in text and "-2%" in text


def _layers(T, R, M, C):
    return pd.DataFrame({"layer": range(len(T)), "total": T, "R": R, "M": M, "C": C})


def test_components_sentence_reports_the_in_sample_table_when_there_is_no_held_out_split():
    text = takeaways.components_sentence(_layers([0.3, 0.5, 0.1], [0.2, 0.1, 0.05], [0.1, 0.3, 0.04],
                                                 [0.0, 0.1, 0.01]), "model A")
    assert text.startswith("On model A") and "no held-out, reference-free columns" in text
    assert "total = 0.300" in text and "R = 0.117" in text and "M = 0.147" in text and "C = 0.037" in text
    assert "R exceeds M in 2 of 3 layers" in text
    assert "the largest total, 0.500, is in layer 1" in text
    other = takeaways.components_sentence(_layers([0.3, 0.5, 0.9], [0.0, 0.0, 0.0], [0.3, 0.5, 0.9],
                                                  [0.0, 0.0, 0.0]))
    assert "R exceeds M in 0 of 3 layers" in other and "is in layer 2" in other


def _recommended(r_rf, m_rf, noise=0.0):
    layers = _layers([0.3] * len(r_rf), [0.1] * len(r_rf), [0.2] * len(r_rf), [0.0] * len(r_rf)).assign(
        R_rf_heldout=r_rf, M_rf_heldout=m_rf, total_heldout=[a + b for a, b in zip(r_rf, m_rf)], n_sequences=8)
    rng = np.random.default_rng(0)
    replicates = pd.concat([layers[["layer", "R_rf_heldout", "M_rf_heldout", "total_heldout"]].assign(
        replicate=b, R_rf_heldout=layers["R_rf_heldout"] + noise * rng.standard_normal(len(layers)))
        for b in range(200)], ignore_index=True)
    replicates["total_heldout"] = replicates["R_rf_heldout"] + replicates["M_rf_heldout"]
    return layers, replicates


def test_components_sentence_leads_with_the_mask_and_residual_shares_of_the_held_out_total():
    layers, replicates = _recommended([0.1, 0.3], [0.3, 0.3], noise=0.01)
    text = takeaways.components_sentence(layers, "model A", replicates)
    # closed form: R' = 0.2, M' = 0.3, total = 0.5 on average: 40% residual, 60% mask
    assert text.startswith("On model A, absolute position accounts for 0.5 [")
    assert "60% [" in text.split("the causal mask's")[0] and "M' = 0.3" in text
    assert "40% [" in text.split("the residual stream's")[0].split("and")[-1] and "R' = 0.2 [" in text
    assert "R' exceeds M' in 0 of 2 layers" in text
    assert text.index("R' =") < text.index("In-sample, self-referenced")


@given(st.lists(st.tuples(st.floats(0.0, 0.5), st.floats(0.0, 0.5), st.floats(-0.1, 0.1)), min_size=1, max_size=6))
@settings(max_examples=40, deadline=None)
def test_the_printed_shares_of_mask_residual_and_interaction_add_up_to_100_percent(parts):
    r, m, c = (list(column) for column in zip(*parts))
    total = [a + b + d for a, b, d in parts]
    assume(np.mean(total) > 0.05)
    layers = _layers(total, r, m, c).assign(R_rf_heldout=r, M_rf_heldout=m, C_rf_heldout=c, total_heldout=total,
                                            n_sequences=8)
    text = takeaways.components_sentence(layers, "model A", in_sample=False)
    shares = [float(re.search(rf"(-?[0-9.]+(?:e[-+]?[0-9]+)?)% {words}", text).group(1))
              for words in ("of it is the causal mask's", "the residual stream's", "their interaction")]
    assert "their interaction (C' = " in text and "the three add up to 100%" in text
    assert len(shares) == 3 and abs(sum(shares) - 100) <= 1.5, (shares, text)  # three figures each, rounded


def test_components_sentence_splits_nothing_when_the_total_is_not_distinguishable_from_zero():
    layers, replicates = _recommended([0.0, 0.0], [0.0, 0.0], noise=0.01)
    text = takeaways.components_sentence(layers, None, replicates)
    assert "not distinguishable from zero" in text and "of it is the causal mask's" not in text


def test_probe_sentences_say_which_way_r2_moves_with_depth():
    probes = pd.concat([
        pd.DataFrame({"architecture": "rising", "layer": range(4), "r2_heldout": [0.1, 0.3, 0.5, 0.7]}),
        pd.DataFrame({"architecture": "falling", "layer": range(4), "r2_heldout": [0.9, 0.6, 0.4, 0.2]}),
    ])
    rising, falling = takeaways.probe_sentences(probes)
    assert rising.startswith("rising:") and " rises with depth, from 0.100 at layer 0 to 0.700 at layer 3" in rising
    assert falling.startswith("falling:") and " falls with depth, from 0.900 at layer 0 to 0.200" in falling
    assert "best 0.900 at layer 0" in falling


def test_patch_and_check_sentences_follow_the_numbers():
    base = _layers([0.3, 0.3, 0.3], [0.1, 0.2, 0.3], [0.2, 0.1, 0.0], [0.0, 0.0, 0.0])
    patched = base.assign(R=[0.1, 0.2, 0.05])
    text, = takeaways.patch_sentences(base, {"my patch": patched})
    assert text == "my patch: R changes by at most -0.25 (layer 2, from 0.3 to 0.05); 2 of 3 layers unchanged."
    assert "passes" in takeaways.self_patch_sentence(3e-9) and "3.0e-09" in takeaways.self_patch_sentence(3e-9)
    assert "FAILS" in takeaways.self_patch_sentence(0.2)
    assert "agrees" in takeaways.agreement_sentence("ours", "theirs", 1e-7, 1e-4)
    assert "does NOT agree" in takeaways.agreement_sentence("ours", "theirs", 0.3, 1e-4)
    assert takeaways.untrained_note(False) == "" and "random weights" in takeaways.untrained_note(True)


def test_takeaway_is_markdown_with_one_heading_and_no_empty_paragraphs():
    text = takeaways.Takeaway.join("", ["a", "", "b"], "c")
    assert text == f"{takeaways.HEADING}\n\na\n\nb\n\nc"
    assert text._repr_markdown_() == str(text)


def test_result_tables_from_result_objects_feed_the_claims(tiny_llama):
    """On a real (tiny) decomposition and BOS replacement: the tables carry the architecture
    and role, and the claims read the numbers the result objects hold."""
    from lens_position.analyses.bos import bos_replacement
    from lens_position.analyses.decompose import decompose
    from lens_position.core.data import build_prompts

    loaded = tiny_llama
    prompts = build_prompts(loaded, source="natural", T=20, N=4, bos="force")
    result = decompose(loaded, prompts, progress=False)
    bos = bos_replacement(loaded, prompts, query_range=(0, 12), progress=False)
    tables = takeaways.result_tables("tiny A", loaded.spec.role, decomposition=result, bos=bos)
    assert {"decompose_layers", "decompose_replicates", "bos_overall", "bos_replicates",
            "decompose_early_layers"} <= set(tables)
    for frame in tables.values():
        assert (frame["architecture"] == "tiny A").all() and (frame["role"] == loaded.spec.role).all()
    claims = claims_table(tables)
    c1 = claims.query("claim == 'C1' and architecture == 'tiny A'").iloc[0]
    assert c1["value"] == pytest.approx(result.layers["total_heldout"].mean())
    assert c1["verdict"] in (HOLDS, FAILS, INCONCLUSIVE)
    text = takeaways.claims_markdown(tables, ["C1", "C4"])
    assert f"- tiny A: **{c1['verdict']}**" in text
    stacked = takeaways.stack_tables(tables, takeaways.result_tables("tiny B", "ntk", decomposition=result))
    assert set(stacked["decompose_layers"]["architecture"]) == {"tiny A", "tiny B"}
    assert "bos_overall" in stacked and set(stacked["bos_overall"]["architecture"]) == {"tiny A"}
    with pytest.raises(TypeError, match="unknown result keyword"):
        takeaways.result_tables("x", decompositon=result)


def test_a_single_sequence_is_said_to_decide_nothing():
    """With N = 1 there is no held-out half and no interval: the takeaway says so, instead of
    an explanation about intervals being switched off."""
    tables = fake_results()
    one = {name: (frame.assign(n_sequences=1) if "n_sequences" in frame.columns else frame)
           for name, frame in tables.items() if name.startswith("decompose_layers")}
    one["decompose_layers"] = one["decompose_layers"].assign(total_heldout=np.nan, R_rf_heldout=np.nan,
                                                             M_rf_heldout=np.nan)
    text = takeaways.claims_markdown(one, ["C1"])
    assert "With N = 1 sequence there is neither a held-out half nor a bootstrap interval" in text
    assert "switched off" not in text
    layers = one["decompose_layers"].query("role == 'standard'")
    assert "this decomposition ran on N = 1" in takeaways.components_sentence(layers)
    assert "this decomposition ran on N" not in takeaways.components_sentence(tables["decompose_layers"])
