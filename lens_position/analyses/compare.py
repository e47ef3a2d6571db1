"""Experiments as named conditions compared with one base decomposition.

An intervention experiment (BOS replacement, head ablation, trajectory patching, the
sink-reading detector) is: decompose the prompts once without intervention (the *base*),
decompose them again under each *condition* (a list of
:class:`~lens_position.analyses.patching.Patch`, one forward pass per batch each, see
:func:`lens_position.core.stream.stream`), and compare. :func:`decompose_conditions` runs the
conditions; :func:`compare` turns a base and the conditions into tables, computing the
summary every experiment reports in one place:

- per head: ``R_base``, ``R_condition``, ``R_change = R_condition - R_base`` and the same
  for the held-out ``R``;
- per layer (means over the layer's heads) and overall (means over every compared head):
  ``R_base``, ``R_condition``, the changes ``R_change``, ``R_heldout_change`` and
  ``R_rf_change`` (condition minus base), **``fraction_removed = 1 - R_condition / R_base``** (the
  fraction of the residual component the intervention removed; negative when it *added*
  some; NaN when ``R_base = 0``), the held-out means, and the raw version on the
  unnormalised variance, ``fraction_removed_raw = 1 - sum var_abs_t_condition /
  sum var_abs_t_base`` (squared nats summed over heads), since an intervention also changes
  ``Var(log A)``; and ``fraction_removed_rf``, the same fraction for the reference-free
  residual component ``R'`` (``R_rf``). Each fraction is a ratio of means (pooled over heads,
  then divided), and it is reported only where its denominator is resolved from 0 (its interval
  excludes 0 and it is at least
  :data:`~lens_position.core.intervals.RATIO_FLOOR`): elsewhere it is NaN, its interval too, and
  ``<fraction>_resolved`` is False, since a ratio of a denominator that may be 0 is noise
  (``-165%`` and ``+2100%`` were printed so).

**Intervals.** When base and condition carry bootstrap replicates (``Decomposition.replicates``)
they resample the same sequences in each replicate (the prompts are the same), so every
fraction's and every change's interval (``*_lo``/``*_hi``) comes from that quantity computed
replicate by replicate: a paired bootstrap. It is the bias-corrected percentile interval for the
quantities computed from in-sample components (``fraction_removed``, ``fraction_removed_rf``,
``R_change``, ``R_rf_change``) and the percentile interval for ``R_heldout_change``
(:mod:`lens_position.core.intervals`: why). Per head, the changes' intervals
come the same way from ``Decomposition.head_replicates``. ``Comparison.replicates`` keeps the
overall fractions and changes per replicate. Both sides must have been decomposed with the
same number of resamples (and seed); otherwise the intervals are NaN.

The base is an argument, so several experiments on the same prompts share it instead of
recomputing it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.patching import Patch
from lens_position.core.checks import check_layers, check_query_range, check_same_origin
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import (
    BIAS_CORRECTED_QUANTITIES,
    Bootstrap,
    bootstrap_interval,
    denominator_resolved,
    interval_method,
)
from lens_position.core.results import SavedResult
from lens_position.core.stream import BATCH_SIZE
from lens_position.core.summaries import Headline, headlines_from_rows
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

HEAD_KEYS = ["layer", "head"]


#: A condition's name: a string, or another key (the patched layer, an ablation kind).
Name = TypeVar("Name", bound=Hashable)

@dataclass(repr=False)
class Comparison(SavedResult):
    """Result of :func:`compare` (module docstring: definitions).

    ``heads``: one row per (condition, layer, head) present in both base and condition:
    ``condition``, ``layer``, ``head``, ``layer_type``, ``R_base``, ``R_condition``,
    ``R_change``, ``R_heldout_base``, ``R_heldout_condition``, ``R_heldout_change``, and the
    paired intervals ``R_change_lo``/``_hi``, ``R_heldout_change_lo``/``_hi``.
    ``layers``: one row per (condition, layer) with the summary columns; ``overall``: one
    row per condition with the same columns over all compared heads; both with the paired
    intervals ``fraction_removed_lo``/``_hi``, ``fraction_removed_rf_lo``/``_hi`` and
    ``{R, R_heldout, R_rf}_change_lo``/``_hi``. ``replicates``: one row per (condition,
    bootstrap replicate) with the overall fractions and changes (None without replicates).
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    overall: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    replicates: pd.DataFrame | None = None

    WHAT = "conditions against a base decomposition: the change in the residual component"
    INTERVALS = "95% paired bootstrap over sequences"
    HEADS = ("heads", "R_change")

    def headline(self) -> list[Headline]:
        """Per condition, the fraction of R' removed over all compared heads, with its paired interval."""
        return headlines_from_rows(self.overall, "condition", [
            ("fraction_removed_rf_heldout", "R' removed (held-out)",
             "1 - R'_condition / R'_base (negative: added; not defined where R'_base's interval contains 0)")])


def fraction_removed(base: float, condition: float) -> float:
    """``1 - condition / base``; NaN when ``base`` is 0."""
    return 1.0 - condition / base if base != 0 else float("nan")


# paired quantities: name -> (column of the decompositions, "fraction" (1 - condition / base) or "change")
PAIRED = {"fraction_removed": ("R", "fraction"), "fraction_removed_rf": ("R_rf", "fraction"),
          "fraction_removed_rf_heldout": ("R_rf_heldout", "fraction"),
          "R_change": ("R", "change"), "R_heldout_change": ("R_heldout", "change"), "R_rf_change": ("R_rf", "change")}
HEAD_CHANGES = ("R_change", "R_heldout_change")
# the summary's column holding each decomposed quantity's base value
_BASE_VALUE = {"R": "R_base", "R_rf": "R_rf_base", "R_rf_heldout": "R_rf_heldout_base"}


def _summary(base: pd.DataFrame, condition: pd.DataFrame) -> dict[str, float]:
    r_base, r_condition = float(base["R"].mean()), float(condition["R"].mean())
    v_base, v_condition = float(base["var_abs_t"].sum()), float(condition["var_abs_t"].sum())
    return {
        "R_base": r_base, "R_condition": r_condition, "fraction_removed": fraction_removed(r_base, r_condition),
        "R_change": r_condition - r_base,
        "R_heldout_base": float(base["R_heldout"].mean()),
        "R_heldout_condition": float(condition["R_heldout"].mean()),
        "R_heldout_change": float(condition["R_heldout"].mean()) - float(base["R_heldout"].mean()),
        "var_abs_t_base": v_base, "var_abs_t_condition": v_condition,
        "fraction_removed_raw": fraction_removed(v_base, v_condition),
        "R_rf_base": float(base["R_rf"].mean()), "R_rf_condition": float(condition["R_rf"].mean()),
        "fraction_removed_rf": fraction_removed(float(base["R_rf"].mean()), float(condition["R_rf"].mean())),
        "R_rf_change": float(condition["R_rf"].mean()) - float(base["R_rf"].mean()),
        "R_rf_heldout_base": float(base["R_rf_heldout"].mean()),
        "R_rf_heldout_condition": float(condition["R_rf_heldout"].mean()),
        "fraction_removed_rf_heldout": fraction_removed(float(base["R_rf_heldout"].mean()),
                                                        float(condition["R_rf_heldout"].mean())),
    }


def _replicate_fractions(base: Decomposition, condition: Decomposition,
                         layers: Sequence[int]) -> dict[str, np.ndarray] | None:
    """Per bootstrap replicate, every quantity of ``PAIRED`` over ``layers`` (``1 - R_condition /
    R_base``, ``R_condition - R_base``, ...), from the replicates' per-layer means (None when
    either side has none, or they differ in number)."""
    if base.replicates is None or condition.replicates is None:
        return None
    sides = (base.replicates, condition.replicates)
    out = {}
    for name, (column, kind) in PAIRED.items():
        means = [replicates[replicates["layer"].isin(layers)].groupby("replicate", sort=True)[column]
                 .mean().to_numpy() for replicates in sides]
        if len(means[0]) != len(means[1]):
            return None
        with np.errstate(divide="ignore", invalid="ignore"):
            out[name] = 1.0 - means[1] / means[0] if kind == "fraction" else means[1] - means[0]
        out[f"{column}:base"] = means[0]
    return out


def _replicate_layer_fractions(base: Decomposition, condition: Decomposition
                               ) -> dict[int, dict[str, np.ndarray]] | None:
    """:func:`_replicate_fractions` of every single layer both sides cover, from one pivot per
    side and column (a layer's mean over its own replicate row is that row's value)."""
    if base.replicates is None or condition.replicates is None:
        return None
    sides = (base.replicates, condition.replicates)
    columns = dict.fromkeys(column for column, _ in PAIRED.values())
    grids = {column: [replicates.pivot(index="replicate", columns="layer", values=column)
                      for replicates in sides] for column in columns}
    first = next(iter(columns))
    if len(grids[first][0]) != len(grids[first][1]):
        return None
    out: dict[int, dict[str, np.ndarray]] = {}
    for layer in grids[first][0].columns.intersection(grids[first][1].columns):
        out[int(layer)] = {}
        for name, (column, kind) in PAIRED.items():
            before, after = (grid[layer].to_numpy() for grid in grids[column])
            with np.errstate(divide="ignore", invalid="ignore"):
                out[int(layer)][name] = 1.0 - after / before if kind == "fraction" else after - before
            out[int(layer)][f"{column}:base"] = before
    return out


def _with_intervals(row: dict[str, Any], fractions: dict[str, np.ndarray] | None, level: float) -> dict[str, Any]:
    """``row`` with every paired quantity's interval, and each fraction kept only where its
    denominator is resolved (:func:`denominator_resolved`; else NaN, interval too, and
    ``<fraction>_resolved`` False)."""
    for name, (column, kind) in PAIRED.items():
        lo, hi = (np.nan, np.nan) if fractions is None else bootstrap_interval(row[name], fractions[name], level,
                                                                               interval_method(name))
        if kind == "fraction":
            base = None if fractions is None else fractions[f"{column}:base"]
            resolved = denominator_resolved(row[_BASE_VALUE[column]], base, level, interval_method(column))
            row[f"{name}_resolved"] = resolved
            if not resolved:
                row[name], lo, hi = np.nan, np.nan, np.nan
        row[f"{name}_lo"], row[f"{name}_hi"] = float(lo), float(hi)
    return row


def _head_change_intervals(base: Decomposition, condition: Decomposition, level: float) -> pd.DataFrame | None:
    """Per (layer, head), the paired intervals of ``HEAD_CHANGES`` from both sides'
    ``head_replicates`` (None when either side has none, or they differ in number)."""
    if base.head_replicates is None or condition.head_replicates is None \
            or base.head_replicates["replicate"].nunique() != condition.head_replicates["replicate"].nunique():
        return None
    keys = ["replicate", *HEAD_KEYS]
    columns = [name.removesuffix("_change") for name in HEAD_CHANGES]
    paired = base.head_replicates[keys + columns].merge(condition.head_replicates[keys + columns], on=keys,
                                                        suffixes=("_base", "_condition"))
    out = None
    for name, column in zip(HEAD_CHANGES, columns):
        paired[name] = paired[f"{column}_condition"] - paired[f"{column}_base"]
        grid = paired.pivot(index="replicate", columns=HEAD_KEYS, values=name)
        estimate = (condition.heads.set_index(HEAD_KEYS)[column] - base.heads.set_index(HEAD_KEYS)[column]
                    ).reindex(grid.columns).to_numpy(dtype=float)
        lo, hi = bootstrap_interval(estimate, grid.to_numpy(), level, interval_method(name))
        frame = pd.DataFrame({"layer": grid.columns.get_level_values(0).astype(int),
                              "head": grid.columns.get_level_values(1).astype(int), f"{name}_lo": lo, f"{name}_hi": hi})
        out = frame if out is None else out.merge(frame, on=HEAD_KEYS)
    return out


def _level(base: Decomposition) -> float:
    return float(((base.provenance.get("options") or {}).get("intervals") or {}).get("level", 0.95))


def _check_comparable(base: Decomposition, conditions: Mapping[Name, Decomposition]) -> None:
    """BadInputError unless every condition is a Decomposition of the base's model and prompts, over
    the same queries and keys."""
    if not isinstance(base, Decomposition):
        raise BadInputError(f"the base must be a Decomposition (from decompose or Decomposition.load), got "
                            f"{type(base).__name__}")
    if not isinstance(conditions, Mapping):
        raise BadInputError(f"conditions must be a mapping {{name: Decomposition}}, got {type(conditions).__name__}")
    for name, result in conditions.items():
        if not isinstance(result, Decomposition):
            raise BadInputError(f"condition {name!r} must be a Decomposition (from decompose or "
                                f"Decomposition.load), got {type(result).__name__}")
    for name, result in conditions.items():
        check_same_origin(base.provenance, result.provenance, f"condition {name!r}")
        for column in ("query_start", "query_stop", "key_set"):
            if set(result.heads[column]) != set(base.heads[column]):
                raise BadInputError(
                    f"condition {name!r} was decomposed with {column}={sorted(set(result.heads[column]))} but "
                    f"the base with {sorted(set(base.heads[column]))}; decompose both with the same options")


def _head_changes(name: Hashable, paired: pd.DataFrame, base: Decomposition, result: Decomposition,
                  level: float) -> pd.DataFrame:
    """Per head, ``R`` and held-out ``R`` under the base and the condition ``name``, their changes and
    the changes' paired intervals."""
    heads = paired[HEAD_KEYS + ["layer_type"]].copy()
    heads.insert(0, "condition", name)
    heads["R_base"], heads["R_condition"] = paired["R_base"], paired["R_condition"]
    heads["R_change"] = heads["R_condition"] - heads["R_base"]
    heads["R_heldout_base"] = paired["R_heldout_base"]
    heads["R_heldout_condition"] = paired["R_heldout_condition"]
    heads["R_heldout_change"] = heads["R_heldout_condition"] - heads["R_heldout_base"]
    bounds = _head_change_intervals(base, result, level)
    if bounds is None:
        for change in HEAD_CHANGES:
            heads[f"{change}_lo"] = heads[f"{change}_hi"] = np.nan
    else:
        heads = heads.merge(bounds, on=HEAD_KEYS, how="left")
    return heads


def compare(base: Decomposition, conditions: Mapping[Name, Decomposition]) -> Comparison:
    """Compare each condition's decomposition with the base, head by head, per layer and
    overall (module docstring). A condition may cover fewer layers than the base (e.g.
    only those downstream of a patch); only the heads it covers are compared.

    Base and conditions must come from the same model (weights hash) and the same prompts
    (token hash), or the "paired" intervals would pair unrelated sequences:
    :func:`~lens_position.core.checks.check_same_origin` refuses them otherwise."""
    _check_comparable(base, conditions)
    head_frames, layer_rows, overall_rows, replicate_frames = [], [], [], []
    level = _level(base)
    for name, result in conditions.items():
        paired = base.heads.merge(result.heads[HEAD_KEYS + ["R", "R_heldout", "var_abs_t"]], on=HEAD_KEYS,
                                  suffixes=("_base", "_condition"), validate="one_to_one")
        if paired.empty:
            raise BadInputError(f"condition {name!r} shares no (layer, head) with the base")
        heads = _head_changes(name, paired, base, result, level)
        head_frames.append(heads)
        covered = base.heads.merge(paired[HEAD_KEYS], on=HEAD_KEYS)
        compared = result.heads.merge(paired[HEAD_KEYS], on=HEAD_KEYS)
        per_layer = _replicate_layer_fractions(base, result)
        for layer, group in covered.groupby("layer", sort=True):
            layer_rows.append(_with_intervals(
                {"condition": name, "layer": int(layer), "layer_type": group["layer_type"].iloc[0],
                 **_summary(group, compared[compared["layer"] == layer])},
                None if per_layer is None else per_layer.get(int(layer)), level))
        # overall fractions from replicates need whole layers on both sides (a replicate keeps layer means)
        fractions = _replicate_fractions(base, result, sorted(set(paired["layer"])))
        overall_rows.append(_with_intervals({"condition": name, **_summary(covered, compared),
                                             "n_sequences": int(base.heads["n_sequences"].iloc[0])},
                                            fractions, level))
        if fractions is not None:
            replicate_frames.append(pd.DataFrame({"condition": name,
                                                  "replicate": np.arange(len(fractions["fraction_removed"])),
                                                  **{key: fractions[key] for key in PAIRED}}))
    return Comparison(
        heads=pd.concat(head_frames, ignore_index=True) if head_frames else pd.DataFrame(),
        layers=pd.DataFrame(layer_rows), overall=pd.DataFrame(overall_rows),
        replicates=pd.concat(replicate_frames, ignore_index=True) if replicate_frames else None,
        provenance={"base": base.provenance, "conditions": {n: r.provenance for n, r in conditions.items()},
                    "fraction_removed": "1 - R_condition / R_base, R = mean over heads of Var(abs t)/Var(log A)",
                    "fraction_removed_raw": "1 - sum_heads var_abs_t_condition / sum_heads var_abs_t_base",
                    "fraction_removed_rf": "1 - R_rf_condition / R_rf_base (reference-free split)",
                    "fraction_removed_rf_heldout": "1 - R_rf_heldout_condition / R_rf_heldout_base (held-out "
                                                   "reference-free split: no in-sample fit's upward bias, so it "
                                                   "does not drift with N)",
                    "R_change": "R_condition - R_base (per head; per layer and overall: of the means over heads)",
                    "intervals": {"method": "paired bootstrap: base and condition resample the same sequences per "
                                            "replicate; each interval comes from the quantity computed replicate "
                                            "by replicate: the bias-corrected percentile interval for the "
                                            "quantities under 'bias_corrected' (computed from in-sample fits), "
                                            "else the percentile "
                                            "interval",
                                  "bias_corrected": [name for name in PAIRED if name in BIAS_CORRECTED_QUANTITIES],
                                  **{k: v for k, v in ((base.provenance.get("options") or {}).get("intervals")
                                                       or {}).items() if k in ("level", "n_resamples", "seed")},
                                  "columns": [f"{name}_lo/_hi" for name in PAIRED],
                                  "per_head": [f"{name}_lo/_hi" for name in HEAD_CHANGES]}})


@public
def decompose_conditions(
    loaded: LoadedModel,
    prompts: Prompts,
    conditions: Mapping[Name, Sequence[Patch]],
    *,
    layers: Mapping[Name, Sequence[int]] | Sequence[int] | None = None,
    query_range: tuple[int, int] | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> dict[Name, Decomposition]:
    """Decompose ``prompts`` under each named condition (its patches applied; one streamed
    pass per condition). ``layers``: the layers to analyse, for all conditions or per
    condition name (default all; the pass stops after the last). ``progress``: one bar
    counting the sequences of every condition's pass."""
    out = {}
    # what decompose asks of them: checked once here
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    if query_range is not None:
        query_range = check_query_range(query_range, prompts.tokens.shape[1])
    if layers is not None and not isinstance(layers, Mapping):
        layers = check_layers(layers, loaded.spec.n_layers)
    n_prompts = len(prompts)
    with progress_bar("decompose conditions", total=len(conditions) * n_prompts, enabled=progress):
        for name, patches in conditions.items():
            chosen = layers.get(name) if isinstance(layers, Mapping) else layers
            out[name] = decompose.body(loaded, prompts, patches=list(patches), layers=chosen, query_range=query_range,
                                  batch_size=batch_size, bootstrap=bootstrap)
    return out
