"""Experiments as conditions compared with one base: the fraction of R removed is computed
in one place, and is 1 when an intervention removes all of R, 0 when it changes nothing."""

import pytest
import torch

from lens_position.compare import compare, decompose_conditions
from lens_position.decompose import decompose
from lens_position.errors import BadInputError
from lens_position.patching import Patch
from lens_position.toy import offset_only_model, toy_tokens

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
