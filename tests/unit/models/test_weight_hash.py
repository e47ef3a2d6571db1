"""The weights' sha256 a result records says which weights made it, on either backend: the hash
taken again after a weight changed names and lays out the weights as the load hashed them, so an
edit shows and an edit undone gives the load's hash back.

On the bridge the Hugging Face model's modules sit inside the bridge's wrappers after booting (its
state dict names each weight several times, none by its checkpoint name) and its grouped keys and
values are repeated once per query head; both are read back to the checkpoint's names and rows.
Marked ``tl4``: it runs on TransformerLens 3.9 (both backends) and 4.3 (the bridge).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.models import load_model
from lens_position.models.backends import hooked_available
from lens_position.models.family_checkpoints import write_family_checkpoint
from lens_position.models.spec import as_loaded
from lens_position.models.tiny import TINY_CONFIGS, tiny_hf_model
from lens_position.models.weights import model_weights_sha256, weight_owners, weights_of
from lens_position.pipeline.family_matrix import MATRIX_FILE, line

pytestmark = pytest.mark.tl4

TINY = sorted(TINY_CONFIGS)
BACKENDS = ("bridge", "hooked") if hooked_available() else ("bridge",)


@pytest.fixture(scope="module")
def models() -> dict[tuple[str, str], object]:
    return {(name, backend): load_model(name, backend=backend) for name in TINY for backend in BACKENDS}


def _weights(loaded) -> dict[str, torch.Tensor]:
    owners = weight_owners(loaded.model)
    if owners is None:  # the hooked backend: no wrappers
        return weights_of(loaded.model.state_dict(keep_vars=True))
    return {name: getattr(owner, leaf) for name, (owner, leaf) in owners.items()}


@pytest.mark.parametrize("name", TINY)
def test_a_booted_bridge_hashes_as_the_checkpoint_it_was_loaded_from(name, models):
    """After booting, the Hugging Face model's weights are found under their checkpoint names, once
    each, with the checkpoint's key/value rows: the hash equals the one taken before booting and the
    one of the same model built afresh."""
    loaded = models[(name, "bridge")]
    hf_model, _ = tiny_hf_model(name)
    assert set(_weights(loaded)) == set(hf_model.state_dict())
    assert model_weights_sha256(loaded.model) == loaded.spec.weights_sha256
    assert model_weights_sha256(hf_model) == loaded.spec.weights_sha256
    assert as_loaded(loaded.model, loaded.tokenizer).spec.weights_sha256 == loaded.spec.weights_sha256


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=st.tuples(st.sampled_from(TINY), st.sampled_from(BACKENDS)), which=st.integers(0, 10**6),
       where=st.integers(0, 10**9), delta=st.sampled_from([1.0, -0.5, 1e-3]))
def test_an_edit_shows_in_the_hash_and_an_edit_undone_does_not(case, which, where, delta, models):
    """Any one element of any weight, changed: the recorded hash changes and the load's is kept
    beside it; set back: the load's hash again, with nothing kept beside it."""
    loaded = models[case]
    at_load = loaded.spec.weights_sha256
    weights = _weights(loaded)
    weight = weights[sorted(weights)[which % len(weights)]]
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(where % weight.numel()), weight.shape))
    before = weight.data[index].clone()
    try:
        with torch.no_grad():
            weight.data[index] += delta
        edited = as_loaded(loaded).spec
        assert edited.weights_sha256 != at_load
        assert edited.extra["weights_sha256_at_load"] == at_load
    finally:
        with torch.no_grad():
            weight.data[index] = before
    undone = as_loaded(loaded).spec
    assert undone.weights_sha256 == at_load
    assert "weights_sha256_at_load" not in undone.extra


@pytest.mark.parametrize("name", [n for n in TINY if TINY_CONFIGS[n][1].get("num_key_value_heads")
                                  not in (None, TINY_CONFIGS[n][1].get("num_attention_heads"))])
def test_an_edit_of_every_copy_of_a_repeated_key_head_shows_too(name, models):
    """The bridge's keys are repeated once per query head: an edit of all copies of one key head
    alike (the checkpoint's own key edited) changes the hash, as an edit of one copy does."""
    loaded = models[(name, "bridge")]
    at_load = loaded.spec.weights_sha256
    key = next(w for n, w in _weights(loaded).items() if n.endswith("k_proj.weight"))
    before = key.data.clone()
    try:
        with torch.no_grad():
            key.data += 0.25  # every row, so every copy alike
        assert as_loaded(loaded).spec.weights_sha256 not in (at_load, None)
    finally:
        with torch.no_grad():
            key.data.copy_(before)
    assert as_loaded(loaded).spec.weights_sha256 == at_load


@pytest.mark.parametrize("model_type", ["phi3", "olmo2", "qwen2", "gpt_neox", "starcoder2"])
def test_a_booted_bridge_of_any_layout_hashes_as_its_checkpoint(model_type, tmp_path):
    """Checkpoint folders of families whose keys and values the bridge backend repeats in other
    layouts (Phi-3's fused ``qkv_proj``, OLMo-2's key norm over all heads, Qwen2's key and value
    biases) or splits into copies of its own (GPT-NeoX's fused multi-head projection): after booting,
    the weights hash as at load, and every key weight the model holds (the checkpoint's and the
    bridge's copies), edited, shows, and set back gives that hash again."""
    loaded = load_model(str(write_family_checkpoint(model_type, tmp_path / model_type)), backend="bridge")
    at_load = loaded.spec.weights_sha256
    assert model_weights_sha256(loaded.model) == at_load
    assert as_loaded(loaded.model, loaded.tokenizer).spec.weights_sha256 == at_load
    for name, weight in _weights(loaded).items():
        if not any(part in name for part in ("k_proj.weight", "qkv_proj.weight", "query_key_value.weight",
                                             ".k.weight")):
            continue
        _edit_and_undo(loaded, weight, at_load)
    assert "weights_sha256_at_load" not in as_loaded(loaded).spec.extra


def _edit_and_undo(loaded, weight: torch.Tensor, at_load: str) -> None:
    before = weight.data.clone()
    try:
        with torch.no_grad():
            weight.data[(-1,) + (0,) * (weight.ndim - 1)] += 0.5
        edited = as_loaded(loaded).spec
        assert edited.weights_sha256 != at_load and edited.extra["weights_sha256_at_load"] == at_load
    finally:
        with torch.no_grad():
            weight.data.copy_(before)
    assert as_loaded(loaded).spec.weights_sha256 == at_load


_MATRIX = json.loads((Path(__file__).resolve().parents[3] / MATRIX_FILE).read_text(encoding="utf-8"))
BRIDGED_FAMILIES = sorted(name for name, row in _MATRIX[f"transformer_lens {line()}"]["rows"].items()
                          if row["status"] == "works" and row.get("backend") == "bridge")


@pytest.mark.parametrize("model_type", BRIDGED_FAMILIES)
def test_on_every_family_the_bridge_loads_an_edit_shows_and_an_edit_undone_does_not(model_type, tmp_path):
    """Each family the family matrix records as working on the bridge: the hash after booting is the
    load's and a bare wrap's, an edit of any weight the bridge computes with shows, and set back,
    gives the load's hash again."""
    loaded = load_model(str(write_family_checkpoint(model_type, tmp_path / model_type)), backend="bridge")
    at_load = loaded.spec.weights_sha256
    assert model_weights_sha256(loaded.model) == at_load
    assert as_loaded(loaded.model, loaded.tokenizer).spec.weights_sha256 == at_load
    for weight in _weights(loaded).values():
        if weight.ndim and weight.is_floating_point() and not weight.is_meta:
            _edit_and_undo(loaded, weight, at_load)
