"""Zoo checkpoints as Hugging Face models, for the bridge backend (TransformerLens 3.9 and 4.x).

A zoo checkpoint stores ``HookedTransformer`` parameters (:mod:`lens_position.models.zoo.store`).
Here they are read straight from the safetensors file (no HookedTransformer is built, so this
runs where TransformerLens 4.x removed it) and written into a Hugging Face model built in code
from a config, which :func:`~lens_position.models.backends.bridge.boot_bridge` then wraps:

- ``rope``, ``rope-nobos``, ``ntk``, ``ntk-control`` (RoPE, every layer global):
  ``LlamaForCausalLM``, rotary over the whole head with rotate-half (GPT-NeoX) pairing, the
  recipe's final rotary base;
- ``window``, ``window-mix`` (RoPE with window-32 local layers): ``SmolLM3ForCausalLM`` with
  ``layer_types`` (``sliding_attention`` for a local layer) and ``sliding_window`` = the window.
  transformers' sliding mask shows key ``j`` to query ``i`` iff ``i - window < j <= i``,
  TransformerLens's local mask exactly;
- ``nope`` (no position input): ``SmolLM3ForCausalLM`` with every layer NoPE
  (``no_rope_layers`` all 0; the zoo's ``W_pos`` is exactly zero, which is checked);
- ``learned`` (a trained ``W_pos`` added at layer 0): no Hugging Face RMSNorm/gated-MLP family
  has learned absolute positions, so it is refused (:func:`check_convertible`).

Both families share the zoo's block (pre-RMSNorm with eps :data:`RMS_NORM_EPS`, gated SiLU MLP,
untied embeddings, scores scaled by ``1/sqrt(d_head)``, a final RMSNorm) and take every bias the
zoo trains (``attention_bias``, ``mlp_bias``). Two biases have no exact slot and are placed where
they give the same function:

- TransformerLens adds the MLP's ``b_in`` *after* the gate product (``(silu(x W_gate) * x W_in +
  b_in) W_out + b_out``), so its effect is the constant ``b_in W_out``, folded into ``down_proj``'s
  bias (the MLP output is unchanged; ``mlp.hook_post`` differs from the hooked model's by ``b_in``);
- the unembedding bias ``b_U``: ``lm_head`` is replaced by a linear layer with a bias (HF's has
  none). The model is therefore built here, not saved and re-read with ``from_pretrained``.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch
from jaxtyping import Float

from lens_position.ground.errors import CorruptFileError, UnsupportedArchitectureError
from lens_position.models.spec import LoadedModel, attach_tokenizer, spec_from_hf_config, tokenizer_prepends_bos
from lens_position.models.tiny import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE, byte_tokenizer
from lens_position.models.zoo.architecture import RMS_NORM_EPS
from lens_position.models.zoo.recipe import Recipe

#: The Hugging Face model class each kind of zoo variant becomes.
LLAMA, SMOLLM3 = "LlamaForCausalLM", "SmolLM3ForCausalLM"


def hf_class_name(recipe: Recipe) -> str:
    """The Hugging Face model class of ``recipe`` (after :func:`check_convertible`)."""
    check_convertible(recipe)
    return LLAMA if recipe.position == "rope" and "local" not in recipe.attn_types else SMOLLM3


def check_convertible(recipe: Recipe) -> None:
    """Refuse (UnsupportedArchitectureError) a recipe no Hugging Face family computes exactly:
    learned absolute positions on an RMSNorm/gated-MLP decoder."""
    if recipe.position == "learned":
        raise UnsupportedArchitectureError(
            f"zoo:{recipe.variant} adds learned absolute position embeddings (W_pos) at layer 0, which no "
            "Hugging Face RMSNorm/gated-MLP family has, so it cannot run on the bridge backend "
            "(TransformerBridge). Load it with backend='auto' (the default) on either TransformerLens line: a "
            "HookedTransformer on 3.x, a MiniTransformer computing the same on 4.x; every other zoo variant "
            "loads on the bridge")
    if recipe.position not in ("rope", "none"):
        raise UnsupportedArchitectureError(f"zoo position {recipe.position!r} has no Hugging Face conversion")


def hf_config(recipe: Recipe) -> Any:
    """The Hugging Face config of ``recipe``'s model (eager attention, fp32)."""
    import transformers

    common = dict(
        vocab_size=VOCAB_SIZE, hidden_size=recipe.d_model, intermediate_size=recipe.d_mlp,
        num_hidden_layers=recipe.n_layers, num_attention_heads=recipe.n_heads,
        num_key_value_heads=recipe.n_heads, head_dim=recipe.d_head, hidden_act="silu",
        max_position_embeddings=recipe.context, rms_norm_eps=RMS_NORM_EPS, tie_word_embeddings=False,
        attention_bias=True, mlp_bias=True, attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": float(recipe.final_rotary_base)},
        pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID,
    )
    if hf_class_name(recipe) == LLAMA:
        config = transformers.LlamaConfig(**common)
    else:
        local = [kind == "local" for kind in recipe.attn_types]
        config = transformers.SmolLM3Config(
            **common, no_rope_layers=[int(recipe.position == "rope")] * recipe.n_layers,
            use_sliding_window=any(local), sliding_window=recipe.window if any(local) else None,
            layer_types=["sliding_attention" if is_local else "full_attention" for is_local in local])
    config._name_or_path = f"zoo:{recipe.variant}"
    config._attn_implementation = "eager"
    config.architectures = [hf_class_name(recipe)]
    return config


def _linear_weight(projection: Float[torch.Tensor, "head d_model d_head"]) -> Float[torch.Tensor, "out d_model"]:
    """A TransformerLens Q/K/V matrix as ``nn.Linear`` weight rows ``head * d_head + i``."""
    n_heads, d_model, d_head = projection.shape
    return projection.permute(0, 2, 1).reshape(n_heads * d_head, d_model)


def hf_state_dict(recipe: Recipe, parameters: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The zoo's ``HookedTransformer`` parameters as the Hugging Face model's state dict (every
    stored parameter used exactly once; CorruptFileError for a missing, extra or misshapen one)."""
    check_convertible(recipe)
    left = dict(parameters)

    def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in left:
            raise CorruptFileError(f"zoo:{recipe.variant}: the checkpoint has no {name}")
        tensor = left.pop(name).to(torch.float32)
        if tuple(tensor.shape) != shape:
            raise CorruptFileError(f"zoo:{recipe.variant}: {name} has shape {tuple(tensor.shape)}, the recipe "
                                   f"says {shape}")
        return tensor

    n, d, h, m, v = recipe.n_heads, recipe.d_model, recipe.d_head, recipe.d_mlp, VOCAB_SIZE
    out = {"model.embed_tokens.weight": take("embed.W_E", (v, d))}
    if recipe.position == "none":
        position = take("pos_embed.W_pos", (recipe.context, d))
        if torch.count_nonzero(position):
            raise CorruptFileError(f"zoo:{recipe.variant} is NoPE but its W_pos is not zero: the checkpoint is "
                                   "not the recipe's model")
    for layer in range(recipe.n_layers):
        block, hf = f"blocks.{layer}", f"model.layers.{layer}"
        out[f"{hf}.input_layernorm.weight"] = take(f"{block}.ln1.w", (d,))
        out[f"{hf}.post_attention_layernorm.weight"] = take(f"{block}.ln2.w", (d,))
        for kind in "QKV":
            weight = take(f"{block}.attn.W_{kind}", (n, d, h))
            out[f"{hf}.self_attn.{kind.lower()}_proj.weight"] = _linear_weight(weight)
            out[f"{hf}.self_attn.{kind.lower()}_proj.bias"] = take(f"{block}.attn.b_{kind}", (n, h)).reshape(n * h)
        out[f"{hf}.self_attn.o_proj.weight"] = take(f"{block}.attn.W_O", (n, h, d)).reshape(n * h, d).T
        out[f"{hf}.self_attn.o_proj.bias"] = take(f"{block}.attn.b_O", (d,))
        out[f"{hf}.mlp.gate_proj.weight"] = take(f"{block}.mlp.W_gate", (d, m)).T
        out[f"{hf}.mlp.gate_proj.bias"] = torch.zeros(m)
        out[f"{hf}.mlp.up_proj.weight"] = take(f"{block}.mlp.W_in", (d, m)).T
        out[f"{hf}.mlp.up_proj.bias"] = torch.zeros(m)
        w_out = take(f"{block}.mlp.W_out", (m, d))
        b_in, b_out = take(f"{block}.mlp.b_in", (m,)), take(f"{block}.mlp.b_out", (d,))
        out[f"{hf}.mlp.down_proj.weight"] = w_out.T
        # b_in is added after the gate product: its whole effect is b_in @ W_out on the output
        out[f"{hf}.mlp.down_proj.bias"] = (b_out.double() + b_in.double() @ w_out.double()).float()
    out["model.norm.weight"] = take("ln_final.w", (d,))
    out["lm_head.weight"] = take("unembed.W_U", (d, v)).T
    out["lm_head.bias"] = take("unembed.b_U", (v,))
    if left:
        raise CorruptFileError(
            f"zoo:{recipe.variant}: the checkpoint has parameters the recipe's model does not: {sorted(left)}"
        )
    return {name: tensor.contiguous() for name, tensor in out.items()}


def hf_model(recipe: Recipe, parameters: dict[str, torch.Tensor]) -> Any:
    """The Hugging Face model (fp32, eval mode, CPU) computing what the zoo's ``HookedTransformer``
    computes with ``parameters``."""
    import transformers

    state_dict = hf_state_dict(recipe, parameters)
    config = hf_config(recipe)
    with torch.random.fork_rng(devices=[]):  # HF initialises weights we overwrite: keep the global RNG
        model = getattr(transformers, hf_class_name(recipe))(config)
    model.lm_head = torch.nn.Linear(recipe.d_model, VOCAB_SIZE, bias=True)  # the zoo's b_U
    model.load_state_dict(state_dict, strict=True)
    model.to(torch.float32)
    model.eval()
    return model


def load_zoo_bridge(checkpoint: Any, recipe: Recipe, *, source: str, device: str = "cpu") -> LoadedModel:
    """A verified zoo checkpoint as a ``LoadedModel`` on the bridge backend: its parameters read
    from the safetensors file, converted (:func:`hf_model`), booted into a ``TransformerBridge``;
    the spec says what the hooked spec says (layer types, window, RoPE kind and base, BOS policy)
    and keeps the zoo's provenance (variant, seed, recipe and weights hashes)."""
    from safetensors.torch import load_file

    from lens_position.models.backends.bridge import boot_bridge

    started = time.perf_counter()
    check_convertible(recipe)
    model = hf_model(recipe, load_file(str(checkpoint.weights)))
    tokenizer = byte_tokenizer(prepend_bos=recipe.bos)
    prepends_bos = tokenizer_prepends_bos(tokenizer)
    ntk = recipe.position == "rope" and recipe.ntk_alpha != 1.0
    position: dict[str, Any] = {"rope_kind": "ntk-aware", "ntk_alpha": recipe.ntk_alpha} if ntk else {}
    if recipe.position == "none":  # every layer NoPE: the config's rope_theta is never used
        position = {"rope_kind": "none", "rotary_base": None}
    name = checkpoint.name
    spec = spec_from_hf_config(
        model.config, name=name, family="custom", source=source, **position,
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id,
        weights_sha256=checkpoint.meta["weights_sha256"],
        extra={"zoo_variant": recipe.variant, "zoo_seed": recipe.seed, "position": recipe.position,
               "recipe_sha256": checkpoint.meta["recipe_sha256"], "extend_at": recipe.extend_at,
               "pretrain_rotary_base": recipe.rotary_base,
               "held_out_bits_per_byte": checkpoint.meta["held_out_bits_per_byte"],
               "hf_class": hf_class_name(recipe), "ungrouped_kv_hooks": True, "backend": "bridge"})
    bridge = boot_bridge(model, tokenizer, name=name, device=device, prepends_bos=prepends_bos)
    bridge.cfg.model_name = name
    attach_tokenizer(bridge, tokenizer, prepends_bos)
    extra = {**spec.extra, "load_seconds": round(time.perf_counter() - started, 3)}
    return LoadedModel(model=bridge, tokenizer=tokenizer, spec=dataclasses.replace(spec, extra=extra))

