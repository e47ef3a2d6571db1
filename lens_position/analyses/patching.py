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
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from transformer_lens import HookedTransformer
from transformer_lens.ActivationCache import ActivationCache as TransformerLensCache

from lens_position.ground import provenance
from lens_position.core.patch import (Condition, Patch, _check_layer, _check_position, act_name,  # noqa: F401
                                       patches_as_hooks, source_activation)
from lens_position.ground.errors import BadInputError
from lens_position.core.inputs import checked_prompts
from lens_position.models.spec import LoadedModel, as_loaded
from lens_position.ground.progress import progress as progress_bar
from lens_position.core.results import SavedResult
from lens_position.core.stream import LOGITS, WholeActivations, stream

Replacement = Literal["token", "mean", "random"]


# --------------------------------------------------------------------------- inputs


def _hooked(model: LoadedModel | HookedTransformer) -> HookedTransformer:
    return as_loaded(model).model


def as_tokens(model: LoadedModel | HookedTransformer, prompts: Any) -> Int[torch.Tensor, "batch pos"]:
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
    model: LoadedModel | HookedTransformer,
    prompts: Any,
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
    model: LoadedModel | HookedTransformer, prompts: Any
) -> Float[torch.Tensor, "layer batch pos d_model"]:
    """``resid_pre`` of every block on ``prompts``, stacked: the cache that patches resume from."""
    hooked = _hooked(model)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(hooked.cfg.n_layers)]
    store = cache_activations(model, prompts, names)
    return torch.stack([store[n] for n in names])


# --------------------------------------------------------------------------- the engine


def run_patches(
    model: LoadedModel | HookedTransformer,
    prompts: Any,
    conditions: Sequence[Condition | Patch],
    metric: Callable[[Any], torch.Tensor],
    *,
    read: Sequence[str] = (),
    resid_pre: Float[torch.Tensor, "layer batch pos d_model"] | None = None,
    batch_size: int = 64,
    progress: bool = True,
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
        progress: one bar, "patching", counting the patched sequences (conditions x ``B``).

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
    missing = [n for n in read if n not in hooked.hook_dict]
    if missing:
        raise BadInputError(f"the model has no hooks named {missing}")

    def start_of(condition: list[Patch]) -> int:
        # An unpatched or embedding-level condition runs from the tokens (start 0).
        return max(0, min((p.layer for p in condition), default=0))

    by_start: dict[int, list[int]] = defaultdict(list)
    for index, condition in enumerate(conditions):
        by_start[start_of(condition)].append(index)
    if resid_pre is None and any(start > 0 for start in by_start):
        resid_pre = resid_pre_stack(hooked, tokens)
    if resid_pre is not None and tuple(resid_pre.shape[1:3]) != (n_rows, n_pos):
        raise BadInputError(
            f"resid_pre cache has batch x pos {tuple(resid_pre.shape[1:3])} but the target "
            f"prompts are {(n_rows, n_pos)}; cache the same prompts"
        )

    per_pass = max(1, batch_size // n_rows)
    passes = [
        (start, indices[i : i + per_pass])
        for start, indices in sorted(by_start.items())
        for i in range(0, len(indices), per_pass)
    ]
    results: list[torch.Tensor | None] = [None] * len(conditions)
    with progress_bar("patching", total=len(conditions) * n_rows, enabled=progress) as bar:
        for start, indices in passes:
            # one pass: the target rows repeated once per condition, each condition's patches
            # bound to its own block of rows
            patches = [dataclasses.replace(patch, rows=range(k * n_rows, (k + 1) * n_rows))
                       for k, index in enumerate(indices) for patch in conditions[index]]
            captured = WholeActivations(list(read) or [LOGITS])
            repeats = len(indices)
            x = resid_pre[start].repeat(repeats, 1, 1) if start > 0 else tokens.repeat(repeats, 1)
            # reading hooks only: the pass stops after the last block read (no unembedding)
            stream(hooked, x, [captured], patches=patches, batch_size=len(x), start_at_layer=start or None,
                   progress=False, desc="patching")
            acts = captured.result()
            for k, index in enumerate(indices):
                rows = slice(k * n_rows, (k + 1) * n_rows)
                view = {name: act[rows] for name, act in acts.items()} if read else acts[LOGITS][rows]
                results[index] = torch.as_tensor(metric(view)).detach()
            bar.update(len(indices) * n_rows)
    return torch.stack(results) if results else torch.empty(0)


# --------------------------------------------------------------------------- entry points


def kv_head_of(model: LoadedModel | HookedTransformer, head: int) -> int:
    """The checkpoint's key/value head that query head ``head`` reads: ``head // (n_heads /
    n_key_value_heads)`` with grouped-query attention, ``head`` itself without. (The hooks carry
    one ungrouped copy per query head; this names the weights the copy comes from.)"""
    cfg = model.model.cfg if isinstance(model, LoadedModel) else model.cfg
    if not cfg.n_key_value_heads:
        return head
    return head // (cfg.n_heads // cfg.n_key_value_heads)


def replacement_embedding(
    model: LoadedModel | HookedTransformer,
    prompts: Any,
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
    W_E = hooked.W_E.detach()
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
    model: LoadedModel | HookedTransformer, prompts: Any, *, position: int = 0, seed: int = 0
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
    model: LoadedModel | HookedTransformer,
    prompts: Any,
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
    model: LoadedModel | HookedTransformer,
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
    model: LoadedModel | HookedTransformer,
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


@dataclass
class PatchSweep(SavedResult):
    """A metric per patch condition. ``values``: ``[layer, pos]`` for a resid_pre sweep, in the
    order of the swept layers and positions (row ``i`` is ``layers[i]``: like the model when
    every layer is swept); ``frame`` has one row per condition with the real ``layer`` and
    ``position`` (what :func:`lens_position.report.plots.patching_sweep` draws)."""

    values: torch.Tensor
    frame: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)


def resid_pre_sweep(
    model: LoadedModel | HookedTransformer,
    target: Any,
    source: Any,
    metric: Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor],
    *,
    layers: Sequence[int] | None = None,
    positions: Sequence[int] | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> PatchSweep:
    """Patch ``resid_pre[layer][:, pos]`` from the ``source`` run into the ``target`` run,
    for every layer x position; ``metric(logits)`` (a scalar per condition) of each.

    ``source``: the source prompts (PromptSet or tokens, run here), or the source run's
    activations already cached, a TransformerLens ``ActivationCache`` (``model.run_with_cache``)
    or a dict, holding ``blocks.{l}.hook_resid_pre`` of the swept layers.

    The same computation as ``transformer_lens.patching.get_act_patch_resid_pre(model,
    target_tokens, source_cache, metric)`` (there "corrupted" = our target, "clean" = our
    source; :func:`get_act_patch_resid_pre` takes those arguments), resumed at each layer and
    batched over positions. ``values``: ``Float[Tensor, "layer pos"]``, row ``i`` for
    ``layers[i]``. ``progress``: one bar, "resid_pre sweep", counting the patched sequences
    (layers x positions x target prompts).
    """
    hooked = _hooked(model)
    target_tokens = as_tokens(model, target)
    cached = not isinstance(source, torch.Tensor) and hasattr(source, "keys")
    if not cached:
        check_same_layout(target, source)
    n_pos = target_tokens.shape[1]
    layers = list(range(hooked.cfg.n_layers)) if layers is None else list(layers)
    positions = list(range(n_pos)) if positions is None else list(positions)
    for layer in layers:
        _check_layer(hooked, layer)
    for position in positions:
        _check_position(position, n_pos)
    if cached:
        for layer in layers:
            shape = tuple(source_activation(source, f"blocks.{layer}.hook_resid_pre").shape[:2])
            if shape != tuple(target_tokens.shape):
                raise BadInputError(f"the source cache holds batch x pos {shape} at layer {layer} but the target "
                                    f"tokens are {tuple(target_tokens.shape)}; cache a run of the same shape")
    with progress_bar("resid_pre sweep", enabled=progress):
        source_run = source if cached else resid_pre_stack(hooked, as_tokens(model, source))
        conditions = [[resid_pre_patch(source_run, l, p)] for l in layers for p in positions]
        flat = run_patches(hooked, target_tokens, conditions, metric, batch_size=batch_size)
    values = flat.reshape(len(layers), len(positions), *flat.shape[1:])
    frame = pd.DataFrame(
        [(l, p) for l in layers for p in positions], columns=["layer", "position"]
    )
    if flat.ndim == 1:
        frame["metric"] = flat.cpu().numpy()
    return PatchSweep(values=values, frame=frame, provenance=provenance.collect(
        model=model if isinstance(model, LoadedModel) else None,
        data=getattr(target, "spec", None), activation="resid_pre",
        source=("cached activations" if cached else getattr(getattr(source, "spec", None), "to_dict", lambda: None)()),
        batch_size=batch_size))


def get_act_patch_resid_pre(
    model: LoadedModel | HookedTransformer,
    corrupted_tokens: Int[torch.Tensor, "batch pos"],
    clean_cache: Any,
    patching_metric: Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor],
    *,
    batch_size: int = 64,
) -> Float[torch.Tensor, "layer pos"]:
    """``transformer_lens.patching.get_act_patch_resid_pre`` with its arguments and result: for
    every layer and position, the corrupted run with ``resid_pre`` there taken from
    ``clean_cache`` (an ``ActivationCache`` from ``model.run_with_cache(clean_tokens)``), scored
    by ``patching_metric(logits)``. The same numbers, computed by :func:`resid_pre_sweep`
    (resumed at each layer, batched over positions)."""
    return resid_pre_sweep(model, corrupted_tokens, clean_cache, patching_metric, batch_size=batch_size).values
