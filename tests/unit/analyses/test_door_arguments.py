"""Every Patch, hook and metric argument is checked at the door: a bad one is a sentence naming
it, never a raw error from deep in a pass, and never accepted to give numbers on the wrong shape."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import run_patches
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.patch import Patch
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

MODEL = random_model(n_layers=2, d_vocab=50)
TOKENS = toy_tokens(3, 10, seed=0, d_vocab=50)


def decompose_with(fwd_hooks):
    return decompose(MODEL, TOKENS, fwd_hooks=fwd_hooks, bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="hooks", given="fwd_hooks naming a hook the model does not have, or not a (name, function) "
                                       "pair",
                   happens="BadInputError naming the hook (and similar ones the model has), before any pass")
@pytest.mark.parametrize("hooks, match", [
    ([("blocks.9.attn.hook_q", lambda a, hook: None)], r"'blocks\.9\.attn\.hook_q'.*blocks\.0\.attn\.hook_q"),
    ([("blocks.0.attn.hook_q",)], "pair"),
    ([("blocks.0.attn.hook_q", "not a function")], "not callable"),
    ([(3, lambda a, hook: None)], "name filter"),
])
def test_bad_fwd_hooks_are_named(hooks, match):
    with pytest.raises(BadInputError, match=match):
        decompose_with(hooks)


@pytest.mark.fault(area="hooks", given="a forward hook that returns an activation of another shape (a[:, :5]), "
                                       "dtype or type",
                   happens="BadInputError naming the hook and both shapes; never numbers computed on 5 positions")
@pytest.mark.parametrize("returned", [lambda a: a[:, :5], lambda a: a.double(), lambda a: a.tolist(),
                                      lambda a: a[..., :1]])
def test_a_hook_returning_another_shape_is_refused(returned):
    with pytest.raises(BadInputError, match=r"blocks\.0\.hook_resid_pre returned"):
        decompose_with([("blocks.0.hook_resid_pre", lambda a, hook: returned(a))])


def test_a_hook_that_edits_in_place_or_returns_a_like_tensor_is_run():
    seen = []
    decompose_with([("blocks.0.hook_resid_pre", lambda a, hook: seen.append(a.shape) or a * 1.0)])
    assert seen


@pytest.mark.fault(area="patches", given="Patch with a fractional position or head, a label that is not text, or a "
                                         "value on the meta device",
                   happens="BadInputError when the Patch is made, naming the argument")
@pytest.mark.parametrize("kwargs, match", [
    (dict(position=2.5), "position must be an integer"), (dict(head=1.5), "head must be an integer"),
    (dict(position=True), "position must be an integer"), (dict(label=3), "label must be a string"),
    (dict(value=torch.zeros(4, device="meta")), "meta device"),
])
def test_bad_patch_arguments_are_named(kwargs, match):
    arguments = dict(hook_name="blocks.0.hook_resid_pre", value=0.0) | kwargs
    with pytest.raises(BadInputError, match=match):
        Patch(**arguments)


def test_a_whole_float_position_is_taken_as_the_integer():
    assert Patch("blocks.0.hook_resid_pre", 0.0, position=2.0).position == 2


@pytest.mark.fault(area="patches", given="a metric returning a string, None, a dict or a list of strings",
                   happens="BadInputError saying what it returned and what a metric must return")
@pytest.mark.parametrize("returned", ["0.5", None, {"a": 1}, ["x"]])
def test_a_metric_returning_no_number_is_named(returned):
    with pytest.raises(BadInputError, match="the metric returned"):
        run_patches(MODEL, TOKENS, [[Patch("blocks.1.hook_resid_pre", 0.0, position=1)]], lambda logits: returned,
                    progress=False)


@settings(max_examples=30, deadline=None)
@given(value=st.one_of(st.floats(allow_nan=False, allow_infinity=False, width=32), st.integers(-5, 5)))
def test_a_metric_returning_any_number_is_taken(value):
    out = run_patches(MODEL, TOKENS, [[Patch("blocks.1.hook_resid_pre", 0.0, position=1)]], lambda logits: value,
                      progress=False)
    assert float(out[0]) == pytest.approx(float(value))


@pytest.mark.fault(area="bos replacement", given="bos_replacement(replacements=[]) or a replacement named twice",
                   happens="BadInputError naming the choices; never an empty result")
@pytest.mark.parametrize("replacements, match", [([], "empty"), (["mean", "mean"], "twice"), (["nope"], "unknown")])
def test_bos_replacement_needs_replacements(replacements, match):
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    with pytest.raises(BadInputError, match=match):
        bos_replacement(loaded, toy_tokens(3, 12, bos=True, seed=0), replacements=replacements,
                        bootstrap=NO_INTERVALS, progress=False)
