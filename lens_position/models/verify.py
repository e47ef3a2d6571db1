"""Load-time verification: the booted model against the model it was booted from, and the facts
the spec reads checked against the model itself.

Three checks, each cheap next to a load, each refusing (never warning) when it fails:

- **Equivalence with the source.** The Hugging Face model the weights came from (eager attention,
  the load's position options applied) runs a few fixed tokens; the booted model runs the same
  tokens. Its logits must agree within :data:`LOGITS_RTOL` of the largest reference logit and every
  layer's attention pattern within :data:`PATTERN_ATOL` (probabilities). The check runs more tokens
  than the widest sliding window, so the window is in what is compared.
- **Key sets.** The reference's own attention (what the model computes) must be zero exactly where
  the spec's key sets (causal, or a window of ``window`` keys) leave a key out, and must not zero
  any key the spec keeps in every head of a layer: a window the spec does not know, or a window the
  model does not have, is refused.
- **K/V hook layout.** One pass adds a different vector to one head's key and value at one position
  in every layer (each layer's output put back to the unpatched one, so layers do not disturb each
  other): the scores must move at that head and key position only, and the per-head outputs at that
  head and the positions that read the key only. A patch of one head at one position then moves
  exactly that head and position.

And, when ``ntk_alpha`` is given: the model's own rotary tables must turn its lowest frequency
``ntk_alpha`` times slower than the unscaled base over the rotated dimensions says
(:func:`check_ntk_scaling` on the hooked backend's tables, :func:`check_ntk_tables` on the Hugging Face
model's).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models.placement import input_device

LOGITS_RTOL = 1e-3  # of the largest |reference logit|: float32 round-off is about 1e-6
PATTERN_ATOL = 1e-3  # attention probability: float32 round-off is about 1e-7
_MIN_TOKENS = 8
_EDGE_ROWS = 4
_KV_POSITION = 1


class EquivalenceError(UnsupportedArchitectureError):
    """The booted model does not compute what its source computes, or a fact the spec reads (a window,
    the K/V hook layout, a rotary scaling) is not what the model does."""


def family_name(hf_config: Any) -> str:
    """``"LlamaForCausalLM (model_type 'llama')"``: how refusals name a family."""
    config = getattr(hf_config, "text_config", None) or hf_config
    architectures = getattr(hf_config, "architectures", None) or []
    model_type = getattr(config, "model_type", None) or getattr(hf_config, "model_type", None)
    head = architectures[0] if architectures else "this model"
    return f"{head} (model_type {model_type!r})"


@dataclass(frozen=True)
class Reference:
    """What the source model computes on the check tokens: logits and attention patterns at the
    query positions ``rows`` (the first and last few)."""

    tokens: Int[torch.Tensor, "pos"]
    rows: Int[torch.Tensor, "row"]
    logits: Float[torch.Tensor, "row vocab"]
    patterns: Float[torch.Tensor, "layer head row pos"]


def check_tokens(vocab: int, windows: Sequence[int | None], n_ctx: int) -> Int[torch.Tensor, "pos"]:
    """The fixed tokens of every check: more than the widest window (so the window is compared), at
    least eight, at most ``n_ctx``; ids spread over the vocabulary, id 0 (often padding) avoided."""
    widest = max((w for w in windows if w), default=0)
    length = min(max(_MIN_TOKENS, widest + _EDGE_ROWS), int(n_ctx))
    ids = (torch.arange(length, dtype=torch.long) * 7919 + 11) % max(2, vocab - 1) + 1
    return ids.clamp(max=vocab - 1)


def _rows(length: int) -> Int[torch.Tensor, "row"]:
    head = list(range(min(_EDGE_ROWS, length)))
    tail = list(range(max(0, length - _EDGE_ROWS), length))
    return torch.tensor(sorted(set(head + tail)), dtype=torch.long)


@torch.no_grad()
def reference_of(hf_model: torch.nn.Module, tokens: Int[torch.Tensor, "pos"], n_layers: int) -> Reference:
    """Run ``hf_model`` (eager attention) on ``tokens``, keeping the logits and each attention layer's
    weights at the check rows only (a hook per attention module: the whole ``T x T`` weights of every
    layer are never held at once). EquivalenceError when the model does not return its attention
    weights from ``n_layers`` attention modules (SDPA or a fused kernel: read it with eager attention)."""
    length = int(tokens.shape[0])
    rows = _rows(length)
    captured: list[tuple[str, torch.Tensor]] = []

    def keeper(name: str) -> Any:
        def keep(_module: torch.nn.Module, _args: Any, output: Any) -> None:
            if not isinstance(output, tuple) or len(output) < 2:
                return
            weights = output[1]
            if (not isinstance(weights, torch.Tensor) or weights.dim() != 4 or weights.shape[-1] != length
                    or weights.shape[-2] != length):
                return
            if any(inner.startswith(name + ".") for inner, _ in captured):  # a wrapper passing them on
                return
            captured.append((name, weights[0, :, rows].detach().to(torch.float32).cpu().clone()))

        return keep

    handles = [module.register_forward_hook(keeper(name)) for name, module in hf_model.named_modules() if name]
    try:
        output = hf_model(tokens.unsqueeze(0).to(input_device(hf_model)))
    finally:
        for handle in handles:
            handle.remove()
    logits = output.logits if hasattr(output, "logits") else output[0]
    if len(captured) != n_layers:
        raise EquivalenceError(
            f"{family_name(getattr(hf_model, 'config', None))}: the Hugging Face model returned attention weights "
            f"from {len(captured)} modules for {n_layers} layers, so its attention cannot be compared with the "
            "booted model's; lens_position reads every model with eager attention (attn_implementation='eager'); "
            "a model that still hides its weights (a fused or linear attention) is not supported")
    return Reference(tokens=tokens.cpu(), rows=rows, logits=logits[0, rows].detach().to(torch.float32).cpu(),
                     patterns=torch.stack([weights for _, weights in captured]))


@dataclass(frozen=True)
class Agreement:
    """How close the booted model came to its reference: the largest logit difference relative to the
    largest reference logit, and the largest attention-probability difference; ``tokens``: the check's
    length."""

    logits_rel: float
    pattern_max: float
    tokens: int

    def to_dict(self) -> dict[str, float | int]:
        return {"logits_rel": self.logits_rel, "pattern_max": self.pattern_max, "tokens": self.tokens}


@torch.no_grad()
def compare_with_reference(backend: Any, reference: Reference, *, family: str, routes: str) -> Agreement:
    """Run the booted model (behind the seam) on the reference's tokens; EquivalenceError naming
    ``family``, the size of the difference and ``routes`` when the logits or any layer's pattern
    differ beyond :data:`LOGITS_RTOL` / :data:`PATTERN_ATOL`."""
    n_layers = backend.n_layers
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
    rows = reference.rows
    patterns: dict[int, torch.Tensor] = {}

    def keep(activation: torch.Tensor, hook: Any) -> None:
        layer = int(hook.name.split(".")[1])
        patterns[layer] = activation[0, :, rows.to(activation.device)].detach().to(torch.float32).cpu()

    tokens = reference.tokens.unsqueeze(0).to(backend.device)
    with backend.hooks([(name, keep) for name in names]):
        logits = backend.forward(tokens)
    assert logits is not None
    ours = logits[0, rows.to(logits.device)].detach().to(torch.float32).cpu()
    if ours.shape != reference.logits.shape:
        raise EquivalenceError(f"{family}: the booted model's logits have shape {tuple(ours.shape)}, its source's "
                               f"{tuple(reference.logits.shape)}. {routes}")
    scale = float(reference.logits.abs().max()) or 1.0
    logits_rel = float((ours - reference.logits).abs().max()) / scale
    pattern_max = 0.0
    worst_layer = 0
    for layer in range(n_layers):
        if layer not in patterns or patterns[layer].shape != reference.patterns[layer].shape:
            raise EquivalenceError(f"{family}: layer {layer}'s hook_pattern did not fire with the shape of the "
                                   f"source's attention weights. {routes}")
        difference = float((patterns[layer] - reference.patterns[layer]).abs().max())
        if difference > pattern_max:
            pattern_max, worst_layer = difference, layer
    if not (logits_rel <= LOGITS_RTOL and pattern_max <= PATTERN_ATOL):
        raise EquivalenceError(
            f"{family}: the booted model does not compute what its Hugging Face source computes on "
            f"{reference.tokens.shape[0]} check tokens (logits {logits_rel:.3g} relative off, attention "
            f"probabilities up to {pattern_max:.3g} off at layer {worst_layer}; float round-off is below "
            f"{LOGITS_RTOL:g} and {PATTERN_ATOL:g}): every number lens_position computed on it would be wrong, so "
            f"it is refused. {routes}")
    return Agreement(logits_rel=logits_rel, pattern_max=pattern_max, tokens=int(reference.tokens.shape[0]))


def check_key_sets(reference: Reference, windows: Sequence[int | None], *, family: str) -> None:
    """EquivalenceError unless the source's attention is zero exactly where the spec's key sets
    (``windows``: keys a query of each layer sees, None for every earlier key) leave a key out, and
    no layer zeroes a key the spec keeps in every one of its heads."""
    rows = reference.rows
    length = int(reference.tokens.shape[0])
    query = rows.unsqueeze(1)
    key = torch.arange(length).unsqueeze(0)
    for layer, window in enumerate(windows):
        inside = key <= query
        if window is not None:
            inside &= query - key < window
        pattern = reference.patterns[layer]
        if bool((pattern[:, key > query] != 0).any()):
            raise EquivalenceError(
                f"{family}: layer {layer} attends to later keys (bidirectional attention: an encoder read as a "
                "language model, not a causal decoder); lens_position analyses causal decoders, whose queries see "
                "only earlier keys")
        if bool((pattern[:, ~inside] != 0).any()):
            said = f"a window of {window} keys" if window is not None else "causal attention over every earlier key"
            raise EquivalenceError(
                f"{family}: layer {layer} attends to keys outside the key sets lens_position read from its config "
                f"({said}); a wider window, or none, is what the model does. Refused rather than analysed with the "
                "wrong key sets; pass the model's window with load_model(..., window=W) if its config misstates it")
        zero_everywhere = (pattern == 0).all(dim=0) & inside
        if bool(zero_everywhere.any()):
            raise EquivalenceError(
                f"{family}: layer {layer} masks keys that lens_position's key sets include (its config names no "
                f"window{'' if window is None else f' wider than {window}'}, yet every head gives them zero "
                "attention): a sliding window or mask the config does not declare. Refused rather than analysed "
                "with the wrong key sets")


@torch.no_grad()
def check_kv_layout(backend: Any, vocab: int, *, family: str) -> dict[str, str]:
    """EquivalenceError unless ``hook_k``/``hook_v`` (and ``hook_q``, ``hook_z``, the rotated ``hook_rot_q``
    / ``hook_rot_k`` where they fire) are ``[batch, pos, head, d_head]`` with one entry per query head,
    and a patch of one head's key (value) at one position moves the scores (per-head outputs) at that
    key position, and that head among others, only. Every layer is checked in one pass per part: each
    layer's residual output is put back to the unpatched one, so one layer's patch does not reach the
    next layer.

    Returns, per part (``"k"``, ``"v"``), why a patch of *one* head there moves other heads too, where
    it does: a norm over all heads' keys at once (OLMo-2's ``k_norm``) makes a key patch of one head
    change every head's keys, as the model itself computes. Such a model loads; a one-head patch of
    that part is refused (:meth:`ModelBackend.single_head_kv_unsupported`)."""
    n_layers, n_heads = backend.n_layers, backend.n_heads
    length = n_heads + 3 if n_heads + 3 != 4 else 5
    tokens = (torch.arange(length, dtype=torch.long) * 7919 + 11) % max(2, vocab - 1) + 1
    tokens = tokens.clamp(max=vocab - 1).unsqueeze(0).to(backend.device)
    head = n_heads - 1 if n_heads > 1 else 0
    position = _KV_POSITION if head != _KV_POSITION else _KV_POSITION + 1
    hook_dict = backend.hook_dict
    required = [f"blocks.{layer}.attn.hook_{part}" for layer in range(n_layers)
                for part in ("k", "v", "z", "attn_scores")]
    optional = [f"blocks.{layer}.attn.hook_{part}" for layer in range(n_layers) for part in ("q", "rot_q", "rot_k")]
    residual = [f"blocks.{layer}.hook_resid_post" for layer in range(n_layers)]
    missing = [name for name in required + residual if name not in hook_dict]
    if missing:
        raise EquivalenceError(f"{family}: the model has no hook {missing[0]} (and {len(missing) - 1} more), so its "
                               "keys, values and scores cannot be read")
    base = backend.run_with_cache(tokens, required + [n for n in optional if n in hook_dict] + residual)
    for name in required + optional:
        if name not in base:
            if name in required:
                raise EquivalenceError(f"{family}: {name} did not fire, so the model's keys, values and scores "
                                       "cannot be read")
            continue
        shape = tuple(base[name].shape)
        if name.endswith("attn_scores"):
            if shape != (1, n_heads, length, length):
                raise EquivalenceError(f"{family}: {name} has shape {shape}, not [batch, head, query, key] = "
                                       f"[1, {n_heads}, {length}, {length}]; refused")
        elif len(shape) != 4 or shape[:3] != (1, length, n_heads):
            raise EquivalenceError(
                f"{family}: {name} has shape {shape}, not [batch, pos, head, d_head] = [1, {length}, {n_heads}, "
                "d_head] with one entry per query head: its keys, values or queries would be read with the wrong "
                "axes or heads, so the model is refused.")
    coupled: dict[str, str] = {}
    for part, observe in (("k", "attn_scores"), ("v", "z")):
        moved = _patched_moves(backend, tokens, base, part, observe, head, position)
        for layer, change in enumerate(moved):
            if observe == "attn_scores":  # [head, query, key]
                heads, positions = change.any(dim=(1, 2)), change.any(dim=(0, 1))
                early = torch.zeros((), dtype=torch.bool)
            else:  # [pos, head, d_head]
                heads, positions = change.any(dim=(0, 2)), change.any(dim=(1, 2))
                early = change[:position].any()
            found_heads = heads.nonzero().flatten().tolist()
            found_positions = positions.nonzero().flatten().tolist()
            position_ok = (found_positions == [position]) if observe == "attn_scores" else not bool(early)
            if not position_ok or head not in found_heads:
                raise EquivalenceError(
                    f"{family}: layer {layer}: a patch of head {head}'s {'key' if part == 'k' else 'value'} at "
                    f"position {position} moved heads {found_heads} at positions {found_positions}: hook_{part} does "
                    "not carry [batch, pos, head, d_head] with one entry per query head, so every K/V patch and every "
                    "reading of keys and values would land on the wrong head or position. Refused")
            if found_heads != [head] and part not in coupled:
                coupled[part] = (f"a patch of one head's {'key' if part == 'k' else 'value'} at hook_{part} moves "
                                 f"heads {found_heads} (layer {layer}): the model mixes the heads after hook_{part} "
                                 "(a norm over all heads at once), so a one-head patch there is not one head's")
    return coupled


def _patched_moves(backend: Any, tokens: torch.Tensor, base: dict[str, torch.Tensor], part: str, observe: str,
                   head: int, position: int) -> list[torch.Tensor]:
    """Per layer, where ``hook_{observe}`` moved when every layer's ``hook_{part}`` got a random vector
    added at ``head``, ``position`` (each layer's residual output put back to the unpatched one)."""
    patched: dict[str, torch.Tensor] = {}

    def nudge(activation: torch.Tensor, hook: Any) -> torch.Tensor:
        out = activation.clone()
        generator = torch.Generator().manual_seed(int(hook.name.split(".")[1]))
        delta = torch.randn(out.shape[-1], generator=generator).to(out)
        out[0, position, head] += delta * (1.0 + float(out[0, position, head].abs().max()))
        return out

    def keep(activation: torch.Tensor, hook: Any) -> None:
        patched[hook.name] = activation.detach().clone()

    def restore(_activation: torch.Tensor, hook: Any) -> torch.Tensor:
        return base[hook.name]

    n_layers = backend.n_layers
    hooks: list[tuple[str, Any]] = []
    for layer in range(n_layers):
        hooks += [(f"blocks.{layer}.attn.hook_{part}", nudge), (f"blocks.{layer}.attn.hook_{observe}", keep),
                  (f"blocks.{layer}.hook_resid_post", restore)]
    with backend.hooks(hooks):
        backend.forward(tokens, stop_at_layer=n_layers, return_type=None)
    moves = []
    for layer in range(n_layers):
        name = f"blocks.{layer}.attn.hook_{observe}"
        if name not in patched:
            raise EquivalenceError(f"layer {layer}'s hook_{observe} did not fire in the K/V layout check, so its K/V "
                                   "hooks cannot be verified")
        moves.append(_moved(patched[name], base[name])[0])
    return moves


def _moved(after: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """Where ``after`` differs from ``before`` (both finite, or masked alike)."""
    both_masked = ~torch.isfinite(after) & ~torch.isfinite(before) & (after == before)
    return ~both_masked & ((after - before).abs() > 1e-6 * (1.0 + before.abs().nan_to_num(0.0, 0.0, 0.0)))


def check_ntk_scaling(backend: Any, *, ntk_alpha: float, rotary_base: float, layers: Sequence[int],
                      family: str) -> None:
    """EquivalenceError unless every RoPE layer of ``layers`` turns its lowest frequency exactly
    ``ntk_alpha`` times slower than the unscaled base ``rotary_base`` over the layer's own rotated
    dimensions: ``θ^(-(d-2)/d) / α`` (NTK-aware scaling's definition), read off the model's rotary
    tables, partial rotary included."""
    for layer in layers:
        layout = backend.rotary_layout(layer)
        d = int(layout.rotary_dim)
        lowest = float(layout.frequencies.abs().min())
        intended = rotary_base ** (-(d - 2) / d) / ntk_alpha
        if not math.isclose(lowest, intended, rel_tol=1e-4):
            raise EquivalenceError(
                f"{family}: layer {layer}: after ntk_alpha={ntk_alpha:g} the lowest rotary frequency is {lowest:.6g} "
                f"rad/position, not the unscaled {rotary_base ** (-(d - 2) / d):.6g} divided by {ntk_alpha:g} "
                f"({intended:.6g}) over its {d} rotated dimensions: the scaling is not NTK-aware as asked, so the "
                "load is refused")


def rotary_tables(hf_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The inverse frequencies every rotary embedding module of a Hugging Face model turns its pairs by
    (its ``*inv_freq`` buffers, the originals kept for dynamic scaling left out), by buffer name."""
    return {name: buffer.detach().to(torch.float64).cpu().clone() for name, buffer in hf_model.named_buffers()
            if name.endswith("inv_freq") and not name.rsplit(".", 1)[-1].startswith("original")}


def check_ntk_tables(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], *, ntk_alpha: float,
                     family: str) -> None:
    """EquivalenceError unless every rotary table of the model turns its lowest frequency exactly
    ``ntk_alpha`` times slower after the scaling than before it, over the same rotated dimensions
    (NTK-aware scaling's definition, partial rotary included), or when the model has no table to check."""
    if not before or sorted(before) != sorted(after):
        raise EquivalenceError(f"{family}: the model's rotary tables cannot be read (no inv_freq buffers), so "
                               f"ntk_alpha={ntk_alpha:g} cannot be verified; refused rather than assumed")
    for name in before:
        old, new = before[name], after[name]
        ratio = float(old.min() / new.min())
        if old.shape != new.shape or not math.isclose(ratio, ntk_alpha, rel_tol=1e-5):
            raise EquivalenceError(
                f"{family}: after ntk_alpha={ntk_alpha:g} the lowest rotary frequency of {name} is "
                f"{float(new.min()):.6g} rad/position, not the unscaled {float(old.min()):.6g} divided by "
                f"{ntk_alpha:g} ({ratio:.6g} times slower over {2 * old.numel()} rotated dimensions): the scaling "
                "is not NTK-aware as asked, so the load is refused")
