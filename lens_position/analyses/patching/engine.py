"""The patching engine: a list of conditions (each a list of :class:`Patch`) run on the target
prompts in as few forward passes as the model allows, each condition's run reduced by a metric.

:func:`run_patches` resumes a condition from the cached residual of the block of its earliest
patch (layers before it are not recomputed), batches conditions (the target rows repeated once per
condition, each condition's patches bound to its own rows), and, where the model's attention
allows it (:func:`prefix_reuse_unsupported`), computes only the positions a patch can change, the
earlier ones taken from the unpatched target run. :func:`plan_passes` decides which conditions
share a pass; :func:`token_layers` counts what a plan computes. The named patches
(:mod:`lens_position.analyses.patching.patches`) and the sweeps
(:mod:`lens_position.analyses.patching.sweeps`) are built on it.
"""

from __future__ import annotations

import dataclasses
import numbers
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from jaxtyping import Float, Int

if TYPE_CHECKING:
    from transformer_lens.ActivationCache import ActivationCache

from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.patch import Condition, Patch, act_name
from lens_position.core.stream import LOGITS, WholeActivations, checked_fwd_hooks, stream
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public


def as_tokens(loaded: LoadedModel, prompts: Prompts) -> Int[torch.Tensor, "batch pos"]:
    """The token tensor of ``prompts``, checked by the input door
    (:func:`lens_position.core.inputs.checked_prompts`: ids in the vocabulary, length within the
    context, no padding), on the model's device. It issues no position warnings: it also reads
    the token variants the analyses build on purpose (position 0 replaced, BOS removed); each
    analysis's entry has checked the user's prompts (:mod:`lens_position.core.positions`)."""
    return checked_prompts(loaded, prompts, hygiene=False).tokens.to(loaded.backend.device)


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


@public
def cache_activations(
    loaded: LoadedModel,
    prompts: Prompts,
    names: Sequence[str],
    *,
    fwd_hooks: Sequence[tuple[str, Callable]] = (),
) -> ActivationCache:
    """Run once and keep only the activations named in ``names`` (the whole batch), as a
    TransformerLens ``ActivationCache``: index it by name, ``get_act_name`` or tuple
    (``cache["resid_pre", 3]``), use its helpers (``accumulated_resid``, ...), pass it as the
    source of a patch. ``names`` may be written in any form :func:`act_name` accepts.

    ``fwd_hooks`` (e.g. ``Patch.hook()``) apply during the run; they are removed after it.
    The forward pass stops after the last block that is read.
    """
    tokens = as_tokens(loaded, prompts)
    names = [act_name(name) for name in names]
    cache = WholeActivations(names)
    hooks = checked_fwd_hooks(fwd_hooks, loaded.backend.hook_dict)
    stream.body(loaded, tokens, [cache], fwd_hooks=hooks, batch_size=max(1, len(tokens)), progress=False,
           desc="cache activations")
    from transformer_lens.ActivationCache import ActivationCache

    return ActivationCache(cache.result(), loaded.model)


@public
def resid_pre_stack(
    loaded: LoadedModel, prompts: Prompts
) -> Float[torch.Tensor, "layer batch pos d_model"]:
    """``resid_pre`` of every block on ``prompts``, stacked: the cache that patches resume from."""
    names = [f"blocks.{layer}.hook_resid_pre" for layer in range(loaded.backend.n_layers)]
    store = cache_activations.body(loaded, prompts, names)
    return torch.stack([store[n] for n in names])


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


@public
def prefix_reuse_unsupported(loaded: LoadedModel) -> str | None:
    """Why ``model`` cannot reuse the target run's prefix (None: it can).

    Prefix reuse computes positions ``>= p`` only and hands attention the target run's keys and
    values of the positions before ``p`` through ``hook_k`` / ``hook_v``, with the queries padded
    at ``hook_q`` so that TransformerLens applies rotary positions, the causal mask and sliding
    windows at their absolute positions, and ``hook_z`` cut back to the computed positions. The
    model's backend says whether its attention can (``ModelBackend.prefix_reuse_unsupported``): a
    ``HookedTransformer`` with causal attention whose position information is rotary or already in
    the residual stream can; a ``TransformerBridge``, which computes rotary positions from the length
    of the sequence it is given, cannot."""
    return loaded.backend.prefix_reuse_unsupported()


def _first_position(condition: Sequence[Patch], n_pos: int) -> int:
    """The first position a condition can change (causal attention: none before it); ``n_pos``
    for the unpatched run; 0 for an embedding-level patch or one at every position."""
    if not condition:
        return n_pos
    positions = [p.position for p in condition]
    if any(position is None for position in positions) or any(p.layer < 0 for p in condition):
        return 0
    return min(position for position in positions if position is not None)


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
        best, cut = np.zeros(n + 1), np.zeros(n + 1, dtype=np.int64)  # type: np.ndarray, np.ndarray
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
    n_layers: int,
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
        else:  # a patch at every position starts the pass at 0: reusing passes have positions
            assert patch.position is not None
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
    for layer in range(max(step.layer, 0), n_layers):
        attn = f"blocks.{layer}.attn"
        hooks += [hook(f"{attn}.hook_q", before=pad), hook(f"{attn}.hook_k", before=prepend(f"{attn}.hook_k")),
                  hook(f"{attn}.hook_v", before=prepend(f"{attn}.hook_v")),
                  hook(f"{attn}.hook_z", after=lambda activation: activation[:, start:])]
    handled = {name for name, _ in hooks}
    hooks += [hook(name) for name in by_name if name not in handled]
    return hooks


@public
def run_patches(
    loaded: LoadedModel,
    prompts: Prompts,
    conditions: Sequence[Condition | Patch],
    metric: Callable[[Any], torch.Tensor],
    *,
    read: Sequence[str] = (),
    select: Callable[[torch.Tensor], torch.Tensor] | None = None,
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
        select: narrows each activation in ``read`` as it is captured (``lambda a: a[:, :, :32]``:
            32 query rows of a pattern), so a pass keeps only what ``metric`` reads.
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
    tokens = as_tokens(loaded, prompts)
    n_rows, n_pos = tokens.shape
    conditions = _checked_conditions(loaded, conditions, n_pos)
    read = [act_name(n) for n in read]
    hook_dict = loaded.backend.hook_dict  # once (a TransformerBridge resolves its aliases on every access)
    if missing := [n for n in read if n not in hook_dict]:
        raise BadInputError(f"the model has no hooks named {missing}")
    reuse = _decide_reuse(loaded, reuse_prefix, read)
    passes = plan_passes([_start_of(condition, n_pos, reuse, bool(read)) for condition in conditions],
                         n_rows, n_pos, batch_size)
    if resid_pre is not None and tuple(resid_pre.shape[1:3]) != (n_rows, n_pos):
        raise BadInputError(f"resid_pre cache has batch x pos {tuple(resid_pre.shape[1:3])} but the target "
                            f"prompts are {(n_rows, n_pos)}; cache the same prompts")
    target = _target_run(loaded, tokens, passes, resid_pre is None)
    if resid_pre is None and any(step.layer >= 0 for step in passes):
        resid_pre = torch.stack([target[f"blocks.{layer}.hook_resid_pre"] for layer in range(loaded.backend.n_layers)])
    if plan is not None:
        plan.extend(passes)
    results: list[torch.Tensor] = [torch.empty(0)] * len(conditions)
    with progress_bar("patching", total=len(conditions) * n_rows, enabled=progress) as bar:
        for step in passes:
            if step.position >= n_pos:  # unpatched: the target run itself
                for index in step.conditions:
                    results[index] = metric_value(metric(target[LOGITS]))
            else:
                acts = _run_pass(loaded, step, [conditions[index] for index in step.conditions], tokens, resid_pre,
                                 target, read, select)
                for k, index in enumerate(step.conditions):
                    rows = slice(k * n_rows, (k + 1) * n_rows)
                    view = {name: act[rows] for name, act in acts.items()} if read else acts[LOGITS][rows]
                    results[index] = metric_value(metric(view))
            bar.update(len(step.conditions) * n_rows)
    return torch.stack(results) if results else torch.empty(0)


def metric_value(returned: Any) -> torch.Tensor:
    """What a metric returned, as a detached tensor; BadInputError for anything but a tensor, an
    array or a number (a string, a dict, None: a metric that forgot its ``return``)."""
    if isinstance(returned, torch.Tensor):
        return returned.detach()
    if isinstance(returned, (numbers.Real, np.ndarray, np.generic)) and not isinstance(returned, bool):
        try:
            return torch.as_tensor(np.asarray(returned, dtype=np.float64))
        except (TypeError, ValueError) as error:
            raise BadInputError(f"the metric returned an array that is not numbers ({error})") from error
    raise BadInputError(f"the metric returned {type(returned).__name__} {returned!r:.80}; it must return a tensor "
                        "or a number (e.g. logits[:, -1, answer].mean()); did it forget its return?")


def _checked_conditions(loaded: LoadedModel, conditions: Sequence[Condition | Patch], n_pos: int) -> list[list[Patch]]:
    """Every condition as a list of patches, each patch checked against the model."""
    out = [[c] if isinstance(c, Patch) else list(c) for c in conditions]
    for condition in out:
        for patch in condition:
            if not isinstance(patch, Patch):
                raise BadInputError(f"a condition holds {type(patch).__name__}, expected Patch")
            patch.validate(loaded.backend, n_pos)
    return out


def _start_of(condition: list[Patch], n_pos: int, reuse: bool, reads: bool) -> tuple[int, int]:
    """The block and position a condition's pass starts from. An embedding-level condition runs from
    the tokens (block -1); the unpatched one, for a logits metric, is read off the target run
    (position ``n_pos``: nothing to compute)."""
    position = _first_position(condition, n_pos) if reuse or (not condition and not reads) else 0
    layer = -1 if not condition or min(p.layer for p in condition) < 0 else min(p.layer for p in condition)
    if layer == 0 and position == 0:
        layer = -1
    return layer, position


def _run_pass(loaded: LoadedModel, step: PatchPass, conditions: Sequence[list[Patch]],
              tokens: Int[torch.Tensor, "batch pos"], resid_pre: torch.Tensor | None,
              target: Mapping[str, torch.Tensor], read: Sequence[str],
              select: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """One forward pass of ``step``: the target rows repeated once per condition, each condition's
    patches bound to its own block of rows; the activations ``read`` (narrowed by ``select``) or the
    logits."""
    n_rows, repeats = tokens.shape[0], len(conditions)
    patches = [dataclasses.replace(patch, rows=range(k * n_rows, (k + 1) * n_rows))
               for k, condition in enumerate(conditions) for patch in condition]
    captured = WholeActivations(list(read) or [LOGITS], select=select if read else None)
    if step.layer < 0:
        x = tokens.repeat(repeats, 1)
    else:
        assert resid_pre is not None  # computed by run_patches whenever a pass resumes at a block
        x = resid_pre[step.layer][:, step.position:].repeat(repeats, 1, 1)
    start_at = step.layer if step.layer >= 0 else None
    if step.position == 0:
        # reading hooks only: the pass stops after the last block read (no unembedding)
        stream.body(loaded, x, [captured], patches=patches, batch_size=len(x), start_at_layer=start_at,
               progress=False, desc="patching")
        return captured.result()
    for patch in patches:  # stream checks its own patches; these go in as hooks
        patch.check_prompts(len(x))
    hooks = _prefix_hooks(loaded.backend.n_layers, step, patches, target, repeats)
    stream.body(loaded, x, [captured], fwd_hooks=hooks, batch_size=len(x), start_at_layer=start_at,
           progress=False, desc="patching")
    computed = captured.result()[LOGITS]
    prefix = target[LOGITS][:, :step.position].repeat(repeats, 1, 1)
    return {LOGITS: torch.cat([prefix.to(computed.dtype), computed], dim=1)}


def _decide_reuse(loaded: LoadedModel, reuse_prefix: bool | None, read: Sequence[str]) -> bool:
    if reuse_prefix is False:
        return False
    reason = loaded.backend.prefix_reuse_unsupported()
    if reason is None and read:
        reason = "the metric reads hooks (read=), which would see only the computed positions"
    if reason is not None and reuse_prefix:
        raise BadInputError(f"cannot reuse the target run's prefix: {reason}; pass reuse_prefix=None "
                            "(reuse where possible) or False")
    return reason is None


def _target_run(
    loaded: LoadedModel, tokens: Int[torch.Tensor, "batch pos"], passes: Sequence[PatchPass],
    need_resid: bool,
) -> dict[str, torch.Tensor]:
    """What the passes take from the unpatched target run, in one forward pass: ``resid_pre`` of
    every block (if ``need_resid`` and a pass resumes at a block), ``hook_k`` / ``hook_v`` of the
    blocks a prefix-reusing pass runs, and the logits (for the reused prefix, and for the
    unpatched condition)."""
    n_pos = tokens.shape[1]
    n_layers = loaded.backend.n_layers
    names: list[str] = []
    if need_resid and any(step.layer >= 0 for step in passes):
        names += [f"blocks.{layer}.hook_resid_pre" for layer in range(n_layers)]
    reusing = [step for step in passes if 0 < step.position < n_pos]
    if reusing:
        first = min(max(step.layer, 0) for step in reusing)
        names += [f"blocks.{layer}.attn.hook_{part}" for layer in range(first, n_layers) for part in ("k", "v")]
    if reusing or any(step.position >= n_pos for step in passes):
        names.append(LOGITS)
    if not names:
        return {}
    cache = WholeActivations(names)
    stream.body(loaded, tokens, [cache], batch_size=max(1, len(tokens)), progress=False, desc="target run")
    return cache.result()
