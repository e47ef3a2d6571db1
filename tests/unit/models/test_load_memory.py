"""Loading holds one copy of the weights: the converter takes the Hugging Face tensors as they lie
where they already are in the layout the hooked model computes with, the weight cache stores each
weight as it lies in memory and gives it back so (memory-mapped, no copy), and a hash reads a weight
in any layout in bounded blocks. The numbers are those of a model loaded with copies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.models import cache as weight_cache
from lens_position.models import weights
from lens_position.models.adapters import convert_state_dict, hooked_config, in_linear_layout, linear_layout
from lens_position.models.backends import hooked_available
from lens_position.models.tiny import tiny_hf_model

needs_hooked = pytest.mark.skipif(not hooked_available(), reason="the hooked backend: TransformerLens 3.x")
linux_maps = pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps (Linux)")


def _strides(tensor: torch.Tensor) -> tuple[int, ...]:
    """The strides of the axes longer than 1 (an axis of length 1 has no stride that matters)."""
    return tuple(stride for stride, size in zip(tensor.stride(), tensor.shape) if size > 1)


def _laid_out(tensor: torch.Tensor, order: tuple[int, ...]) -> bool:
    return tensor.permute(order).is_contiguous()


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not a.numel() or not b.numel():
        return False
    a_start, b_start = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
    return a_start < b_start + b.untyped_storage().nbytes() and b_start < a_start + a.untyped_storage().nbytes()


def _views(draw, shape: tuple[int, ...]) -> torch.Tensor:
    """A float tensor of ``shape`` lying in memory as a drawn permutation of a contiguous block, a
    strided slice of a bigger one, or in float64 (then converted)."""
    kind = draw(st.sampled_from(["contiguous", "permuted", "sliced", "float64"]))
    if kind == "permuted" and len(shape) > 1:
        order = draw(st.permutations(range(len(shape))))
        return torch.randn([shape[axis] for axis in order]).permute(weight_cache.inverse_order(tuple(order)))
    if kind == "sliced":
        return torch.randn(shape[0] * 2, *shape[1:])[::2]
    if kind == "float64":
        return torch.randn(shape, dtype=torch.float64)
    return torch.randn(shape)


NAMES = ["blocks.0.attn.W_Q", "blocks.0.attn.W_O", "blocks.0.attn._W_K", "blocks.0.mlp.W_in", "blocks.0.mlp.W_gate",
         "blocks.0.mlp.W_out", "embed.W_E", "unembed.W_U", "blocks.0.ln1.w", "ln_final.w"]
SHAPES = {"blocks.0.attn.W_Q": (2, 6, 3), "blocks.0.attn.W_O": (2, 3, 6), "blocks.0.attn._W_K": (1, 6, 3),
          "blocks.0.mlp.W_in": (6, 8), "blocks.0.mlp.W_gate": (6, 8), "blocks.0.mlp.W_out": (8, 6),
          "embed.W_E": (10, 6), "unembed.W_U": (6, 10), "blocks.0.ln1.w": (6,), "ln_final.w": (6,)}


@st.composite
def state_dicts(draw):
    state = {name: _views(draw, SHAPES[name]) for name in draw(st.lists(st.sampled_from(NAMES), min_size=1,
                                                                          unique=True))}
    if "embed.W_E" in state and "unembed.W_U" in state and draw(st.booleans()):
        state["unembed.W_U"] = state["embed.W_E"].T  # tied embeddings: one tensor, two entries
    return state


@given(state=state_dicts(), gated=st.booleans())
@settings(max_examples=60, deadline=None)
def test_the_converted_layout_has_the_values_in_the_layout_named_and_no_shared_memory(state, gated):
    out = in_linear_layout(state, gated_mlp=gated)
    assert list(out) == list(state)
    for name, tensor in out.items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, state[name].to(torch.float32))
        assert _laid_out(tensor, linear_layout(name, tensor.ndim, gated)), name
        kept = tensor.untyped_storage().data_ptr() == state[name].untyped_storage().data_ptr()
        fits = (state[name].dtype == torch.float32 and _laid_out(state[name], linear_layout(name, tensor.ndim, gated))
                and state[name].untyped_storage().nbytes() == state[name].numel() * 4)
        first_user = next(other for other in state if state[other].untyped_storage().data_ptr()
                          == state[name].untyped_storage().data_ptr())
        assert kept == (fits and first_user == name), name  # copied exactly when it must be
    names = list(out)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not _shares_memory(out[a], out[b]), (a, b)


def test_the_linear_layouts_are_the_ones_the_hooked_model_lays_out():
    assert linear_layout("blocks.3.attn.W_Q", 3, False) == (0, 2, 1)
    assert linear_layout("blocks.3.attn.W_O", 3, False) == (2, 0, 1)
    assert linear_layout("blocks.3.mlp.W_in", 2, True) == (1, 0)
    assert linear_layout("blocks.3.mlp.W_in", 2, False) == (0, 1)  # an ungated MLP is left alone
    assert linear_layout("unembed.W_U", 2, False) == (1, 0)
    assert linear_layout("blocks.3.attn._W_K", 3, True) == (0, 2, 1)  # used as it lies (grouped keys computed once)
    assert linear_layout("blocks.3.attn.W_V", 3, False) == (0, 2, 1)
    assert linear_layout("embed.W_E", 2, True) == (0, 1)


@needs_hooked
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-qwen2", "tiny-gemma3"])
def test_conversion_takes_the_hf_tensors_without_a_copy_and_keeps_tied_embeddings_apart(name):
    hf_model, _ = tiny_hf_model(name)
    cfg = hooked_config(hf_model.config)
    state = convert_state_dict(hf_model, cfg)
    hf_pointers = {p.untyped_storage().data_ptr() for p in hf_model.parameters()}
    layer = hf_model.model.layers[0]
    assert state["blocks.0.attn.W_Q"].untyped_storage().data_ptr() == layer.self_attn.q_proj.weight.data_ptr()
    assert state["blocks.0.mlp.W_in"].untyped_storage().data_ptr() == layer.mlp.up_proj.weight.data_ptr()
    taken = [t for t in state.values() if t.numel() and t.untyped_storage().data_ptr() in hf_pointers]
    assert len(taken) >= 4 * cfg["n_layers"]  # W_Q, W_O and the gated MLP's three matrices, at least
    names = list(state)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not _shares_memory(state[a], state[b]), (a, b)
    assert torch.equal(state["unembed.W_U"], hf_model.lm_head.weight.T)  # tied or not, its own memory (above)


@given(state=state_dicts())
@settings(max_examples=60, deadline=None)
def test_the_cache_stores_each_weight_as_it_lies_and_gives_it_back_so(state):
    tensors, layouts = weight_cache.stored_layouts(state)
    assert all(t.is_contiguous() for t in tensors.values())
    pointers = [t.untyped_storage().data_ptr() for t in tensors.values() if t.numel()]
    assert len(pointers) == len(set(pointers))  # safetensors refuses shared memory
    back = weight_cache._restored({name: t.clone() for name, t in tensors.items()}, json.loads(json.dumps(layouts)))
    for name, tensor in state.items():
        assert torch.equal(back[name], tensor)
        if tensor.permute(weight_cache.storage_order(tensor)).is_contiguous():
            assert _strides(back[name]) == _strides(tensor), name


@given(state=state_dicts(), block=st.integers(1, 400))
@settings(max_examples=60, deadline=None)
def test_a_weight_hashes_the_same_in_any_layout_and_any_block_size(state, block):
    contiguous = {name: t.contiguous() for name, t in state.items()}
    expected = weights.state_dict_sha256(contiguous)
    original = weights.HASH_BLOCK_BYTES
    weights.HASH_BLOCK_BYTES = block
    try:
        assert weights.state_dict_sha256(state) == expected
    finally:
        weights.HASH_BLOCK_BYTES = original


BAD_LAYOUTS = st.one_of(
    st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3),
    st.dictionaries(st.sampled_from(["w", "missing"]), st.one_of(
        st.none(), st.text(max_size=3), st.lists(st.integers(-2, 4), max_size=4),
        st.lists(st.booleans(), min_size=2, max_size=2), st.lists(st.floats(0, 1), min_size=2, max_size=2)),
        min_size=1))


def _valid(layouts) -> bool:
    return isinstance(layouts, dict) and all(
        name == "w" and isinstance(order, list) and all(type(a) is int for a in order) and sorted(order) == [0, 1]
        for name, order in layouts.items())


@given(layouts=BAD_LAYOUTS)
@settings(max_examples=150, deadline=None)
def test_a_layout_that_does_not_fit_its_weights_is_a_stale_entry(layouts):
    weights = {"w": torch.zeros(2, 3)}
    if _valid(layouts):
        assert weight_cache._restored(weights, layouts)["w"].shape == (3, 2)
        return
    with pytest.raises(weight_cache.StaleEntry):
        weight_cache._restored(weights, layouts)


@pytest.fixture()
def checkpoint(tmp_path) -> Path:
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.save_pretrained(tmp_path / "llama")
    tokenizer.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


def _mapped(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process that map ``path``."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]).resolve() == path.resolve():
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def _in(tensor: torch.Tensor, ranges: list[tuple[int, int]]) -> bool:
    pointer = tensor.untyped_storage().data_ptr()
    return any(start <= pointer < end for start, end in ranges)


@needs_hooked
@linux_maps
def test_a_load_from_the_cache_holds_no_copy_of_any_weight(checkpoint, tmp_path):
    from lens_position.models import load_model

    cache_dir = tmp_path / "cache"
    cold = load_model(str(checkpoint), cache_dir=str(cache_dir))
    warm = load_model(str(checkpoint), cache_dir=str(cache_dir))
    assert warm.spec.extra["from_cache"] and not cold.spec.extra["from_cache"]
    (entry,) = [p for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    mapped = _mapped(entry / "weights.safetensors")
    held = weights.weights_of(warm.model.state_dict())
    outside = [name for name, t in held.items() if t.numel() and not _in(t, mapped)]
    assert not outside, outside
    for name, tensor in held.items():  # the same strides and numbers as the load that converted
        assert _strides(tensor) == _strides(cold.model.state_dict()[name]), name
        assert torch.equal(tensor, cold.model.state_dict()[name]), name
    tokens = torch.tensor([[1, 5, 9, 30, 7]])
    with torch.no_grad():
        assert torch.equal(cold.model(tokens), warm.model(tokens))


@needs_hooked
@linux_maps
def test_a_conversion_holds_no_second_copy_of_the_matrices_it_lays_out(checkpoint, tmp_path):
    from lens_position.models import load_model

    loaded = load_model(str(checkpoint), cache_dir=str(tmp_path / "cache"))
    mapped = _mapped(checkpoint / "model.safetensors")
    if not mapped:
        pytest.skip("this transformers reads the checkpoint into memory rather than mapping it")
    state = loaded.model.state_dict()
    for name in ("blocks.0.attn.W_Q", "blocks.0.attn.W_O", "blocks.0.mlp.W_in", "blocks.0.mlp.W_gate",
                 "blocks.0.mlp.W_out", "embed.W_E"):
        assert _in(state[name], mapped), f"{name} was copied on load"

