"""Nothing random passes for a model: every weight of a loaded model comes from the file. A tensor
missing, renamed, extra or of the wrong shape is refused with its name, per format (safetensors
folder, pickled ``.bin`` folder, GGUF); a header whose sizes no model has, or whose layer count is
not that of the layers in the file, is refused before anything is allocated."""

from __future__ import annotations

import json
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf_edit import first_blocks, rewrite_gguf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from lens_position import load_model
from lens_position.ground.errors import CorruptFileError
from lens_position.models.registry import lookup
from lens_position.models.tiny import tiny_hf_model

WEIGHTS = "model.safetensors"


def save_tiny(folder: Path, name: str = "tiny-llama") -> Path:
    hf_model, tokenizer = tiny_hf_model(name)
    hf_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    return save_tiny(tmp_path_factory.mktemp("tiny") / "llama")


def edited_copy(source: Path, target: Path, edit) -> Path:
    """A copy of the checkpoint folder ``source`` whose safetensors are ``edit(state_dict)``."""
    target.mkdir(parents=True)
    for file in source.iterdir():
        if file.name != WEIGHTS:
            (target / file.name).write_bytes(file.read_bytes())
    save_file(edit(load_file(source / WEIGHTS)), target / WEIGHTS, metadata={"format": "pt"})
    return target


def load(path: Path, tmp_path: Path):
    return load_model(str(path), cache_dir=str(tmp_path / "cache"))


def test_a_clean_checkpoint_loads_every_weight_from_the_file(tiny_folder, tmp_path):
    loaded = load(tiny_folder, tmp_path)
    assert loaded.spec.weights_sha256 == load_model("tiny-llama").spec.weights_sha256


@pytest.mark.fault(area="strict weights", given="a safetensors checkpoint lacking one layer's tensors",
                   happens="refused before the model is built (CorruptFileError naming the missing layer), "
                           "never filled with initialised weights")
def test_a_missing_layer_is_refused_before_anything_is_built(tiny_folder, tmp_path):
    folder = edited_copy(tiny_folder, tmp_path / "ckpt",
                         lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k})
    with pytest.raises(CorruptFileError, match=r"layers 1 are missing"):
        load(folder, tmp_path)


@pytest.mark.fault(area="strict weights", given="a checkpoint saved from a torch.compile'd model (every key "
                                                "prefixed _orig_mod.)",
                   happens="refused, naming the prefix and how to save the model plainly")
def test_torch_compile_prefixes_are_named(tiny_folder, tmp_path):
    folder = edited_copy(tiny_folder, tmp_path / "ckpt", lambda sd: {f"_orig_mod.{k}": v for k, v in sd.items()})
    with pytest.raises(CorruptFileError, match=r"_orig_mod\..*model\._orig_mod|torch\.compile"):
        load(folder, tmp_path)


@pytest.mark.fault(area="strict weights", given="one tensor missing, renamed, added or of the wrong shape",
                   happens="refused with the tensor's name (CorruptFileError); never initialised at random")
@pytest.mark.parametrize("edit, named", [
    (lambda sd: {k: v for k, v in sd.items() if k != "model.layers.0.self_attn.q_proj.weight"},
     "model.layers.0.self_attn.q_proj.weight"),
    (lambda sd: {("model.layers.0.mlp.gate.weight" if k == "model.layers.0.mlp.gate_proj.weight" else k): v
                 for k, v in sd.items()}, "model.layers.0.mlp.gate.weight"),
    (lambda sd: {**sd, "model.extra.weight": torch.zeros(3)}, "model.extra.weight"),
    (lambda sd: {k: (v[:-1] if k == "model.norm.weight" else v) for k, v in sd.items()}, "model.norm.weight"),
], ids=["missing", "renamed", "extra", "wrong-shape"])
def test_each_tensor_fault_is_refused_with_its_name(tiny_folder, tmp_path, edit, named):
    folder = edited_copy(tiny_folder, tmp_path / "ckpt", edit)
    with pytest.raises(CorruptFileError, match=named.replace(".", r"\.")):
        load(folder, tmp_path)


@pytest.mark.fault(area="strict weights", given="a pickled .bin checkpoint lacking a tensor",
                   happens="refused after loading, with the missing weight's name")
def test_pickled_weights_are_checked_too(tmp_path):
    folder = save_tiny(tmp_path / "bin")
    state = load_file(folder / WEIGHTS)
    del state["model.layers.1.self_attn.v_proj.weight"]
    torch.save(state, folder / "pytorch_model.bin")
    (folder / WEIGHTS).unlink()
    with pytest.raises(CorruptFileError, match=r"model\.layers\.1\.self_attn\.v_proj\.weight"):
        load(folder, tmp_path)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_subset_of_tensors_removed_or_renamed_is_refused(tiny_folder, tmp_path_factory, data):
    """Property: whatever tensors are removed or renamed, the load is refused, never completed with
    made-up weights."""
    names = sorted(load_file(tiny_folder / WEIGHTS))
    removed = data.draw(st.sets(st.sampled_from(names), max_size=4))
    renamed = data.draw(st.sets(st.sampled_from(sorted(set(names) - removed)), max_size=3))
    if not removed and not renamed:
        removed = {data.draw(st.sampled_from(names))}
    tmp = tmp_path_factory.mktemp("subset")

    def edit(sd):
        return {(f"{k}.renamed" if k in renamed else k): v for k, v in sd.items() if k not in removed}

    with pytest.raises(CorruptFileError, match="re-download|never builds|never analyses"):
        load(edited_copy(tiny_folder, tmp / "ckpt", edit), tmp)


@pytest.mark.fault(area="strict weights", given="a config with absurd sizes (num_hidden_layers = 10^6, "
                                                "num_attention_heads = 0, hidden_size = -1) or a layer count "
                                                "that is not that of the file's layers",
                   happens="refused from the header in well under a second, naming the field")
@pytest.mark.parametrize("field, value", [("num_hidden_layers", 10**6), ("num_attention_heads", 0),
                                          ("hidden_size", -1), ("num_hidden_layers", 4), ("num_hidden_layers", 2)])
def test_absurd_or_wrong_config_sizes_are_refused_at_once(tiny_folder, tmp_path, field, value):
    folder = edited_copy(tiny_folder, tmp_path / "ckpt", dict)
    config = json.loads((folder / "config.json").read_text())
    config[field] = value
    (folder / "config.json").write_text(json.dumps(config))
    started = time.perf_counter()
    expected = {4: "layers 3 are missing", 2: "layers 2 beyond"}.get(value, f"{field} = {value}")
    with pytest.raises(CorruptFileError, match=expected):
        load(folder, tmp_path)
    assert time.perf_counter() - started < 30  # a million layers would take minutes and gigabytes


# --- GGUF headers: checked before transformers reads anything --------------------------------

def synthetic_gguf(path: Path, *, blocks: int, header_blocks: int | None = None, heads: int = 4,
                   width: int = 8) -> Path:
    """A Llama-architecture GGUF holding an embedding and ``blocks`` blocks' attention tensors."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(blocks if header_blocks is None else header_blocks)
    writer.add_head_count(heads)
    writer.add_embedding_length(width)
    writer.add_tensor("token_embd.weight", np.zeros((16, 8), dtype=np.float32))
    for block in range(blocks):
        writer.add_tensor(f"blk.{block}.attn_q.weight", np.zeros((8, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.fault(area="strict weights", given="a GGUF whose header is absurd (block_count = 10^6, head_count = "
                                                "0) or does not match its tensors (embedding only, a block "
                                                "missing, blocks beyond the count)",
                   happens="refused from the header and tensor index in well under a second, nothing allocated")
@pytest.mark.parametrize("shape, match", [
    (dict(blocks=2, header_blocks=10**6), "block_count = 1000000"),
    (dict(blocks=2, heads=0), "head_count = 0"),
    (dict(blocks=0, header_blocks=2), "holds the tensors of none"),
    (dict(blocks=3, header_blocks=4), "layers 3 are missing"),
    (dict(blocks=3, header_blocks=2), "layers 2 beyond"),
], ids=["million-blocks", "no-heads", "embedding-only", "block-missing", "extra-block"])
def test_gguf_headers_are_checked_against_their_tensors(tmp_path, shape, match):
    path = synthetic_gguf(tmp_path / "model.gguf", **shape)
    started = time.perf_counter()
    with pytest.raises(CorruptFileError, match=match):
        load(path, tmp_path)
    assert time.perf_counter() - started < 10


@pytest.fixture(scope="module")
def two_block_smollm2(tmp_path_factory) -> Path:
    """The embedded SmolLM2 GGUF cut to its first two blocks (a real tokenizer and real tensors)."""
    return rewrite_gguf(lookup("smollm2-135m").locate(), tmp_path_factory.mktemp("gguf") / "two.gguf",
                        keep=lambda name: first_blocks(name, 2), values={"llama.block_count": 2})


@pytest.mark.slow
@pytest.mark.fault(area="strict weights", given="a real GGUF lacking one tensor of a block",
                   happens="refused after transformers' read, naming the weight (CorruptFileError)")
def test_a_real_gguf_lacking_a_tensor_is_refused(two_block_smollm2, tmp_path):
    """(Whole real GGUFs pass the same check on every load of the real-model tests.)"""
    cut = rewrite_gguf(two_block_smollm2, tmp_path / "cut.gguf", keep=lambda name: name != "blk.1.attn_k.weight")
    with pytest.raises(CorruptFileError, match=r"model\.layers\.1\.self_attn\.k_proj\.weight"):
        load(cut, tmp_path)


TRUE_SIZES = {"num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 128, "vocab_size": 259,
              "num_key_value_heads": 2, "head_dim": 16}


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(TRUE_SIZES)), value=st.one_of(st.integers(-3, 10**12), st.just(0)))
def test_any_header_size_other_than_the_files_is_refused_before_the_build(tiny_folder, tmp_path_factory, field,
                                                                         value):
    """Property: a config size that is not the tensors' (layers, width, MLP width, vocabulary,
    key/value heads, head width), from -3 to 10^12, is refused from the headers, in well under a
    second: never built, never loaded."""
    config = json.loads((tiny_folder / "config.json").read_text())
    assert {k: config[k] for k in TRUE_SIZES} == TRUE_SIZES
    if value == TRUE_SIZES[field]:
        return
    tmp = tmp_path_factory.mktemp("header")
    folder = edited_copy(tiny_folder, tmp / "ckpt", dict)
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    started = time.perf_counter()
    with pytest.raises(CorruptFileError, match="config.json|layers"):
        load(folder, tmp)
    assert time.perf_counter() - started < 10
