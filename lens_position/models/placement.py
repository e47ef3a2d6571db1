"""Precision and placement of a loaded model's weights (``load_model(dtype=, n_devices=)``)."""

from __future__ import annotations

from typing import Any

import torch

from lens_position.ground.errors import BadInputError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (BadInputError for another name)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise BadInputError(f"unknown dtype {name!r}; use {', '.join(DTYPES)}") from None


def place(model: Any, *, device: str, dtype: str, n_devices: int = 1) -> Any:
    """Cast a TransformerLens model's weights to ``dtype`` and put it on ``device``, split over
    ``n_devices`` GPUs layer by layer when more than one (HookedTransformer only: a bridge is placed
    by the Hugging Face model it wraps). Returns the model."""
    target = torch_dtype(dtype)
    if n_devices < 1:
        raise BadInputError(f"n_devices must be at least 1, got {n_devices}")
    torch.nn.Module.to(model, target)  # HookedTransformer.to prints a line per call
    model.cfg.dtype = target
    if n_devices > 1:
        if not hasattr(model, "move_model_modules_to_device"):
            raise BadInputError("n_devices > 1 is supported on the hooked backend only")
        model.cfg.n_devices = n_devices
        model.cfg.device = device
        model.move_model_modules_to_device()  # TransformerLens: blocks spread over cuda:0..n-1
    else:
        torch.nn.Module.to(model, device)
        model.cfg.device = device
    return model
