"""Weights placed on their devices as they are read (``load_model(device_map=, max_memory=,
offload_folder=)``, and ``n_devices`` on the bridge): the placed model computes what the whole one
computes, its weights hash the same, grouped keys and values are ungrouped without reading the
offloaded weights, and a map this machine or this TransformerLens cannot honour is refused by name
before any weight is read. Runs on TransformerLens 3.9 and 4.x; on this CPU-only machine the split is
host and disk (a GPU split is checked by benchmarks/gpu.py where a GPU is lent)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.ground.errors import BadInputError
from lens_position.models import load_model
from lens_position.models.placement import Placement, check_bridge_takes, check_placement
from lens_position.models.tiny import tiny_hf_model
from lens_position.models.weights import model_weights_sha256, state_dict_sha256, weights_version

pytestmark = pytest.mark.tl4

TL_MAJOR = int(importlib.metadata.version("transformer_lens").split(".")[0])
TOKENS = torch.tensor([[3, 17, 101, 44, 250, 9, 12, 77, 5, 60]])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """tiny-llama (4 query heads over 2 key/value heads) as a Hugging Face checkpoint folder."""
    path = tmp_path_factory.mktemp("tiny-llama")
    model, tokenizer = tiny_hf_model("tiny-llama")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _split(n_layers: int = 3, last: str = "disk") -> dict[str, str]:
    mapping = {"model.embed_tokens": "cpu", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "cpu"}
    mapping.update({f"model.layers.{i}": "cpu" if i < n_layers // 2 else last for i in range(n_layers)})
    return mapping


@pytest.fixture(scope="module")
def whole(folder):
    return load_model(str(folder), backend="bridge")


@pytest.mark.skipif(TL_MAJOR < 4, reason="the bridge of TransformerLens 3.x refuses disk targets (tested below)")
def test_a_model_split_between_host_and_disk_computes_what_the_whole_model_computes(folder, whole, tmp_path):
    placed = load_model(str(folder), backend="bridge", device_map=_split(), offload_folder=str(tmp_path))
    layer = placed.model.original_model.model.layers[2]
    assert layer.self_attn.k_proj.weight.is_meta  # the disk half was never read into the host
    assert placed.spec.extra["placement"] == {"cpu": 5, "disk": 2}
    assert placed.spec.weights_sha256 == whole.spec.weights_sha256
    assert set(placed.spec.extra["verified"]) >= {"equivalence", "kv_layout"}
    names = [f"blocks.{layer}.attn.hook_{part}" for layer in range(3) for part in ("k", "v", "attn_scores", "z")]
    logits, cache = placed.model.run_with_cache(TOKENS, names_filter=names)
    expected, reference = whole.model.run_with_cache(TOKENS, names_filter=names)
    torch.testing.assert_close(logits, expected, atol=0, rtol=0)
    for name in names:  # keys and values ungrouped on the offloaded layer too: one entry per query head
        assert cache[name].shape == reference[name].shape
        torch.testing.assert_close(cache[name], reference[name], atol=0, rtol=0, equal_nan=True)


def test_a_model_placed_on_the_host_by_a_map_loads_on_either_line(folder, whole):
    placed = load_model(str(folder), backend="bridge", device_map=_split(last="cpu"))
    assert placed.spec.extra["placement"] == {"cpu": 7}
    torch.testing.assert_close(placed.model(TOKENS), whole.model(TOKENS), atol=0, rtol=0)


def test_auto_takes_the_bridge_for_a_device_map(folder):
    placed = load_model(str(folder), device_map=_split(last="cpu"))
    assert placed.spec.extra["backend"] == "bridge" and placed.spec.extra["placement"] == {"cpu": 7}


@pytest.mark.skipif(TL_MAJOR >= 4, reason="TransformerLens 4 takes disk targets (tested above)")
def test_disk_targets_are_refused_on_transformer_lens_3_with_the_route_that_works(folder):
    with pytest.raises(BadInputError, match="TransformerLens 4"):
        load_model(str(folder), backend="bridge", device_map=_split())


def test_the_weights_hash_reads_offloaded_weights_one_module_at_a_time(folder, whole):
    from transformers import AutoModelForCausalLM

    hf_whole = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    hf_placed = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, device_map=_split(last="disk"),
                                                     offload_folder=str(folder / "offload"))
    assert any(p.is_meta for p in hf_placed.parameters())
    assert model_weights_sha256(hf_placed) == state_dict_sha256(hf_whole.state_dict())
    assert weights_version(hf_placed) == weights_version(hf_placed)  # the offloaded ones: layout only


def test_a_placement_is_refused_on_what_cannot_take_it(folder):
    with pytest.raises(BadInputError, match="device_map"):
        load_model("tiny-llama", backend="bridge", device_map=_split(last="cpu"))  # built in code
    with pytest.raises(BadInputError, match="device_map"):
        load_model("zoo:rope", device_map="auto")
    with pytest.raises(BadInputError, match="device_map"):  # modules with no device, others offloaded
        load_model(str(folder), backend="bridge", device_map={"model.embed_tokens": "cpu", "model.layers.0": "disk"},
                   offload_folder=str(folder / "offload"))


def test_the_hooked_backend_refuses_a_device_map_naming_the_bridge():
    with pytest.raises(BadInputError, match="backend='bridge'"):
        check_placement(device_map="auto", backend="hooked")


def test_n_devices_on_the_bridge_is_a_balanced_map_over_that_many_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (1000 + i, 2000))
    assert check_placement(n_devices=2, backend="bridge") == Placement("balanced", {0: 1000, 1: 1001})
    assert check_placement(n_devices=2, backend="hooked") is None  # the hooked backend splits after loading
    assert check_placement(n_devices=1, backend="bridge") is None


@pytest.mark.parametrize("mapping", [
    {"model.embed_tokens": "cuda:0", "model.layers.0": "cpu"},
    {"model.embed_tokens": 0, "model.layers.0": "disk"},
])
def test_a_map_that_mixes_gpus_with_host_or_disk_is_refused(mapping):
    with pytest.raises(BadInputError, match="mixes"):
        check_bridge_takes(Placement(mapping), 4)


_BAD_MAPS = st.one_of(
    st.text(max_size=12).filter(lambda s: s not in ("auto", "balanced", "balanced_low_0", "sequential")),
    st.integers(), st.floats(allow_nan=False), st.just({}), st.lists(st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(min_size=1, max_size=8), st.sampled_from(["meta", "tpu", "cuda:7", "gpu", None, 1.5,
                                                                      True]), min_size=1, max_size=3),
)


@settings(max_examples=60, deadline=None)
@given(_BAD_MAPS)
def test_any_map_this_machine_cannot_honour_is_refused_by_name(device_map):
    """No GPU here: every CUDA target is refused too, before any weight is read."""
    with pytest.raises(BadInputError, match="device_map"):
        check_placement(device_map=device_map)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.just({}), st.text(max_size=5), st.integers(), st.dictionaries(
    st.sampled_from([0, "cpu"]), st.one_of(st.floats(), st.none(), st.booleans()), min_size=1, max_size=2)))
def test_a_bad_memory_budget_is_refused_by_name(max_memory):
    with pytest.raises(BadInputError, match="max_memory"):
        check_placement(device_map="auto", max_memory=max_memory)


@pytest.mark.parametrize("given", [dict(max_memory={"cpu": "1GiB"}), dict(offload_folder="/tmp/x")])
def test_a_budget_or_offload_folder_without_a_map_is_refused(given):
    with pytest.raises(BadInputError, match="device_map"):
        check_placement(**given)


def test_n_devices_and_a_device_map_together_are_refused():
    with pytest.raises(BadInputError, match="n_devices"):
        check_placement(device_map="auto", n_devices=2, backend="bridge")
