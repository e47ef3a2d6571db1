"""The bridge's weight cache (lens_position.models.hf_cache): a GGUF file is dequantised once, saved as
a Hugging Face folder, and later loads read that folder, with the same weights and numbers; a damaged
entry is rebuilt. Marked ``tl4``: the bridge is TransformerLens 4.x's only model class."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf_edit import first_blocks, rewrite_gguf

from lens_position.models import load_model, sources
from lens_position.models.registry import lookup

pytestmark = pytest.mark.tl4


@pytest.fixture(scope="module")
def small_gguf(tmp_path_factory) -> Path:
    """SmolLM2-135M's GGUF cut to its first two blocks (its header says two)."""
    folder = tmp_path_factory.mktemp("gguf")
    return rewrite_gguf(lookup("smollm2-135m").locate(), folder / "two-blocks.gguf",
                        keep=lambda name: first_blocks(name, 2), values={"llama.block_count": 2})


def test_a_gguf_is_dequantised_once_and_read_from_the_cache_after(small_gguf, tmp_path, monkeypatch, capfd):
    cache = str(tmp_path / "cache")
    capfd.readouterr()
    first = load_model(str(small_gguf), backend="bridge", cache_dir=cache)
    # quiet: one lens_position line for the dequantisation, nothing from transformers or tqdm
    printed = capfd.readouterr()
    lines = [line for line in (printed.out + printed.err).replace("\r", "\n").splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dequantising two-blocks.gguf:"), lines
    assert "tensors in" in lines[0]
    entries = [entry for entry in (tmp_path / "cache" / "hf").iterdir() if entry.is_dir()]
    assert len(entries) == 1 and (entries[0] / "entry.json").is_file()

    read = sources.read_gguf
    calls: list[Path] = []
    monkeypatch.setattr(sources, "read_gguf", lambda path, check=None: calls.append(path) or read(path, check))
    second = load_model(str(small_gguf), backend="bridge", cache_dir=cache)
    assert calls == []  # the folder, not the GGUF
    printed = capfd.readouterr()
    assert not (printed.out + printed.err).strip()  # a cached load prints nothing
    assert second.spec.weights_sha256 == first.spec.weights_sha256
    tokens = torch.tensor([second.tokenizer("the cache keeps the weights")["input_ids"]])
    assert torch.equal(first.backend.forward(tokens), second.backend.forward(tokens))
    assert second.tokenizer.bos_token_id == first.tokenizer.bos_token_id

    entry = next(e for e in (tmp_path / "cache" / "hf").iterdir() if e.is_dir())
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-64:] = bytes(64)  # damaged weights: the entry no longer matches its recorded sha256
    weights.write_bytes(bytes(data))
    third = load_model(str(small_gguf), backend="bridge", cache_dir=cache)
    assert calls == [small_gguf] and third.spec.weights_sha256 == first.spec.weights_sha256


def test_reading_a_folder_draws_no_weight_bar_and_leaves_the_setting_as_it_was(tmp_path, capfd):
    from transformers.utils import logging as transformers_logging

    from lens_position.models.family_checkpoints import write_family_checkpoint

    folder = write_family_checkpoint("llama", tmp_path / "llama")
    capfd.readouterr()
    assert transformers_logging.is_progress_bar_enabled()
    sources.read_hf_folder(folder, check=None)
    assert "Loading weights" not in capfd.readouterr().err
    assert transformers_logging.is_progress_bar_enabled()
