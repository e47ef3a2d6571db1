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
from lens_position.models.cache import state_dict_sha256
from lens_position.models.spec import as_loaded, weights_version
from lens_position.models.toy import random_model

MODEL = random_model(n_layers=2, d_vocab=50)
NAMES = sorted(name for name, tensor in MODEL.model.state_dict().items() if tensor.numel())


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
    assert after.provenance["model"]["weights_sha256"] == state_dict_sha256(loaded.model.state_dict())
    assert after.provenance["model"]["weights_sha256"] != before.provenance["model"]["weights_sha256"]
    with pytest.raises(BadInputError, match="model weights"):
        compare(before, {"edited": after})


def test_unchanged_weights_keep_their_hash_without_hashing_again(monkeypatch):
    loaded = random_model(n_layers=2, d_vocab=50, seed=4)
    as_loaded(loaded)
    from lens_position.models import cache

    monkeypatch.setattr(cache, "state_dict_sha256", lambda state: pytest.fail("hashed again"))
    assert as_loaded(loaded).spec.weights_sha256 is not None
