"""Experiments as conditions compared with one base: the fraction of R removed is computed
in one place, and is 1 when an intervention removes all of R, 0 when it changes nothing."""

import pytest
import torch

from lens_position.analyses.compare import compare, decompose_conditions
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import Patch
from lens_position.core.columns import display_order
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import offset_only_model, toy_tokens

LENGTH = 24


def test_erasing_the_bos_marker_removes_all_of_R_and_a_self_patch_none():
    loaded = offset_only_model(bos_bonus=2.0, n_layers=2)
    tokens = toy_tokens(5, LENGTH, bos=True)
    base = decompose(loaded, tokens, batch_size=2, progress=False)
    assert (base.heads.R > 0.01).all()
    content_only = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    own = loaded.model.W_E.detach()[tokens[:, 0]]
    conditions = decompose_conditions(loaded, tokens, {
        "erase marker": [Patch("hook_embed", content_only, position=0)],
        "self": [Patch("hook_embed", own, position=0)],
        "erase, layer 1 only": [Patch("hook_embed", content_only, position=0)],
    }, layers={"erase, layer 1 only": [1]}, batch_size=2)
    comparison = compare(base, conditions)
    overall = comparison.overall.set_index("condition")
    assert overall.loc["erase marker", "fraction_removed"] == pytest.approx(1.0, abs=1e-10)
    assert overall.loc["self", "fraction_removed"] == pytest.approx(0.0, abs=1e-12)
    per_layer = comparison.layers.set_index(["condition", "layer"])
    assert per_layer.loc[("erase marker", 0), "R_base"] == pytest.approx(base.heads.R[base.heads.layer == 0].mean())
    # a condition covering fewer layers is compared on those only
    partial = comparison.heads[comparison.heads.condition == "erase, layer 1 only"]
    assert set(partial.layer) == {1}
    assert partial.R_condition.abs().max() < 1e-12 and (partial.R_base > 0.01).all()


def test_conditions_decomposed_differently_from_the_base_are_refused():
    loaded = offset_only_model(bos_bonus=2.0)
    tokens = toy_tokens(4, LENGTH, bos=True)
    base = decompose(loaded, tokens, progress=False)
    other = decompose(loaded, tokens, query_range=(0, 8), progress=False)
    with pytest.raises(BadInputError, match="same options"):
        compare(base, {"narrow": other})


CHANGE_INTERVALS = {"fraction_removed_lo", "fraction_removed_hi", "fraction_removed_rf_lo", "fraction_removed_rf_hi",
                    "R_change_lo", "R_change_hi", "R_heldout_change_lo", "R_heldout_change_hi",
                    "R_rf_change_lo", "R_rf_change_hi"}


def test_changes_of_R_have_paired_intervals_per_head_per_layer_and_overall():
    """A self patch leaves every replicate unchanged, so its paired intervals have zero width
    (an unpaired bootstrap would not); a real patch's change has an interval of positive width
    around it. Each interval comes from the change computed replicate by replicate, per head from
    ``head_replicates``, per layer from ``replicates``: the percentile interval for a held-out
    component's change, the bias-corrected percentile interval for an in-sample one's."""
    import numpy as np

    from lens_position.core.intervals import BIAS_CORRECTED, bootstrap_interval, percentile_interval

    def intervals_differ(row, name, layer_reps):
        """The bias correction moved the interval (the replicates' median is not the estimate)."""
        lo, _ = percentile_interval((layer_reps["R_rf_condition"] - layer_reps["R_rf_base"]).to_numpy())
        return abs(row[f"{name}_lo"] - lo) > 1e-9
    from lens_position.models.toy import random_model

    loaded = random_model(n_layers=2, d_vocab=50)
    tokens = torch.randint(1, 50, (6, LENGTH), generator=torch.Generator().manual_seed(0))
    base = decompose(loaded, tokens, batch_size=2, progress=False)
    own = loaded.model.W_E.detach()[tokens[:, 0]]
    conditions = decompose_conditions(loaded, tokens, {"self": [Patch("hook_embed", own, position=0)],
                                                       "token 0": [Patch("hook_embed", own.mean(0), position=0)]},
                                      batch_size=2)
    comparison = compare(base, conditions)
    assert list(comparison.heads.columns) == display_order([
        "condition", "layer", "head", "layer_type", "R_base", "R_condition", "R_change", "R_heldout_base",
        "R_heldout_condition", "R_heldout_change", "R_change_lo", "R_change_hi", "R_heldout_change_lo",
        "R_heldout_change_hi"])
    assert CHANGE_INTERVALS <= set(comparison.layers.columns) and CHANGE_INTERVALS <= set(comparison.overall.columns)
    assert {"R_change", "R_heldout_change", "R_rf_change"} <= set(comparison.overall.columns)
    heads = comparison.heads[comparison.heads.condition == "self"]
    assert np.abs(heads[["R_change_lo", "R_change_hi", "R_heldout_change_lo", "R_heldout_change_hi"]]
                  .to_numpy()).max() < 1e-12
    assert comparison.overall.set_index("condition").loc["self", "R_rf_change_hi"] == pytest.approx(0.0, abs=1e-12)
    patched = comparison.heads[comparison.heads.condition == "token 0"]
    assert ((patched.R_heldout_change_lo <= patched.R_heldout_change)
            & (patched.R_heldout_change <= patched.R_heldout_change_hi)).all()
    assert (patched.R_change_hi - patched.R_change_lo).min() > 0
    # explicit: the per-head and per-layer replicate differences
    reps = base.head_replicates.merge(conditions["token 0"].head_replicates, on=["replicate", "layer", "head"],
                                      suffixes=("_base", "_condition"))
    one = reps[(reps["layer"] == 1) & (reps["head"] == 2)]
    lo, hi = percentile_interval((one["R_heldout_condition"] - one["R_heldout_base"]).to_numpy())
    row = patched[(patched["layer"] == 1) & (patched["head"] == 2)].iloc[0]
    assert (row.R_heldout_change_lo, row.R_heldout_change_hi) == (pytest.approx(lo, abs=1e-12),
                                                                  pytest.approx(hi, abs=1e-12))
    layer_reps = base.replicates.merge(conditions["token 0"].replicates, on=["replicate", "layer"],
                                       suffixes=("_base", "_condition"))
    layer_reps = layer_reps[layer_reps.layer == 0]
    layer = comparison.layers.set_index(["condition", "layer"]).loc[("token 0", 0)]
    # R' is an in-sample component: its change gets the bias-corrected percentile interval
    lo, hi = bootstrap_interval(layer.R_rf_change, (layer_reps["R_rf_condition"] - layer_reps["R_rf_base"]).to_numpy(),
                                0.95, BIAS_CORRECTED)
    assert (layer.R_rf_change_lo, layer.R_rf_change_hi) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))
    assert intervals_differ(layer, "R_rf_change", layer_reps)
    intervals = comparison.provenance["intervals"]
    assert intervals["n_resamples"] == 200 and intervals["level"] == 0.95 and "paired" in intervals["method"]
    assert intervals["bias_corrected"] == ["fraction_removed", "fraction_removed_rf", "R_change", "R_rf_change"]


def test_change_intervals_are_nan_when_the_sides_drew_different_replicates():
    from lens_position.core.intervals import Bootstrap

    loaded = offset_only_model(bos_bonus=2.0)
    tokens = toy_tokens(4, LENGTH, bos=True)
    base = decompose(loaded, tokens, progress=False)
    other = decompose(loaded, tokens, bootstrap=Bootstrap(n_resamples=50), progress=False)
    comparison = compare(base, {"fewer replicates": other})
    assert comparison.heads[["R_change_lo", "R_change_hi"]].isna().all().all()
    assert comparison.overall[sorted(CHANGE_INTERVALS)].isna().all().all()
