"""Device and precision of a model's weights and forward passes.

``--device auto`` picks CUDA when torch sees a GPU, else the CPU; ``--dtype`` casts the
weights (and so every activation) after loading; ``n_devices > 1`` splits the layers over
that many GPUs (TransformerLens's own placement on the hooked backend, accelerate's as the weights
are read on the bridge). The analyses keep
their statistics in float64 whatever the model's dtype (``decompose`` upcasts the scores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lens_position.ground.errors import BadInputError
from lens_position.models.placement import DTYPES, place, torch_dtype  # noqa: F401 (written once, in the models layer)


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


def load_on(load: Callable[..., Any], compute: Any) -> Any:
    """Load with ``load(device=...)`` (``load_model``'s options) as ``compute`` asks (a ``Compute``): on
    one device in float32, verified against its source, then cast to the dtype; split over GPUs by
    ``load_model(n_devices=)`` itself (the hooked backend after loading on the host, the bridge as
    the weights are read, in the dtype asked)."""
    device = resolve_device(compute.device, n_devices=compute.n_devices)
    if compute.n_devices > 1:
        return load(device=device, dtype=compute.dtype, n_devices=compute.n_devices)
    loaded = load(device=device)
    if compute.dtype != "float32":
        place(loaded.model, device=device, dtype=compute.dtype)
    return loaded
