"""Attention scores a TransformerLens user already has, checked for the decomposition.

``decompose(model, prompts, scores=cache)`` reads the scores ``s[i, j]`` from what
``model.run_with_cache(tokens)`` returned instead of running the model again. Accepted:

- a TransformerLens ``ActivationCache`` (or any mapping from hook name to tensor) holding
  ``blocks.{l}.attn.hook_attn_scores`` ``[batch, head, query, key]`` for every analysed layer, or
  ``blocks.{l}.attn.hook_rot_q`` and ``hook_rot_k`` ``[batch, pos, head, d_head]`` (the rotated
  queries and keys), from which ``s = q·k / attn_scale`` (soft-capped where the model caps) is
  formed and the model's mask applied;
- a mapping from layer index to a scores tensor ``[batch, head, query, key]``.

What the decomposition needs and cannot take on trust is checked here, once, and refused with
:class:`~lens_position.ground.errors.BadInputError`: the hooks of every analysed layer, the shapes
(the prompts' ``N`` and ``T``, the model's heads), finite values inside the key set, and the key
set itself, which comes from the model's spec (causal, or a sliding window of ``W`` keys) and never
from the values: scores without the mask applied are refused, not silently masked. Scores of another
model or other prompts would give numbers that look right; the first and last prompt are therefore
run through the model once more and their scores compared with the cached ones (a forward pass of
two sequences, stopped after the last analysed layer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from jaxtyping import Float

from lens_position.ground.errors import BadInputError, NonFiniteError
from lens_position.models.spec import LoadedModel

SCORES, ROT_Q, ROT_K = "hook_attn_scores", "hook_rot_q", "hook_rot_k"


def _hook(layer: int, name: str) -> str:
    return f"blocks.{layer}.attn.{name}"


def key_set(length: int, window: int | None) -> torch.Tensor:
    """``[query, key]`` booleans: key ``j`` is in ``K(i)`` (``j <= i``, and ``i - j < window`` for a
    sliding window), from the model's spec, never from score values."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    visible = j <= i
    if window is not None:
        visible &= (i - j) < window
    return visible


class CachedScores:
    """Scores of the analysed ``layers`` for ``tokens`` taken from ``source`` (module docstring),
    checked; :meth:`batches` hands them out as the model's hook would, masked cells ``-inf``."""

    def __init__(self, loaded: LoadedModel, tokens: torch.Tensor, layers: Sequence[int], source: Any) -> None:
        self.loaded, self.tokens, self.layers = loaded, tokens, list(layers)
        self.windows = list(loaded.spec.layer_windows)
        self.n_seq, self.length = (int(x) for x in tokens.shape)
        self.n_heads = int(loaded.backend.n_heads)
        self._by_layer = self._select(source)
        self.kind = "rotated q/k" if any(isinstance(v, tuple) for v in self._by_layer.values()) else SCORES
        for layer in self.layers:
            self._check_layer(layer)
        self._check_against_model()

    # ------------------------------------------------------------------ reading the source
    def _select(self, source: Any) -> dict[int, torch.Tensor | tuple[torch.Tensor, torch.Tensor]]:
        if isinstance(source, torch.Tensor):
            raise BadInputError(
                "scores: a single tensor is ambiguous; pass the ActivationCache from model.run_with_cache(tokens) "
                "or a mapping {layer: scores [batch, head, query, key]}")
        if getattr(source, "has_batch_dim", True) is False:
            raise BadInputError("scores: this ActivationCache has no batch dimension (remove_batch_dim=True); "
                                "cache the prompts with run_with_cache(tokens) as they are")
        if not isinstance(source, Mapping) and not (hasattr(source, "keys") and hasattr(source, "__getitem__")):
            raise BadInputError(f"scores must be an ActivationCache or a mapping from hook name or layer to a "
                                f"tensor, got {type(source).__name__}")
        cached_model = getattr(source, "model", None)
        if cached_model is not None and cached_model is not self.loaded.backend.model:
            raise BadInputError("scores: this ActivationCache was made by another model object than the one "
                                "passed to decompose; pass the model whose run_with_cache made it")
        keys = list(source.keys())
        selected: dict[int, Any] = {}
        missing = []
        for layer in self.layers:
            if layer in keys:
                selected[layer] = source[layer]
            elif _hook(layer, SCORES) in keys:
                selected[layer] = source[_hook(layer, SCORES)]
            elif _hook(layer, ROT_Q) in keys and _hook(layer, ROT_K) in keys:
                selected[layer] = (source[_hook(layer, ROT_Q)], source[_hook(layer, ROT_K)])
            else:
                missing.append(layer)
        if missing:
            raise BadInputError(
                f"scores: no attention scores for layer(s) {missing} (neither {_hook(missing[0], SCORES)} nor "
                f"{_hook(missing[0], ROT_Q)} with {ROT_K}); cache them, e.g. model.run_with_cache(tokens, "
                "names_filter=lambda name: name.endswith('hook_attn_scores')), or pass layers= for the layers the "
                "cache holds")
        for layer, value in selected.items():
            parts = value if isinstance(value, tuple) else (value,)
            if not all(isinstance(p, torch.Tensor) for p in parts):
                raise BadInputError(f"scores of layer {layer}: expected a tensor, got {type(parts[0]).__name__}")
            if not all(p.is_floating_point() for p in parts):
                raise BadInputError(f"scores of layer {layer}: expected floating-point values, got {parts[0].dtype}")
        return selected

    # ------------------------------------------------------------------ checks
    def _check_layer(self, layer: int) -> None:
        value = self._by_layer[layer]
        n, t = self.n_seq, self.length
        if isinstance(value, tuple):
            q, k = value
            d_head = q.shape[-1] if q.ndim == 4 else None
            kv_heads = {self.n_heads, self.loaded.spec.n_kv_heads}
            if q.shape != (n, t, self.n_heads, d_head) or k.ndim != 4 or k.shape[:2] != (n, t) \
                    or k.shape[2] not in kv_heads or k.shape[3] != d_head:
                raise BadInputError(
                    f"layer {layer}: rotated q/k of shapes {tuple(q.shape)} and {tuple(k.shape)} do not match the "
                    "prompts "
                    f"and the model: expected [{n}, {t}, {self.n_heads}, d_head] and [{n}, {t}, heads, d_head]"
                )
            if self.loaded.spec.rope_kind == "none":
                raise BadInputError(
                    f"layer {layer}: scores from rotated q/k need a RoPE model; cache {_hook(layer, SCORES)} instead"
                )
            for name, part in (("hook_rot_q", q), ("hook_rot_k", k)):
                if not bool(torch.isfinite(part).all()):
                    raise NonFiniteError(f"layer {layer}: {name} in the cache holds NaN or infinite values")
            return
        expected = (n, self.n_heads, t, t)
        if tuple(value.shape) != expected:
            raise BadInputError(
                f"layer {layer}: cached scores have shape {tuple(value.shape)}; the prompts and the model need "
                f"[batch, head, query, key] = {list(expected)}")
        if bool(torch.isnan(value).any()) or bool((value == float("inf")).any()):
            raise NonFiniteError(f"layer {layer}: the cached scores hold NaN or +inf")
        visible = key_set(t, self.windows[layer]).to(value.device)
        masked = ~torch.isfinite(value) | (value <= torch.finfo(value.dtype).min / 2)
        if bool((masked & visible).any()):
            raise NonFiniteError(f"layer {layer}: the cached scores are -inf (or the dtype's minimum) on keys the "
                                 "mask shows: non-finite weights, or overflow in float16/bfloat16")
        if bool((~masked & ~visible).any()):
            what = "causal" if self.windows[layer] is None else f"sliding-window (W = {self.windows[layer]})"
            raise BadInputError(
                f"layer {layer}: the cached scores are finite outside the model's {what} key set: they were "
                "taken without the mask applied (or from another model). Cache "
                f"{_hook(layer, SCORES)}, which the model fires after masking")

    def _check_against_model(self) -> None:
        """The cached scores must be this model's on these prompts: the first and last prompt again."""
        rows = sorted({0, self.n_seq - 1})
        names = [_hook(layer, SCORES) for layer in self.layers]
        with torch.no_grad():
            fresh = self.loaded.backend.run_with_cache(self.tokens[rows], names, stop_at_layer=max(self.layers) + 1)
        for layer, name in zip(self.layers, names):
            ours = self._scores(layer, rows).to(torch.float64).cpu()
            model = fresh[name].to(torch.float64).cpu()
            visible = key_set(self.length, self.windows[layer])
            ours, model = ours[..., visible], model[..., visible]
            scale = max(1.0, float(model.abs().max()))
            cached_dtype = self._dtype(layer)
            tolerance = 256 * max(torch.finfo(cached_dtype).eps, torch.finfo(fresh[name].dtype).eps) * scale
            difference = float((ours - model).abs().max())
            if not difference <= tolerance:
                raise BadInputError(
                    f"layer {layer}: the cached scores are not this model's on these prompts (prompt {rows[-1]} run "
                    f"again differs by up to {difference:.3g}, tolerance {tolerance:.3g}); pass the prompts and the "
                    "model the cache was made from, unpatched (decompose's patches= and fwd_hooks= measure a "
                    "patched run)")

    def _dtype(self, layer: int) -> torch.dtype:
        value = self._by_layer[layer]
        return (value[0] if isinstance(value, tuple) else value).dtype

    # ------------------------------------------------------------------ scores
    def _scores(self, layer: int, rows: Sequence[int] | slice) -> Float[torch.Tensor, "batch head query key"]:
        value = self._by_layer[layer]
        if not isinstance(value, tuple):
            return value[rows]
        q, k = value[0][rows], value[1][rows]
        if k.shape[2] != q.shape[2]:  # grouped-query attention: each key head serves a group of query heads
            k = k.repeat_interleave(q.shape[2] // k.shape[2], dim=2)
        scale, cap = self.loaded.backend.score_scale_and_cap()
        # a model scaling otherwise than it says is caught by the fresh run of two prompts
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (scale if scale is not None else q.shape[-1] ** 0.5)
        if cap is not None:
            scores = cap * torch.tanh(scores / cap)
        visible = key_set(self.length, self.windows[layer]).to(scores.device)
        return scores.masked_fill(~visible, float("-inf"))

    def batches(self, batch_size: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """``(layer, scores [batch, head, query, key], rows)`` for every batch of prompts and layer."""
        for start in range(0, self.n_seq, batch_size):
            rows = torch.arange(start, min(start + batch_size, self.n_seq))
            for layer in self.layers:
                yield layer, self._scores(layer, slice(start, start + len(rows))), rows
