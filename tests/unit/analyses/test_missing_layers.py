"""A layer without a value (a NaN R': a window of one key leaves nothing to fit) is named in every
summary that averages over layers; it is left out of the mean and out of the "R' exceeds M'" count,
never counted as a layer where R' does not exceed M'."""

from __future__ import annotations

import numpy as np
import pytest
from fake_results import fake_results

from lens_position.analyses.claims import evaluate
from lens_position.analyses.sentences import components_sentence
from lens_position.core.summaries import layer_mean, missing_layers


def with_a_missing_layer(results, layer: int = 2):
    layers = results["decompose_layers"].copy()
    rows = layers["layer"] == layer
    for column in ("R_rf_heldout", "R_rf_heldout_lo", "R_rf_heldout_hi"):
        layers.loc[rows, column] = np.nan
    replicates = results["decompose_replicates"].copy()
    replicates.loc[replicates["layer"] == layer, "R_rf_heldout"] = np.nan
    return {**results, "decompose_layers": layers, "decompose_replicates": replicates}


@pytest.mark.fault(area="summaries", given="a layer whose R' is NaN (a window of one key)",
                   happens="named in the sentence and in the claims' measured text; the mean is over the other "
                           "layers (its interval too), and the layer is not counted as 'R' does not exceed M''")
def test_a_layer_without_a_value_is_named_and_left_out():
    results = with_a_missing_layer(fake_results(n_layers=4))
    layers = results["decompose_layers"]
    one = layers[layers["architecture"] == layers["architecture"].iloc[0]]
    reps = results["decompose_replicates"]
    reps = reps[reps["architecture"] == one["architecture"].iloc[0]]
    assert missing_layers(one, "R_rf_heldout") == [2]
    mean = layer_mean(one, reps, "R_rf_heldout")
    kept = one[one["layer"] != 2]["R_rf_heldout"].mean()
    assert mean.value == pytest.approx(kept) and np.isfinite(mean.lo) and np.isfinite(mean.hi)
    sentence = components_sentence(one, replicates=reps)
    assert "layer 2 has no value" in sentence and "the mean is over the other 3 layers" in sentence
    assert "of 3 layers with both values (1 without)" in sentence
    c2 = [e for e in evaluate(results) if e.claim == "C2"][0]
    assert "layer 2 has no value" in c2.measured


def test_every_layer_with_a_value_adds_no_note():
    results = fake_results(n_layers=4)
    layers = results["decompose_layers"]
    one = layers[layers["architecture"] == layers["architecture"].iloc[0]]
    assert missing_layers(one, "R_rf_heldout", "M_rf_heldout") == []
    assert "no value" not in components_sentence(one)
