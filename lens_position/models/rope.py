"""Position mechanisms as load-time options: RoPE bases, NTK scaling, sliding windows.

Every option here edits a ``HookedTransformerConfig`` dict before the model is built, so
a reader can follow one parameter from ``load_model(..., window=64)`` to the mask that
``AbstractAttention`` applies:

- **NTK-aware scaling** (bloc97): the rotary base becomes ``θ' = θ · α^(d/(d-2))`` with ``d``
  the rotary dimension. Every frequency slows down, the lowest by exactly ``α``, the highest
  (``θ^0``) not at all. ``α = 1`` leaves the base bit-for-bit unchanged. Applied to every
  base the model has (Gemma-3's local base too).
- **NTK-by-parts** (Llama-3 style, YaRN §3.2): wavelengths ``λ = 2π/ω`` longer than
  ``original_context / low_freq_factor`` are divided by ``factor`` in frequency, those shorter
  than ``original_context / high_freq_factor`` are kept, and the band in between is
  interpolated. TransformerLens implements it in ``AbstractAttention.calculate_sin_cos_rotary``;
  here we only set its config fields.
- **Window override**: local layers attend to the ``window`` most recent keys, the query
  included (key ``j`` is visible from query ``i`` when ``i - window < j <= i``). On a model
  without local layers every layer becomes local.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from jaxtyping import Float

from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError

# Llama-3's published values; ``original_context`` defaults to the model's own context.
NTK_BY_PARTS_DEFAULTS: dict[str, float] = {"factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0}
NTK_BY_PARTS_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_context")


def rope_theta(hf_config: Any, layer_type: str | None = None) -> float:
    """The rotary base of an HF config (transformers 5 ``rope_parameters``, or the older
    ``rope_theta``). ``layer_type`` selects a per-layer-type entry ("full_attention",
    "sliding_attention") where the config has them (Gemma-3)."""
    params = rope_parameters(hf_config, layer_type)
    if "rope_theta" in params:
        return float(params["rope_theta"])
    theta = getattr(hf_config, "rope_theta", None)
    if theta is None:
        raise UnsupportedArchitectureError(
            f"{type(hf_config).__name__} carries no rope_theta; lens_position needs a RoPE model")
    return float(theta)


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The rope parameter dict of an HF config (empty when it has none)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling",
                                                                    None) or {}
    if layer_type is not None and layer_type in params:
        params = params[layer_type]
    return dict(params)


def hf_rope_scaling_to_cfg(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """Map an HF ``rope_type`` to HookedTransformerConfig fields: ``default`` adds nothing,
    ``llama3`` becomes NTK-by-parts; anything else is refused (we would silently compute
    different frequencies from the checkpoint's)."""
    params = rope_parameters(hf_config, layer_type)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return {}
    if rope_type == "llama3":
        return {
            "use_NTK_by_parts_rope": True,
            "NTK_by_parts_factor": float(params["factor"]),
            "NTK_by_parts_low_freq_factor": float(params["low_freq_factor"]),
            "NTK_by_parts_high_freq_factor": float(params["high_freq_factor"]),
            "NTK_original_ctx_len": int(params["original_max_position_embeddings"]),
        }
    raise UnsupportedArchitectureError(
        f"rope_type {rope_type!r} is not supported by the hooked backend (supported: 'default', 'llama3'). "
        "Routes that work: load_model(..., backend='bridge') (TransformerBridge runs the Hugging Face model's "
        "own rotary embedding: linear, yarn and dynamic scaling), or load the checkpoint with its rope scaling "
        "removed and re-apply NTK scaling with load_model(..., ntk_alpha=...) or ntk_by_parts={...}.")


def ntk_aware_base(base: float, alpha: float, rotary_dim: int) -> float:
    """NTK-aware base ``θ · α^(d/(d-2))`` (d = rotary_dim); ``alpha = 1`` returns ``base``."""
    if alpha == 1:
        return base
    try:
        return base * alpha ** (rotary_dim / (rotary_dim - 2))
    except OverflowError:  # the caller refuses a base that is not finite
        return math.inf


def inverse_frequencies(base: float, rotary_dim: int) -> Float[torch.Tensor, "half_rotary_dim"]:
    """Standard RoPE angular frequencies ``ω_k = base^(-2k/d)``, k = 0..d/2-1, in radians per
    position (float64)."""
    k = torch.arange(rotary_dim // 2, dtype=torch.float64)
    return base ** (-2 * k / rotary_dim)


def ntk_by_parts_frequencies(
    base: float, rotary_dim: int, *, factor: float, low_freq_factor: float,
    high_freq_factor: float, original_context: int,
) -> Float[torch.Tensor, "half_rotary_dim"]:
    """Llama-3 NTK-by-parts angular frequencies (radians per position, float64), written
    from the formula so tests can check TransformerLens's rotary tables against it."""
    omega = inverse_frequencies(base, rotary_dim)
    wavelength = 2 * math.pi / omega
    low_wavelength = original_context / low_freq_factor
    high_wavelength = original_context / high_freq_factor
    smooth = (original_context / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    interpolated = (1 - smooth) * omega / factor + smooth * omega
    out = torch.where(wavelength > low_wavelength, omega / factor, omega)
    medium = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(medium, interpolated, out)


def normalise_ntk_by_parts(options: dict[str, float] | bool | None, n_ctx: int) -> dict[str, float]:
    """Fill defaults into an NTK-by-parts option dict and validate it."""
    if options is True:
        options = {}
    if not isinstance(options, dict):
        raise BadInputError(
            f"ntk_by_parts must be a dict with keys from {NTK_BY_PARTS_KEYS} (or True for "
            f"Llama-3 defaults), got {options!r}")
    unknown = set(options) - set(NTK_BY_PARTS_KEYS)
    if unknown:
        raise BadInputError(f"unknown ntk_by_parts keys {sorted(unknown)}; use {NTK_BY_PARTS_KEYS}")
    out = {**NTK_BY_PARTS_DEFAULTS, "original_context": n_ctx, **options}
    out = {k: float(v) for k, v in out.items()}
    if out["factor"] <= 0 or out["original_context"] <= 0:
        raise BadInputError(f"ntk_by_parts factor and original_context must be positive: {out}")
    if not out["high_freq_factor"] > out["low_freq_factor"] > 0:
        raise BadInputError(
            f"ntk_by_parts needs high_freq_factor > low_freq_factor > 0, got {out}")
    return out


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise BadInputError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _whole(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or not float(value).is_integer():
        raise BadInputError(f"{name} must be a whole number, got {value!r} (nothing is rounded)")
    if int(float(value)) < minimum:
        raise BadInputError(f"{name} must be >= {minimum}, got {value!r}")
    return int(float(value))


def check_position_options(*, ntk_alpha: Any = None, ntk_by_parts: Any = None, window: Any = None,
                           n_ctx: Any = None) -> None:
    """Refuse, before anything is built, a position option that is not finite or not in range:
    ``ntk_alpha`` a finite number > 0; every ``ntk_by_parts`` factor finite (the dict's ranges are
    :func:`normalise_ntk_by_parts`'s), ``original_context`` a whole number >= 1; ``window`` a whole
    number >= 1 and ``n_ctx`` one >= 2 (``2.7`` is refused, never cut to 2)."""
    if ntk_alpha is not None and not _finite("ntk_alpha", ntk_alpha) > 0:
        raise BadInputError(f"ntk_alpha must be > 0 (1 is plain RoPE), got {ntk_alpha!r}")
    if isinstance(ntk_by_parts, dict):
        for key, value in ntk_by_parts.items():
            if key == "original_context":
                _whole("ntk_by_parts original_context", value, 1)
            else:
                _finite(f"ntk_by_parts {key}", value)
    elif ntk_by_parts is not None and not isinstance(ntk_by_parts, bool):
        raise BadInputError(f"ntk_by_parts must be True or a dict with keys from {NTK_BY_PARTS_KEYS}, "
                            f"got {ntk_by_parts!r}")
    if window is not None:
        _whole("window", window, 1)
    if n_ctx is not None:
        _whole("n_ctx", n_ctx, 2)


def apply_position_options(
    cfg: dict[str, Any], *, ntk_alpha: float | None = None,
    ntk_by_parts: dict[str, float] | bool | None = None, window: int | None = None,
    n_ctx: int | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return a copy of ``cfg`` (HookedTransformerConfig kwargs) with the position options
    applied, and the spec fields they imply (``rope_kind``, ``ntk_alpha``, ``ntk_by_parts``)."""
    check_position_options(ntk_alpha=ntk_alpha, ntk_by_parts=ntk_by_parts, window=window, n_ctx=n_ctx)
    cfg = dict(cfg)
    facts: dict[str, Any] = {"ntk_alpha": None, "ntk_by_parts": None}
    wants_parts = ntk_by_parts is not None and ntk_by_parts is not False  # {} means "defaults"
    if cfg.get("positional_embedding_type") != "rotary" and (ntk_alpha is not None or wants_parts):
        raise BadInputError("NTK options need a RoPE model; this one has no rotary embedding")
    if ntk_alpha is not None and wants_parts:
        raise BadInputError("choose one of ntk_alpha and ntk_by_parts, not both")
    trained_context = cfg["n_ctx"]  # NTK-by-parts' default original context, before any override
    if n_ctx is not None:
        if int(n_ctx) < 1:
            raise BadInputError(f"n_ctx must be a positive number of positions, got {n_ctx}")
        cfg["n_ctx"] = int(n_ctx)
    if ntk_alpha is not None:
        if not ntk_alpha > 0:
            raise BadInputError(f"ntk_alpha must be > 0 (1 is plain RoPE), got {ntk_alpha}")
        d = cfg["rotary_dim"]
        facts["unscaled_rotary_base"] = float(cfg["rotary_base"])
        cfg["rotary_base"] = ntk_aware_base(cfg["rotary_base"], float(ntk_alpha), d)
        if cfg.get("rotary_base_local") is not None:
            cfg["rotary_base_local"] = ntk_aware_base(cfg["rotary_base_local"], float(ntk_alpha), d)
        if not all(math.isfinite(b) and b > 0 for b in (cfg["rotary_base"], cfg.get("rotary_base_local") or 1.0)):
            raise BadInputError(f"ntk_alpha = {ntk_alpha!r} gives the rotary base {cfg['rotary_base']!r}, which is "
                                "not a finite positive number; use a smaller alpha")
        facts["ntk_alpha"] = float(ntk_alpha)
    if wants_parts:
        parts = normalise_ntk_by_parts(ntk_by_parts, trained_context)
        cfg.update(use_NTK_by_parts_rope=True, NTK_by_parts_factor=parts["factor"],
                   NTK_by_parts_low_freq_factor=parts["low_freq_factor"],
                   NTK_by_parts_high_freq_factor=parts["high_freq_factor"],
                   NTK_original_ctx_len=int(parts["original_context"]))
        facts["ntk_by_parts"] = parts
    elif cfg.get("use_NTK_by_parts_rope"):  # the checkpoint's own (Llama-3.1 ...)
        facts["ntk_by_parts"] = {
            "factor": cfg["NTK_by_parts_factor"], "low_freq_factor": cfg["NTK_by_parts_low_freq_factor"],
            "high_freq_factor": cfg["NTK_by_parts_high_freq_factor"],
            "original_context": float(cfg["NTK_original_ctx_len"])}
    if window is not None:
        if int(window) != window or window < 1:
            raise BadInputError(f"window must be a positive whole number of keys, got {window}")
        cfg["window_size"] = int(window)
        if not cfg.get("use_local_attn"):
            cfg["use_local_attn"] = True
            cfg["attn_types"] = ["local"] * cfg["n_layers"]
    if cfg.get("positional_embedding_type") != "rotary":
        facts["rope_kind"] = "none"
    elif cfg.get("use_NTK_by_parts_rope"):
        facts["rope_kind"] = "ntk-by-parts"
    elif facts["ntk_alpha"] not in (None, 1.0):
        facts["rope_kind"] = "ntk-aware"
    else:
        facts["rope_kind"] = "standard"
    return cfg, facts
