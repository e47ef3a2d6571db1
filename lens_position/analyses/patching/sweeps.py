"""Sweeps: one activation patched at every layer x position (x head) from a source run into a
target run, a metric of each, as a :class:`PatchSweep` with intervals over prompts; and the
TransformerLens-compatible entry points (``get_act_patch_resid_pre`` and its siblings), each a
``partial`` of one engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

if TYPE_CHECKING:
    from transformer_lens.ActivationCache import ActivationCache

from lens_position.analyses.patching.engine import (
    PatchPass,
    as_tokens,
    cache_activations,
    check_same_layout,
    metric_value,
    run_patches,
    token_layers,
)
from lens_position.core.checks import check_heads, check_layers, check_position
from lens_position.core.columns import recommended_first
from lens_position.core.inputs import Prompts
from lens_position.core.intervals import (
    Bootstrap,
    Estimate,
    benjamini_hochberg,
    bootstrap_mean,
    sign_flip_pvalue,
)
from lens_position.core.patch import Patch, source_activation
from lens_position.core.results import SavedResult
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, ModelLike, public

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
      :func:`lens_position.core.intervals.sign_flip_pvalue`), and ``q_value``: the Benjamini-Hochberg
      q-value of that p-value among all the cells of this sweep
      (:func:`lens_position.core.intervals.benjamini_hochberg`): the cells with ``q_value < 0.05``
      are discoveries at a false discovery rate of 5%, where ``p_value < 0.05`` alone would flag
      about 5% of the null cells of a sweep of hundreds. What
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


@public
def activation_sweep(
    loaded: LoadedModel,
    target: Prompts,
    source: Prompts | ActivationCache,
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
    target_tokens = as_tokens(loaded, target)
    n_rows, n_pos = target_tokens.shape
    n_layers, n_heads = loaded.backend.n_layers, loaded.backend.n_heads
    cached = not isinstance(source, torch.Tensor) and hasattr(source, "keys")
    if not cached:
        check_same_layout(target, source)
    per_head = activation == "z"
    cells = _cells(activation, layers, positions, heads, n_layers, n_pos, n_heads)
    swept_layers, swept_positions, swept_heads = cells
    names = [SWEPT_ACTIVATIONS[activation].format(layer=layer) for layer in swept_layers]
    if reduce == "none" and n_rows < 2:
        raise BadInputError("reduce='none' gives intervals over target prompts: pass at least 2 prompts")
    per_prompt = reduce == "none"
    checked = partial(_checked_metric, shape=(n_rows,) if per_prompt else (), reduce=reduce)

    with progress_bar(f"{activation} sweep", enabled=progress):
        store = _source_store(loaded, source, names, target_tokens) if cached else \
            cache_activations.body(loaded, as_tokens(loaded, source), names)
        conditions = [[Patch(name, store[name][:, p] if head is None else store[name][:, p, head],
                             position=p, head=head, label=f"{activation}[{layer}][{p}]")]
                      for layer, name in zip(swept_layers, names) for p in swept_positions for head in swept_heads]
        plan: list[PatchPass] = []
        flat = run_patches.body(loaded, target_tokens, conditions + [[]], lambda logits: checked(
            metric_value(metric(logits))), batch_size=batch_size, reuse_prefix=reuse_prefix, plan=plan,
            progress=progress)
    baseline, flat = flat[-1], flat[:-1]
    shape = (len(swept_layers), len(swept_positions)) + ((len(swept_heads),) if per_head else ())
    values = flat.reshape(*shape, *flat.shape[1:])
    frame = _cell_frame(swept_layers, swept_positions, swept_heads, per_head)
    sweep = PatchSweep(values=values, frame=frame, reduced=not per_prompt, baseline=baseline,
                       axis_names=["layer", "pos"] + (["head"] if per_head else []))
    frame["metric"] = sweep.mean().reshape(-1).double().cpu().numpy()
    if per_prompt:
        _add_intervals(sweep, frame, bootstrap)
    sweep.frame = recommended_first(frame)  # the columns computed from the sweep itself, added after it was built
    sweep.provenance = provenance.collect(
        model=loaded.spec,
        data=getattr(target, "spec", None), activation=activation,
        source=("cached activations" if cached else getattr(getattr(source, "spec", None), "to_dict", lambda: None)()),
        batch_size=batch_size, reduce=reduce,
        reuse_prefix=any(0 < step.position < n_pos for step in plan),
        token_layers=token_layers(plan, n_rows, n_pos, n_layers),
        intervals=bootstrap.to_dict(unit="prompt") if per_prompt else None)
    return sweep


def _checked_metric(values: torch.Tensor, *, shape: tuple[int, ...], reduce: str) -> torch.Tensor:
    if tuple(values.shape) != shape:
        raise BadInputError(f"the metric returned shape {tuple(values.shape)}; under reduce={reduce!r} it must "
                            f"return {'one value per target prompt, ' if shape else 'a scalar, '}shape {shape}")
    return values


def _cell_frame(layers: Sequence[int], positions: Sequence[int], heads: Sequence[int | None],
                per_head: bool) -> pd.DataFrame:
    """One row per cell, in the order of the sweep's values: layer, position (and head)."""
    index = [(layer, p, h) for layer in layers for p in positions for h in heads]
    return pd.DataFrame([row[:3] if per_head else row[:2] for row in index],
                        columns=["layer", "position", "head"][:3 if per_head else 2])


def _cells(activation: str, layers: Sequence[int] | None, positions: Sequence[int] | None,
           heads: Sequence[int] | None, n_layers: int, n_pos: int, n_heads: int,
           ) -> tuple[list[int], list[int], list[int | None]]:
    """The swept layers, positions and heads (``[None]`` unless ``activation`` is per head), checked."""
    per_head = activation == "z"
    if heads is not None and not per_head:
        raise BadInputError(f"heads= applies to the per-head sweep (activation='z'), not {activation!r}")
    layers = list(range(n_layers)) if layers is None else list(layers)
    positions = list(range(n_pos)) if positions is None else list(positions)
    swept: list[int | None] = (list(range(n_heads)) if heads is None else list(heads)) if per_head else [None]
    check_layers(layers, n_layers)
    for position in positions:
        check_position(position, n_pos)
    check_heads([(layer, head) for layer in layers for head in swept if head is not None], n_layers, n_heads)
    return layers, positions, swept


def _source_store(loaded: LoadedModel, source: Any, names: Sequence[str],
                  target_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """The swept activations of a source run cached by the caller, checked to be of the target's shape."""
    store = {name: source_activation(source, name) for name in names}
    for name, act in store.items():
        if tuple(act.shape[:2]) != tuple(target_tokens.shape):
            raise BadInputError(f"the source cache holds batch x pos {tuple(act.shape[:2])} at {name} but "
                                f"the target tokens are {tuple(target_tokens.shape)}; cache a run of the same shape")
    return store


def _add_intervals(sweep: PatchSweep, frame: pd.DataFrame, bootstrap: Bootstrap) -> None:
    """The per-cell intervals and p-values over prompts of a per-prompt sweep, as columns of ``frame``."""
    lo, hi = sweep.bootstrap_ci(bootstrap=bootstrap)
    effect_lo, effect_hi = sweep.bootstrap_ci(bootstrap=bootstrap, of_effect=True)
    frame["metric_lo"], frame["metric_hi"] = lo.reshape(-1).numpy(), hi.reshape(-1).numpy()
    frame["effect"] = sweep.effect().mean(-1).reshape(-1).double().cpu().numpy()
    frame["effect_lo"], frame["effect_hi"] = effect_lo.reshape(-1).numpy(), effect_hi.reshape(-1).numpy()
    frame["p_value"] = sweep.permutation_pvalue(seed=bootstrap.seed).reshape(-1).numpy()
    frame["q_value"] = benjamini_hochberg(frame["p_value"].to_numpy())


def resid_pre_sweep(
    model: ModelLike,
    target: Prompts,
    source: Prompts | ActivationCache,
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
    return n_heads * n_rows * sum((n_pos - p) * (n_layers - layer) for layer in layers for p in positions)


def _transformerlens_sweep(
    model: ModelLike, corrupted_tokens: Int[torch.Tensor, "batch pos"], clean_cache: Any,
    patching_metric: Callable[[Float[torch.Tensor, "batch pos d_vocab"]], torch.Tensor], *, activation: str,
    batch_size: int = 64, reuse_prefix: bool | None = None,
) -> Float[torch.Tensor, "layer pos"] | Float[torch.Tensor, "layer pos head"]:
    """TransformerLens's ``get_act_patch_<activation>`` with its arguments and result: for every layer
    and position (and head, for ``"z"``), the corrupted run with ``activation`` there taken from
    ``clean_cache`` (an ``ActivationCache`` from ``model.run_with_cache(clean_tokens)``), scored by
    ``patching_metric(logits)``. The same numbers, computed by :func:`activation_sweep`."""
    return activation_sweep(model, corrupted_tokens, clean_cache, patching_metric, activation, batch_size=batch_size,
                            reuse_prefix=reuse_prefix, progress=False).values


# The TransformerLens-compatible entry points, as ``transformer_lens.patching`` names them: one
# engine, bound to the activation each patches. Each takes ``(model, corrupted_tokens, clean_cache,
# patching_metric, *, batch_size=64, reuse_prefix=None)`` and returns ``[layer, pos]``
# (``[layer, pos, head]`` for the per-head one).
get_act_patch_resid_pre = partial(_transformerlens_sweep, activation="resid_pre")
get_act_patch_attn_out = partial(_transformerlens_sweep, activation="attn_out")
get_act_patch_mlp_out = partial(_transformerlens_sweep, activation="mlp_out")
get_act_patch_attn_head_out_by_pos = partial(_transformerlens_sweep, activation="z")
