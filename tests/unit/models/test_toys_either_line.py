"""The hand-set ground truths on whichever TransformerLens is installed (marked tl4: make test runs
this file on 3.9, where the toys are HookedTransformers, and on 4.3, where they are
MiniTransformers), and on 3.9 once more built as MiniTransformers: each comes out as built."""

from __future__ import annotations

import pytest
import torch

from lens_position.analyses.decompose import check_identity, decompose
from lens_position.analyses.sink_origin import sink_origin
from lens_position.models import toy
from lens_position.models.backends import hooked_available
from lens_position.models.mini import MiniTransformer
from lens_position.models.toy import offset_only_model, random_model, sink_origin_model, toy_tokens

pytestmark = pytest.mark.tl4

LENGTH = 16
LINES = ["auto", "mini"] if hooked_available() else ["auto"]


@pytest.fixture(params=LINES)
def line(request, monkeypatch):
    if request.param == "mini":
        monkeypatch.setattr(toy, "hooked_available", lambda: False)
    return request.param


def test_the_toys_are_mini_transformers_exactly_where_hooked_transformer_is_missing(line):
    mini = isinstance(offset_only_model().model, MiniTransformer)
    assert mini == (line == "mini" or not hooked_available())


def test_offset_only_scores_have_only_a_mask_component(line):
    heads = decompose(offset_only_model(n_heads=2, n_kv_heads=1), toy_tokens(4, LENGTH, bos=False),
                      progress=False).heads
    assert (heads.R.abs() < 1e-12).all() and (heads.C.abs() < 1e-12).all() and (heads.M > 0.01).all()


def test_uniform_attention_is_the_causal_average(line):
    loaded = offset_only_model(uniform=True)
    _, cache = loaded.model.run_with_cache(toy_tokens(2, LENGTH, bos=False), names_filter="blocks.0.attn.hook_pattern")
    pattern = cache["blocks.0.attn.hook_pattern"][0, 0]
    i = torch.arange(LENGTH)[:, None].to(pattern.dtype)
    assert torch.allclose(pattern, torch.tril(torch.ones_like(pattern)) / (i + 1), atol=1e-14)


def test_a_full_window_has_no_mask_component_and_a_bos_bonus_is_residual(line):
    window = 6
    local = decompose(offset_only_model(window=window), toy_tokens(3, LENGTH, bos=False),
                      query_range=(window - 1, LENGTH), progress=False).heads
    assert (local.layer_type == "local").all() and (local["total"].abs() < 1e-12).all()
    bonus = decompose(offset_only_model(bos_bonus=2.0), toy_tokens(6, LENGTH), progress=False).heads
    assert (bonus.R > 0.01).all()


@pytest.mark.parametrize("kind, verdict", [("position", "position-driven"), ("bos", "BOS-driven"),
                                           ("mixed", "mixed"), ("none", "none")])
def test_each_sink_origin_model_comes_out_as_built(line, kind, verdict):
    result = sink_origin(sink_origin_model(kind), toy_tokens(12, 32, bos=False, seed=3), progress=False)
    assert result.origin == verdict, result.verdict["reason"].iloc[0]


def test_the_random_model_satisfies_the_exact_identity(line):
    loaded = random_model()
    tokens = toy_tokens(3, 24, d_vocab=50, seed=1)
    assert (check_identity(loaded, tokens)["max_abs_error_pattern"] < 1e-5).all()
