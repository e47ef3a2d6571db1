"""Qwen2 family (Qwen1.5, Qwen2, Qwen2.5; ``Qwen2ForCausalLM``): Llama layout with q/k/v
biases. Layers listed as ``sliding_attention`` in ``layer_types`` (``use_sliding_window``)
become local layers of ``sliding_window`` keys.
"""

from __future__ import annotations

from typing import Any

import torch

from lens_position.models.llama import llama_like_config
from lens_position.models.rope import hf_rope_scaling_to_cfg

FAMILY = "qwen2"
ARCHITECTURE = "Qwen2ForCausalLM"  # the HF class, TransformerLens's original_architecture
MODEL_TYPES = ("qwen2",)


def hooked_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig kwargs for a ``Qwen2Config``."""
    cfg = llama_like_config(hf_config, ARCHITECTURE)
    cfg.update(hf_rope_scaling_to_cfg(hf_config))
    layer_types = list(getattr(hf_config, "layer_types", None) or [])
    if "sliding_attention" in layer_types and getattr(hf_config, "sliding_window", None):
        cfg.update(use_local_attn=True, window_size=int(hf_config.sliding_window),
                   attn_types=["local" if t == "sliding_attention" else "global" for t in layer_types])
    return cfg


def convert_weights(hf_model: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """HookedTransformer state dict from a ``Qwen2ForCausalLM``."""
    from transformer_lens.pretrained.weight_conversions import convert_qwen2_weights  # TransformerLens 3.x (hooked)

    return convert_qwen2_weights(hf_model, cfg)
