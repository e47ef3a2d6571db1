"""Precision and placement of a loaded model's weights (``load_model(dtype=, n_devices=)``)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
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


_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


@dataclass(frozen=True)
class Placement:
    """Where a Hugging Face model's weights go while they are read (the bridge backend): accelerate's
    ``device_map`` (a strategy such as ``"balanced"``, or module names to ``"cpu"``, ``"disk"``,
    ``"cuda:<i>"`` or a GPU index), its per-device ``max_memory`` budget, the ``offload_folder`` of
    weights placed on ``"disk"`` and the ``dtype`` they are read in. No device holds more than its
    share at any time: a model split over two GPUs never lies whole on the host first."""

    device_map: str | dict[str, str | int]
    max_memory: dict[str | int, str | int] | None = None
    offload_folder: str | None = None
    dtype: str = "float32"

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``from_pretrained`` that place the weights (read in ``dtype``)."""
        kwargs: dict[str, Any] = {"device_map": self.device_map, "dtype": torch_dtype(self.dtype)}
        if self.max_memory is not None:
            kwargs["max_memory"] = self.max_memory
        if self.offload_folder is not None:
            kwargs["offload_folder"] = self.offload_folder
        return kwargs


def _check_target(module: Any, target: Any) -> None:
    if isinstance(target, bool) or not isinstance(target, (int, str)):
        raise BadInputError(f"device_map[{module!r}] = {target!r}: a target is 'cpu', 'disk', 'cuda:<i>' or a GPU "
                            "index")
    if target in ("cpu", "disk"):
        return
    if target == "meta":
        raise BadInputError(f"device_map[{module!r}] = 'meta': weights on 'meta' have no values to compute with; "
                            "place them on 'cpu', 'disk' or a GPU")
    try:
        check_device(f"cuda:{target}" if isinstance(target, int) else target)
    except BadInputError as refusal:
        raise BadInputError(f"device_map[{module!r}] = {target!r}: {refusal}") from None


def check_placement(*, device_map: Any = None, max_memory: Any = None, offload_folder: Any = None,
                    n_devices: int = 1, backend: str = "auto", dtype: str = "float32") -> Placement | None:
    """The :class:`Placement` that ``load_model``'s ``device_map``, ``max_memory``, ``offload_folder``
    and ``n_devices`` ask of the bridge (None: the model is read whole, then placed on ``device``).
    ``n_devices > 1`` on the bridge is ``device_map="balanced"`` over GPUs 0 .. n-1 (the memory each
    has free). BadInputError, before any weights are read, for a map or budget that cannot be
    honoured here: an unknown strategy or target, a GPU this machine lacks, ``max_memory`` or an
    offload folder without a map."""
    if device_map is None:
        if max_memory is not None or offload_folder is not None:
            raise BadInputError("max_memory and offload_folder shape a device_map; pass device_map too (e.g. "
                                "device_map='auto' with max_memory={0: '20GiB', 'cpu': '60GiB'})")
        if n_devices > 1 and backend == "bridge":
            budget: dict[str | int, str | int] = {i: int(torch.cuda.mem_get_info(i)[0]) for i in range(n_devices)}
            return Placement("balanced", budget, dtype=dtype)
        return None
    if n_devices > 1:
        raise BadInputError("choose one of n_devices and device_map, not both (device_map='balanced' with a "
                            "max_memory per GPU is what n_devices does)")
    if backend == "hooked":
        raise BadInputError("device_map places a Hugging Face model's weights as they are read, which the bridge "
                            "backend does; use backend='bridge' (or 'auto'), or n_devices with the hooked backend")
    if isinstance(device_map, str):
        if device_map not in _MAP_STRATEGIES:
            raise BadInputError(f"device_map={device_map!r}: use one of {', '.join(_MAP_STRATEGIES)}, or a dict of "
                                "module names to 'cpu', 'disk', 'cuda:<i>' or GPU indices")
    elif isinstance(device_map, dict) and device_map and all(isinstance(k, str) for k in device_map):
        for module, target in device_map.items():
            _check_target(module, target)
    else:
        raise BadInputError(f"device_map must be a strategy name or a non-empty dict of module names to devices, "
                            f"got {type(device_map).__name__} {device_map!r}")
    if max_memory is not None and not (isinstance(max_memory, dict) and max_memory and all(
            isinstance(v, (int, str)) and not isinstance(v, bool) for v in max_memory.values())):
        raise BadInputError(f"max_memory must be a dict of devices (GPU index, 'cpu') to sizes ('20GiB' or bytes), "
                            f"got {max_memory!r}")
    if offload_folder is not None and not isinstance(offload_folder, (str, Path)):
        raise BadInputError(f"offload_folder must be a folder path, got {type(offload_folder).__name__}")
    disk = isinstance(device_map, dict) and "disk" in device_map.values()
    folder = str(offload_folder) if offload_folder is not None else (
        tempfile.mkdtemp(prefix="lens_position-offload-") if disk else None)
    return Placement(device_map, dict(max_memory) if max_memory else None, folder, dtype)


def check_bridge_takes(placement: Placement | None, transformer_lens_major: int) -> None:
    """BadInputError, before any weights are read, for a device map this TransformerLens's bridge
    refuses once the model is placed: weights on ``"disk"`` before 4.x (3.9's wrapped components
    read parameters outside accelerate's hooks), and a map that mixes the host or disk with GPUs."""
    if placement is None or not isinstance(placement.device_map, dict):
        return
    targets = {str(v) for v in placement.device_map.values()}
    offloaded, gpus = targets & {"cpu", "disk"}, targets - {"cpu", "disk"}
    if offloaded and gpus:
        raise BadInputError(f"device_map mixes {' and '.join(sorted(offloaded))} with GPUs "
                            f"({', '.join(sorted(gpus))}), which TransformerBridge refuses; put every module on "
                            "GPUs (device_map='balanced', or n_devices), or every module on the host and disk")
    if "disk" in offloaded and transformer_lens_major < 4:
        raise BadInputError("device_map puts weights on 'disk', which the bridge of TransformerLens 3.x refuses (its "
                            "wrapped components read parameters outside accelerate's offload hooks); install "
                            "TransformerLens 4 (pip install 'transformer-lens>=4'), or place every module on the host "
                            "or on GPUs")


def input_device(hf_model: Any) -> torch.device:
    """The device a Hugging Face model takes its input ids on: its input embedding's (the host when
    accelerate keeps that on ``meta`` between forwards)."""
    weight = hf_model.get_input_embeddings().weight
    return torch.device("cpu") if weight.device.type == "meta" else weight.device


def placed_summary(hf_model: Any, placement: Placement | None) -> dict[str, int] | None:
    """How many of a placed model's modules went to each device (None: not placed): accelerate's
    record of where they went, else (a map onto one device, which transformers applies without
    recording it) the map asked for."""
    if placement is None:
        return None
    mapping = getattr(hf_model, "hf_device_map", None) or (
        placement.device_map if isinstance(placement.device_map, dict) else {"model": str(input_device(hf_model))})
    counts: dict[str, int] = {}
    for target in mapping.values():
        key = f"cuda:{target}" if isinstance(target, int) else str(target)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
