"""Decoder families our adapters do not convert, loaded through the bridge from tiny random
checkpoints saved locally with ``save_pretrained`` (no hub): OLMo-2 (a key norm over all key
heads), Phi-3 (fused QKV projection) and Llama with RoPE scaling of type linear, YaRN and dynamic.
Each is checked against an independent reference, the Hugging Face model's own forward pass
(loaded afresh from the folder, grouped-query attention as saved), then decomposed. Marked
``tl4``: the same on TransformerLens 3.9 and 4.x (Qwen3 and SmolLM3 are in test_backends.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from lens_position.analyses.decompose import check_identity, decompose, decompose_dense
from lens_position.core.data import build_prompts
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.backends import hooked_available
from lens_position.models.tiny import byte_tokenizer

pytestmark = pytest.mark.tl4

# float32 forward noise of 2-layer models (test_backends.py measures the same bounds on the tiny models)
LOGIT_TOL = 1e-4
PATTERN_TOL = 1e-5
T = 24
SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=259,
             max_position_embeddings=64, bos_token_id=1, eos_token_id=2, pad_token_id=0, num_hidden_layers=2)
ROPE_SCALING = {
    "linear": {"rope_type": "linear", "factor": 4.0},
    # original context 16 < T: YaRN's ramp and its attention temperature both act on these prompts
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0},
}
FAMILIES = {
    "olmo2": (lambda: transformers.Olmo2Config(**SMALL), transformers.Olmo2ForCausalLM),
    "phi3": (lambda: transformers.Phi3Config(**SMALL), transformers.Phi3ForCausalLM),
    **{f"llama-{kind}": (lambda kind=kind: transformers.LlamaConfig(rope_scaling=dict(ROPE_SCALING[kind]), **SMALL),
                         transformers.LlamaForCausalLM) for kind in ROPE_SCALING},
}


def _save(folder: Path, config: transformers.PretrainedConfig, model_class: type) -> Path:
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    byte_tokenizer(False).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {name: _save(root / name, make(), model_class) for name, (make, model_class) in FAMILIES.items()}


def _reference(folder: Path, tokens: torch.Tensor):
    """The Hugging Face model's own forward pass (eager attention, so it returns its patterns)."""
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        return hf_model(tokens, output_attentions=True)


def _agrees_with_hugging_face(loaded, folder: Path, tokens: torch.Tensor) -> None:
    reference = _reference(folder, tokens)
    assert (loaded.backend.forward(tokens) - reference.logits).abs().max() < LOGIT_TOL
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(loaded.spec.n_layers)]
    cache = loaded.backend.run_with_cache(tokens, names)
    for layer, attention in enumerate(reference.attentions):
        assert (cache[names[layer]] - attention).abs().max() < PATTERN_TOL, layer


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_family_loads_through_the_bridge_computes_what_hugging_face_computes_and_decomposes(name, folders):
    loaded = load_model(str(folders[name]), backend="bridge")
    assert loaded.spec.extra["backend"] == "bridge" and loaded.spec.n_kv_heads == 2
    prompts = build_prompts(loaded, N=4, T=T, source="random", seed=0)
    _agrees_with_hugging_face(loaded, folders[name], prompts.tokens)
    identity = check_identity(loaded, prompts)
    assert float(identity["max_abs_error_pattern"].max()) < 1e-5
    result = decompose(loaded, prompts, progress=False)
    assert len(result.layers) == 2 and len(result.heads) == 2 * 4
    total = result.heads["R"] + result.heads["M"] + result.heads["C"]
    assert float((total - result.heads["total"]).abs().max()) < 1e-9
    if hooked_available():  # the adapters convert none of these: the hooked backend names the bridge
        with pytest.raises((UnsupportedArchitectureError, BadInputError), match="bridge"):
            load_model(str(folders[name]), backend="hooked")


def test_olmo2s_key_norm_over_all_key_heads_survives_ungrouping(folders):
    """OLMo-2 normalises the keys of all key/value heads together; the bridge repeats the heads
    and the norm's weight, and a single query head's key can be patched."""
    loaded = load_model(str(folders["olmo2"]), backend="bridge")
    attention = loaded.model.original_model.model.layers[0].self_attn
    assert attention.k_proj.out_features == attention.k_norm.weight.numel() == 4 * 8
    assert loaded.backend.kv_hooks_per_query_head


def test_phi3s_fused_projection_is_ungrouped_row_block_by_row_block(folders):
    loaded = load_model(str(folders["phi3"]), backend="bridge")
    attention = loaded.model.original_model.model.layers[0].self_attn
    assert attention.qkv_proj.out_features == 3 * 4 * 8 and attention.num_key_value_heads == 4
    assert loaded.backend.kv_hooks_per_query_head


@pytest.mark.parametrize("kind, rope_kind, role", [("linear", "linear", "interpolated"), ("yarn", "yarn", "ntk"),
                                                   ("dynamic", "dynamic-ntk", "standard")])
def test_the_spec_states_the_rope_scaling(kind, rope_kind, role, folders):
    spec = load_model(str(folders[f"llama-{kind}"]), backend="bridge").spec
    assert (spec.rope_kind, spec.role, spec.rotary_base) == (rope_kind, role, 10_000.0)
    assert spec.extra["rope_scaling"]["rope_type"] == kind
    assert spec.extra["rope_scaling"]["factor"] == ROPE_SCALING[kind]["factor"]


def test_linear_scaling_divides_every_rotary_frequency_by_its_factor(folders):
    """Closed form: position interpolation turns position p into p / factor, so every rotary
    frequency is the standard one theta^(-2k/d) divided by the factor."""
    loaded = load_model(str(folders["llama-linear"]), backend="bridge")
    inv_freq = loaded.model.original_model.model.rotary_emb.inv_freq.to(torch.float64)
    d_head = loaded.spec.d_head
    expected = 10_000.0 ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head) / 4.0
    assert torch.allclose(inv_freq, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_the_scaling_changes_the_patterns_and_the_decomposition_equals_the_dense_reference(kind, folders, tmp_path):
    """The comparison with Hugging Face is sensitive to the scaling (the same weights without it
    give other patterns), and the streamed decomposition equals the dense one."""
    loaded = load_model(str(folders[f"llama-{kind}"]), backend="bridge")
    plain = load_model(str(_save(tmp_path / "plain", transformers.LlamaConfig(**SMALL), transformers.LlamaForCausalLM)),
                       backend="bridge")
    prompts = build_prompts(loaded, N=2, T=T, source="random", seed=1)
    name = "blocks.1.attn.hook_pattern"
    scaled_pattern = loaded.backend.run_with_cache(prompts.tokens, [name])[name]
    plain_pattern = plain.backend.run_with_cache(prompts.tokens, [name])[name]
    assert (scaled_pattern - plain_pattern).abs().max() > 1e-3
    streamed, dense = decompose(loaded, prompts, progress=False), decompose_dense(loaded, prompts)
    for column in ("total", "R", "M", "C"):  # the dense reference computes the self-referenced split
        assert (streamed.heads[column] - dense.heads[column]).abs().max() < 1e-8, column


def test_dynamic_ntk_within_its_context_is_plain_rope_and_beyond_it_is_refused(folders, tmp_path):
    """Dynamic NTK rescales only for sequences longer than the trained context: within it the
    patterns are those of the same weights with plain RoPE (to float round-off), and an n_ctx
    beyond it is refused (the frequencies would depend on the longest sequence seen)."""
    loaded = load_model(str(folders["llama-dynamic"]), backend="bridge")
    plain = load_model(str(_save(tmp_path / "plain", transformers.LlamaConfig(**SMALL), transformers.LlamaForCausalLM)),
                       backend="bridge")
    prompts = build_prompts(loaded, N=2, T=T, source="random", seed=2)
    name = "blocks.1.attn.hook_pattern"
    dynamic_pattern = loaded.backend.run_with_cache(prompts.tokens, [name])[name]
    assert (dynamic_pattern - plain.backend.run_with_cache(prompts.tokens, [name])[name]).abs().max() < 1e-6
    with pytest.raises(BadInputError, match="dynamic-NTK"):
        load_model(str(folders["llama-dynamic"]), backend="bridge", n_ctx=2 * SMALL["max_position_embeddings"])
    load_model(str(folders["llama-dynamic"]), backend="bridge", n_ctx=SMALL["max_position_embeddings"] // 2)


def test_ntk_options_on_an_already_scaled_rope_are_refused(folders):
    with pytest.raises(BadInputError, match="already scaled"):
        load_model(str(folders["llama-linear"]), backend="bridge", ntk_alpha=2.0)


@pytest.mark.fault(area="models", given="a GPT-NeoX checkpoint without attention biases (attention_bias=False) on "
                                        "the bridge", happens="computes what Hugging Face computes, or is refused by "
                                        "name (UnsupportedArchitectureError: the adapter's assumption, where, the "
                                        "config switches), never TransformerLens's bare AssertionError")
def test_a_family_variant_the_bridge_does_not_cover_is_refused_by_name_or_exact(tmp_path):
    from lens_position.models.family_checkpoints import write_family_checkpoint

    folder = write_family_checkpoint("gpt_neox", tmp_path / "neox", attention_bias=False)
    try:
        loaded = load_model(str(folder), backend="bridge")
    except UnsupportedArchitectureError as error:
        assert "'gpt_neox'" in str(error) and "attention_bias" in str(error) and "assumes" in str(error)
        return
    prompts = build_prompts(loaded, N=2, T=T, source="random", seed=0)
    _agrees_with_hugging_face(loaded, folder, prompts.tokens)


LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.5, 2.0, 3.0, 4.0],
            "original_max_position_embeddings": 16}


@pytest.mark.fault(area="models", given="a LongRoPE checkpoint (Phi-3-128k's shape) used beyond its original context",
                   happens="the rotary bands read the long factors the model rotates those prompts with (the short "
                           "ones within the original context), checked against the model's own cos/sin")
@pytest.mark.parametrize("length", [12, T])
def test_longrope_bands_read_the_frequencies_the_model_rotates_the_prompts_with(tmp_path, length):
    from lens_position.analyses.rotary_bands import frequency_bands, rotary_frequencies

    config = transformers.Phi3Config(**{**SMALL, "max_position_embeddings": 64}, rope_scaling=dict(LONGROPE),
                                     original_max_position_embeddings=16)
    loaded = load_model(str(_save(tmp_path / "longrope", config, transformers.Phi3ForCausalLM)), backend="bridge")
    frequencies = rotary_frequencies(loaded, 0, length).to(torch.float64)
    factors = LONGROPE["long_factor" if length > 16 else "short_factor"]
    d_head = loaded.spec.d_head
    expected = 1.0 / (torch.tensor(factors, dtype=torch.float64)
                      * 10_000.0 ** (torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
    assert torch.allclose(frequencies, expected, rtol=1e-5)
    name = "blocks.0.attn.hook_cos"  # the model's own table on a prompt of this length, at position 1
    tokens = build_prompts(loaded, N=1, T=length, source="random", seed=0).tokens
    cos = loaded.backend.run_with_cache(tokens, [name], stop_at_layer=1)[name].reshape(-1, d_head)[1]
    sin_name = "blocks.0.attn.hook_sin"
    sin = loaded.backend.run_with_cache(tokens, [sin_name], stop_at_layer=1)[sin_name].reshape(-1, d_head)[1]
    assert torch.allclose(torch.atan2(sin, cos)[: d_head // 2].to(torch.float64), expected, rtol=1e-4)
    bands = frequency_bands(loaded, 0, 2, length)
    assert bands[0].inv_freq_max == pytest.approx(float(expected.max()), rel=1e-5)
