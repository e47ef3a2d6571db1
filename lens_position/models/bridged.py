"""The bridge backend's load path: the Hugging Face model from the same sources as the hooked
path (the tiny models, GGUF files dequantised by transformers, checkpoint folders, hub snapshots),
booted into a ``TransformerBridge`` (:mod:`lens_position.models.backends.bridge`), described by a
``ModelSpec`` read off its Hugging Face config."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from lens_position.ground.errors import BadInputError
from lens_position.models import sources
from lens_position.models.cache import state_dict_sha256
from lens_position.models.placement import torch_dtype
from lens_position.models.rope import normalise_ntk_by_parts, ntk_aware_base
from lens_position.models.spec import Family, LoadedModel, attach_tokenizer, spec_from_hf_config, tokenizer_prepends_bos
from lens_position.models.tiny import tiny_hf_model

_FAMILIES: dict[str | None, Family] = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2",
                                       "gemma3_text": "gemma3", "gemma3": "gemma3"}


def apply_hf_position_options(hf_model: Any, *, ntk_alpha: float | None = None,
                              ntk_by_parts: dict[str, float] | bool | None = None, window: int | None = None,
                              n_ctx: int | None = None) -> dict[str, Any]:
    """Apply ``load_model``'s position options to a Hugging Face model in place, as the hooked
    backend applies them to its config (:func:`lens_position.models.rope.apply_position_options`):
    NTK-aware ``θ·α^(d/(d-2))`` on every base; NTK-by-parts as ``rope_type="llama3"``; ``window`` on
    the local layers of a model that has them; ``n_ctx``. The rotary tables are rebuilt from the
    edited config. Returns the spec fields they imply."""
    config = hf_model.config
    facts: dict[str, Any] = {}
    wants_parts = ntk_by_parts is not None and ntk_by_parts is not False
    if ntk_alpha is not None and wants_parts:
        raise BadInputError("choose one of ntk_alpha and ntk_by_parts, not both")
    trained_context = int(config.max_position_embeddings)
    params = getattr(config, "rope_parameters", None)
    scaled = sorted({entry.get("rope_type", "default") for entry in _rope_entries(params)} - {"default"})
    if scaled and (ntk_alpha is not None or wants_parts):
        raise BadInputError(f"this model's RoPE is already scaled (rope_type {', '.join(scaled)}); NTK options "
                            "would stack a second scaling on it: load it without ntk_alpha / ntk_by_parts")
    if "dynamic" in scaled and n_ctx is not None and int(n_ctx) > trained_context:
        raise BadInputError(
            f"n_ctx={n_ctx} beyond the trained context ({trained_context}) of a dynamic-NTK model: its rotary "
            "frequencies would then depend on the longest sequence run so far (and Hugging Face measures that "
            "length against max_position_embeddings, which n_ctx replaces), so lens_position analyses it "
            f"within its trained context only (T <= {trained_context}, where it is plain RoPE)")
    if n_ctx is not None:
        if int(n_ctx) < 1:
            raise BadInputError(f"n_ctx must be a positive number of positions, got {n_ctx}")
        config.max_position_embeddings = int(n_ctx)
    if (ntk_alpha is not None or wants_parts) and not params:
        raise BadInputError("NTK options need a RoPE model; this one has no rope_parameters")
    entries = _rope_entries(params)
    d_head = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    rotary_dim = int(d_head * float(getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    if ntk_alpha is not None:
        if not ntk_alpha > 0:
            raise BadInputError(f"ntk_alpha must be > 0 (1 is plain RoPE), got {ntk_alpha}")
        for entry in entries:
            entry["rope_theta"] = ntk_aware_base(float(entry["rope_theta"]), float(ntk_alpha), rotary_dim)
        if float(ntk_alpha) != 1.0:
            facts.update(rope_kind="ntk-aware")
        facts["ntk_alpha"] = float(ntk_alpha)
    if wants_parts:
        parts = normalise_ntk_by_parts(ntk_by_parts, trained_context)
        for entry in entries:
            entry.update(rope_type="llama3", factor=parts["factor"], low_freq_factor=parts["low_freq_factor"],
                         high_freq_factor=parts["high_freq_factor"],
                         original_max_position_embeddings=int(parts["original_context"]))
        facts.update(rope_kind="ntk-by-parts", ntk_by_parts=parts)
    if window is not None:
        if int(window) != window or window < 1:
            raise BadInputError(f"window must be a positive whole number of keys, got {window}")
        if not getattr(config, "sliding_window", None):
            raise BadInputError("window= on a model without sliding-window layers is applied by the hooked "
                                "backend only (it makes every layer local); use backend='hooked'")
        config.sliding_window = int(window)
    if ntk_alpha is not None or wants_parts:
        _rebuild_rotary(hf_model)
    return facts


def _rope_entries(params: Any) -> list[dict[str, Any]]:
    """The RoPE parameter dicts of a config's ``rope_parameters``: one, or one per layer type."""
    if not isinstance(params, dict) or not params:
        return []
    if any(isinstance(v, dict) for v in params.values()):
        return [v for v in params.values() if isinstance(v, dict)]
    return [params]


def _rebuild_rotary(hf_model: Any) -> None:
    """Replace every rotary embedding module by one built from the (edited) config."""
    for parent in list(hf_model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "config"):
                buffer = next(iter(child.buffers()), None)
                rebuilt = type(child)(config=child.config)
                setattr(parent, child_name, rebuilt.to(buffer.device) if buffer is not None else rebuilt)


def load_bridged(name: str, source: str, kind: str, target: Any, options: dict[str, Any], *, device: str,
                 dtype: str, started: float) -> LoadedModel:
    """A LoadedModel on the bridge backend, with the position options applied to the Hugging Face
    model (:func:`apply_hf_position_options`)."""
    from lens_position.models.backends.bridge import boot_bridge

    if kind == "tiny":
        hf_model, tokenizer = tiny_hf_model(target)
    elif kind == "gguf":
        hf_model, tokenizer = sources.read_gguf(target, check=None)
    else:
        hf_model, tokenizer = sources.read_hf_folder(target, check=None)
    facts = apply_hf_position_options(hf_model, **{k: v for k, v in options.items() if v is not None})
    weights_sha256 = state_dict_sha256(hf_model.state_dict())
    prepends_bos = tokenizer_prepends_bos(tokenizer)
    model_type = getattr(hf_model.config, "model_type", None)
    spec = spec_from_hf_config(
        hf_model.config, name=name, family=_FAMILIES.get(model_type, "custom"), source=source,
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id, weights_sha256=weights_sha256,
        **facts,
        extra={"file": str(target) if kind != "tiny" else None, "from_cache": False, "ungrouped_kv_hooks": True,
               "backend": "bridge"})
    bridge = boot_bridge(hf_model, tokenizer, name=name, device=device, dtype=torch_dtype(dtype),
                         prepends_bos=prepends_bos)
    bridge.cfg.model_name = name
    attach_tokenizer(bridge, tokenizer, prepends_bos)
    extra = {**spec.extra, "load_seconds": round(time.perf_counter() - started, 3)}
    return LoadedModel(model=bridge, tokenizer=tokenizer, spec=dataclasses.replace(spec, extra=extra))
