"""Provenance hashes the weights an analysis actually ran: an edit of any kind after the load (in
place, through ``.data``, by a cast or a swap) is seen, and the sha256 taken again."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.compare import compare
from lens_position.analyses.decompose import decompose
from lens_position.core.intervals import NO_INTERVALS
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import as_loaded
from lens_position.models.toy import random_model
from lens_position.models.weights import (
    DERIVED_BUFFERS,
    model_weights_sha256,
    state_dict_sha256,
    weights_of,
    weights_version,
)

MODEL = random_model(n_layers=2, d_vocab=50)
NAMES = sorted(name for name, tensor in weights_of(MODEL.model.state_dict()).items() if tensor.numel())


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(NAMES), where=st.floats(0, 1, exclude_max=True), value=st.floats(width=32, allow_nan=False))
def test_a_write_through_data_to_any_one_weight_changes_the_version(name, where, value):
    tensor = MODEL.model.state_dict()[name]
    flat = tensor.data.view(-1)
    index = int(where * flat.numel())
    old = flat[index].clone()
    if torch.equal(old, torch.tensor(value, dtype=old.dtype)):
        return
    before = weights_version(MODEL.model)
    flat[index] = value
    try:
        assert weights_version(MODEL.model) != before
    finally:
        flat[index] = old
    assert weights_version(MODEL.model) == before


@pytest.mark.fault(area="provenance", given="weights edited through .data after a first analysis (no version "
                                            "counter moves)",
                   happens="seen by the weights' checksum: provenance carries the new sha256, and compare() of "
                           "results before and after refuses them as different weights")
def test_weights_edited_through_data_are_hashed_again():
    loaded = random_model(n_layers=2, d_vocab=50, seed=3)
    tokens = torch.randint(1, 50, (4, 12))
    before = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    loaded.model.blocks[1].attn.W_O.data[0, 0, 0] += 0.5
    after = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    assert after.provenance["model"]["weights_sha256"] == state_dict_sha256(weights_of(loaded.model.state_dict()))
    assert after.provenance["model"]["weights_sha256"] != before.provenance["model"]["weights_sha256"]
    with pytest.raises(BadInputError, match="model weights"):
        compare(before, {"edited": after})


def test_unchanged_weights_keep_their_hash_without_hashing_again(monkeypatch):
    loaded = random_model(n_layers=2, d_vocab=50, seed=4)
    as_loaded(loaded)
    from lens_position.models import weights

    monkeypatch.setattr(weights, "state_dict_sha256", lambda state: pytest.fail("hashed again"))
    assert as_loaded(loaded).spec.weights_sha256 is not None


def _counted_checksums(monkeypatch) -> list[int]:
    from lens_position.models import weights

    calls: list[int] = []
    real = weights._checksum
    monkeypatch.setattr(weights, "_checksum", lambda storage: calls.append(1) or real(storage))
    return calls


def test_one_call_reads_the_weight_bytes_once_however_many_helpers_take_the_model(monkeypatch):
    loaded = random_model(n_layers=2, d_vocab=50, seed=5)
    tokens = torch.randint(1, 50, (4, 12))
    n_storages = len({t.untyped_storage().data_ptr() for t in weights_of(loaded.model.state_dict()).values()})
    calls = _counted_checksums(monkeypatch)
    decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
    assert len(calls) == n_storages  # one look in full, however many times the door was passed
    calls.clear()
    for _ in range(3):
        as_loaded(loaded)
    assert len(calls) == 3 * n_storages  # outside a call every look reads the bytes


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(NAMES), how=st.sampled_from(["in place", "cast", "swap"]))
def test_a_change_of_layout_or_version_is_seen_at_the_next_door(name, how):
    loaded = random_model(n_layers=2, d_vocab=50, seed=6)
    first = as_loaded(loaded).spec.weights_sha256
    parameter = dict(loaded.model.named_parameters()).get(name)
    if parameter is None:
        return
    with torch.no_grad():
        if how == "in place":
            parameter.add_(1.0)  # bumps the version counter
        elif how == "cast":
            parameter.data = parameter.data.double()
        else:
            parameter.data = parameter.data.clone() + 1.0
    assert as_loaded(loaded).spec.weights_sha256 != first


def test_a_write_through_data_between_two_calls_is_seen(monkeypatch):
    loaded = random_model(n_layers=2, d_vocab=50, seed=7)
    first = as_loaded(loaded).spec.weights_sha256
    loaded.model.blocks[0].attn.W_Q.data[0, 0, 0] += 1.0
    assert as_loaded(loaded).spec.weights_sha256 != first



@pytest.mark.fault(area="provenance", given="a pass longer than TransformerLens 3.x's first rotary tables (2048 "
                                            "rows: it extends them on the first longer pass) inside a paired analysis",
                   happens="no weight hash moves: the tables are made from the config, not weights; BOS replacement "
                           "pairs its base and its condition as at any other length")
def test_a_pass_that_extends_the_rotary_tables_changes_no_weight_hash():
    from lens_position.analyses.bos import bos_replacement
    from lens_position.core.data import build_prompts

    loaded = random_model(n_layers=1, d_vocab=50, n_ctx=2200, window=None, attn_types=None, seed=9)
    attn = loaded.model.blocks[0].attn
    rows_before = attn.rotary_cos.shape[0]
    first = as_loaded(loaded).spec.weights_sha256
    prompts = build_prompts(loaded, source="random", T=2100, N=2, bos="force")
    result = bos_replacement(loaded, prompts, replacements=("mean",), query_range=(0, 8), bootstrap=NO_INTERVALS,
                             progress=False)
    if rows_before < 2100:  # TransformerLens 3.x: the tables grew during the analysis
        assert attn.rotary_cos.shape[0] >= 2100
    assert result.provenance["model"]["weights_sha256"] == first == as_loaded(loaded).spec.weights_sha256


def test_a_loaded_models_weights_hash_to_the_hash_recorded_at_load():
    """What a weight hash stands for is the same at load and after: the weights without the buffers
    TransformerLens makes from the config."""
    from lens_position.models import load_model

    loaded = load_model("tiny-llama")
    state = loaded.model.state_dict()
    assert any(name.rpartition(".")[2] in DERIVED_BUFFERS for name in state)
    assert model_weights_sha256(loaded.model) == loaded.spec.weights_sha256
