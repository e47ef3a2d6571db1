"""Whether one forward pass's attention fits the memory of its device, asked before the pass runs.

TransformerLens computes each layer's attention as whole ``[batch, head, T, T]`` tensors: the scores
and their softmax at least, both at once, in the model's dtype (``HookedTransformer`` and the bridge's
eager attention alike; a sliding window masks the same ``T x T`` scores). That memory grows as
``T²``, and on a CPU a pass that does not fit is killed by the kernel without a message, after the
passes before it ran. So every pass of the backends is checked first:

- **refused** (:class:`~lens_position.ground.errors.ResourceError`) when those two tensors alone are
  more than the device has available: the pass cannot run there. The message says how much it
  needs, what the device has, and the longest ``T`` (and, with several sequences per pass, the
  batch) whose typical peak would fit;
- **warned** (:class:`MemoryWarning`) when a bare pass's measured peak, :data:`TYPICAL_TENSORS`
  such tensors, is more than that: it may not fit.

Measured peaks of a bare pass over the loaded model, in ``[batch, head, T, T]`` tensors of the
model's dtype: SmolLM2-135M 4.4 (hooked, T = 2048 and 8192) and 5.2 (bridge, 2048); Gemma-3-270M
5.8 (hooked) and 4.0 (bridge), at T = 2048. Passes whose attention is smaller than
:data:`CHECKED_FROM_BYTES` are not checked (the memory is not read for them).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch

from lens_position.ground.errors import ResourceError
from lens_position.ground.memory import host_available_bytes

FLOOR_TENSORS = 2  # the scores and their softmax, whole at once: no pass needs less
TYPICAL_TENSORS = 4  # a bare pass's measured peak is 4.0-5.8 of them
CHECKED_FROM_BYTES = 256 * 2**20  # TYPICAL_TENSORS tensors of this size or more are checked


class MemoryWarning(UserWarning):
    """A forward pass that may need more memory than its device has available."""


def attention_bytes(batch: int, n_heads: int, T: int, dtype: torch.dtype) -> int:
    """Bytes of one ``[batch, n_heads, T, T]`` tensor of ``dtype``: one layer's scores."""
    return batch * n_heads * T * T * torch.empty((), dtype=dtype).element_size()


def available_bytes(device: torch.device) -> int | None:
    """Bytes a new allocation can take on ``device``, at most: the host's available memory for a
    CPU (:func:`lens_position.ground.memory.host_available_bytes`), a CUDA device's free memory plus
    what torch holds reserved and unused; None where it is not known (then nothing is checked)."""
    if device.type == "cpu":
        return host_available_bytes()
    if device.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    return None


def longest_fitting_T(available: int, n_heads: int, dtype: torch.dtype, tensors: int = TYPICAL_TENSORS) -> int:
    """The longest ``T`` whose ``tensors`` attention tensors (one sequence) fit in ``available``
    bytes: by default a pass's typical peak."""
    per_position_squared = tensors * attention_bytes(1, n_heads, 1, dtype)
    return math.isqrt(max(available, 0) // per_position_squared)


def pass_memory_problem(batch: int, T: int, n_heads: int, dtype: torch.dtype, available: int | None,
                        where: str = "the device") -> tuple[str, str] | None:
    """``("refuse", message)`` when a pass of ``batch`` sequences of ``T`` positions cannot hold one
    layer's scores and softmax in ``available`` bytes, ``("warn", message)`` when its typical peak
    (:data:`TYPICAL_TENSORS` such tensors) exceeds them, None when it fits (or ``available`` is
    unknown). The message's routes keep a pass's typical peak within ``available``. Pure:
    :func:`check_pass_memory` reads the device."""
    one = attention_bytes(batch, n_heads, T, dtype)
    if available is None or TYPICAL_TENSORS * one <= available:
        return None
    shape = f"{batch} sequence{'s' if batch != 1 else ''} of {T} positions"
    tensors = f"{n_heads} heads x {T}x{T} in {str(dtype).removeprefix('torch.')}"
    routes = []
    if batch > 1:
        routes.append(f"batch_size=1 (about {_gib(TYPICAL_TENSORS * one // batch)} at its peak)")
    fits = longest_fitting_T(available, n_heads, dtype)
    if fits < T:
        routes.append(f"sequences of at most T = {fits} (the longest whose pass peaks within {_gib(available)})")
    routes.append("a machine or GPU with more memory")
    if FLOOR_TENSORS * one > available:
        return "refuse", (
            f"a forward pass of {shape} holds at least {_gib(FLOOR_TENSORS * one)} in each layer, its scores "
            f"and their softmax ({tensors}), which TransformerLens computes whole; {where} has {_gib(available)} "
            f"available, so the pass cannot run here. Use {_either(routes)}")
    return "warn", (
        f"a forward pass of {shape} may need about {_gib(TYPICAL_TENSORS * one)} ({TYPICAL_TENSORS} tensors of "
        f"{tensors} at its peak, as measured), and {where} has {_gib(available)} available: it may be killed "
        f"for lack of memory. If it is, use {_either(routes)}")


def check_pass_memory(backend: Any, inputs: torch.Tensor) -> None:
    """Refuse (ResourceError) or warn (MemoryWarning) before a pass of ``inputs`` (tokens
    ``[batch, T]`` or a residual ``[batch, T, d_model]``) through ``backend`` whose attention does
    not fit its device's available memory (:func:`pass_memory_problem`)."""
    if inputs.ndim >= 2:
        check_pass_fits(backend, int(inputs.shape[0]), int(inputs.shape[1]), warn=True)


def check_pass_fits(backend: Any, batch: int, T: int, *, warn: bool = False) -> None:
    """Refuse (ResourceError) a pass of ``batch`` sequences of ``T`` positions through ``backend``
    that cannot fit its device's available memory; with ``warn``, also warn (MemoryWarning) about
    one that may not. An analysis of several lengths asks it for each before its first pass."""
    n_heads, dtype = backend.n_heads, backend.dtype
    if TYPICAL_TENSORS * attention_bytes(batch, n_heads, T, dtype) < CHECKED_FROM_BYTES:
        return
    if T > getattr(getattr(backend.model, "cfg", None), "n_ctx", T):
        return  # longer than the context: the pass refuses it itself (ContextLengthError)
    device = backend.device
    problem = pass_memory_problem(batch, T, n_heads, dtype, available_bytes(device),
                                  where="the host" if device.type == "cpu" else str(device))
    if problem is None:
        return
    level, message = problem
    if level == "refuse":
        raise ResourceError(message)
    if warn:
        warnings.warn(message, MemoryWarning, stacklevel=4)


def _either(routes: list[str]) -> str:
    return ", ".join(routes[:-1]) + f" or {routes[-1]}" if len(routes) > 1 else routes[0]


def _gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"
