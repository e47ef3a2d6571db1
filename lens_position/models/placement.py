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


def check_n_devices(n_devices: Any, device: str) -> int:
    """``n_devices`` as an int when this machine can split a model over that many devices: 1
    anywhere; more only over CUDA GPUs it has (``device`` a CUDA device, at least ``n_devices`` GPUs
    seen by torch). BadInputError naming ``n_devices`` otherwise, before any weights are read: a
    split that cannot happen is refused, never ignored."""
    if isinstance(n_devices, bool) or not isinstance(n_devices, int) or n_devices < 1:
        raise BadInputError(f"n_devices must be a whole number of at least 1, got {n_devices!r}")
    if n_devices == 1:
        return 1
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if torch.device(device).type != "cuda" or count < n_devices:
        raise BadInputError(
            f"n_devices={n_devices} splits a model over {n_devices} CUDA GPUs, but the device is {device!r} and "
            f"torch sees {count} GPU(s) here; use n_devices=1" + (f" or at most {count}" if count > 1 else "")
            + (", with device='cuda'" if count > 1 and torch.device(device).type != "cuda" else ""))
    return n_devices


def check_device(device: Any) -> str:
    """A device torch can place a model on here (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``),
    returned as given; BadInputError for a name torch does not know, or for a GPU this machine
    does not have, before any weights are read."""
    if not isinstance(device, (str, torch.device)):
        raise BadInputError(f"device must be a string such as 'cpu' or 'cuda', got {type(device).__name__} {device!r}")
    try:
        parsed = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise BadInputError(f"unknown device {str(device)!r}; use cpu, cuda (or cuda:<index>) or mps") from None
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise BadInputError(f"device {str(device)!r}, but torch sees no CUDA GPU here (the CPU build of torch, "
                                "or no GPU); use device='cpu'")
        if parsed.index is not None and parsed.index >= count:
            raise BadInputError(f"device {str(device)!r}, but torch sees {count} CUDA GPU(s) "
                                f"(cuda:0..cuda:{count - 1})")
    elif parsed.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise BadInputError(f"device {str(device)!r}, but torch has no MPS backend here; use device='cpu'")
    elif parsed.type not in ("cpu", "cuda", "mps"):
        raise BadInputError(f"device {str(device)!r} is not one lens_position runs on; use cpu, cuda or mps")
    return str(device)
