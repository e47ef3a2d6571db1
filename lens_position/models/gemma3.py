"""Gemma-3 text family (``Gemma3ForCausalLM``, e.g. Gemma-3-270M): interleaved local
(sliding window) and global layers, separate RoPE bases for each (``rotary_base_local``),
RMSNorm before and after attention and MLP, QK-norm, gated GELU(tanh) MLP.

Conventions checked against the HF implementation:
- embeddings are scaled by ``sqrt(d_model)`` (folded into ``W_E`` by the converter);
- Gemma RMSNorm multiplies by ``1 + w`` (the converter adds the 1);
- scores are scaled by ``query_pre_attn_scalar ** -0.5``, not ``d_head ** -0.5``;
- no logit soft-capping in Gemma-3 (both caps are None in its config).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models.rope import hf_rope_scaling_to_cfg, rope_theta

FAMILY = "gemma3"
ARCHITECTURE = "Gemma3ForCausalLM"  # the HF class, TransformerLens's original_architecture
MODEL_TYPES = ("gemma3_text",)


def hooked_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig kwargs for a ``Gemma3TextConfig``."""
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(hf_config, cap, None) is not None:
            raise UnsupportedArchitectureError(
                f"Gemma-3 config sets {cap}; lens_position's Gemma-3 adapter assumes none "
                "(as released). Remove it from the config or open an issue")
    layer_types = list(hf_config.layer_types)
    cfg = {
        "model_name": getattr(hf_config, "_name_or_path", "") or ARCHITECTURE,
        "original_architecture": ARCHITECTURE,
        "d_model": hf_config.hidden_size,
        "d_head": hf_config.head_dim,
        "n_heads": hf_config.num_attention_heads,
        "n_key_value_heads": hf_config.num_key_value_heads,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": hf_config.rms_norm_eps,
        "d_vocab": hf_config.vocab_size,
        "act_fn": hf_config.hidden_activation,
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        "use_normalization_before_and_after": True,
        "use_qk_norm": True,
        "use_attn_scale": True,
        "attn_scale": math.sqrt(hf_config.query_pre_attn_scalar),
        "positional_embedding_type": "rotary",
        "rotary_adjacent_pairs": False,
        "rotary_dim": hf_config.head_dim,
        "rotary_base": rope_theta(hf_config, "full_attention"),
        "rotary_base_local": rope_theta(hf_config, "sliding_attention"),
        "use_local_attn": True,
        "window_size": int(hf_config.sliding_window),
        "attn_types": ["local" if t == "sliding_attention" else "global" for t in layer_types],
        "ungroup_grouped_query_attention": True,
        "dtype": torch.float32,
        "init_weights": False,
    }
    if hf_rope_scaling_to_cfg(hf_config, "full_attention") or hf_rope_scaling_to_cfg(
            hf_config, "sliding_attention"):
        # HF scales only the global layers (Gemma-3 4B+); TransformerLens would scale all.
        raise UnsupportedArchitectureError(
            "this Gemma-3 checkpoint scales its RoPE (rope_type other than 'default'); "
            "lens_position supports unscaled Gemma-3 (270M, 1B). Open an issue for others")
    return cfg


def convert_weights(hf_model: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """HookedTransformer state dict from a ``Gemma3ForCausalLM``."""
    from transformer_lens.pretrained.weight_conversions import convert_gemma_weights  # TransformerLens 3.x (hooked)

    return convert_gemma_weights(hf_model, cfg)
