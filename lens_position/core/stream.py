"""The streaming loop: one forward pass per batch of prompts, reducers keep statistics.

Every analysis in lens_position has the same shape: push ``N`` prompts through the model in
batches, read a few activations at TransformerLens hooks, reduce each batch to small
float64 statistics and drop the big tensors, so memory does not grow with ``N``. The
decomposition (:mod:`lens_position.analyses.decompose`), the position probes
(:mod:`lens_position.analyses.probes`), the sink scores (:mod:`lens_position.analyses.sinks`) and the
position-0 fingerprint (:mod:`lens_position.analyses.fingerprint`) are each a *reducer*; this module
is the one loop that feeds them.

:func:`stream` takes the prompts, any number of reducers and any number of
:class:`~lens_position.core.patch.Patch` interventions, and for every batch

1. moves the batch to the model's device,
2. runs **one** forward pass with the patches applied (each to the prompts it names),
3. hands every reducer the activations it asked for (``reducer.hook_names``), detached and
   after the patches, together with ``rows``: the indices of the batch's prompts in
   ``prompts`` (so a reducer that splits prompts, by parity or by a seeded draw, never
   counts batches itself),
4. stops after the last block any reducer reads (TransformerLens ``stop_at_layer``: the
   final norm and the unembedding are skipped unless a reducer reads ``"logits"``), and
   within that block as soon as every hook the pass runs for has run (a decomposition of the
   last layer reads its attention scores: the rest of that block, its MLP included, is
   skipped).

Several statistics on the same prompts therefore cost one pass, not one each::

    prompts = check_prompts(model, prompts)  # the input door, once: reducers take checked prompts
    decomposition = DecompositionReducer(model, prompts)
    probe = ProbeReducer(model, prompts)
    stream(model, prompts, [decomposition, probe])
    decomposition.result(), probe.result()

A new statistic is one small class with ``hook_names`` and ``update``; see
:class:`Reducer`.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from jaxtyping import Int

from lens_position.core.checks import check_count
from lens_position.ground.errors import BadInputError, NonFiniteError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.hook_names import block_of, needed_stop
from lens_position.models.spec import LoadedModel, public

if TYPE_CHECKING:
    from lens_position.core.data import PromptSet
    from lens_position.core.patch import Patch

log = logging.getLogger(__name__)

LOGITS = "logits"  # pseudo hook name: the model's output logits (the pass then runs to the end)


@runtime_checkable
class Reducer(Protocol):
    """What :func:`stream` needs of a statistic.

    ``hook_names``: the TransformerLens hooks (or ``"logits"``) it reads.
    ``update(hook_name, activation, rows)``: called once per batch and hook, in forward
    order, with the activation as the model computed it (patches applied, detached, on the
    model's device and in its dtype; batch first) and ``rows``, ``Int[Tensor, "batch"]`` on
    the CPU: the index in the streamed prompts of each batch row. Keep sums, not tensors.

    By convention a reducer also has ``result()``, turning its sums into the analysis's
    result once the stream is over.
    """

    @property
    def hook_names(self) -> Sequence[str]: ...

    def update(self, hook_name: str, activation: torch.Tensor, rows: Int[torch.Tensor, "batch"]) -> None:
        ...


class _PassDone(Exception):
    """Raised by the last hook a pass runs for: nothing after it is read."""


# Sequences per forward pass, the default of every analysis in Python and of the command line's
# --batch-size. Per-batch costs of the analysis hooks dominate small batches: on SmolLM2 at
# T = 32, batches of 16 took 2.6x less CPU time than batches of 4. Memory grows with it.
BATCH_SIZE = 16

def stream_inputs(prompts: Any) -> torch.Tensor:
    """The tensor ``stream`` batches: tokens ``[N, T]`` (a PromptSet's ``.tokens`` or a
    tensor), or residuals ``[N, T, d_model]`` when starting at a later block."""
    inputs = getattr(prompts, "tokens", prompts)
    if not isinstance(inputs, torch.Tensor):
        raise BadInputError(f"prompts must be a PromptSet or a tensor [N, T], got {type(prompts).__name__}; "
                            "build prompts with lens_position.core.data.build_prompts(...)")
    return inputs


@public
def stream(
    loaded: LoadedModel,
    prompts: PromptSet | torch.Tensor,
    reducers: Sequence[Reducer],
    *,
    patches: Sequence[Patch] = (),
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    batch_size: int = BATCH_SIZE,
    stop_at_layer: int | None = None,
    start_at_layer: int | None = None,
    progress: bool = True,
    desc: str = "stream",
) -> Sequence[Reducer]:
    """Run ``prompts`` through ``model`` in batches, one forward pass each, and feed every
    reducer (module docstring). Returns ``reducers``.

    Args:
        model: a ``LoadedModel`` or a bare ``HookedTransformer`` / ``TransformerBridge``.
        prompts: a ``PromptSet`` or tokens ``Int[Tensor, "N T"]``; with ``start_at_layer``,
            the residual stream ``Float[Tensor, "N T d_model"]`` entering that block.
        reducers: the statistics to feed (:class:`Reducer`).
        patches: interventions applied during every pass; a patch's per-prompt value is
            indexed by ``rows`` (the prompts of the batch), and a patch with ``rows`` of its
            own touches only those prompts.
        fwd_hooks: extra ``(hook name, function)`` pairs, run after the patches and before
            the reducers (so reducers read what the model actually uses).
        batch_size: prompts per forward pass.
        stop_at_layer: stop before this block; default: after the last block a reducer reads.
        start_at_layer: start at this block from the given residuals (TransformerLens).
        progress: count the prompts in a progress bar (:mod:`lens_position.ground.progress`: a bar
            of its own, or the bar of the slow call this pass is part of; a log line reports
            the pass either way).
        desc: label of the progress bar (when it is the outermost) and the log line.
    """
    backend = loaded.backend
    inputs = stream_inputs(prompts)
    batch_size = check_count("batch_size", batch_size)
    names = [name for reducer in reducers for name in reducer.hook_names]
    hook_dict = backend.hook_dict  # once: a TransformerBridge resolves its hook aliases on every access
    missing = sorted({n for n in names if n != LOGITS and n not in hook_dict})
    if missing:
        raise BadInputError(f"the model has no hooks named {missing}")
    n_prompts = inputs.shape[0]
    for patch in patches:
        patch.validate(backend, inputs.shape[1] if inputs.ndim > 1 else 1)
        patch.check_prompts(n_prompts)
    stop = needed_stop([n for n in names if n != LOGITS]) if stop_at_layer is None and LOGITS not in names \
        else stop_at_layer
    pass_hooks = _PassHooks(backend.model, reducers, patches, fwd_hooks)
    started = time.perf_counter()
    with progress_bar(desc, total=n_prompts, enabled=progress) as bar, torch.no_grad(), \
            backend.hooks(pass_hooks.hooks(hook_dict)):
        for first in range(0, n_prompts, batch_size):
            rows = torch.arange(first, min(first + batch_size, n_prompts))
            pass_hooks.begin(rows)
            try:
                output = backend.forward(inputs[first:first + batch_size].to(backend.device), stop_at_layer=stop,
                                         start_at_layer=start_at_layer,
                                         return_type="logits" if LOGITS in pass_hooks.readers else None)
            except _PassDone:
                output = None
            pass_hooks.read_logits(output)
            bar.update(len(rows))
    log.info("%s: %d prompts, %d reducer(s), %d patch(es), stop_at_layer=%s, %.1f s", desc, n_prompts,
             len(reducers), len(patches), stop, time.perf_counter() - started)
    return reducers


def checked_fwd_hooks(fwd_hooks: Sequence[tuple[str | Callable, Callable]],
                      hook_dict: Mapping[str, Any]) -> list[tuple[str | Callable, Callable]]:
    """A user's ``(hook name or name filter, function)`` pairs, checked (each a pair, each name one the
    model has, each function callable: BadInputError) and each function guarded so that an
    activation it returns has the shape, dtype and device of the one it was given (a hook returning
    ``a[:, :5]`` would otherwise have the rest of the pass run on 5 positions). The public entry
    points that take ``fwd_hooks`` call it; the package's own hooks (which may reshape on purpose)
    go to :func:`stream` as they are."""
    checked: list[tuple[str | Callable, Callable]] = []
    for entry in fwd_hooks:
        if not (isinstance(entry, tuple) and len(entry) == 2):
            raise BadInputError(f"fwd_hooks holds {entry!r}; each entry is a (hook name, function) pair")
        name, function = entry
        if not callable(function):
            raise BadInputError(f"the fwd_hooks function for {name!r} is a {type(function).__name__}, not callable")
        if isinstance(name, str) and name not in hook_dict:
            close = sorted(hook for hook in hook_dict if hook.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1])[:3]
            raise BadInputError(f"fwd_hooks names {name!r}, a hook this model does not have"
                                + (f" (the model has e.g. {', '.join(close)})" if close else "")
                                + "; the names are those of model.hook_dict")
        if not (isinstance(name, str) or callable(name)):
            raise BadInputError(f"fwd_hooks names {name!r}; a hook is named by a string or a name filter function")
        checked.append((name, _shape_guarded(function)))
    return checked


def _shape_guarded(function: Callable) -> Callable:
    def guarded(activation: torch.Tensor, hook: Any) -> Any:
        returned = function(activation, hook)
        if returned is None or returned is activation:
            return returned
        if not isinstance(returned, torch.Tensor):
            raise BadInputError(f"the fwd_hooks function at {hook.name} returned a {type(returned).__name__}; a "
                                "hook returns None or a tensor shaped like the activation it was given")
        if returned.shape != activation.shape or returned.dtype != activation.dtype \
                or returned.device != activation.device:
            raise BadInputError(
                f"the fwd_hooks function at {hook.name} returned a tensor of shape {tuple(returned.shape)} "
                f"({returned.dtype}, {returned.device}) for an activation of shape {tuple(activation.shape)} "
                f"({activation.dtype}, {activation.device}); return one of the same shape, dtype and device "
                "(edit it in place, or return None)")
        return returned
    return guarded


class _PassHooks:
    """The hooks of one streamed pass, over its batches: the patches (each applied to the prompts it
    names), the caller's hooks, the reducers' reads (checked finite first), a finiteness guard on
    every normalisation scale, and the early end of the pass once every hook it runs for has run."""

    def __init__(self, module: torch.nn.Module, reducers: Sequence[Reducer], patches: Sequence[Patch],
                 fwd_hooks: Sequence[tuple[str | Callable, Callable]]) -> None:
        self.module, self.patched, self.fwd_hooks = module, bool(patches), list(fwd_hooks)
        self.readers: dict[str, list[Reducer]] = defaultdict(list)
        for reducer in reducers:
            for name in dict.fromkeys(reducer.hook_names):
                self.readers[name].append(reducer)
        self.patches_at: dict[str, list[Patch]] = defaultdict(list)
        for patch in patches:
            self.patches_at[patch.hook_name].append(patch)
        # The pass ends once every hook it runs for has run (the output is read only for "logits"; a hook
        # given as a name filter could match anything, so it keeps the pass whole).
        self.watched: set[str] = {*self.readers, *self.patches_at,
                                  *(name for name, _ in fwd_hooks if isinstance(name, str))}
        self.end_early = LOGITS not in self.readers and all(isinstance(name, str) for name, _ in fwd_hooks)
        self.pending: set[str] = set()
        self.rows = torch.empty(0, dtype=torch.int64)

    def hooks(self, hook_dict: Mapping[str, Any]) -> list[tuple[str | Callable, Callable]]:
        hooks: list[tuple[str | Callable, Callable]] = [(name, self._apply_patches) for name in self.patches_at]
        hooks += self.fwd_hooks
        hooks += [(name, self._read) for name in self.readers if name != LOGITS]
        # A normalisation whose scale overflows (x² beyond the dtype's range: huge but finite weights or
        # activations) divides by inf and hands the next layer zeros, which attend uniformly and look like a
        # model that is "all mask": every pass checks the scales it runs through, not only what it reads.
        hooks += [(name, self._guard) for name in norm_scale_hooks(hook_dict) if name not in self.readers]
        if self.end_early:  # after the others at the same hook: they run first
            hooks += [(name, self._done) for name in self.watched]
        return hooks

    def begin(self, rows: Int[torch.Tensor, "batch"]) -> None:
        """A batch of the prompts ``rows`` starts."""
        self.rows = rows
        self.pending.update(self.watched)

    def read_logits(self, output: torch.Tensor | None) -> None:
        if not self.readers.get(LOGITS):
            return
        assert output is not None  # a pass that reads the logits runs to the end
        check_finite_activation(LOGITS, output, self.rows, self.module, self.patched)
        for reducer in self.readers[LOGITS]:
            reducer.update(LOGITS, output.detach(), self.rows)

    def _apply_patches(self, activation: torch.Tensor, hook: Any) -> torch.Tensor:
        for patch in self.patches_at[hook.name]:
            patch.apply(activation, sequences=self.rows)
        return activation

    def _read(self, activation: torch.Tensor, hook: Any) -> None:
        check_finite_activation(hook.name, activation, self.rows, self.module, self.patched)
        for reducer in self.readers[hook.name]:
            reducer.update(hook.name, activation.detach(), self.rows)

    def _guard(self, activation: torch.Tensor, hook: Any) -> None:
        check_finite_activation(hook.name, activation, self.rows, self.module, self.patched)

    def _done(self, activation: torch.Tensor, hook: Any) -> None:
        self.pending.discard(hook.name)
        if not self.pending:
            raise _PassDone


def norm_scale_hooks(hook_dict: Mapping[str, Any]) -> list[str]:
    """The hooks of the model's normalisation scales (``blocks.L.ln1.hook_scale``, ...,
    ``ln_final.hook_scale``; none for a model without them), checked on every pass."""
    return [name for name in hook_dict if name.endswith(".hook_scale")]


PATTERN_ROW_TOLERANCE = 1e-2  # float16 rounding of a softmax stays far below; a zeroed NaN row is off by 1


def _likely_cause(module: torch.nn.Module, hook_name: str, patched: bool, overflow: bool = False) -> str:
    causes = []
    if overflow:
        causes.append("activations too large for the normalisation (the square of a value beyond about 1e19 "
                      "overflows float32, and the next layer would read zeros): weights scaled far beyond a "
                      "trained model's, e.g. an embedding multiplied by 1e20")
    dtype = next(module.parameters()).dtype
    if dtype in (torch.float16, torch.bfloat16):
        causes.append(f"overflow of {str(dtype).removeprefix('torch.')} (run in float32)")
    causes.append("non-finite weights (W_Q/W_K/W_V of that layer, or an embedding row of a token the prompt "
                  "holds: check torch.isfinite(p).all() for model.parameters())")
    if patched:
        causes.append("a non-finite patch value")
    return "; likely cause: " + ", or ".join(causes)


def check_finite_activation(hook_name: str, activation: torch.Tensor, rows: Int[torch.Tensor, "batch"],
                            module: torch.nn.Module, patched: bool = False) -> None:
    """Raise :class:`NonFiniteError` if ``activation`` holds a value no finite model produces:
    NaN or an infinity anywhere, except in attention scores (``hook_attn_scores``) where ``-inf``
    is the mask; there NaN, ``+inf`` and a ``-inf`` on a query's own key (never masked) are
    refused. One reduction per tensor; the search for where it happened runs only on failure.
    The message names the hook (layer), head, prompt (its index in the streamed prompts) and
    position, and the likely cause (``module``: the model, whose dtype the cause names)."""
    if not activation.is_floating_point():
        return
    scores = hook_name.endswith("hook_attn_scores") and activation.ndim == 4
    pattern = hook_name.endswith("hook_pattern") and activation.ndim == 4
    row_error = None
    if scores:
        top = activation.amax()  # NaN propagates through max
        own = activation.diagonal(dim1=-2, dim2=-1)
        ok = bool(torch.isfinite(top)) and bool(torch.isfinite(own.amin()))
    elif pattern and activation.numel():
        # one read: NaN and infinities reach their row's sum, and TransformerLens turns a NaN pattern
        # into zeros, so a row that does not sum to 1 is that (summed in float32 at least)
        row_error = (activation.sum(-1, dtype=torch.promote_types(activation.dtype, torch.float32)) - 1).abs()
        ok = bool(row_error.amax() <= PATTERN_ROW_TOLERANCE)
    else:
        ok = bool(torch.isfinite(activation.sum() if activation.numel() else activation.new_zeros(())))
        if not ok:  # a sum can overflow where every element is finite
            ok = bool(torch.isfinite(activation).all())
    if ok:
        return
    if row_error is not None:
        bad = (~(row_error <= PATTERN_ROW_TOLERANCE))[..., None].expand_as(activation)  # NaN included
    elif scores:
        bad = torch.isnan(activation) | (activation == float("inf"))
        diag = ~torch.isfinite(activation.diagonal(dim1=-2, dim2=-1))
        bad |= torch.diag_embed(diag).to(bad.dtype) if diag.any() else torch.zeros_like(bad)
    else:
        bad = ~torch.isfinite(activation)
    where = [int(i) for i in bad.nonzero()[0].tolist()]
    place = [f"prompt {int(rows[where[0]])}"]
    if scores or hook_name.endswith(("hook_pattern", "hook_q", "hook_k", "hook_v", "hook_z")):
        head_axis = 1 if scores or hook_name.endswith("hook_pattern") else 2
        if len(where) > head_axis:
            place.insert(0, f"head {where[head_axis]}")
    if len(where) > 1 and not (scores and len(where) < 3):
        place.append(f"position {where[2] if scores or hook_name.endswith('hook_pattern') else where[1]}")
    block = block_of(hook_name)
    layer = f"layer {block}, " if block is not None and block >= 0 else ""
    n_bad = int(bad.sum())
    raise NonFiniteError(
        f"non-finite values at {hook_name} ({layer}{', '.join(place)}; {n_bad} value(s) in this batch)"
        + _likely_cause(module, hook_name, patched,
                        overflow=hook_name.endswith(".hook_scale") and bool(torch.isinf(activation).any())
                        and not bool(torch.isnan(activation).any())))


class WholeActivations:
    """A reducer that keeps whole activations (the exception to "keep sums": for patch
    sources and small reference runs). ``result()``: ``{hook_name: activation}`` with the
    prompts in order along the batch axis, on the model's device unless ``device`` says
    otherwise; hooks that did not run (blocks before ``start_at_layer``) are absent.
    ``select`` optionally narrows each activation before it is kept (e.g. to position 0)."""

    def __init__(self, hook_names: Sequence[str], *, select: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 device: torch.device | str | None = None) -> None:
        self.hook_names = tuple(dict.fromkeys(hook_names))
        self.select = select
        self.device = device
        self._parts: dict[str, list[tuple[int, torch.Tensor]]] = defaultdict(list)

    def update(self, hook_name: str, activation: torch.Tensor, rows: Int[torch.Tensor, "batch"]) -> None:
        kept = activation if self.select is None else self.select(activation)
        kept = kept.clone() if self.device is None else kept.to(self.device, copy=True)
        self._parts[hook_name].append((int(rows[0]), kept))

    def result(self) -> dict[str, torch.Tensor]:
        out = {}
        for name in self.hook_names:
            if not self._parts[name]:
                continue  # not run (e.g. a block before start_at_layer)
            parts = sorted(self._parts[name], key=lambda part: part[0])
            out[name] = parts[0][1] if len(parts) == 1 else torch.cat([p for _, p in parts])
        return out
