"""Position-0 trajectory patching: which heads downstream depend on the position-0 residual.

At block ``l`` (the *patch layer*), ``resid_pre[l][:, 0]`` is replaced by its value from a
counterfactual run (the text without BOS, or another token 0; by C5 this value depends on
token 0 only, so it comes from a one-token run) and the model runs on from there. For every
head in blocks ``>= l`` we measure

- ``pattern_change``: the mean over prompts and queries ``i`` in ``query_range`` of the
  total-variation distance ``0.5 * sum_j |A_patched[i, j] - A_base[i, j]|``, in [0, 1];
- ``R_change = R_patched - R_base``, the change in the head's residual component (fraction
  of Var(log A), ``lens_position.analyses.decompose`` over ``query_range``).

Heads in blocks ``< l`` are unaffected by construction and are not listed. Pattern changes
come from :func:`lens_position.analyses.patching.run_patches` (all patch layers batched, each
resumed from the cached residual at its layer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from lens_position.analyses.compare import compare, decompose_conditions
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.fingerprint import counterfactual_token0, position0_activations
from lens_position.analyses.patching import Patch, as_tokens, run_patches
from lens_position.core.checks import check_count, check_layers, check_query_range
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts
from lens_position.core.intervals import Estimate
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, WholeActivations, stream
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public


@dataclass(repr=False)
class TrajectoryPatching(SavedResult):
    """Result of :func:`trajectory_patching` (module docstring: definitions).

    ``frame``: one row per (patch_layer, layer, head) with ``layer >= patch_layer``:
    ``pattern_change``, ``R_base``, ``R_patched``, ``R_change``, ``layer_type``.
    ``by_patch_layer``: one row per patch layer: mean ``pattern_change`` and ``R_change`` over the
    downstream heads, and ``R_base`` / ``R_patched`` as means over the same heads.
    """

    KEYWORD = "trajectory"
    TABLES = (
        Table("trajectory_heads", "frame",
              "TrajectoryPatching.frame: pattern and R change of every downstream head per patched layer"),
        Table("trajectory_layers", "by_patch_layer",
              "TrajectoryPatching.by_patch_layer: the mean changes per patched layer"),
    )

    frame: pd.DataFrame
    by_patch_layer: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "position-0 trajectory patching: downstream pattern and R change per patched layer"
    HEADS = ("frame", "R_change")

    def headline(self) -> list[Headline]:
        """Per patch layer (at most five, largest first), the mean R change of the downstream heads."""
        frame = self.by_patch_layer.reindex(self.by_patch_layer["R_change"].astype(float).abs()
                                            .sort_values(ascending=False).index).head(5)
        return [Headline("R_change", f"mean R change, patch at layer {int(row['patch_layer'])}",
                         Estimate(float(row["R_change"])), f"pattern change {float(row['pattern_change']):.3g}")
                for _, row in frame.iterrows()]


def trajectory_patches(
    loaded: LoadedModel, prompts: CheckedPrompts, counterfactual: str, layers: Sequence[int]
) -> dict[int, Patch]:
    """For each patch layer ``l``: the patch of ``resid_pre[l][:, 0]`` with the
    counterfactual position-0 residual (one value per prompt)."""
    token0 = counterfactual_token0(loaded, prompts, counterfactual)
    names = [f"blocks.{layer}.hook_resid_pre" for layer in layers]
    counter = position0_activations(loaded, token0, names)
    return {layer: Patch(name, counter[name][:, 0], position=0, label=f"resid_pre[{layer}][0]={counterfactual}")
            for layer, name in zip(layers, names)}


def _pattern_change(
    loaded: LoadedModel, tokens: torch.Tensor, patches: dict[int, Patch],
    query_range: tuple[int, int], batch_size: int,
) -> Float[torch.Tensor, "patch_layer layer head"]:
    """Each patch's total-variation change of every head's pattern rows ``query_range``, mean over
    prompts and queries; the prompts ``batch_size`` at a time, so no pass holds more sequences than
    the decompositions' (at long T a pass's scores are what memory holds)."""
    n_layers = loaded.spec.n_layers
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
    start, stop = query_range

    def rows(pattern: torch.Tensor) -> torch.Tensor:  # the query rows measured, never [layer, T, T] kept
        return pattern[:, :, start:stop]

    total = torch.zeros(len(patches), n_layers, loaded.spec.n_heads, dtype=torch.float64)
    for first in range(0, len(tokens), batch_size):
        chunk = tokens[first:first + batch_size]
        mine = [dataclasses.replace(patch, value=torch.as_tensor(patch.value)[first:first + batch_size])
                for patch in patches.values()]  # one value per prompt
        kept = WholeActivations(names, select=rows)
        stream.body(loaded, chunk, [kept], batch_size=len(chunk), progress=False, desc="trajectory patching")
        base = kept.result()

        def tv_distance(acts: dict[str, torch.Tensor], base: dict[str, torch.Tensor] = base) -> torch.Tensor:
            out = torch.full((n_layers, loaded.spec.n_heads), float("nan"), dtype=torch.float64)
            for layer, name in enumerate(names):
                if name in acts:
                    diff = (acts[name] - base[name]).to(torch.float64)
                    out[layer] = 0.5 * diff.abs().sum(-1).mean((0, 2))
            return out

        # one patch's rows per pass (a pass holds at least one condition's prompts)
        total += len(chunk) * run_patches.body(loaded, chunk, [[p] for p in mine], tv_distance, read=names,
                                          select=rows, batch_size=len(chunk))
    return total / len(tokens)


@public
def trajectory_patching(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    counterfactual: str = "no-bos",
    layers: Sequence[int] | int | str | None = None,
    query_range: tuple[int, int] = (0, 32),
    base: Decomposition | None = None,
    batch_size: int = BATCH_SIZE,
    progress: bool = True,
) -> TrajectoryPatching:
    """Patch the position-0 residual at each layer in ``layers`` (default: all) with its
    counterfactual value and measure every downstream head's pattern and ``R`` change.

    ``counterfactual``: ``"no-bos"`` (prompts must start with BOS) or ``"token:<id>"``.
    ``base``: the unpatched ``decompose(model, prompts, query_range=query_range)`` when
    already computed (it is then not recomputed); each patch layer is one condition of
    :func:`lens_position.analyses.compare.compare`.
    ``batch_size``: prompts per decomposition batch; pattern changes run ``batch_size``
    patch layers per forward pass. ``progress``: one bar, "trajectory patching", counting
    the sequences of the patched runs (pattern changes and decompositions) and the base
    decomposition.
    """
    prompts = checked_prompts(loaded, prompts, min_length=2)
    tokens = as_tokens(loaded, prompts)
    n_layers = loaded.spec.n_layers
    layers = check_layers(layers, n_layers)
    query_range = check_query_range(query_range, tokens.shape[1])
    batch_size = check_count("batch_size", batch_size)
    patches = trajectory_patches(loaded, prompts, counterfactual, layers)
    passes = 2 * len(layers) + (base is None)  # pattern change and decomposition per patch layer, the base
    with progress_bar("trajectory patching", total=passes * len(tokens), enabled=progress):
        pattern = _pattern_change(loaded, tokens, patches, query_range, batch_size)
        if base is None:
            base = decompose.body(loaded, prompts, query_range=query_range, batch_size=batch_size)
        # one condition per patch layer, decomposed from that layer down
        conditions = {layer: [patches[layer]] for layer in layers}
        patched = decompose_conditions.body(loaded, prompts, conditions, query_range=query_range, batch_size=batch_size,
                                       layers={layer: range(layer, n_layers) for layer in layers})
    comparison = compare(base, patched).heads
    frames = []
    for k, layer in enumerate(layers):
        rows = comparison[comparison["condition"] == layer][["layer", "head", "layer_type", "R_base", "R_condition"]]
        rows = rows.rename(columns={"R_condition": "R_patched"}).reset_index(drop=True)
        rows.insert(0, "patch_layer", layer)
        rows["R_change"] = rows["R_patched"] - rows["R_base"]
        rows["pattern_change"] = pattern[k, layer:].reshape(-1).numpy()
        frames.append(rows)
    frame = pd.concat(frames, ignore_index=True)[
        ["patch_layer", "layer", "head", "layer_type", "pattern_change", "R_base", "R_patched", "R_change"]]
    summary = frame.groupby("patch_layer", sort=True)[
        ["pattern_change", "R_change", "R_base", "R_patched"]].mean().reset_index()
    spec = getattr(prompts, "spec", None)
    return TrajectoryPatching(frame=frame, by_patch_layer=summary, provenance=provenance.collect(
        model=loaded.spec, data=spec if spec is not None else {"source": "tensor", "shape": list(tokens.shape)},
        seed=getattr(spec, "seed", None), counterfactual=counterfactual, patch_layers=layers,
        query_range=list(query_range), bos_policy=getattr(spec, "bos", "as given (token tensor)"),
        pattern_change="mean over prompts and queries of 0.5 * sum_j |A_patched - A_base|"))
