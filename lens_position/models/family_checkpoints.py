"""Tiny random checkpoints of any decoder family the installed transformers has, written to a
folder as a downloaded checkpoint would be (``config.json``, safetensors weights, tokenizer files).

They are how lens_position checks itself against the families researchers bring
(:func:`write_family_checkpoint`, used by the family matrix in the tests and the docs' "Load a
model" page): each is the family's own Hugging Face model class with every size shrunk (2 layers,
d_model 64, 4 query heads over 2 key/value heads, head size 16, a 259-id byte tokenizer), weights
drawn from a fixed seed with a larger spread than Hugging Face's default (attention far from
uniform), so a wrong mask, head axis or rotation shows in the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lens_position.models.tiny import BOS_ID, EOS_ID, PAD_ID, TINY_INIT_STD, VOCAB_SIZE, byte_tokenizer

N_LAYERS = 2
SEED = 0
MAX_PARAMETERS = 50_000_000

# The sizes every family gets (names transformers maps to each config's own attribute names).
_SIZES: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    num_hidden_layers=N_LAYERS, vocab_size=VOCAB_SIZE, max_position_embeddings=256, initializer_range=TINY_INIT_STD,
    pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID, tie_word_embeddings=False,
    # mixture-of-experts families: few small experts
    num_local_experts=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_routed_experts=4,
    # families that name sizes their own way
    n_embd=64, n_head=4, n_layer=N_LAYERS, n_positions=256, n_inner=128, ffn_dim=128,
)

# Per-family settings a tiny checkpoint needs (a window short enough to be seen in a short check,
# the real model's multi-query layout).
FAMILY_SETTINGS: dict[str, dict[str, Any]] = {
    "mistral": {"sliding_window": 6},
    "mixtral": {"sliding_window": 6},
    "starcoder2": {"sliding_window": 6},
    "phi3": {"sliding_window": 6},
    "falcon": {"new_decoder_architecture": False, "multi_query": True, "parallel_attn": True},
    "gemma2": {"sliding_window": 6},
    "gemma3_text": {"sliding_window": 6},
    "cohere2": {"sliding_window": 6},
    # one global and one local layer (the default pattern is 24 layers long)
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "window_size": 6},
    # multi-head latent attention as the real models have it: one key head per query head, the rotated
    # and unrotated query/key parts and the values of the shared head size
    "deepseek_v2": {"num_key_value_heads": 4, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                    "kv_lora_rank": 32, "q_lora_rank": 32},
    "deepseek_v3": {"num_key_value_heads": 4, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16, "v_head_dim": 16,
                    "kv_lora_rank": 32, "q_lora_rank": 32},
}


def family_config(model_type: str, **settings: Any) -> Any:
    """The tiny config of ``model_type`` (transformers' ``AutoConfig.for_model`` with the shared sizes,
    the family's settings and ``settings``); eager attention."""
    import inspect

    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    # only the sizes this family's config has (a config stores any keyword, and a family without
    # grouped-query attention would then carry a num_key_value_heads its model ignores)
    known = set(inspect.signature(config_class.__init__).parameters) | set(getattr(config_class, "attribute_map", {}))
    defaults = config_class()
    known |= {name for name in _SIZES if hasattr(defaults, name)}
    sizes = {name: value for name, value in _SIZES.items()
             if name in known and not isinstance(getattr(config_class, name, None), property)}
    kwargs = {**sizes, **FAMILY_SETTINGS.get(model_type, {}), **settings}
    config = AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    return config


def family_model(model_type: str, **settings: Any) -> Any:
    """The tiny random Hugging Face causal LM of ``model_type`` (float32, eval mode), weights from a
    fixed seed; the global random state is left as it was."""
    from transformers import AutoModelForCausalLM

    config = family_config(model_type, **settings)
    with torch.device("meta"):  # the size first: a config that ignores the shared sizes builds a full model
        skeleton = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        size = sum(p.numel() for p in skeleton.parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"model_type {model_type!r} ignores the tiny sizes ({size:,} parameters at its defaults)")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(torch.float32)
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.ndim == 1:  # norms and biases away from their neutral values
                    parameter.add_(0.1 * torch.randn_like(parameter))
    return model.eval()


def write_family_checkpoint(model_type: str, folder: str | Path, **settings: Any) -> Path:
    """Write the tiny checkpoint of ``model_type`` to ``folder`` (created) and return it: what
    ``load_model(folder)`` reads like any downloaded checkpoint."""
    folder = Path(folder)
    model = family_model(model_type, **settings)
    model.save_pretrained(folder)
    byte_tokenizer(prepend_bos=False).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.pop("_attn_implementation", None)
    (folder / "config.json").write_text(json.dumps(config, indent=1), encoding="utf-8")
    return folder
