"""Device and precision of a model's weights and forward passes.

``--device auto`` picks CUDA when torch sees a GPU, else the CPU; ``--dtype`` casts the
weights (and so every activation) after loading; ``n_devices > 1`` splits the layers over
that many GPUs with TransformerLens's own placement (``cfg.n_devices``). The analyses keep
their statistics in float64 whatever the model's dtype (``decompose`` upcasts the scores).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from lens_position.ground.errors import BadInputError

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str, *, cuda_available: bool | None = None, cuda_count: int | None = None,
                   n_devices: int = 1) -> str:
    """``"cpu"`` or ``"cuda"`` for a requested device; BadInputError when CUDA is asked for and
    absent, or when fewer GPUs than ``n_devices`` are visible."""
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    count = (torch.cuda.device_count() if available else 0) if cuda_count is None else cuda_count
    if device == "auto":
        device = "cuda" if available else "cpu"
    if device == "cuda":
        if not available:
            raise BadInputError("--device cuda, but torch sees no CUDA GPU here (the CPU build of torch, or no "
                                "driver); use --device cpu or auto, or install a CUDA build of torch")
        if count < n_devices:
            raise BadInputError(f"--n-devices {n_devices}, but only {count} GPU(s) are visible")
    elif device != "cpu":
        raise BadInputError(f"unknown device {device!r}; use cpu, cuda or auto")
    return device


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype called ``name`` (BadInputError for another name)."""
    try:
        return DTYPES[name]
    except KeyError:
        raise BadInputError(f"unknown dtype {name!r}; use {', '.join(DTYPES)}") from None


def place(model: Any, *, device: str, dtype: str, n_devices: int = 1) -> Any:
    """Cast a HookedTransformer's weights to ``dtype`` and put it on ``device`` (split over
    ``n_devices`` GPUs layer by layer when more than one). Returns the model."""
    target = torch_dtype(dtype)
    torch.nn.Module.to(model, target)  # HookedTransformer.to prints a line per call
    model.cfg.dtype = target
    if n_devices > 1:
        model.cfg.n_devices = n_devices
        model.cfg.device = device
        model.move_model_modules_to_device()  # TransformerLens: blocks spread over cuda:0..n-1
    else:
        torch.nn.Module.to(model, device)
        model.cfg.device = device
    return model


def load_on(load: Callable[..., Any], compute: Any) -> Any:
    """Load with ``load(device=...)`` and place the model as ``compute`` asks (a ``Compute``)."""
    device = resolve_device(compute.device, n_devices=compute.n_devices)
    loaded = load(device="cpu" if compute.n_devices > 1 else device)
    if compute.dtype != "float32" or compute.n_devices > 1:
        place(loaded.model, device=device, dtype=compute.dtype, n_devices=compute.n_devices)
    return loaded
