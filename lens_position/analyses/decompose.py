"""How much of each attention head's pattern depends on absolute position, and where from.

The measurement (see the docs' concepts page), for one layer and one head:

1. Read the scores ``s[i, j]`` at ``blocks.{l}.attn.hook_attn_scores`` (after RoPE, the
   1/sqrt(d_head) scale and any soft-cap; ``-inf`` outside the key set ``K(i)``, which is
   ``{0..i}`` for a causal layer and ``{i-W+1..i}`` for a sliding window of ``W`` keys).
2. Self-reference them: ``t[i, j] = s[i, j] - s[i, i]``. A per-query constant never
   changes a softmax and the reference sits at offset 0, so offset-only scores give
   offset-only ``t``.
3. The log-normaliser ``z[i] = logsumexp_{j in K(i)} t[i, j]``, and the exact identity
   ``log A[i, j] = t[i, j] - z[i]``.
4. Fit ``y`` by least squares on relative features (one-hot offset ``d = i - j``, every
   offset its own bin, plus an intercept) and on relative plus absolute features (one-hot
   bins of the query position ``i`` and key position ``j``: exact below ``exact_until``,
   log-spaced beyond). The *absolute part* ``abs(y)`` is the full fit minus the relative
   fit. Least squares is linear in its target, so ``abs(log A) = abs(t) - abs(z)``.
5. With ``V = Var(log A)`` over the analysed (sequence, query, key) triples:
   total ``T = Var(abs log A)/V``, residual ``R = Var(abs t)/V``, mask
   ``M = Var(abs z)/V``, interaction ``C = -2 Cov(abs t, abs z)/V``; ``T = R + M + C``.

Why offsets get one bin each: the relative model must be able to express *any* function
of the offset, otherwise within-bin offset variation would be credited to absolute
position (and offset-only scores would not give ``R = 0``).

Streaming. Every sequence has the same positions, so the design matrix ``X`` (analysed
pairs x features) is the same for every sequence. Least squares over all (n, i, j)
triples then needs only ``X'X`` (counted once from positions) and ``X'y`` (per-feature
sums of ``y`` over the batch), and ``V`` needs ``sum y`` and ``sum y^2``. A hook on
``hook_attn_scores`` reduces each batch to these float64 statistics and drops the
``T x T`` tensors, so memory is ``O(layers x heads x features)`` whatever the number of
sequences; the forward pass stops after the last analysed layer (``stop_at_layer``).

Held-out values (split-half cross-fit). Sequences are split by parity of their index
(halves A and B). The absolute parts ``abs_A``, ``abs_B`` are fitted on each half. Because
``abs_A`` lies in the span of the absolute features orthogonal to the relative ones, the
share of half B's ``log A`` variance that the A-fitted absolute part explains is
``Cov(abs_A(log A), log A_B) / V_B = Cov(abs_A(log A), abs_B(log A)) / V_B``. Expanding
``abs = abs(t) - abs(z)`` gives held-out ``R, M, C`` with ``T = R + M + C`` exactly; we
average the two directions (A -> B and B -> A). In-sample values include the part of
sequence-specific noise that happens to align with the absolute bins (it shrinks as
``features / (N x pairs)``); the held-out values do not, and they can be slightly negative
when there is no absolute signal at all. With ``N = 1`` they are NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.cached_scores import CachedScores
from lens_position.analyses.engine.design import KeySet, PairDesign, PositionBins
from lens_position.analyses.engine.fit import Fitter, components
from lens_position.analyses.engine.statistics import (
    HeadStatistics,
    Workspace,
    check_key_set,
    reduce_scores,
    self_referenced_scores,
    visible_keys,
)
from lens_position.core.checks import check_count, check_layers, check_query_range, tokens_sha256
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts, require_checked
from lens_position.core.intervals import (
    BIAS_CORRECTED_QUANTITIES,
    MIN_INTERVAL_UNITS,
    Bootstrap,
    bootstrap_interval,
    interval_method,
    resample_counts,
    small_sample_widening,
)
from lens_position.core.patch import Patch
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, check_finite_activation, checked_fwd_hooks, stream
from lens_position.core.summaries import Headline, layer_mean
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models.pass_memory import check_pass_fits
from lens_position.models.spec import LoadedModel, public

__all__ = ["COMPONENTS", "HEAD_COLUMNS", "HEAD_REPLICATE_COMPONENTS", "INTERVAL_COLUMNS", "MAX_GROUPS", "Decomposition",
           "DecompositionReducer", "HeadStatistics", "KeySet", "PairDesign", "PositionBins", "check_identity",
           "decompose", "decompose_dense", "layer_key_windows", "self_referenced_scores", "visible_keys"]

REFERENCE_FREE_DEFINITION = (
    "mask-only counterfactual: g(d) fitted to t with one constant per query (t ~ g(i - j) + c(i)), "
    "lam = g - logsumexp_K(i) g; M' = Var(abs lam)/V, R' = Var(abs log A - abs lam)/V, "
    "C' = 2 Cov(abs lam, abs log A - abs lam)/V"
)
HELDOUT_DEFINITION = (
    "split-half cross-fit: absolute part fitted on even-indexed sequences, evaluated as "
    "Cov(abs_even, abs_odd)/V_odd, averaged with the reverse direction"
)


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------

COMPONENTS = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout",
              "R_rf", "M_rf", "C_rf", "R_rf_heldout", "M_rf_heldout", "C_rf_heldout"]
INTERVAL_COLUMNS = [f"{c}_{side}" for c in COMPONENTS for side in ("lo", "hi")]
# The components kept per head and replicate (Decomposition.head_replicates): the residual components an
# intervention changes, so a per-head change gets a paired interval (lens_position.analyses.compare).
HEAD_REPLICATE_COMPONENTS = ["R", "R_heldout", "R_rf", "R_rf_heldout"]
HEAD_COLUMNS = [
    "layer", "head", "layer_type", "window", "query_start", "query_stop", "key_set", *COMPONENTS,
    "var_logA", "var_abs_t", "var_abs_z", "cov_abs_tz", "n_pairs", "n_sequences", *INTERVAL_COLUMNS,
]


@dataclass(repr=False)
class Decomposition(SavedResult):
    """Result of :func:`decompose`.

    ``heads``: one row per (layer, head). ``T, R, M, C`` (and ``*_heldout``) are fractions of
    ``var_logA`` = Var(log A) over the analysed triples (in-sample ``T`` lies in [0, 1];
    ``T = R + M + C``). ``var_abs_t``, ``var_abs_z``, ``cov_abs_tz`` are in squared nats.
    ``n_pairs`` counts analysed (sequence, query, key) triples. ``layer_type`` is
    ``"global"`` or ``"local"`` with its ``window``. ``*_heldout`` are split-half cross-fits
    (module docstring): free of the in-sample fit's noise, slightly negative when there is
    no signal, NaN with a single sequence. ``R_rf, M_rf, C_rf`` (and ``*_heldout``) are
    the reference-free split of the same ``T`` (module docstring), ``T = R_rf + M_rf + C_rf``;
    NaN with ``keys="no-bos"``. Every component ``X`` has its bootstrap interval
    ``X_lo``/``X_hi`` (NaN when intervals are off): the percentile interval for the held-out
    components, the bias-corrected percentile one for the in-sample components, whose replicates
    carry the in-sample fit's optimism once more (:mod:`lens_position.core.intervals`).
    ``layers``: one row per layer, the mean over heads of each component, its interval (from
    that mean over the replicates, the same method), ``relative_depth`` = layer / (n_layers − 1),
    ``query_stop``, ``n_sequences`` and ``seq_len`` (``T``, positions per sequence: cross-model comparisons are
    made only between decompositions of the same ``T``, :mod:`lens_position.analyses.claims`).
    ``provenance``: model spec, data spec, seed, options (bins, query range, keys), the
    interval method, level and number of resamples, versions.
    ``replicates``: one row per (bootstrap replicate, layer) with the layer's mean over heads
    of every component in that replicate (None when intervals are off). Derived quantities
    (a ratio, a depth slope, a difference between two runs on the same prompts) get their
    intervals by computing them replicate by replicate.
    ``head_replicates``: one row per (bootstrap replicate, layer, head) with the head's residual
    components (``HEAD_REPLICATE_COMPONENTS``) in that replicate, for the per-head paired
    intervals of an intervention's change (None when intervals are off).
    """

    KEYWORD = "decomposition"
    TABLES = (
        Table("decompose_layers", "layers",
              "Decomposition.layers (all queries, all keys)"),
        Table("decompose_heads", "heads",
              "Decomposition.heads (all queries, all keys)"),
        Table("decompose_replicates", "replicates",
              "Decomposition.replicates (all queries, all keys): per-layer means per bootstrap replicate"),
    )

    heads: pd.DataFrame
    layers: pd.DataFrame
    provenance: dict[str, Any]
    replicates: pd.DataFrame | None = None
    head_replicates: pd.DataFrame | None = None

    WHAT = "absolute position in attention split into residual (R') and mask (M') components"
    HEADS = ("heads", "R_rf_heldout")

    def headline(self) -> list[Headline]:
        """Mean over layers and heads of R', M' (held out, reference-free: what the claims use) and
        the total, with their intervals; the query range in the label when it is not all queries."""
        has_stop = "query_stop" in self.layers.columns and len(self.layers)
        stop = int(self.layers["query_stop"].iloc[0]) if has_stop else None
        where = (
            f", queries < {stop}"
            if stop is not None and stop < int((self.provenance.get("data") or {}).get("T") or 0)
            else ""
        )
        counted = "n_sequences" in self.layers.columns and len(self.layers)
        n_seq = int(self.layers["n_sequences"].iloc[0]) if counted else None
        if n_seq is not None and n_seq < 2:  # held out: one half of the sequences fits, the other evaluates
            where += f": needs N >= 2 sequences, this ran on N = {n_seq}"
        out = []
        for column, label, meaning in (
                ("R_rf_heldout", "R' residual", "the residual stream's share of Var(log A)"),
                ("M_rf_heldout", "M' mask", "the causal mask's share of Var(log A)"),
                ("total_heldout", "total", "absolute-position share of Var(log A)")):
            if column in self.layers.columns:
                out.append(Headline(column, f"{label} (held out{where})",
                                    layer_mean(self.layers, self.replicates, column), meaning))
        return out

    def to_tensor(self, component: str = "R") -> Float[torch.Tensor, "layer head"]:
        """One per-head column of ``heads`` (``"R"``, ``"M_heldout"``, ...) as a float64
        ``[layer, head]`` tensor indexed like the model: ``to_tensor("R")[l, h]`` is layer ``l``,
        head ``h``. Layers that were not analysed are rows of NaN, so a subset keeps its real
        layer indices."""
        if (
            component not in self.heads.columns
            or component in ("layer", "head")
            or not pd.api.types.is_numeric_dtype(self.heads[component])
        ):
            numeric = [
                c
                for c in self.heads.columns
                if c not in ("layer", "head") and pd.api.types.is_numeric_dtype(self.heads[c])
            ]
            raise BadInputError(f"no per-head quantity {component!r}; choose one of {numeric}")
        model = self.provenance.get("model") or {}
        n_layers = int(model.get("n_layers") or self.heads["layer"].max() + 1)
        n_heads = int(model.get("n_heads") or self.heads["head"].max() + 1)
        out = torch.full((n_layers, n_heads), float("nan"), dtype=torch.float64)
        layer = torch.from_numpy(self.heads["layer"].to_numpy(dtype=np.int64, copy=True))
        head = torch.from_numpy(self.heads["head"].to_numpy(dtype=np.int64, copy=True))
        values = self.heads[component].to_numpy(dtype=np.float64, na_value=np.nan, copy=True)
        out[layer, head] = torch.from_numpy(values)
        return out


def layer_key_windows(loaded: LoadedModel) -> list[int | None]:
    """Window of each layer's attention mask (``None`` for a causal layer over all earlier
    keys): ``ModelSpec.layer_windows``, which the spec builder reads off the model's own
    attention modules."""
    return list(loaded.spec.layer_windows)


def _check_options(
    loaded: LoadedModel,
    tokens: torch.Tensor,
    layers: Sequence[int] | int | str | None,
    query_range: tuple[int, int] | None,
    keys: str,
) -> tuple[list[int], int, int]:
    unsupported = loaded.backend.attention_unsupported()
    if unsupported is not None:
        raise UnsupportedArchitectureError(
            f"decompose needs plain causal softmax attention (log A = s - logsumexp s); this model has {unsupported}"
        )
    length = tokens.shape[1]
    layers = check_layers(layers, loaded.spec.n_layers)
    query_start, query_stop = check_query_range(query_range, length)
    if keys not in ("all", "no-bos"):
        raise BadInputError(f"keys must be 'all' or 'no-bos', got {keys!r}")
    return layers, query_start, query_stop


MAX_GROUPS = 32  # sequences are kept in at most this many groups (each its own while N <= MAX_GROUPS)


class DecompositionReducer:
    """The decomposition's statistics as a reducer for :func:`lens_position.core.stream.stream`:
    it reads ``hook_attn_scores`` of the analysed layers and keeps, per layer, the
    :class:`HeadStatistics` of every group of sequences: each sequence its own group while
    ``N <= MAX_GROUPS`` and intervals are on, else sequence ``n`` in group ``n % n_groups``
    (two groups, the halves, when intervals are off).

    Build it with the same options as :func:`decompose`, stream the prompts through the
    model (together with any other reducers), then call :meth:`result`.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        prompts: CheckedPrompts,
        *,
        layers: Sequence[int] | int | str | None = None,
        query_range: tuple[int, int] | None = None,
        keys: KeySet = "all",
        bins: PositionBins = PositionBins(),
        bootstrap: Bootstrap = Bootstrap(),
    ) -> None:
        self.loaded = loaded
        checked = require_checked(loaded, prompts, "DecompositionReducer", min_length=2)  # T >= 2: pairs to fit
        tokens, self.data = checked.tokens, checked.spec
        self.tokens_sha256 = tokens_sha256(tokens)
        self.seed = checked.spec.seed
        self.layers, self.query_start, self.query_stop = _check_options(self.loaded, tokens, layers, query_range, keys)
        self.length = tokens.shape[1]
        check_pass_fits(loaded.backend, 1, self.length)  # before the design, which grows with T² as the pass does
        self.keys, self.bins, self.bootstrap = keys, bins, bootstrap
        n_seq = tokens.shape[0]
        self.n_groups = 2 if not bootstrap.enabled else max(2, min(n_seq + n_seq % 2, MAX_GROUPS))
        self.windows = layer_key_windows(self.loaded)
        self.designs: dict[int | None, PairDesign] = {}
        for layer in self.layers:
            window = self.windows[layer]
            if window not in self.designs:
                self.designs[window] = PairDesign.build(
                    self.length, window, self.query_start, self.query_stop, keys, bins
                )
        n_heads = self.loaded.spec.n_heads
        self.stats = {
            layer: HeadStatistics.zeros(
                n_heads, self.designs[self.windows[layer]].n_features, self.query_stop - self.query_start, self.n_groups
            )
            for layer in self.layers
        }
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_attn_scores" for layer in self.layers)
        self._layer_of = dict(zip(self.hook_names, self.layers))
        self._checked: set[int] = set()
        self._on_device: dict[int | None, PairDesign] = {}
        self._workspace = Workspace()

    def update(self, hook_name: str, scores: Float[torch.Tensor, "batch head query key"],
               rows: Int[torch.Tensor, "batch"]) -> None:
        layer = self._layer_of[hook_name]
        if scores.device.type != "cpu":  # reduce where the scores are; sums come back in result()
            if self.windows[layer] not in self._on_device:
                self._on_device[self.windows[layer]] = self.designs[self.windows[layer]].to(scores.device)
            self.stats[layer] = self.stats[layer].to(scores.device)
            design = self._on_device[self.windows[layer]]
        else:
            design = self.designs[self.windows[layer]]
        check_key_set(scores, design, layer, rows)
        reduce_scores(scores, design, rows % self.n_groups, self.stats[layer], self._workspace)

    def resample_weights(self) -> Float[torch.Tensor, "replicate group"] | None:
        """Multiplicities of the groups in every bootstrap replicate, drawn within halves
        (None when intervals are off). Deterministic in the number of groups and the
        bootstrap seed, so two decompositions of the same prompts draw the same replicates."""
        if not self.bootstrap.enabled:
            return None
        stats = self.stats[self.layers[0]]
        present = (stats.n_sequences > 0).numpy()
        counts = torch.zeros(self.bootstrap.n_resamples, stats.n_groups, dtype=torch.float64)
        counts[:, present] = resample_counts(int(present.sum()), self.bootstrap.n_resamples, self.bootstrap.seed,
                                             strata=stats.halves.numpy()[present]).to(torch.float64)
        return counts

    def result(self, **options: Any) -> Decomposition:
        """The :class:`Decomposition` of everything streamed so far; ``options`` (batch
        size, interventions) are recorded in its provenance."""
        n_seq = int(self.stats[self.layers[0]].n_sequences.sum())
        if n_seq == 0:
            raise BadInputError("no prompts were streamed through this decomposition")
        self.stats = {layer: stats.to("cpu") for layer, stats in self.stats.items()}
        # too few sequences for an interval to exist (MIN_INTERVAL_UNITS): none is computed
        weights = self.resample_weights() if n_seq >= MIN_INTERVAL_UNITS else None
        estimates, refits, intervals = self._fit(weights)
        heads = self._head_table(estimates, intervals, n_seq)
        per_layer = heads.groupby(["layer", "layer_type"], dropna=False, sort=True)[COMPONENTS].mean().reset_index()
        per_layer["relative_depth"] = per_layer["layer"] / max(self.loaded.spec.n_layers - 1, 1)
        per_layer["query_stop"], per_layer["n_sequences"], per_layer["seq_len"] = self.query_stop, n_seq, self.length
        replicates = head_replicates = None
        layer_means: dict[str, np.ndarray] = {}
        if weights is not None:
            replicates, head_replicates, layer_means = self._replicate_tables(refits, len(weights))
        order = [self.layers.index(layer) for layer in per_layer["layer"]]  # per_layer is sorted by layer
        for name in COMPONENTS:  # a layer's interval: the percentiles of its head mean over replicates
            if weights is None:
                per_layer[f"{name}_lo"] = per_layer[f"{name}_hi"] = np.nan
                continue
            lo, hi = bootstrap_interval(per_layer[name].to_numpy(dtype=float), layer_means[name][:, order],
                                        self.bootstrap.level, interval_method(name))
            per_layer[f"{name}_lo"], per_layer[f"{name}_hi"] = lo, hi
        return Decomposition(heads=heads, layers=per_layer, provenance=self._provenance(options),
                             replicates=replicates, head_replicates=head_replicates)

    def _fit(self, weights: Float[torch.Tensor, "replicate group"] | None) -> tuple[dict, dict, dict]:
        """Per layer: every component's estimate per head, its replicates (with ``weights``) and
        per-head intervals. The layers of one key set are refitted together (their heads side by
        side): one design, one refit, and each component's per-head intervals in one call."""
        n_heads, level = self.loaded.spec.n_heads, self.bootstrap.level
        stats0 = self.stats[self.layers[0]]
        per_half = min(int(((stats0.n_sequences > 0) & (stats0.halves == h)).sum()) for h in (0, 1))
        estimates: dict[int, dict] = {}
        refits: dict[int, dict] = {}
        intervals: dict[int, dict] = {}
        for window, design in self.designs.items():
            group = [layer for layer in self.layers if self.windows[layer] == window]
            stats = HeadStatistics.side_by_side([self.stats[layer] for layer in group])
            # the estimate (every group once) refitted with the replicates: one pass over the statistics
            everything = torch.ones(1, stats.n_groups, dtype=torch.float64)
            if weights is not None:
                everything = torch.cat([everything, weights])
            fitted = components(Fitter(design), stats, everything)
            together = {name: v[0].numpy() for name, v in fitted.items()}
            if weights is not None:
                # only the components get intervals (and kept replicates)
                replicates = {name: small_sample_widening(torch.as_tensor(together[name]), fitted[name][1:], per_half)
                              for name in COMPONENTS}
                bounds = {name: bootstrap_interval(together[name], replicates[name].numpy(), level,
                                                   interval_method(name)) for name in COMPONENTS}
            for k, layer in enumerate(group):
                heads = slice(k * n_heads, (k + 1) * n_heads)
                estimates[layer] = {name: v[heads] for name, v in together.items()}
                if weights is not None:
                    refits[layer] = {name: v[:, heads] for name, v in replicates.items()}
                    intervals[layer] = {name: (lo[heads], hi[heads]) for name, (lo, hi) in bounds.items()}
        return estimates, refits, intervals

    def _head_table(self, estimates: dict, intervals: dict, n_seq: int) -> pd.DataFrame:
        """The per-head table, column by column: a row per layer and head, layers in the order analysed."""
        layers, n_heads = self.layers, self.loaded.spec.n_heads
        n_rows = len(layers) * n_heads
        columns: dict[str, Any] = {
            "layer": np.repeat(layers, n_heads), "head": np.tile(np.arange(n_heads), len(layers)),
            "layer_type": np.repeat([self.loaded.spec.layer_types[layer] for layer in layers], n_heads),
            "window": pd.array(np.repeat([self.windows[layer] for layer in layers], n_heads).tolist(), dtype="Int64"),
            "query_start": np.full(n_rows, self.query_start), "query_stop": np.full(n_rows, self.query_stop),
            "key_set": np.full(n_rows, self.keys),
            "n_pairs": np.repeat([self.designs[self.windows[layer]].n_pairs * n_seq for layer in layers], n_heads),
            "n_sequences": np.full(n_rows, n_seq),
        }
        for name in estimates[layers[0]]:
            columns[name] = np.concatenate([estimates[layer][name] for layer in layers]).astype(float)
        for name in COMPONENTS:
            for side in (0, 1):
                columns[f"{name}_{('lo', 'hi')[side]}"] = (
                    np.concatenate([intervals[layer][name][side] for layer in layers]).astype(float)
                    if intervals else np.full(n_rows, np.nan))
        return pd.DataFrame(columns, columns=HEAD_COLUMNS)

    def _replicate_tables(self, refits: dict, n_rep: int) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, np.ndarray]]:
        """The layers' and the heads' replicate tables, and each component's layer means
        ``[replicate, layer]`` (a layer's replicate: the mean over its heads of their refits)."""
        layers, n_heads = self.layers, self.loaded.spec.n_heads
        layer_means = {name: torch.stack([refits[layer][name].mean(-1) for layer in layers], dim=1).numpy()
                       for name in COMPONENTS}
        replicates = pd.DataFrame({"replicate": np.tile(np.arange(n_rep), len(layers)),
                                   "layer": np.repeat(layers, n_rep),
                                   **{name: layer_means[name].T.reshape(-1) for name in COMPONENTS}})
        head_replicates = pd.DataFrame({
            "replicate": np.tile(np.repeat(np.arange(n_rep), n_heads), len(layers)),
            "layer": np.repeat(layers, n_rep * n_heads),
            "head": np.tile(np.arange(n_heads), n_rep * len(layers)),
            **{name: torch.stack([refits[layer][name] for layer in layers]).reshape(-1).numpy()
               for name in HEAD_REPLICATE_COMPONENTS}})
        return replicates, head_replicates, layer_means

    def _provenance(self, options: dict[str, Any]) -> dict[str, Any]:
        return provenance.collect(
            model=self.loaded.spec, data=self.data, seed=self.seed, tokens_sha256=self.tokens_sha256,
            layers=self.layers,
            query_range=[self.query_start, self.query_stop], keys=self.keys, **options,
            bins={**self.bins.to_dict(), "position_edges": self.bins.edges(self.length).tolist(), "offsets": "exact"},
            heldout=HELDOUT_DEFINITION, reference_free=REFERENCE_FREE_DEFINITION,
            intervals={**self.bootstrap.to_dict("sequence", [c for c in COMPONENTS
                                                               if c in BIAS_CORRECTED_QUANTITIES]),
                       "groups": self.n_groups,
                       "strata": "halves (even / odd sequences), resampled separately"},
            mask_windows={str(layer): self.windows[layer] for layer in self.layers},
        )


@public
def decompose(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    layers: Sequence[int] | int | str | None = None,
    query_range: tuple[int, int] | None = None,
    keys: KeySet = "all",
    patches: Sequence[Patch] = (),
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    batch_size: int = BATCH_SIZE,
    bins: PositionBins = PositionBins(),
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
    scores: Any = None,
) -> Decomposition:
    """Measure, per layer and head, the absolute-position share of the attention pattern
    and split it into residual and mask components (module docstring: method), with
    bootstrap intervals over whole sequences.

    Args:
        model: a ``LoadedModel`` or a bare ``HookedTransformer``.
        prompts: a ``PromptSet`` or integer tokens ``Int[Tensor, "N T"]``; every sequence
            has the same length ``T`` and is analysed as is (no BOS is added).
        layers: layers to analyse (default all); the forward pass stops after the last.
        query_range: ``(start, stop)``, queries ``start <= i < stop`` (default all ``T``).
        keys: ``"all"`` keys of ``K(i)``, or ``"no-bos"`` to leave position 0 out of the
            analysed pairs (the normaliser ``z`` still sums over all of ``K(i)``).
        patches: interventions (:class:`lens_position.analyses.patching.Patch`) applied during the
            pass; the analysis reads the scores the patched model actually uses.
        fwd_hooks: extra ``(hook name, function)`` pairs active during the forward pass,
            run after the patches and before the analysis.
        batch_size: sequences per forward pass.
        bins: query/key position bins (offsets always get one bin each).
        bootstrap: the intervals (:class:`lens_position.core.intervals.Bootstrap`; its default is
            a 95% percentile interval from 200 replicates; ``NO_INTERVALS`` switches them off).
            Replicates refit re-weighted statistics: they cost no forward pass.
        progress: show a progress bar.
        scores: the scores already computed for ``prompts``, instead of a forward pass: the
            ``ActivationCache`` of ``model.run_with_cache(prompts.tokens)`` (``hook_attn_scores``,
            or ``hook_rot_q`` and ``hook_rot_k``, of every analysed layer) or a mapping
            ``{layer: Float[Tensor, "batch head query key"]}``; checked against the model's key
            sets, the prompts' shape and a fresh run of two prompts
            (:mod:`lens_position.analyses.cached_scores`). The numbers are those of the forward pass.

    Returns:
        a :class:`Decomposition`. To compute it in the same pass as other statistics, stream
        a :class:`DecompositionReducer` with them (:func:`lens_position.core.stream.stream`).
    """
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    batch_size = check_count("batch_size", batch_size)
    fwd_hooks = checked_fwd_hooks(fwd_hooks, loaded.backend.hook_dict)
    reducer = DecompositionReducer(
        loaded, prompts, layers=layers, query_range=query_range, keys=keys, bins=bins, bootstrap=bootstrap
    )
    if scores is not None:
        if patches or fwd_hooks:
            raise BadInputError(
                "decompose: scores= are read as cached; patches= and fwd_hooks= need a forward pass "
                "(pass one or the other)"
            )
        cached = CachedScores(loaded, prompts.tokens, reducer.layers, scores)
        for layer, batch, rows in cached.batches(batch_size):
            reducer.update(f"blocks.{layer}.attn.hook_attn_scores", batch, rows)
        return reducer.result(batch_size=batch_size, scores_from=f"cached {cached.kind}")
    stream.body(
        loaded,
        prompts,
        [reducer],
        patches=patches,
        fwd_hooks=fwd_hooks,
        batch_size=batch_size,
        progress=progress,
        desc="decompose",
    )
    return reducer.result(
        batch_size=batch_size,
        patches=[patch.label or patch.hook_name for patch in patches],
        fwd_hooks=[name if isinstance(name, str) else repr(name) for name, _ in fwd_hooks],
    )


# ---------------------------------------------------------------------------------------
# Dense reference
# ---------------------------------------------------------------------------------------


@public
def decompose_dense(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    layers: Sequence[int] | int | str | None = None,
    query_range: tuple[int, int] | None = None,
    keys: KeySet = "all",
    bins: PositionBins = PositionBins(),
) -> Decomposition:
    """The same measurement done the plain way, as a reference for :func:`decompose`.

    Caches every analysed layer's scores for all sequences at once, builds the explicit
    design matrix stacked over sequences (``[N * pairs, features]``) and solves each fit with
    ``torch.linalg.lstsq``; the absolute parts, variances and held-out cross-fits are then
    computed pair by pair. Memory grows as ``N x layers x heads x T^2``: use it on small
    cases (tests, the benchmark), never for analysis.
    """
    checked = checked_prompts(loaded, prompts, min_length=2)
    tokens, data = checked.tokens, checked.spec
    layers, query_start, query_stop = _check_options(loaded, tokens, layers, query_range, keys)
    n_seq, length = tokens.shape
    windows = layer_key_windows(loaded)
    names = {f"blocks.{layer}.attn.hook_attn_scores" for layer in layers}
    with torch.no_grad():
        cache = loaded.backend.run_with_cache(tokens, sorted(names), stop_at_layer=layers[-1] + 1)
    for name in sorted(names):
        check_finite_activation(name, cache[name], torch.arange(len(tokens)), loaded.backend.model)
    n_heads = loaded.backend.n_heads
    rows = []
    for window in dict.fromkeys(windows[layer] for layer in layers):
        group = [layer for layer in layers if windows[layer] == window]
        design = PairDesign.build(length, window, query_start, query_stop, keys, bins)
        x_full = design.dense().repeat(n_seq, 1)
        y = _dense_targets(cache, group, design, n_seq, n_heads)
        sequence = torch.arange(n_seq).repeat_interleave(design.n_pairs)
        halves = [sequence % 2 == 0, sequence % 2 == 1]
        fits = [_dense_absolute_part(x_full, design, y, None)]
        fits += [_dense_absolute_part(x_full, design, y, h) for h in halves] if n_seq > 1 else []
        for k, layer in enumerate(group):
            values = _dense_components(y, fits, k, n_heads, halves if n_seq > 1 else None, design.n_pairs)
            for head in range(n_heads):
                row = {"layer": layer, "head": head, "layer_type": loaded.spec.layer_types[layer],
                       "window": window, "query_start": query_start, "query_stop": query_stop, "key_set": keys,
                       "n_pairs": design.n_pairs * n_seq, "n_sequences": n_seq}
                row.update({name: float(v[head]) for name, v in values.items()})
                rows.append(row)
    heads = (pd.DataFrame(rows, columns=HEAD_COLUMNS).astype({"window": "Int64"})
             .sort_values(["layer", "head"], ignore_index=True))
    per_layer = heads.groupby(["layer", "layer_type"], dropna=False, sort=True)[COMPONENTS].mean().reset_index()
    prov = provenance.collect(model=loaded.spec, data=data, tokens_sha256=tokens_sha256(tokens), layers=layers,
                              query_range=[query_start, query_stop],
                              keys=keys, bins={**bins.to_dict(), "position_edges": bins.edges(length).tolist()},
                              method="dense reference (cached scores, torch.linalg.lstsq)")
    return Decomposition(heads=heads, layers=per_layer, provenance=prov)


def _dense_targets(cache: dict[str, torch.Tensor], group: Sequence[int], design: PairDesign, n_seq: int,
                   n_heads: int) -> Float[torch.Tensor, "pair column"]:
    """``t`` then ``z`` of every layer of ``group`` and head, on the analysed pairs of every sequence:
    ``[N * pairs, layers * 2 * heads]``."""
    query_start, query_stop = design.query_start, design.query_stop
    y = torch.empty(n_seq * design.n_pairs, len(group) * 2 * n_heads, dtype=torch.float64)
    for k, layer in enumerate(group):
        scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][:, :, query_start:query_stop]
        t, z = self_referenced_scores(scores, query_start)
        y_t = t.reshape(n_seq, n_heads, -1)[:, :, design.flat]
        y_z = z[:, :, design.query - query_start]
        y[:, 2 * k * n_heads:(2 * k + 1) * n_heads] = y_t.permute(0, 2, 1).reshape(-1, n_heads)
        y[:, (2 * k + 1) * n_heads:(2 * k + 2) * n_heads] = y_z.permute(0, 2, 1).reshape(-1, n_heads)
    return y


def _dense_absolute_part(x_full: torch.Tensor, design: PairDesign, y: torch.Tensor,
                         rows: torch.Tensor | None) -> torch.Tensor:
    """abs(y) on one sequence's pairs ``[pairs, columns]``, fitted by ``torch.linalg.lstsq`` on
    ``rows`` of the stacked design (None: all)."""
    x_rel = x_full[:, design.relative]
    if rows is not None:
        x_full_rows, x_rel_rows, y = x_full[rows], x_rel[rows], y[rows]
    else:
        x_full_rows, x_rel_rows = x_full, x_rel
    full = torch.linalg.lstsq(x_full_rows, y, driver="gelsd").solution
    rel = torch.linalg.lstsq(x_rel_rows, y, driver="gelsd").solution
    return x_full[: design.n_pairs] @ full - x_rel[: design.n_pairs] @ rel


def _centred_cov(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ((a - a.mean(0)) * (b - b.mean(0))).mean(0)


def _dense_components(y: torch.Tensor, fits: Sequence[torch.Tensor], k: int, n_heads: int,
                      halves: Sequence[torch.Tensor] | None, n_pairs: int) -> dict[str, torch.Tensor]:
    """The components of layer ``k`` of the targets ``y``, from the absolute parts fitted on all
    sequences (``fits[0]``) and, with ``halves``, on each half (held out)."""
    cols_t = slice(2 * k * n_heads, (2 * k + 1) * n_heads)
    cols_z = slice((2 * k + 1) * n_heads, (2 * k + 2) * n_heads)
    log_a = y[:, cols_t] - y[:, cols_z]
    var_log_a = log_a.var(0, unbiased=False)
    a_t, a_z = fits[0][:, cols_t], fits[0][:, cols_z]
    var_t, var_z, cov_tz = _centred_cov(a_t, a_t), _centred_cov(a_z, a_z), _centred_cov(a_t, a_z)
    values = {"R": var_t / var_log_a, "M": var_z / var_log_a, "C": -2 * cov_tz / var_log_a,
              "total": (a_t - a_z).var(0, unbiased=False) / var_log_a,
              "var_logA": var_log_a, "var_abs_t": var_t, "var_abs_z": var_z, "cov_abs_tz": cov_tz}
    if halves is None:
        return values
    (at0, az0), (at1, az1) = [(f[:, cols_t], f[:, cols_z]) for f in fits[1:]]
    v0, v1 = (log_a[h].var(0, unbiased=False) for h in halves)
    # fit on half 0, evaluate on half 1: Cov(abs_0, log A of half 1) / V_1, and back
    cross = []
    for fitted, other, v_other in (((at0, az0), 1, v1), ((at1, az1), 0, v0)):
        la = log_a[halves[other]].reshape(-1, n_pairs, n_heads)
        cross.append(torch.stack([
            _centred_cov(fitted[0].repeat(la.shape[0], 1), la.reshape(-1, n_heads)),
            _centred_cov(fitted[1].repeat(la.shape[0], 1), la.reshape(-1, n_heads)),
        ]) / v_other)
    values["total_heldout"] = 0.5 * sum(c[0] - c[1] for c in cross)
    values["R_heldout"] = 0.5 * (_centred_cov(at0, at1) / v1 + _centred_cov(at1, at0) / v0)
    values["M_heldout"] = 0.5 * (_centred_cov(az0, az1) / v1 + _centred_cov(az1, az0) / v0)
    values["C_heldout"] = -0.5 * ((_centred_cov(at0, az1) + _centred_cov(az0, at1)) / v1
                                  + (_centred_cov(at1, az0) + _centred_cov(az1, at0)) / v0)
    return values


@public
def check_identity(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    layers: Sequence[int] | int | str | None = None,
    min_pattern: float = 1e-6,
) -> pd.DataFrame:
    """Check the exact identity ``log A = t - z`` against the model's own ``hook_pattern``.

    Returns one row per layer: ``max_abs_error_pattern`` = max |exp(t - z) - A| over all
    entries (probability units), ``max_abs_error_log`` = max |(t - z) - log A| over entries
    with ``A > min_pattern`` (nats; smaller patterns are float32 round-off territory), and
    ``max_row_sum_error`` = max |sum_j exp(t - z) - 1|. Expected: float32 round-off.
    """
    tokens = checked_prompts(loaded, prompts, min_length=2).tokens
    layers, _, _ = _check_options(loaded, tokens, layers, None, "all")
    names = {f"blocks.{layer}.attn.{kind}" for layer in layers for kind in ("hook_attn_scores", "hook_pattern")}
    with torch.no_grad():
        cache = loaded.backend.run_with_cache(tokens, sorted(names), stop_at_layer=layers[-1] + 1)
    for name in sorted(names):
        check_finite_activation(name, cache[name], torch.arange(len(tokens)), loaded.backend.model)
    rows = []
    for layer in layers:
        t, z = self_referenced_scores(cache[f"blocks.{layer}.attn.hook_attn_scores"])
        log_a = t - z[..., None]
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].to(torch.float64)
        visible = pattern > min_pattern
        rows.append({
            "layer": layer,
            "max_abs_error_pattern": float((log_a.exp() - pattern).abs().max()),
            "max_abs_error_log": float((log_a - pattern.log())[visible].abs().max()),
            "max_row_sum_error": float((log_a.exp().sum(-1) - 1).abs().max()),
        })
    return pd.DataFrame(rows)
