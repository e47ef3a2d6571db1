"""Llama family (Llama-2/3, SmolLM2, any ``LlamaForCausalLM``): HF config and weights to
HookedTransformer.

RMSNorm before attention and MLP, gated SiLU MLP, rotary embeddings on the rotate-half
layout (``rotary_adjacent_pairs=False``), grouped-query attention, no biases. A
``rope_type: llama3`` checkpoint maps to TransformerLens's NTK-by-parts rotary.
"""

from __future__ import annotations

from typing import Any

import torch

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models.rope import hf_rope_scaling_to_cfg, rope_theta

FAMILY = "llama"
ARCHITECTURE = "LlamaForCausalLM"  # the HF class, TransformerLens's original_architecture
MODEL_TYPES = ("llama",)


def llama_like_config(hf_config: Any, architecture: str) -> dict[str, Any]:
    """HookedTransformerConfig kwargs shared by Llama, Mistral and Qwen2 (fp32, exact HF
    computation: no folding later)."""
    d_head = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return {
        "model_name": getattr(hf_config, "_name_or_path", "") or architecture,
        "original_architecture": architecture,
        "d_model": hf_config.hidden_size,
        "d_head": d_head,
        "n_heads": hf_config.num_attention_heads,
        "n_key_value_heads": hf_config.num_key_value_heads or hf_config.num_attention_heads,
        "d_mlp": hf_config.intermediate_size,
        "n_layers": hf_config.num_hidden_layers,
        "n_ctx": hf_config.max_position_embeddings,
        "eps": hf_config.rms_norm_eps,
        "d_vocab": hf_config.vocab_size,
        "act_fn": hf_config.hidden_act,
        "normalization_type": "RMS",
        "final_rms": True,
        "gated_mlp": True,
        "positional_embedding_type": "rotary",
        "rotary_adjacent_pairs": False,
        "rotary_dim": d_head,
        "rotary_base": rope_theta(hf_config),
        # hook_k / hook_v per query head, so a single head's key or value can be patched.
        "ungroup_grouped_query_attention": True,
        "dtype": torch.float32,
        "init_weights": False,
    }


def hooked_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig kwargs for a ``LlamaConfig``."""
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise UnsupportedArchitectureError(
            "Llama checkpoints with attention_bias or mlp_bias are not supported (TransformerLens's "
            "Llama converter drops biases); use a checkpoint without biases or open an issue")
    cfg = llama_like_config(hf_config, ARCHITECTURE)
    cfg.update(hf_rope_scaling_to_cfg(hf_config))
    return cfg


def convert_weights(hf_model: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """HookedTransformer state dict from a ``LlamaForCausalLM``."""
    from transformer_lens.pretrained.weight_conversions import convert_llama_weights  # TransformerLens 3.x (hooked)

    return convert_llama_weights(hf_model, cfg)
