"""Mistral family (``MistralForCausalLM``): Llama layout plus a sliding window on every
layer when ``sliding_window`` is set (Mistral-7B-v0.1: W = 4096).

HF's sliding mask keeps key ``j`` for query ``i`` when ``i - W < j <= i``, the same rule
as TransformerLens's local attention.
"""

from __future__ import annotations

from typing import Any

import torch

from lens_position.models.llama import llama_like_config
from lens_position.models.rope import hf_rope_scaling_to_cfg

FAMILY = "mistral"
ARCHITECTURE = "MistralForCausalLM"  # the HF class, TransformerLens's original_architecture
MODEL_TYPES = ("mistral",)


def hooked_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig kwargs for a ``MistralConfig``."""
    cfg = llama_like_config(hf_config, ARCHITECTURE)
    cfg.update(hf_rope_scaling_to_cfg(hf_config))
    window = getattr(hf_config, "sliding_window", None)
    if window is not None:
        cfg.update(use_local_attn=True, window_size=int(window),
                   attn_types=["local"] * hf_config.num_hidden_layers)
    return cfg


def convert_weights(hf_model: Any, cfg: Any) -> dict[str, torch.Tensor]:
    """HookedTransformer state dict from a ``MistralForCausalLM``."""
    from transformer_lens.pretrained.weight_conversions import convert_mistral_weights  # TransformerLens 3.x (hooked)

    return convert_mistral_weights(hf_model, cfg)
