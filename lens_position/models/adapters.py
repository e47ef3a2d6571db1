"""One adapter per family, chosen by the HF config's ``model_type``.

An adapter is a module with ``FAMILY``, ``MODEL_TYPES``, ``hooked_config(hf_config) ->
dict`` (HookedTransformerConfig kwargs) and ``convert_weights(hf_model, cfg) -> state dict``.
``hooked_from_hf`` is the one place that turns an HF model into a ``HookedTransformer``.
"""

from __future__ import annotations

from types import MethodType, ModuleType
from typing import Any

import torch

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models import gemma3, llama, mistral, qwen2
from lens_position.models.backends.hooked import new_hooked_transformer
from lens_position.models.cache import inverse_order

ADAPTERS: dict[str, ModuleType] = {
    model_type: module for module in (llama, mistral, qwen2, gemma3) for model_type in module.MODEL_TYPES
}
# The family of each HF architecture class (TransformerLens's ``original_architecture``).
FAMILY_OF_ARCHITECTURE: dict[str, str] = {module.ARCHITECTURE: module.FAMILY for module in ADAPTERS.values()}


def adapter_for(hf_config: Any) -> ModuleType:
    """The adapter module for an HF config, or UnsupportedArchitectureError."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type == "gemma3" and hasattr(hf_config, "text_config"):
        raise UnsupportedArchitectureError(
            "multimodal Gemma-3 (Gemma3ForConditionalGeneration) is not supported; use a text-only "
            "Gemma-3 checkpoint (270M or 1B) or open an issue")
    if model_type not in ADAPTERS:
        raise UnsupportedArchitectureError(
            f"architecture {model_type!r} ({', '.join(getattr(hf_config, 'architectures', None) or [])}) "
            f"is not supported by the hooked backend; lens_position has adapters for model_type {sorted(ADAPTERS)} "
            "(Llama/SmolLM2, Mistral, Qwen2, Gemma-3 text). Routes that work: load_model(..., backend='bridge') "
            "(TransformerBridge: Qwen3, SmolLM3, OLMo-2, Phi-3 and the other decoders it supports), or build "
            "the model yourself as a HookedTransformer or TransformerBridge and pass it to the analyses")
    return ADAPTERS[model_type]


def hooked_config(hf_config: Any) -> dict[str, Any]:
    """HookedTransformerConfig kwargs for any supported HF config (a ``quantization_config``
    left by GGUF loading is ignored: transformers has already dequantized the weights)."""
    return adapter_for(hf_config).hooked_config(hf_config)


def build_hooked(cfg_kwargs: dict[str, Any], state_dict: dict[str, torch.Tensor],
                 device: str = "cpu") -> Any:
    """A HookedTransformer with ``state_dict`` loaded unprocessed (no LayerNorm folding, no
    centering), so every activation equals the HF model's."""
    model = new_hooked_transformer({**cfg_kwargs, "device": device}, what="a model on the hooked backend",
                                   move_to_device=False)
    # What load_and_process_state_dict does with every processing flag off, in one
    # load_state_dict call instead of one per tensor (which walks the module tree each time).
    state_dict = model.fill_missing_keys(dict(state_dict))
    # assign: the model takes the tensors as they are (no second 0.5-2 GB copy on load).
    result = model.load_state_dict(state_dict, strict=False, assign=True)
    buffers = {name for name, _ in model.named_buffers()}
    missing = [key for key in result.missing_keys if key not in buffers]
    if missing or result.unexpected_keys:
        raise RuntimeError(f"state dict does not fit the config: missing {missing[:5]}, "
                           f"unexpected {result.unexpected_keys[:5]}")
    torch.nn.Module.to(model, device)  # HookedTransformer.to prints a line per call
    lay_out_for_linear(model)
    rotate_without_copies(model)
    group_keys_values_without_copies(model)
    model.eval()
    return model


# How TransformerLens turns each weight into the matrix it hands F.linear on every forward pass (a
# permutation of the weight's axes, then a contiguous copy), as the order of the axes that makes that
# permutation contiguous already: (parameter, permutation applied, its inverse).
_LINEAR_LAYOUTS = (
    ("mlp.W_gate", (1, 0), (1, 0)),  # GatedMLP: F.linear(x, W_gate.T.contiguous())
    ("mlp.W_in", (1, 0), (1, 0)),
    ("mlp.W_out", (1, 0), (1, 0)),
    ("attn.W_Q", (0, 2, 1), (0, 2, 1)),  # simple_attn_linear: "head d_model d_head -> (head d_head) d_model"
    ("attn.W_K", (0, 2, 1), (0, 2, 1)),
    ("attn.W_V", (0, 2, 1), (0, 2, 1)),
    ("attn._W_K", (0, 2, 1), (0, 2, 1)),  # grouped-query attention's own key/value heads
    ("attn._W_V", (0, 2, 1), (0, 2, 1)),
    ("attn.W_O", (2, 0, 1), (1, 2, 0)),  # "head d_head d_model -> d_model (head d_head)", then .contiguous()
)


def lay_out_for_linear(model: Any) -> None:
    """Store the weights TransformerLens copies into another layout on every forward pass (the gated
    MLP's three matrices, ``W_Q``, ``W_O`` and the unembedding) in that layout already, so each copy is a no-op view.
    The values, shapes and the matrices F.linear receives are the same (so is every activation, bit
    for bit); only the strides change. On SmolLM2-135M these copies took about a tenth of the CPU
    time of a short forward pass. A weight another module type uses differently is left alone."""
    from transformer_lens.components import GatedMLP

    with torch.no_grad():
        for block in model.blocks:
            for name, permutation, inverse in _LINEAR_LAYOUTS:
                module_name, leaf = name.split(".")
                module = getattr(block, module_name, None)
                param = getattr(module, leaf, None)
                if not isinstance(param, torch.nn.Parameter) or param.ndim != len(permutation) or \
                        (module_name == "mlp" and not isinstance(module, GatedMLP)):
                    continue
                param.data = param.data.permute(*permutation).contiguous().permute(*inverse)
        # Unembed: F.linear(residual, W_U.T.contiguous(), b_U) on TransformerLens 3.9, a copy of the
        # whole unembedding (671 MB for Gemma-3's vocabulary) on every forward pass
        unembed = getattr(getattr(model, "unembed", None), "W_U", None)
        if isinstance(unembed, torch.nn.Parameter) and unembed.ndim == 2:
            unembed.data = unembed.data.T.contiguous().T


def rotate_without_copies(model: Any) -> None:
    """Give every rotary attention layer an ``apply_rotary`` (:func:`_apply_rotary`) that makes the
    same float32 operations as TransformerLens's, in the same order, without its extra copies: the
    same bits, in about half the time."""
    for block in model.blocks:
        attn = getattr(block, "attn", None)
        if attn is not None and attn.cfg.positional_embedding_type == "rotary":
            attn.apply_rotary = MethodType(_apply_rotary, attn)


def group_keys_values_without_copies(model: Any) -> None:
    """Give every grouped-query attention layer a ``calculate_qkv_matrices``
    (:func:`_calculate_qkv_matrices`) that, with ``cfg.ungroup_grouped_query_attention`` set, computes
    the keys and values of the model's own key/value heads and repeats them once per query head,
    where TransformerLens repeats the weights (``W_K``, ``W_V``: a new ``[heads, d_model, d_head]``
    tensor each, then a transposed copy of each) on every forward pass: 64 MiB of copies per layer
    and pass on a Llama-3.2-1B shape, 1 GiB on a 70B one, whatever the length of the pass. The
    same values reach ``hook_k`` and ``hook_v`` (one entry per query head) and the attention."""
    from transformer_lens.components import GroupedQueryAttention

    for block in model.blocks:
        attn = getattr(block, "attn", None)
        if isinstance(attn, GroupedQueryAttention):
            attn.calculate_qkv_matrices = MethodType(_calculate_qkv_matrices, attn)


def _calculate_qkv_matrices(self: Any, query_input: torch.Tensor, key_input: torch.Tensor,
                            value_input: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TransformerLens's ``GroupedQueryAttention.calculate_qkv_matrices`` with ungrouped hooks, with
    each key (value) computed once per key/value head and repeated along the heads
    (``repeat_interleave``, as ``W_K`` repeats its heads) instead of computed from repeated weights.
    Inputs split per head, or the flag unset, go to TransformerLens's own method."""
    cfg = self.cfg
    if not cfg.ungroup_grouped_query_attention or cfg.use_split_qkv_input or cfg.use_attn_in:
        return type(self).calculate_qkv_matrices(self, query_input, key_input, value_input)
    from transformer_lens.utilities.attention import simple_attn_linear

    repeats = self.repeat_kv_heads
    q = self.hook_q(simple_attn_linear(query_input, self.W_Q, self.b_Q))
    k = self.hook_k(simple_attn_linear(key_input, self._W_K, self._b_K).repeat_interleave(repeats, dim=2))
    v = self.hook_v(simple_attn_linear(value_input, self._W_V, self._b_V).repeat_interleave(repeats, dim=2))
    if cfg.use_qk_norm:
        q = self._apply_qk_norm(q, self.q_norm)
        k = self._apply_qk_norm(k, self.k_norm)
    return q, k, v


def _apply_rotary(self: Any, x: torch.Tensor, past_kv_pos_offset: int = 0,
                  attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """TransformerLens's ``AbstractAttention.apply_rotary`` (``x·cos + rotate(x)·sin`` on the first
    ``rotary_dim`` dimensions, rotate = the second half negated, then the first), computed as one
    concatenation and two products added in place, where TransformerLens clones ``x``, writes the
    rotation over the clone in two slices and concatenates the result with the unrotated dimensions
    even when there are none. Each element gets the same products and sum, so the output is the
    same bit for bit (tested); on Gemma-3-270M's queries at T = 640 it takes 58 ms instead of 119 ms
    per layer and batch of 16. A padding mask, dynamic NTK scaling, adjacent pairs (GPT-J) or
    positions beyond the sine and cosine tables go to TransformerLens's own method."""
    x_pos = x.size(1)
    cfg = self.cfg
    if (attention_mask is not None or cfg.use_dynamic_ntk_rope or cfg.rotary_adjacent_pairs
            or x.device != self.rotary_sin.device or past_kv_pos_offset + x_pos > self.rotary_cos.shape[0]):
        return type(self).apply_rotary(self, x, past_kv_pos_offset, attention_mask)
    x_rot = x[..., :cfg.rotary_dim]
    half = cfg.rotary_dim // 2
    cos = self.rotary_cos[None, past_kv_pos_offset:past_kv_pos_offset + x_pos, None, :]
    sin = self.rotary_sin[None, past_kv_pos_offset:past_kv_pos_offset + x_pos, None, :]
    rotated = (x_rot * cos).add_(torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1).mul_(sin))
    if cfg.rotary_dim == x.size(-1):
        return rotated.contiguous()
    return torch.cat([rotated, x[..., cfg.rotary_dim:]], dim=-1)


def convert_state_dict(hf_model: Any, cfg_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """HookedTransformer-format state dict of an HF model: fp32, detached, each weight in the layout
    the hooked model computes with (:func:`in_linear_layout`), without a second copy of the weights
    (the HF model is read once and dropped; the tensors it leaves are the hooked model's)."""
    from transformer_lens import HookedTransformerConfig

    adapter = adapter_for(hf_model.config)
    cfg = HookedTransformerConfig(**cfg_kwargs)
    with torch.no_grad():
        state_dict = adapter.convert_weights(hf_model, cfg)
    return in_linear_layout(state_dict, gated_mlp=bool(cfg_kwargs.get("gated_mlp")))


def linear_layout(name: str, ndim: int, gated_mlp: bool) -> tuple[int, ...]:
    """The order of axes :func:`lay_out_for_linear` stores the state-dict entry ``name`` in (the
    weight with its axes permuted so is contiguous); the identity for every weight it leaves alone."""
    if name == "unembed.W_U" and ndim == 2:
        return (1, 0)
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blocks" and (gated_mlp or parts[2] != "mlp"):
        for suffix, permutation, _ in _LINEAR_LAYOUTS:
            if f"{parts[2]}.{parts[3]}" == suffix and ndim == len(permutation):
                return permutation
    return tuple(range(ndim))


def in_linear_layout(state_dict: dict[str, torch.Tensor], *, gated_mlp: bool) -> dict[str, torch.Tensor]:
    """Each tensor of ``state_dict`` fp32 and detached, in the layout :func:`linear_layout` names, and
    owning its memory: one that already is so laid out and is the whole of a storage no earlier entry
    took is kept as it is (no copy: a converter's transposed views of the HF weights); any other is
    copied (a slice of a fused matrix, a second use of tied embeddings, another layout). So no two
    entries share memory (an edit of one weight never changes another, as in a model loaded whole)."""
    taken: set[int] = set()
    laid_out = {}
    for name, tensor in state_dict.items():
        tensor = tensor.detach().to(torch.float32)
        order = linear_layout(name, tensor.ndim, gated_mlp)
        permuted = tensor.permute(order)
        storage = permuted.untyped_storage()
        whole = (permuted.is_contiguous() and permuted.storage_offset() == 0
                 and storage.nbytes() == permuted.numel() * permuted.element_size())
        if not whole or storage.data_ptr() in taken or not permuted.numel():
            permuted = permuted.clone(memory_format=torch.contiguous_format)
        taken.add(permuted.untyped_storage().data_ptr())
        laid_out[name] = permuted.permute(inverse_order(order))
    return laid_out

