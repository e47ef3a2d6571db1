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
from lens_position.models.spec import LoadedModel, attach_tokenizer, spec_from_hf_config, tokenizer_prepends_bos
from lens_position.models.tiny import tiny_hf_model

_FAMILIES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3"}


def load_bridged(name: str, source: str, kind: str, target: Any, options: dict[str, Any], *, device: str,
                 dtype: str, started: float) -> LoadedModel:
    """A LoadedModel on the bridge backend. Position options: ``n_ctx`` (the context the spec and
    the length check use); RoPE scaling and windows are applied by the hooked backend only (refused
    here, rather than silently ignored)."""
    from lens_position.models.backends.bridge import boot_bridge

    unsupported = sorted(k for k in options if k != "n_ctx" and options[k] is not None)
    if unsupported:
        raise BadInputError(
            f"{name}: the position options {', '.join(unsupported)} are applied by the hooked backend only "
            "(TransformerLens 3.x); load with backend='hooked', or without them on the bridge")
    if kind == "tiny":
        hf_model, tokenizer = tiny_hf_model(target)
    elif kind == "gguf":
        hf_model, tokenizer = sources.read_gguf(target, check=None)
    else:
        hf_model, tokenizer = sources.read_hf_folder(target, check=None)
    if options.get("n_ctx"):
        hf_model.config.max_position_embeddings = int(options["n_ctx"])
    weights_sha256 = state_dict_sha256(hf_model.state_dict())
    prepends_bos = tokenizer_prepends_bos(tokenizer)
    model_type = getattr(hf_model.config, "model_type", None)
    spec = spec_from_hf_config(
        hf_model.config, name=name, family=_FAMILIES.get(model_type, "custom"), source=source,
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id, weights_sha256=weights_sha256,
        extra={"file": str(target) if kind != "tiny" else None, "from_cache": False, "ungrouped_kv_hooks": True,
               "backend": "bridge"})
    bridge = boot_bridge(hf_model, tokenizer, name=name, device=device, dtype=torch_dtype(dtype),
                         prepends_bos=prepends_bos)
    bridge.cfg.model_name = name
    attach_tokenizer(bridge, tokenizer, prepends_bos)
    extra = {**spec.extra, "load_seconds": round(time.perf_counter() - started, 3)}
    return LoadedModel(model=bridge, tokenizer=tokenizer, spec=dataclasses.replace(spec, extra=extra))
