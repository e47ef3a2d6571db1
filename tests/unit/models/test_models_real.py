"""The two embedded real models: adapter logits equal the Hugging Face GGUF model's, and the
registry variants carry the position mechanisms they name. Slow (GGUF dequantization)."""

from __future__ import annotations

import pytest
import torch

from lens_position.models import load_model
from lens_position.models.registry import REGISTRY
from lens_position.models.rope import NTK_BY_PARTS_DEFAULTS, ntk_aware_base
from lens_position.models.sources import read_gguf

pytestmark = pytest.mark.slow
LOGIT_TOLERANCE = 1e-3  # fp32, max absolute difference
TEXT = "The history of all hitherto existing society is the history of class struggles. " * 40


def max_logit_difference(loaded, registry_name: str, n_positions: int) -> float:
    hf_model, tokenizer = read_gguf(REGISTRY[registry_name].locate())
    reference_ids = tokenizer(TEXT)["input_ids"]
    assert loaded.tokenizer(TEXT)["input_ids"] == reference_ids  # the cached tokenizer is the GGUF's
    tokens = torch.tensor([reference_ids[:n_positions]])
    assert tokens.shape[1] == n_positions
    with torch.no_grad():
        reference = hf_model(tokens).logits
        ours = loaded.model(tokens)
    return (ours - reference).abs().max().item()


def test_smollm2_logits_equal_hugging_face(smollm2):
    assert max_logit_difference(smollm2, "smollm2-135m", 96) < LOGIT_TOLERANCE


def test_gemma3_logits_equal_hugging_face_beyond_the_window(gemma3):
    # 530 > 512 positions: the local layers' window is in force for the last queries.
    assert max_logit_difference(gemma3, "gemma3-270m", 530) < LOGIT_TOLERANCE


def test_smollm2_spec(smollm2):
    spec = smollm2.spec
    assert (spec.family, spec.n_layers, spec.n_heads, spec.n_kv_heads, spec.d_head) == ("llama", 30, 9, 3, 64)
    assert spec.rope_kind == "standard" and spec.rotary_base == 100_000.0 and spec.window is None
    assert not spec.tokenizer_prepends_bos and spec.bos_token_id == 1
    assert len(spec.weights_sha256) == 64


def test_gemma3_spec(gemma3):
    spec = gemma3.spec
    assert (spec.family, spec.n_layers, spec.window) == ("gemma3", 18, 512)
    assert spec.attn_types == (("local",) * 5 + ("global",)) * 3
    assert (spec.rotary_base, spec.rotary_base_local) == (1_000_000.0, 10_000.0)
    assert spec.tokenizer_prepends_bos and spec.bos_token_id == 2


def test_smollm2_ntk_variants_share_the_weights_and_scale_the_rope(smollm2):
    aware = load_model("smollm2-135m-ntk")
    parts = load_model("smollm2-135m-ntk-parts")
    assert aware.spec.extra["from_cache"] and parts.spec.extra["from_cache"]
    assert aware.spec.weights_sha256 == parts.spec.weights_sha256 == smollm2.spec.weights_sha256
    assert aware.spec.rope_kind == "ntk-aware" and aware.spec.ntk_alpha == 4.0
    assert aware.spec.rotary_base == pytest.approx(ntk_aware_base(100_000.0, 4.0, 64))
    assert parts.spec.rope_kind == "ntk-by-parts"
    assert parts.spec.ntk_by_parts == {**NTK_BY_PARTS_DEFAULTS, "original_context": float(smollm2.spec.n_ctx)}


def test_gguf_read_with_metadata_parsed_once_equals_transformers_own(monkeypatch):
    import gguf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = REGISTRY["smollm2-135m"].locate()
    built = []
    original_init = gguf.GGUFReader.__init__

    def counting_init(self, *args, **kwargs):
        built.append(args[0] if args else kwargs.get("path"))
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(gguf.GGUFReader, "__init__", counting_init)
    ours, our_tokenizer = read_gguf(path)
    assert len(built) == 1  # transformers alone builds four
    plain = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                 local_files_only=True)
    plain_tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    assert len(built) > 1
    assert ours.config.to_dict() == plain.config.to_dict()
    assert our_tokenizer.get_vocab() == plain_tokenizer.get_vocab()
    plain_weights = plain.state_dict()
    for name, weight in ours.state_dict().items():
        assert torch.equal(weight, plain_weights[name]), name
