"""The configs of the tiny models (:mod:`lens_position.models.tiny`) as plain data: what the command
line reads to check ``--layers`` and ``--T`` against a tiny model without importing transformers."""

from __future__ import annotations

from typing import Any

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
N_SPECIAL = 3
VOCAB_SIZE = N_SPECIAL + 256
TINY_N_CTX = 1024
TINY_SEED = 0
TINY_INIT_STD = 0.15
TINY_VECTOR_NOISE = 0.1

_COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
               vocab_size=VOCAB_SIZE, max_position_embeddings=TINY_N_CTX, rms_norm_eps=1e-6,
               initializer_range=TINY_INIT_STD, tie_word_embeddings=False, pad_token_id=PAD_ID,
               bos_token_id=BOS_ID, eos_token_id=EOS_ID)

TINY_CONFIGS: dict[str, tuple[str, dict[str, Any], bool]] = {
    # name: (HF config class, config kwargs, tokenizer prepends BOS)
    "tiny-llama": ("LlamaConfig", dict(_COMMON, num_hidden_layers=3,
                                       rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
                   False),
    "tiny-mistral": ("MistralConfig", dict(_COMMON, num_hidden_layers=3, sliding_window=32,
                                           rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
                     False),
    "tiny-qwen2": ("Qwen2Config", dict(_COMMON, num_hidden_layers=3,
                                       rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
                   False),
    "tiny-gemma3": ("Gemma3TextConfig", dict(
        _COMMON, num_hidden_layers=6, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=24,
        sliding_window=16, layer_types=["sliding_attention"] * 5 + ["full_attention"],
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                         "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0}},
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True), True),
}
