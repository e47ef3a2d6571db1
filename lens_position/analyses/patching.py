"""Activation patching and ablation: one engine, thin named entry points, fast.

Activation patching asks a causal question. Run the model on a *target* input, but replace
one activation (the residual stream at layer 5, position 0; one head's key at position 0;
the embedding of the first token) by a value taken from a *source* run (a different token
0, no BOS), by a summary (the mean over inputs), or by zero, and measure what changes
downstream: the logits, a head's output, or a head's residual component ``R``
(``lens_position.analyses.decompose``). If changing that one activation changes the measurement, the
activation carries what the measurement depends on; if it does not, it does not.

Here an intervention is a value, not a side effect: a :class:`Patch` says *which* activation
(a TransformerLens hook name), *where* (position, head) and *what to put there*. Apply it to
any forward pass with :meth:`Patch.hook` (a ``(name, fn)`` pair for ``model.hooks`` or for
``decompose(fwd_hooks=...)``), or hand many conditions (each a list of patches) to
:func:`run_patches`, which

- **resumes from a cached residual**: a condition whose earliest patch sits in block ``l``
  starts at ``resid_pre[l]`` of the target run (``start_at_layer``), so layers ``< l`` are
  never recomputed;
- **batches conditions**: the target batch is repeated once per condition and each
  condition's patches touch only its own rows, so a sweep of ``layers x positions`` patches
  costs ``layers`` forward passes of ``positions x batch`` rows, not ``layers x positions``
  passes;
- **always removes its hooks** (``model.hooks`` context manager), also when an exception
  flies.

Named entry points build the usual patches: :func:`embedding_patch` (another token's
embedding, the mean embedding over the vocabulary, or a random vector of the same norm),
:func:`resid_pre_patch` (``resid_pre`` at (layer, position) from a source run),
:func:`head_kv_patches` (one head's key and/or value at a position from a source run) and
:func:`head_ablation` (zero or mean ablation of heads), and :func:`resid_pre_sweep` runs the
classic ``layers x positions`` residual-stream sweep (the fast twin of
``transformer_lens.patching.get_act_patch_resid_pre``).

Patching a run with its own activations changes nothing (tested bit-for-bit on small
models; within float round-off where batching changes the matmul shapes).
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from lens_position.models.backends import ModelLike, hooked_class
from transformer_lens.ActivationCache import ActivationCache as TransformerLensCache

from lens_position.ground import provenance
from lens_position.core.patch import (Condition, Patch, _check_layer, _check_position, act_name,  # noqa: F401
                                       patches_as_hooks, source_activation)
from lens_position.ground.errors import BadInputError
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import Bootstrap, bootstrap_mean, sign_flip_pvalue
from lens_position.models.spec import LoadedModel, as_loaded
from lens_position.ground.progress import progress as progress_bar
from lens_position.core.intervals import Estimate
from lens_position.core.columns import recommended_first
from lens_position.core.summaries import Headline
from lens_position.core.results import SavedResult
from lens_position.core.stream import LOGITS, WholeActivations, stream

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

Replacement = Literal["token", "mean", "random"]


# --------------------------------------------------------------------------- inputs


def _hooked(model: ModelLike) -> Any:
    """The TransformerLens model behind ``model`` (either backend: both have the config facts
    read here, ``hook_dict`` and ``W_E``); forward passes go through the stream loop's seam."""
    return as_loaded(model).model


def as_tokens(model: ModelLike, prompts: Prompts) -> Int[torch.Tensor, "batch pos"]:
    """The token tensor of ``prompts``, checked by the input door
    (:func:`lens_position.core.inputs.checked_prompts`: ids in the vocabulary, length within the
    context, no padding), on the model's device."""
    return checked_prompts(model, prompts).tokens.to(_hooked(model).cfg.device)


def _tokenizer_id(prompts: Any) -> Any:
    spec = getattr(prompts, "spec", None)
    if spec is None:
        return None
    for attr in ("tokenizer", "tokenizer_name", "tokenizer_id"):
        value = getattr(spec, attr, None)
        if value is not None:
            return value
    return None


def check_same_layout(target: Any, source: Any, *, what: str = "source") -> None:
    """Raise BadInputError unless ``source`` and ``target`` prompts can be patched into each
    other: same [batch, pos] shape and, when both say, the same tokenizer."""
    t_tok, s_tok = getattr(target, "tokens", target), getattr(source, "tokens", source)
    if tuple(t_tok.shape) != tuple(s_tok.shape):
        raise BadInputError(
            f"{what} run has token shape {tuple(s_tok.shape)} but the target run has "
            f"{tuple(t_tok.shape)}; patching moves activations position by position, so build "
            "both prompt sets with the same N and T"
        )
    t_id, s_id = _tokenizer_id(target), _tokenizer_id(source)
    if t_id is not None and s_id is not None and t_id != s_id:
        raise BadInputError(
            f"{what} prompts were tokenized with {s_id!r} but the target prompts with {t_id!r}; "
            "build both with the same model's tokenizer"
        )


# --------------------------------------------------------------------------- caches


def cache_activations(
    model: ModelLike,
    prompts: Prompts,
    names: Sequence[str],
    *,
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
) -> TransformerLensCache:
    """Run once and keep only the activations named in ``names`` (the whole batch), as a
    TransformerLens ``ActivationCache``: index it by name, ``get_act_name`` or tuple
    (``cache["resid_pre", 3]``), use its helpers (``accumulated_resid``, ...), pass it as the
    source of a patch. ``names`` may be written in any form :func:`act_name` accepts.

    ``fwd_hooks`` (e.g. ``Patch.hook()``) apply during the run; they are removed after it.
    The forward pass stops after the last block that is read.
    """
    hooked = _hooked(model)
    tokens = as_tokens(model, prompts)
    names = [act_name(name) for name in names]
    cache = WholeActivations(names)
    stream(hooked, tokens, [cache], fwd_hooks=fwd_hooks, batch_size=max(1, len(tokens)), progress=False,
           desc="cache activations")
    return TransformerLensCache(cache.result(), hooked)


def resid_pre_stack(
    model: ModelLike, prompts: Prompts
) -> Float[torch.Tensor, "layer batch pos d_model"]:
    """``resid_pre`` of every block on ``prompts``, stacked: the cache that patches resume from."""
    hooked = _hooked(model)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(hooked.cfg.n_layers)]
    store = cache_activations(model, prompts, names)
    return torch.stack([store[n] for n in names])


# --------------------------------------------------------------------------- the engine

# Inside attention, during a pass that reuses the target run's prefix, these hooks hold every
# position of the sequence (queries padded, keys and values completed with the target's
# prefix), so their patches index absolute positions; every other hook holds the computed
# positions only.
_FULL_LENGTH_HOOK = re.compile(r"attn\.hook_(q|k|v|rot_q|rot_k|z)$")
# What one extra forward pass costs beyond its tokens, in token-positions per layer: the
# scheduler trades it against recomputed prefix positions. It changes which conditions share a
# pass, never a value.
PASS_OVERHEAD_TOKENS = 256


@dataclass(frozen=True)
class PatchPass:
    """One forward pass of :func:`run_patches`: the conditions ``conditions`` (indices), each on
    the ``B`` target rows, computed from block ``layer`` (-1: from the tokens) and from position
    ``position`` on (0: every position; above 0, the earlier positions come from the target run)."""

    layer: int
    position: int
    conditions: tuple[int, ...]


def prefix_reuse_unsupported(model: ModelLike) -> str | None:
    """Why ``model`` cannot reuse the target run's prefix (None: it can).

    Prefix reuse computes positions ``>= p`` only and hands attention the target run's keys and
    values of the positions before ``p`` through ``hook_k`` / ``hook_v``, with the queries padded
    at ``hook_q`` so that TransformerLens applies rotary positions, the causal mask and sliding
    windows at their absolute positions, and ``hook_z`` cut back to the computed positions. It
    needs a ``HookedTransformer`` with causal attention whose position information is rotary or
    already in the residual stream (learned absolute embeddings); a backend that computes rotary
    positions from the length of the sequence it is given (a ``TransformerBridge``) cannot."""
    hooked = model.model if isinstance(model, LoadedModel) else model
    hooked_type = hooked_class()
    if hooked_type is None or not isinstance(hooked, hooked_type):
        return (f"{type(hooked).__name__} is not a HookedTransformer: its attention takes rotary "
                "positions from the length of the sequence it is given")
    cfg = hooked.cfg
    if cfg.positional_embedding_type not in ("rotary", "standard"):
        return f"positional embedding {cfg.positional_embedding_type!r} (supported: rotary, standard)"
    if cfg.attention_dir != "causal":
        return f"attention is {cfg.attention_dir}, not causal: every position depends on every other"
    needed = [f"blocks.{l}.attn.hook_{part}" for l in range(cfg.n_layers) for part in ("q", "k", "v", "z")]
    hook_dict = hooked.hook_dict  # once (a TransformerBridge resolves its aliases on every access)
    missing = [name for name in needed if name not in hook_dict]
    if missing:
        return f"the model has no hooks {missing[:3]}"
    return None


def _first_position(condition: Sequence[Patch], n_pos: int) -> int:
    """The first position a condition can change (causal attention: none before it); ``n_pos``
    for the unpatched run; 0 for an embedding-level patch or one at every position."""
    if not condition:
        return n_pos
    if any(p.position is None or p.layer < 0 for p in condition):
        return 0
    return min(p.position for p in condition)


def plan_passes(
    starts: Sequence[tuple[int, int]], n_rows: int, n_pos: int, batch_size: int
) -> list[PatchPass]:
    """The forward passes that compute conditions starting at ``starts[i] = (block, position)``
    (block -1: from the tokens), at most ``batch_size // n_rows`` conditions (at least one) per
    pass. Conditions of one block share passes; a pass computes from the smallest position of its
    conditions, so conditions are grouped by position, cut where one more pass costs less
    (:data:`PASS_OVERHEAD_TOKENS`) than recomputing the earlier positions of the others."""
    per_pass = max(1, batch_size // n_rows)
    by_layer: dict[int, list[int]] = defaultdict(list)
    for index, (layer, _) in enumerate(starts):
        by_layer[layer].append(index)
    plan = []
    for layer, indices in sorted(by_layer.items()):
        indices = sorted(indices, key=lambda i: starts[i][1])
        lengths = np.array([n_pos - starts[i][1] for i in indices], dtype=float)
        n = len(indices)
        best, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)
        for j in range(1, n + 1):
            first = np.arange(max(0, j - per_pass), j)
            cost = best[first] + (j - first) * n_rows * lengths[first] + PASS_OVERHEAD_TOKENS
            k = int(np.argmin(cost))
            best[j], cut[j] = cost[k], first[k]
        groups, j = [], n
        while j > 0:
            groups.append(indices[cut[j]:j])
            j = int(cut[j])
        plan += [PatchPass(layer, starts[group[0]][1], tuple(group)) for group in reversed(groups)]
    return plan


def token_layers(plan: Sequence[PatchPass], n_rows: int, n_pos: int, n_layers: int) -> int:
    """Token-layers a plan computes: per pass, rows x computed positions x blocks run (a pass at
    position ``n_pos``, the unpatched run read off the target run, computes none)."""
    return sum(len(step.conditions) * n_rows * (n_pos - step.position) * (n_layers - max(step.layer, 0))
               for step in plan)


def _prefix_hooks(
    hooked: HookedTransformer,
    step: PatchPass,
    patches: Sequence[Patch],
    target: Mapping[str, torch.Tensor],
    repeats: int,
) -> list[tuple[str, Callable]]:
    """Forward hooks for a pass computing positions ``>= step.position`` from block
    ``step.layer`` (:func:`prefix_reuse_unsupported` says how), with ``patches`` applied at their
    absolute positions."""
    start = step.position
    by_name: dict[str, list[Patch]] = defaultdict(list)
    for patch in patches:
        if _FULL_LENGTH_HOOK.search(patch.hook_name):
            by_name[patch.hook_name].append(patch)
        else:
            by_name[patch.hook_name].append(dataclasses.replace(patch, position=patch.position - start))

    def hook(name: str, before: Callable | None = None, after: Callable | None = None) -> tuple[str, Callable]:
        def fn(activation: torch.Tensor, hook: Any) -> torch.Tensor:
            if before is not None:
                activation = before(activation)
            for patch in by_name.get(name, ()):
                activation = patch.apply(activation)
            return activation if after is None else after(activation)
        return (name, fn)

    def prepend(name: str) -> Callable:
        prefix = target[name][:, :start].repeat(repeats, *(1,) * (target[name].ndim - 1))
        return lambda activation: torch.cat([prefix.to(activation.dtype), activation], dim=1)

    def pad(activation: torch.Tensor) -> torch.Tensor:
        zeros = activation.new_zeros((activation.shape[0], start, *activation.shape[2:]))
        return torch.cat([zeros, activation], dim=1)

    hooks = []
    for layer in range(max(step.layer, 0), hooked.cfg.n_layers):
        attn = f"blocks.{layer}.attn"
        hooks += [hook(f"{attn}.hook_q", before=pad), hook(f"{attn}.hook_k", before=prepend(f"{attn}.hook_k")),
                  hook(f"{attn}.hook_v", before=prepend(f"{attn}.hook_v")),
                  hook(f"{attn}.hook_z", after=lambda activation: activation[:, start:])]
    handled = {name for name, _ in hooks}
    hooks += [hook(name) for name in by_name if name not in handled]
    return hooks


def run_patches(
    model: ModelLike,
    prompts: Prompts,
    conditions: Sequence[Condition | Patch],
    metric: Callable[[Any], torch.Tensor],
    *,
    read: Sequence[str] = (),
    resid_pre: Float[torch.Tensor, "layer batch pos d_model"] | None = None,
    batch_size: int = 64,
    reuse_prefix: bool | None = None,
    progress: bool = True,
    plan: list[PatchPass] | None = None,
) -> torch.Tensor:
    """Run the target ``prompts`` once per condition, each with its own patches; reduce each
    condition's run with ``metric``. Returns ``metric`` values stacked: ``[condition, ...]``.

    Args:
        prompts: the target run (PromptSet or ``Int[Tensor, "batch pos"]``), ``B`` rows.
        conditions: each a list of :class:`Patch` (or a single Patch); an empty list is the
            unpatched run.
        metric: ``metric(x) -> Tensor`` for one condition's ``B`` rows. ``x`` is the logits
            ``Float[Tensor, "B pos d_vocab"]`` when ``read`` is empty, otherwise a dict
            ``{hook_name: activation}`` of the hooks in ``read`` that ran in this condition's
            pass (blocks before the condition's first patch are not rerun, so their hooks
            are absent: read them from an unpatched run).
        read: hook names (any :func:`act_name` form) to hand to ``metric`` instead of the
            logits, keyed by full hook name; the pass then stops after the last block read.
        resid_pre: the target run's ``resid_pre`` stack (:func:`resid_pre_stack`); computed
            here when some condition can resume from it and it is not given.
        batch_size: most rows per forward pass (conditions x B); at least one condition.
        reuse_prefix: compute only the positions a condition can change (those from its first
            patched position on), the earlier ones taken from the target run (module
            docstring); the values are the same. None: wherever possible (a logits metric on a
            model :func:`prefix_reuse_unsupported` accepts), else the full computation; True:
            refuse (BadInputError) where it is not possible; False: never.
        progress: one bar, "patching", counting the patched sequences (conditions x ``B``).
        plan: if a list is given, the passes run are appended to it (:class:`PatchPass`; count
            their cost with :func:`token_layers`).

    A condition whose earliest patch sits in block ``l > 0`` starts from ``resid_pre[l]``
    (layers ``< l`` are not recomputed); conditions starting at the same block share forward
    passes. Hooks are removed after every pass, also on errors.
    """
    hooked = _hooked(model)
    tokens = as_tokens(model, prompts)
    n_rows, n_pos = tokens.shape
    conditions = [[c] if isinstance(c, Patch) else list(c) for c in conditions]
    for condition in conditions:
        for patch in condition:
            if not isinstance(patch, Patch):
                raise BadInputError(f"a condition holds {type(patch).__name__}, expected Patch")
            patch.validate(hooked, n_pos)
    read = [act_name(n) for n in read]
    hook_dict = hooked.hook_dict  # once (a TransformerBridge resolves its aliases on every access)
    missing = [n for n in read if n not in hook_dict]
    if missing:
        raise BadInputError(f"the model has no hooks named {missing}")
    reuse = _decide_reuse(hooked, reuse_prefix, read)

    def start_of(condition: list[Patch]) -> tuple[int, int]:
        # An embedding-level condition runs from the tokens (block -1); the unpatched one, for a
        # logits metric, is read off the target run (position n_pos: nothing to compute).
        position = _first_position(condition, n_pos) if reuse or (not condition and not read) else 0
        layer = -1 if not condition or min(p.layer for p in condition) < 0 else min(p.layer for p in condition)
        if layer == 0 and position == 0:
            layer = -1
        return layer, position

    starts = [start_of(condition) for condition in conditions]
    passes = plan_passes(starts, n_rows, n_pos, batch_size)
    if resid_pre is not None and tuple(resid_pre.shape[1:3]) != (n_rows, n_pos):
        raise BadInputError(
            f"resid_pre cache has batch x pos {tuple(resid_pre.shape[1:3])} but the target "
            f"prompts are {(n_rows, n_pos)}; cache the same prompts"
        )
    target = _target_run(hooked, tokens, passes, resid_pre is None)
    if resid_pre is None and any(step.layer >= 0 for step in passes):
        resid_pre = torch.stack([target[f"blocks.{l}.hook_resid_pre"] for l in range(hooked.cfg.n_layers)])
    if plan is not None:
        plan.extend(passes)

    results: list[torch.Tensor | None] = [None] * len(conditions)
    with progress_bar("patching", total=len(conditions) * n_rows, enabled=progress) as bar:
        for step in passes:
            indices, repeats = step.conditions, len(step.conditions)
            if step.position >= n_pos:  # unpatched: the target run itself
                for index in indices:
                    results[index] = torch.as_tensor(metric(target[LOGITS])).detach()
                bar.update(repeats * n_rows)
                continue
            # one pass: the target rows repeated once per condition, each condition's patches
            # bound to its own block of rows
            patches = [dataclasses.replace(patch, rows=range(k * n_rows, (k + 1) * n_rows))
                       for k, index in enumerate(indices) for patch in conditions[index]]
            captured = WholeActivations(list(read) or [LOGITS])
            if step.layer < 0:
                x = tokens.repeat(repeats, 1)
            else:
                x = resid_pre[step.layer][:, step.position:].repeat(repeats, 1, 1)
            start_at = step.layer if step.layer >= 0 else None
            if step.position > 0:
                for patch in patches:  # stream checks its own patches; these go in as hooks
                    patch.check_prompts(len(x))
                hooks = _prefix_hooks(hooked, step, patches, target, repeats)
                stream(hooked, x, [captured], fwd_hooks=hooks, batch_size=len(x), start_at_layer=start_at,
                       progress=False, desc="patching")
                computed = captured.result()[LOGITS]
                prefix = target[LOGITS][:, :step.position].repeat(repeats, 1, 1)
                acts = {LOGITS: torch.cat([prefix.to(computed.dtype), computed], dim=1)}
            else:
                # reading hooks only: the pass stops after the last block read (no unembedding)
                stream(hooked, x, [captured], patches=patches, batch_size=len(x), start_at_layer=start_at,
                       progress=False, desc="patching")
                acts = captured.result()
            for k, index in enumerate(indices):
                rows = slice(k * n_rows, (k + 1) * n_rows)
                view = {name: act[rows] for name, act in acts.items()} if read else acts[LOGITS][rows]
                results[index] = torch.as_tensor(metric(view)).detach()
            bar.update(repeats * n_rows)
    return torch.stack(results) if results else torch.empty(0)


def _decide_reuse(hooked: HookedTransformer, reuse_prefix: bool | None, read: Sequence[str]) -> bool:
    if reuse_prefix is False:
        return False
    reason = prefix_reuse_unsupported(hooked)
    if reason is None and read:
        reason = "the metric reads hooks (read=), which would see only the computed positions"
    if reason is not None and reuse_prefix:
        raise BadInputError(f"cannot reuse the target run's prefix: {reason}; pass reuse_prefix=None "
                            "(reuse where possible) or False")
    return reason is None


def _target_run(
    hooked: HookedTransformer, tokens: Int[torch.Tensor, "batch pos"], passes: Sequence[PatchPass],
    need_resid: bool,
) -> dict[str, torch.Tensor]:
    """What the passes take from the unpatched target run, in one forward pass: ``resid_pre`` of
    every block (if ``need_resid`` and a pass resumes at a block), ``hook_k`` / ``hook_v`` of the
    blocks a prefix-reusing pass runs, and the logits (for the reused prefix, and for the
    unpatched condition)."""
    n_pos = tokens.shape[1]
    n_layers = hooked.cfg.n_layers
    names: list[str] = []
    if need_resid and any(step.layer >= 0 for step in passes):
        names += [f"blocks.{l}.hook_resid_pre" for l in range(n_layers)]
    reusing = [step for step in passes if 0 < step.position < n_pos]
    if reusing:
        first = min(max(step.layer, 0) for step in reusing)
        names += [f"blocks.{l}.attn.hook_{part}" for l in range(first, n_layers) for part in ("k", "v")]
    if reusing or any(step.position >= n_pos for step in passes):
        names.append(LOGITS)
    if not names:
        return {}
    cache = WholeActivations(names)
    stream(hooked, tokens, [cache], batch_size=max(1, len(tokens)), progress=False, desc="target run")
    return cache.result()


# --------------------------------------------------------------------------- entry points


def kv_head_of(model: ModelLike, head: int) -> int:
    """The checkpoint's key/value head that query head ``head`` reads: ``head // (n_heads /
    n_key_value_heads)`` with grouped-query attention, ``head`` itself without. (The hooks carry
    one ungrouped copy per query head; this names the weights the copy comes from.)"""
    cfg = model.model.cfg if isinstance(model, LoadedModel) else model.cfg
    if not cfg.n_key_value_heads:
        return head
    return head // (cfg.n_heads // cfg.n_key_value_heads)


def replacement_embedding(
    model: ModelLike,
    prompts: Prompts,
    replacement: Replacement,
    *,
    position: int = 0,
    token: int | None = None,
    seed: int = 0,
) -> Float[torch.Tensor, "batch d_model"]:
    """The vector that replaces the embedding at ``position`` (one row per prompt).

    - ``"token"``: the embedding of ``token`` (default: a token drawn with ``seed`` from the
      vocabulary, never the prompts' own token at ``position``).
    - ``"mean"``: the mean embedding over the whole vocabulary.
    - ``"random"``: a Gaussian direction (``seed``) scaled, per prompt, to the norm of the
      embedding it replaces.
    """
    hooked = _hooked(model)
    tokens = as_tokens(model, prompts)
    _check_position(position, tokens.shape[1])
    W_E = as_loaded(model).backend.W_E.detach()  # rows as hook_embed carries them (scaled, for Gemma)
    original = W_E[tokens[:, position]]
    if replacement == "token":
        if token is None:
            token = default_replacement_token(model, tokens, position=position, seed=seed)
        if not 0 <= token < hooked.cfg.d_vocab:
            raise BadInputError(f"replacement token {token} is outside the vocabulary")
        return W_E[token].expand_as(original).clone()
    if replacement == "mean":
        return W_E.mean(0).expand_as(original).clone()
    if replacement == "random":
        generator = torch.Generator().manual_seed(seed)
        direction = torch.randn(original.shape[-1], generator=generator).to(original)
        return direction / direction.norm() * original.norm(dim=-1, keepdim=True)
    raise BadInputError(f"unknown replacement {replacement!r}; use 'token', 'mean' or 'random'")


def default_replacement_token(
    model: ModelLike, prompts: Prompts, *, position: int = 0, seed: int = 0
) -> int:
    """A token drawn with ``seed`` from the vocabulary, avoiding every token the prompts hold
    at ``position`` (so the replacement really changes the input) and the tokenizer's
    special tokens (BOS, EOS, padding, chat markers), when there is a tokenizer."""
    loaded = as_loaded(model)
    hooked = loaded.model
    tokens = as_tokens(model, prompts)
    avoid = set(tokens[:, position].tolist())
    if loaded.tokenizer is not None:
        avoid |= set(getattr(loaded.tokenizer, "all_special_ids", []))
        avoid |= set(getattr(loaded.tokenizer, "added_tokens_decoder", {}).keys())
        limit = min(hooked.cfg.d_vocab, len(loaded.tokenizer))
    else:
        limit = hooked.cfg.d_vocab
    generator = torch.Generator().manual_seed(seed)
    for candidate in torch.randperm(limit, generator=generator).tolist():
        if candidate not in avoid:
            return candidate
    raise BadInputError("every vocabulary entry occurs at that position; pass token=")


def embedding_patch(
    model: ModelLike,
    prompts: Prompts,
    replacement: Replacement | torch.Tensor = "token",
    *,
    position: int = 0,
    token: int | None = None,
    seed: int = 0,
) -> Patch:
    """Replace the embedding at ``position`` (``hook_embed``) before the forward pass, with
    another token's embedding, the mean embedding, a random vector of the same norm
    (:func:`replacement_embedding`), or a given ``Float[Tensor, "d_model"]`` /
    ``Float[Tensor, "batch d_model"]``."""
    hooked = _hooked(model)
    if isinstance(replacement, torch.Tensor):
        _check_position(position, as_tokens(model, prompts).shape[1])
        value, label = replacement, "given"
    else:
        value = replacement_embedding(
            hooked, prompts, replacement, position=position, token=token, seed=seed
        )
        label = replacement
    return Patch("hook_embed", value, position=position, label=f"embed[{position}]={label}")


def resid_pre_patch(
    source: Any,
    layer: int,
    position: int,
) -> Patch:
    """``resid_pre[layer][:, position]`` from a source run: a TransformerLens
    ``ActivationCache`` (``model.run_with_cache``, :func:`cache_activations`) or a dict holding
    ``blocks.{layer}.hook_resid_pre``, or a :func:`resid_pre_stack`
    ``Float[Tensor, "layer batch pos d_model"]``."""
    name = f"blocks.{layer}.hook_resid_pre"
    if not isinstance(source, torch.Tensor):
        activation = source_activation(source, name)
    else:
        if not 0 <= layer < source.shape[0]:
            raise BadInputError(f"layer {layer} is out of range (source has {source.shape[0]})")
        activation = source[layer]
    _check_position(position, activation.shape[1])
    return Patch(name, activation[:, position], position=position,
                 label=f"resid_pre[{layer}][{position}]")


def head_kv_patches(
    model: ModelLike,
    source: dict[str, torch.Tensor],
    *,
    layer: int,
    head: int,
    position: int,
    parts: Sequence[Literal["k", "v"]] = ("k", "v"),
) -> list[Patch]:
    """One head's key and/or value at ``position`` from a source run.

    ``source`` holds ``blocks.{layer}.attn.hook_k`` / ``hook_v``: a TransformerLens
    ``ActivationCache`` or a dict (:func:`cache_activations`). ``head`` is a query head, for
    every model (:class:`Patch`): the patch reaches that head only, whatever the loader. A
    source cached from a grouped-query model before lens_position ungrouped it (``hook_k``
    with one entry per key/value head) is read at the key/value head of ``head``
    (:func:`kv_head_of`): the same vector.
    """
    hooked = as_loaded(model).model  # ungroups a bare grouped-query model's hooks
    _check_layer(hooked, layer)
    if not 0 <= head < hooked.cfg.n_heads:
        raise BadInputError(f"head {head} is out of range ({hooked.cfg.n_heads} heads)")
    patches = []
    for part in parts:
        name = f"blocks.{layer}.attn.hook_{part}"
        activation = source_activation(source, name)
        _check_position(position, activation.shape[1])
        n_source_heads = activation.shape[2]
        if n_source_heads == hooked.cfg.n_heads:
            index = head
        elif n_source_heads == (hooked.cfg.n_key_value_heads or hooked.cfg.n_heads):
            index = kv_head_of(hooked, head)
        else:
            raise BadInputError(f"the source's {name} has {n_source_heads} heads; the model has "
                                f"{hooked.cfg.n_heads} query heads and {hooked.cfg.n_key_value_heads} key/value heads")
        patches.append(Patch(name, activation[:, position, index], position=position,
                             head=head, label=f"{part}[{layer}.{head}][{position}]"))
    return patches


def head_ablation(
    model: ModelLike,
    heads: Sequence[tuple[int, int]],
    kind: Literal["zero", "mean"] = "zero",
    *,
    reference: Any = None,
) -> list[Patch]:
    """Ablate heads by setting their output ``z`` (``blocks.l.attn.hook_z``, before ``W_O``)
    at every position: to zero, or to its mean over the prompts and positions of
    ``reference`` (a PromptSet or token tensor, or the already cached activations of such a
    run, ``{"blocks.l.attn.hook_z": Float[Tensor, "batch pos head d_head"]}``; required for
    ``kind="mean"``)."""
    hooked = _hooked(model)
    for layer, head in heads:
        _check_layer(hooked, layer)
        if not 0 <= head < hooked.cfg.n_heads:
            raise BadInputError(f"head {head} is out of range ({hooked.cfg.n_heads} heads)")
    if kind == "zero":
        return [Patch(f"blocks.{l}.attn.hook_z", 0.0, head=h, label=f"zero[{l}.{h}]")
                for l, h in heads]
    if kind != "mean":
        raise BadInputError(f"unknown ablation {kind!r}; use 'zero' or 'mean'")
    if reference is None:
        raise BadInputError("mean ablation needs reference prompts to take the mean over")
    names = sorted({f"blocks.{l}.attn.hook_z" for l, _ in heads})
    if isinstance(reference, Mapping) or isinstance(reference, TransformerLensCache):
        missing = [name for name in names if name not in reference]
        if missing:
            raise BadInputError(f"the reference activations lack {missing}; cache them first")
        store = reference
    else:
        store = cache_activations(hooked, reference, names)
    return [Patch(f"blocks.{l}.attn.hook_z", store[f"blocks.{l}.attn.hook_z"][:, :, h].mean((0, 1)),
                  head=h, label=f"mean[{l}.{h}]") for l, h in heads]


# --------------------------------------------------------------------------- sweeps

# The activations a sweep patches, as TransformerLens names them; "z" is per head.
SWEPT_ACTIVATIONS = {
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "z": "blocks.{layer}.attn.hook_z",
}
Reduce = Literal["scalar", "none"]


@dataclass(repr=False)
class PatchSweep(SavedResult):
    """A metric per patch condition (cell), named as TransformerLens 4.3's ``PatchingResult``
    where the meaning is the same.

    - ``values``: ``[layer, pos]`` (``[layer, pos, head]`` for a per-head sweep) in the order of
      the swept layers, positions and heads (row ``i`` is ``layers[i]``: like the model when every
      layer is swept); with ``reduced = False`` (``reduce="none"``) one more, last axis: the
      target prompts.
    - ``baseline``: the metric of the unpatched target run (``[batch]`` per prompt, or a scalar),
      read off the target run (no extra forward pass).
    - ``frame``: one row per cell with the real ``layer``, ``position`` (and ``head``) and
      ``metric`` (the mean over prompts); with per-prompt values also ``metric_lo`` /
      ``metric_hi`` and ``effect`` (mean of ``values - baseline``), ``effect_lo`` / ``effect_hi``
      (bootstrap intervals resampling whole prompts, :func:`lens_position.core.intervals.bootstrap_mean`)
      and ``p_value`` (sign-flip permutation test of "no effect",
      :func:`lens_position.core.intervals.sign_flip_pvalue`). What
      :func:`lens_position.report.plots.patching_sweep` and ``patching_sweep_intervals`` draw.
    """

    values: torch.Tensor
    frame: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    reduced: bool = True
    baseline: torch.Tensor | None = None
    axis_names: list[str] = field(default_factory=lambda: ["layer", "pos"])

    def _require_per_prompt(self, what: str) -> None:
        if self.reduced:
            raise BadInputError(f"{what} needs per-prompt values: run the sweep with reduce='none' (a metric "
                                "returning one value per target prompt)")

    def mean(self) -> torch.Tensor:
        """The mean over prompts per cell (``values`` itself when already reduced)."""
        return self.values if self.reduced else self.values.mean(-1)

    WHAT = "a patching sweep: the metric per patched (layer, position)"

    def headline(self) -> list[Headline]:
        """The largest and smallest metric value and where they are."""
        values = self.values.detach().to(torch.float64).cpu().reshape(-1)
        if values.numel() == 0 or len(self.frame) != values.numel():
            return []
        out = []
        for what, index in (("largest", int(values.argmax())), ("smallest", int(values.argmin()))):
            row = self.frame.iloc[index]
            where = ", ".join(f"{c} {int(row[c])}" for c in ("layer", "position") if c in self.frame.columns)
            out.append(Headline("metric", f"{what} metric ({where})", Estimate(float(values[index])), "metric(logits)"))
        return out

    def effect(self) -> torch.Tensor:
        """``values - baseline``: what each patch changes in the unpatched target run, per prompt."""
        if self.baseline is None:
            raise BadInputError("this sweep has no baseline (a sweep saved before baselines were kept)")
        return self.values - self.baseline

    def stderr(self) -> torch.Tensor:
        """Standard error of the mean over prompts per cell."""
        self._require_per_prompt("stderr")
        return self.values.std(-1) / self.values.shape[-1] ** 0.5

    def bootstrap_ci(self, *, bootstrap: Bootstrap = Bootstrap(), of_effect: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(lo, hi)`` per cell: the percentile bootstrap interval of the mean over prompts
        (whole prompts resampled), of ``values`` or with ``of_effect`` of :meth:`effect`."""
        self._require_per_prompt("bootstrap_ci")
        data = self.effect() if of_effect else self.values
        _, lo, hi = bootstrap_mean(np.moveaxis(data.double().cpu().numpy(), -1, 0), bootstrap)
        return torch.as_tensor(lo), torch.as_tensor(hi)

    def permutation_pvalue(self, *, n_permutations: int = 1000, seed: int = 0) -> torch.Tensor:
        """Two-sided sign-flip permutation p-value per cell that the mean :meth:`effect` is zero
        (exact for 12 prompts or fewer)."""
        self._require_per_prompt("permutation_pvalue")
        effects = np.moveaxis(self.effect().double().cpu().numpy(), -1, 0)
        return torch.as_tensor(sign_flip_pvalue(effects, n_permutations=n_permutations, seed=seed))


def activation_sweep(
    model: ModelLike,
    target: Any,
    source: Any,
    metric: Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor],
    activation: str = "resid_pre",
    *,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    batch_size: int = 64,
    reuse_prefix: bool | None = None,
    reduce: Reduce = "scalar",
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> PatchSweep:
    """Patch ``activation`` (a :data:`SWEPT_ACTIVATIONS` key) at every layer x position (x head,
    for ``"z"``) from the ``source`` run into the ``target`` run; ``metric(logits)`` of each.

    ``source``: the source prompts (PromptSet or tokens, run here), or the source run's
    activations already cached, a TransformerLens ``ActivationCache`` (``model.run_with_cache``)
    or a dict holding the patched hook of the swept layers.

    The same computation as TransformerLens's ``get_act_patch_resid_pre`` / ``_attn_out`` /
    ``_attn_head_out_by_pos`` (there "corrupted" = our target, "clean" = our source), resumed at
    each layer, batched over positions and heads, and computing only the positions a patch can
    change (``reuse_prefix``, :func:`run_patches`). ``metric`` returns a scalar (``reduce =
    "scalar"``) or, with ``reduce="none"``, one value per target prompt (``[batch]``): the cells
    then carry intervals and p-values over prompts (:class:`PatchSweep`; ``bootstrap`` sets
    them), computed from the same passes. ``progress``: one bar counting the patched sequences.
    """
    if activation not in SWEPT_ACTIVATIONS:
        raise BadInputError(f"unknown activation {activation!r}; sweep one of {list(SWEPT_ACTIVATIONS)}")
    if reduce not in ("scalar", "none"):
        raise BadInputError(f"reduce must be 'scalar' or 'none', got {reduce!r}")
    hooked = _hooked(model)
    target_tokens = as_tokens(model, target)
    n_rows, n_pos = target_tokens.shape
    cached = not isinstance(source, torch.Tensor) and hasattr(source, "keys")
    if not cached:
        check_same_layout(target, source)
    layers = list(range(hooked.cfg.n_layers)) if layers is None else list(layers)
    positions = list(range(n_pos)) if positions is None else list(positions)
    per_head = activation == "z"
    if heads is not None and not per_head:
        raise BadInputError(f"heads= applies to the per-head sweep (activation='z'), not {activation!r}")
    heads = (list(range(hooked.cfg.n_heads)) if heads is None else list(heads)) if per_head else [None]
    for layer in layers:
        _check_layer(hooked, layer)
    for position in positions:
        _check_position(position, n_pos)
    for head in heads:
        if head is not None and not 0 <= head < hooked.cfg.n_heads:
            raise BadInputError(f"head {head} is out of range ({hooked.cfg.n_heads} heads)")
    names = [SWEPT_ACTIVATIONS[activation].format(layer=layer) for layer in layers]
    if reduce == "none" and n_rows < 2:
        raise BadInputError("reduce='none' gives intervals over target prompts: pass at least 2 prompts")
    per_prompt = reduce == "none"

    def checked(values: torch.Tensor) -> torch.Tensor:
        shape = (n_rows,) if per_prompt else ()
        if tuple(values.shape) != shape:
            raise BadInputError(f"the metric returned shape {tuple(values.shape)}; under reduce={reduce!r} it must "
                                f"return {'one value per target prompt, ' if per_prompt else 'a scalar, '}"
                                f"shape {shape}")
        return values

    with progress_bar(f"{activation} sweep", enabled=progress):
        if cached:
            store = {name: source_activation(source, name) for name in names}
            for name, act in store.items():
                if tuple(act.shape[:2]) != tuple(target_tokens.shape):
                    raise BadInputError(f"the source cache holds batch x pos {tuple(act.shape[:2])} at {name} but "
                                        f"the target tokens are {tuple(target_tokens.shape)}; cache a run of the "
                                        "same shape")
        else:
            store = cache_activations(hooked, as_tokens(model, source), names)
        conditions = [[Patch(name, store[name][:, p] if head is None else store[name][:, p, head],
                             position=p, head=head, label=f"{activation}[{layer}][{p}]")]
                      for layer, name in zip(layers, names) for p in positions for head in heads]
        plan: list[PatchPass] = []
        flat = run_patches(hooked, target_tokens, conditions + [[]], lambda logits: checked(
            torch.as_tensor(metric(logits))), batch_size=batch_size, reuse_prefix=reuse_prefix, plan=plan,
            progress=progress)
    baseline, flat = flat[-1], flat[:-1]
    shape = (len(layers), len(positions)) + ((len(heads),) if per_head else ())
    values = flat.reshape(*shape, *flat.shape[1:])
    index = [(l, p, h) for l in layers for p in positions for h in heads]
    frame = pd.DataFrame([row[:3] if per_head else row[:2] for row in index],
                         columns=["layer", "position", "head"][:3 if per_head else 2])
    sweep = PatchSweep(values=values, frame=frame, reduced=not per_prompt, baseline=baseline,
                       axis_names=["layer", "pos"] + (["head"] if per_head else []))
    frame["metric"] = sweep.mean().reshape(-1).double().cpu().numpy()
    if per_prompt:
        lo, hi = sweep.bootstrap_ci(bootstrap=bootstrap)
        effect_lo, effect_hi = sweep.bootstrap_ci(bootstrap=bootstrap, of_effect=True)
        frame["metric_lo"], frame["metric_hi"] = lo.reshape(-1).numpy(), hi.reshape(-1).numpy()
        frame["effect"] = sweep.effect().mean(-1).reshape(-1).double().cpu().numpy()
        frame["effect_lo"], frame["effect_hi"] = effect_lo.reshape(-1).numpy(), effect_hi.reshape(-1).numpy()
        frame["p_value"] = sweep.permutation_pvalue(seed=bootstrap.seed).reshape(-1).numpy()
    sweep.frame = recommended_first(frame)  # the columns computed from the sweep itself, added after it was built
    n_layers = hooked.cfg.n_layers
    sweep.provenance = provenance.collect(
        model=model if isinstance(model, LoadedModel) else None,
        data=getattr(target, "spec", None), activation=activation,
        source=("cached activations" if cached else getattr(getattr(source, "spec", None), "to_dict", lambda: None)()),
        batch_size=batch_size, reduce=reduce,
        reuse_prefix=any(0 < step.position < n_pos for step in plan),
        token_layers=token_layers(plan, n_rows, n_pos, n_layers),
        intervals=bootstrap.to_dict(unit="prompt") if per_prompt else None)
    return sweep


def resid_pre_sweep(
    model: ModelLike,
    target: Any,
    source: Any,
    metric: Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor],
    *,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    batch_size: int = 64,
    reuse_prefix: bool | None = None,
    reduce: Reduce = "scalar",
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> PatchSweep:
    """Patch ``resid_pre[layer][:, pos]`` from the ``source`` run into the ``target`` run,
    for every layer x position; ``metric(logits)`` of each (:func:`activation_sweep`).

    The same computation as ``transformer_lens.patching.get_act_patch_resid_pre(model,
    target_tokens, source_cache, metric)`` (:func:`get_act_patch_resid_pre` takes those
    arguments). ``values``: ``Float[Tensor, "layer pos"]``, row ``i`` for ``layers[i]`` (a last
    prompt axis with ``reduce="none"``). ``progress``: one bar, "resid_pre sweep", counting the
    patched sequences (layers x positions x target prompts).
    """
    return activation_sweep(model, target, source, metric, "resid_pre", layers=layers, positions=positions,
                            batch_size=batch_size, reuse_prefix=reuse_prefix, reduce=reduce, bootstrap=bootstrap,
                            progress=progress)


def min_token_layers(layers: Sequence[int], positions: Sequence[int], n_rows: int, n_pos: int,
                     n_layers: int, n_heads: int = 1) -> int:
    """The floor of a sweep: token-layers that a patch at each (layer, position) can change,
    ``n_rows · (n_pos - position) · (n_layers - layer)`` summed over the cells (x ``n_heads``)."""
    return n_heads * n_rows * sum((n_pos - p) * (n_layers - l) for l in layers for p in positions)


_METRIC = Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor]


def get_act_patch_resid_pre(model: ModelLike, corrupted_tokens: Int[torch.Tensor, "batch pos"],
                            clean_cache: Any, patching_metric: _METRIC, *, batch_size: int = 64,
                            reuse_prefix: bool | None = None) -> Float[torch.Tensor, "layer pos"]:
    """``transformer_lens.patching.get_act_patch_resid_pre`` with its arguments and result: for every
    layer and position, the corrupted run with ``resid_pre`` there taken from ``clean_cache`` (an
    ``ActivationCache`` from ``model.run_with_cache(clean_tokens)``), scored by
    ``patching_metric(logits)``. The same numbers, computed by :func:`activation_sweep`."""
    return activation_sweep(model, corrupted_tokens, clean_cache, patching_metric, "resid_pre", batch_size=batch_size,
                            reuse_prefix=reuse_prefix, progress=False).values


def get_act_patch_attn_out(model: ModelLike, corrupted_tokens: Int[torch.Tensor, "batch pos"],
                           clean_cache: Any, patching_metric: _METRIC, *, batch_size: int = 64,
                           reuse_prefix: bool | None = None) -> Float[torch.Tensor, "layer pos"]:
    """``transformer_lens.patching.get_act_patch_attn_out``: :func:`get_act_patch_resid_pre` with
    ``blocks.l.hook_attn_out`` patched."""
    return activation_sweep(model, corrupted_tokens, clean_cache, patching_metric, "attn_out", batch_size=batch_size,
                            reuse_prefix=reuse_prefix, progress=False).values


def get_act_patch_mlp_out(model: ModelLike, corrupted_tokens: Int[torch.Tensor, "batch pos"],
                          clean_cache: Any, patching_metric: _METRIC, *, batch_size: int = 64,
                          reuse_prefix: bool | None = None) -> Float[torch.Tensor, "layer pos"]:
    """``transformer_lens.patching.get_act_patch_mlp_out``: :func:`get_act_patch_resid_pre` with
    ``blocks.l.hook_mlp_out`` patched."""
    return activation_sweep(model, corrupted_tokens, clean_cache, patching_metric, "mlp_out", batch_size=batch_size,
                            reuse_prefix=reuse_prefix, progress=False).values


def get_act_patch_attn_head_out_by_pos(
    model: ModelLike, corrupted_tokens: Int[torch.Tensor, "batch pos"], clean_cache: Any,
    patching_metric: _METRIC, *, batch_size: int = 64, reuse_prefix: bool | None = None,
) -> Float[torch.Tensor, "layer pos head"]:
    """``transformer_lens.patching.get_act_patch_attn_head_out_by_pos``: for every layer, position
    and head, the corrupted run with that head's ``blocks.l.attn.hook_z`` there taken from
    ``clean_cache``, scored by ``patching_metric(logits)`` (:func:`activation_sweep`, ``"z"``)."""
    return activation_sweep(model, corrupted_tokens, clean_cache, patching_metric, "z", batch_size=batch_size,
                            reuse_prefix=reuse_prefix, progress=False).values
