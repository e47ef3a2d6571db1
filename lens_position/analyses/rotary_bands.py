"""Absolute position by RoPE frequency band: which rotary frequencies carry the residual component.

After RoPE, a head's score is a sum over its dimensions, ``s[i, j] = sum_d q_rot[i, d] k_rot[j, d]
/ scale``, and the rotated dimensions come in pairs that turn at one frequency each. Group the
pairs into ``n_bands`` contiguous bands of frequency (band 0 the fastest; the dimensions RoPE
leaves unrotated, if any, are one more band, ``"unrotated"``): ``s = sum_b s_b`` exactly, and so
``t = sum_b t_b`` with ``t_b[i, j] = s_b[i, j] - s_b[i, i]``.

- **Exact split of R.** The decomposition's absolute part is a least-squares fit, linear in its
  target (:mod:`lens_position.analyses.decompose`), so ``abs(t) = sum_b abs(t_b)`` and
  ``R = Var(abs t) / V = sum_b R_b + sum_{b < c} C_bc`` with ``R_b = Var(abs t_b) / V`` and the
  cross-band terms ``C_bc = 2 Cov(abs t_b, abs t_c) / V`` (``V = Var(log A)``). Nothing is
  approximated: the bands plus the cross terms equal ``R`` to float round-off, and every result
  says how far they are from it (``R_split_error``).
- **Attribution of R'.** The reference-free residual component passes through the
  normaliser, so it does not split over bands. Its attribution to band ``b`` is the change when
  the band's scores are removed: ``R'(s) - R'(s - s_b)``, each ``R'`` from the decomposition's own
  fit. These attributions need not add up to ``R'``; ``R_rf_attribution_error`` = their sum minus
  ``R'`` is measured on every head and reported beside them.

The statistics are the decomposition's (:class:`~lens_position.analyses.decompose.HeadStatistics`,
reduced by the same code, fitted by the same ``Fitter``): each band's ``t_b`` and each
band-removed score tensor is reduced as one more "head" of the layer, so a band costs no extra
forward pass, and the bootstrap resamples the same groups of sequences as the decomposition. Both
are read in one sweep over blocks of query rows (each band's ``q_b . k_b`` computed once for the
two), and the band's own scores only to ``X't`` (the exact split is a fit of ``t``, with no
normaliser): ``bands + 1`` full reductions and ``bands`` of ``t`` alone per layer.

Frequencies are read off the model's own rotary tables (``rotary_sin``/``rotary_cos`` at
position 1), so NTK-aware and NTK-by-parts scaling, and Gemma-3's local base, are what the model
uses, not what a config says.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.decompose import DecompositionReducer
from lens_position.analyses.engine.design import PositionBins
from lens_position.analyses.engine.fit import Fitter, components
from lens_position.analyses.engine.statistics import HeadStatistics, Target, Workspace, reduce_score_sets
from lens_position.core.checks import check_count
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts
from lens_position.core.intervals import Bootstrap, Estimate, bootstrap_interval, interval_method, small_sample_widening
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models.backends import RotaryLayout, rotate
from lens_position.models.spec import LoadedModel, public

DEFAULT_BANDS = 4
# The bands' scores must add up to the model's own within float32 forward noise (measured: ~1e-6 of
# the scores' size); a wrong scale or layout is off by O(1) of it.
SCORE_CHECK_TOL = 1e-4
UNROTATED = "unrotated"


@dataclass(frozen=True)
class Band:
    """One band of a layer's head dimensions: ``dims`` (indices into ``d_head``), the frequency
    index range of its pairs ``[first_pair, stop_pair)`` (None for the unrotated band) and its
    angular frequencies in radians per position (``inv_freq_min``, ``inv_freq_max``)."""

    name: str
    dims: tuple[int, ...]
    first_pair: int | None
    stop_pair: int | None
    inv_freq_min: float
    inv_freq_max: float

    @property
    def wavelength_min(self) -> float:
        """Shortest period of the band's pairs, in positions (``2 pi / inv_freq_max``)."""
        return 2 * math.pi / self.inv_freq_max if self.inv_freq_max > 0 else math.inf

    @property
    def wavelength_max(self) -> float:
        """Longest period of the band's pairs, in positions."""
        return 2 * math.pi / self.inv_freq_min if self.inv_freq_min > 0 else math.inf


@public
def rotary_frequencies(loaded: LoadedModel, layer: int, length: int | None = None) -> Float[torch.Tensor, "pair"]:
    """The angular frequency of every rotated pair of ``layer`` (radians per position, pair
    ``k`` = dimensions ``k`` and ``k + rotary_dim/2``, or ``2k, 2k+1`` with adjacent pairs), read
    from the layer's rotary tables: the angle a vector turns through from position 0 to 1. With
    ``length``: those the model rotates a prompt of that many positions with (LongRoPE past its
    original context, dynamic NTK past the context: other frequencies than a short prompt's)."""
    return loaded.backend.rotary_layout(layer, length).frequencies


def frequency_bands(loaded: LoadedModel, layer: int, n_bands: int = DEFAULT_BANDS, length: int | None = None
                    ) -> list[Band]:
    """The layer's dimensions grouped into ``n_bands`` bands of contiguous frequency index
    (pairs split as evenly as they go, fastest first), plus the unrotated band when
    ``rotary_dim < d_head``; each band's frequencies those of prompts of ``length`` positions
    (:func:`rotary_frequencies`)."""
    n_bands = check_count("n_bands", n_bands)
    layout = loaded.backend.rotary_layout(layer, length)
    frequencies = layout.frequencies
    n_pairs = len(frequencies)
    if n_bands > n_pairs:
        raise BadInputError(f"n_bands={n_bands} but layer {layer} has only {n_pairs} rotated pairs; "
                            f"choose n_bands <= {n_pairs}")
    edges = np.linspace(0, n_pairs, n_bands + 1).round().astype(int)
    half = layout.rotary_dim // 2
    bands = []
    for b in range(n_bands):
        pairs = range(int(edges[b]), int(edges[b + 1]))
        dims = [d for k in pairs for d in ((2 * k, 2 * k + 1) if layout.adjacent_pairs else (k, k + half))]
        freq = frequencies[list(pairs)]
        bands.append(Band(f"band {b}", tuple(sorted(dims)), int(edges[b]), int(edges[b + 1]),
                          float(freq.min()), float(freq.max())))
    d_head = loaded.spec.d_head
    if layout.rotary_dim < d_head:
        bands.append(Band(UNROTATED, tuple(range(layout.rotary_dim, d_head)), None, None, 0.0, 0.0))
    return bands


def band_scores(rot_q: Float[torch.Tensor, "batch query head d_head"],
                rot_k: Float[torch.Tensor, "batch key kv_head d_head"],
                bands: Sequence[Band], scale: float) -> Float[torch.Tensor, "band batch head query key"]:
    """Each band's share of the pre-softmax scores, ``s_b = q_rot[..., dims] . k_rot[..., dims] /
    scale`` (float64, unmasked); grouped key heads are repeated as TransformerLens repeats them."""
    n_heads, n_kv = rot_q.shape[2], rot_k.shape[2]
    if n_kv != n_heads:
        rot_k = torch.repeat_interleave(rot_k, n_heads // n_kv, dim=2)
    q, k = rot_q.to(torch.float64), rot_k.to(torch.float64)
    return torch.stack([torch.einsum("bqhd,bkhd->bhqk", q[..., list(band.dims)], k[..., list(band.dims)]) / scale
                        for band in bands])


class BandReducer:
    """The statistics of :func:`rotary_bands` as a reducer for :func:`lens_position.core.stream.stream`:
    per analysed layer it reads ``hook_rot_q``, ``hook_rot_k`` (or, where the model fires no hook after
    its rotation, ``hook_q``, ``hook_k``, ``hook_cos`` and ``hook_sin``, and turns them itself) and
    ``hook_attn_scores``, feeds the
    real scores to a :class:`~lens_position.analyses.decompose.DecompositionReducer`, and reduces,
    with the same code and groups, every band's scores (for the exact split of ``R``) and the
    scores with each band removed (for the attribution of ``R'``). It also keeps the largest
    ``|sum_b s_b - s|`` seen per layer (the split's check against the model's own scores)."""

    def __init__(self, loaded: LoadedModel, prompts: CheckedPrompts, *,
                 layers: Sequence[int] | int | str | None = None, query_range: tuple[int, int] | None = None,
                 n_bands: int = DEFAULT_BANDS, bins: PositionBins = PositionBins(),
                 bootstrap: Bootstrap = Bootstrap()) -> None:
        self.loaded = loaded
        self.full = DecompositionReducer(self.loaded, prompts, layers=layers, query_range=query_range,
                                         keys="all", bins=bins, bootstrap=bootstrap)
        self.layers = self.full.layers
        length = self.full.length  # the frequencies these prompts are rotated with (LongRoPE, dynamic NTK)
        self.layouts = {layer: self.loaded.backend.rotary_layout(layer, length) for layer in self.layers}
        self.bands = {layer: frequency_bands(self.loaded, layer, n_bands, length) for layer in self.layers}
        if any(layout.soft_cap for layout in self.layouts.values()):
            raise UnsupportedArchitectureError(
                "this model soft-caps its attention scores (attn_scores_soft_cap > 0): the scores are then not "
                "a sum over frequency bands, so the split is not exact")
        n_heads = self.loaded.spec.n_heads
        n_queries = self.full.query_stop - self.full.query_start
        # per layer, one statistics per band: of its scores (only their sums of t are read: the exact split
        # is a fit of t) and of the scores without them
        self.band_stats: dict[int, list[HeadStatistics]] = {}
        self.removed_stats: dict[int, list[HeadStatistics]] = {}
        for layer in self.layers:
            design = self.full.designs[self.full.windows[layer]]
            self.band_stats[layer], self.removed_stats[layer] = (
                [HeadStatistics.zeros(n_heads, design.n_features, n_queries, self.full.n_groups, t_only=t_only)
                 for _ in self.bands[layer]] for t_only in (True, False))
        self.score_error = {layer: 0.0 for layer in self.layers}
        self.score_size = {layer: 0.0 for layer in self.layers}
        self.hook_names = tuple(f"blocks.{layer}.attn.{name}" for layer in self.layers
                                for name in self._layer_hooks(self.layouts[layer]))
        self._pending: dict[str, torch.Tensor] = {}
        self._workspace = Workspace()

    @staticmethod
    def _layer_hooks(layout: RotaryLayout) -> tuple[str, ...]:
        """The attention hooks one layer's split reads, the scores last (they fire after the rest)."""
        tables = ("hook_cos", "hook_sin") if layout.rotated_here else ()
        return (*layout.query_hooks, *tables, "hook_attn_scores")

    def check_scores(self) -> None:
        """Refuse (UnsupportedArchitectureError) a run where the bands' scores do not add up to the
        model's own ``hook_attn_scores``: the rotated q and k, the scale or the band layout would then not
        be what the model computes, and the split would be of other scores."""
        for layer, error in self.score_error.items():
            size = self.score_size[layer]
            if not error <= SCORE_CHECK_TOL * max(1.0, size):
                raise UnsupportedArchitectureError(
                    f"layer {layer}: the frequency bands' scores differ from the model's hook_attn_scores by up to "
                    f"{error:.3g} (scores up to {size:.3g}): this model's attention is not q_rot . k_rot / scale as "
                    "lens_position reads it (a score bias, cap or other scale), so the split would be of other scores")

    def update(self, hook_name: str, activation: torch.Tensor, rows: Int[torch.Tensor, "batch"]) -> None:
        _, layer_text, _, kind = hook_name.split(".")
        if kind != "hook_attn_scores":
            self._pending[kind] = activation
            return
        layer = int(layer_text)
        scores = activation
        self.full.update(hook_name, scores, rows)
        bands = self.bands[layer]
        layout = self.layouts[layer]
        rot_q, rot_k = (self._pending.pop(name) for name in layout.query_hooks)
        if layout.rotated_here:  # no hook after the model's rotation: turned here by its own tables
            cos, sin = self._pending.pop("hook_cos"), self._pending.pop("hook_sin")
            rot_q, rot_k = (rotate(x.to(torch.float64), cos.to(torch.float64), sin.to(torch.float64), layout)
                            for x in (rot_q, rot_k))
        split = _BandSets(rot_q, rot_k, scores, bands, layout.scale)
        design = self.full.designs[self.full.windows[layer]]
        targets = ([Target(stats, t_only=True) for stats in self.band_stats[layer]]
                   + [Target(stats) for stats in self.removed_stats[layer]])
        reduce_score_sets(split, design, rows % self.full.n_groups, targets, self._workspace)
        self.score_error[layer] = larger(self.score_error[layer], split.error)
        self.score_size[layer] = larger(self.score_size[layer], split.size)


@dataclass
class _BandSets:
    """One layer's band scores, computed one block at a time for
    :func:`~lens_position.analyses.engine.statistics.reduce_score_sets`: for a block of heads, rows and
    keys, each band's ``s_b`` (target ``b``) and the scores without it, ``s - s_b`` (target
    ``bands + b``), float64, each band's product computed once for both. Never whole:
    ``[band, batch, head, T, T]`` in float64 is 19 GB for SmolLM2's nine heads in four bands at
    T = 8192. While it goes, it keeps the largest ``|sum_b s_b - s|`` (``error``) and ``|s|``
    (``size``) over the cells it reads that the model shows (the split's check against the model's
    own scores); the values at the cells the model masks are not read by the reduction."""

    rot_q: Float[torch.Tensor, "batch query head d_head"]
    rot_k: Float[torch.Tensor, "batch key kv_head d_head"]
    scores: Float[torch.Tensor, "batch head query key"]
    bands: Sequence[Band]
    scale: float
    error: float = 0.0
    size: float = 0.0
    q: list[torch.Tensor] = field(init=False, repr=False)
    k: list[torch.Tensor] = field(init=False, repr=False)
    shape: tuple[int, int, int, int] = field(init=False)
    device: torch.device = field(init=False)

    def __post_init__(self) -> None:
        n_heads, n_kv = self.rot_q.shape[2], self.rot_k.shape[2]
        k = self.rot_k if n_kv == n_heads else torch.repeat_interleave(self.rot_k, n_heads // n_kv, dim=2)
        # each band's dimensions, contiguous and in float64 once per layer (a block then reads a view)
        self.q = [self.rot_q[..., list(band.dims)].to(torch.float64).contiguous() for band in self.bands]
        self.k = [k[..., list(band.dims)].to(torch.float64).contiguous() for band in self.bands]
        batch, heads, queries, keys = self.scores.shape
        self.shape = (batch, heads, queries, keys)
        self.device = self.scores.device

    def blocks(self, heads: slice, queries: slice, keys: slice) -> Iterator[tuple[int, torch.Tensor]]:
        real = self.scores[:, heads, queries, keys].to(torch.float64)
        total = torch.zeros_like(real)
        for b in range(len(self.bands)):
            part = torch.einsum("bqhd,bkhd->bhqk", self.q[b][:, queries, heads], self.k[b][:, keys, heads])
            part /= self.scale
            total += part
            yield b, part
            yield len(self.bands) + b, real - part
        # shown cells only: a masked cell is -inf or finfo.min (below half of it); NaN is compared, and fails
        masked = self.scores[:, heads, queries, keys] <= torch.finfo(self.scores.dtype).min / 2
        self.error = larger(self.error, float(total.sub_(real).abs_().masked_fill_(masked, 0.0).amax()))
        self.size = larger(self.size, float(real.abs_().masked_fill_(masked, 0.0).amax()))


def larger(a: float, b: float) -> float:
    """The larger of ``a`` and ``b``, NaN if either is (``max`` keeps its first argument against NaN)."""
    return math.nan if math.isnan(a) or math.isnan(b) else max(a, b)


@dataclass(repr=False)
class RotaryBands(SavedResult):
    """Result of :func:`rotary_bands`.

    ``bands``: one row per (layer, head, band): ``band`` (``"band 0"`` = fastest, ...,
    ``"unrotated"``), ``first_pair``/``stop_pair``, ``inv_freq_min``/``inv_freq_max``
    (radians per position), ``wavelength_min``/``wavelength_max`` (positions), ``R_band`` =
    Var(abs t_b)/V (the band's own term of the exact split of ``R``, a fraction of Var(log A)),
    ``R_rf_without_band`` (``R'`` of the scores with the band removed) and ``R_rf_attribution``
    = ``R' - R_rf_without_band`` (and ``*_heldout`` of both), each with its bootstrap interval
    over sequences (``*_lo``/``*_hi``).

    ``cross``: one row per (layer, head, band_a, band_b), ``band_a`` before ``band_b``:
    ``C_band`` = 2 Cov(abs t_a, abs t_b)/V, with its interval.

    ``heads``: one row per (layer, head): ``R`` and ``R_rf`` (and held-out) of the unmodified
    scores, ``R_bands`` (sum of ``R_band``), ``R_cross`` (sum of ``C_band``), ``R_split_error`` =
    ``R_bands + R_cross - R`` (float round-off: the split is exact), ``R_rf_attribution_sum`` and
    ``R_rf_attribution_error`` = that sum minus ``R_rf`` (the attribution's stated error; the same
    for the held-out values), and ``score_error``: the layer's largest ``|sum_b s_b - s|``
    against the model's ``hook_attn_scores`` over the cells the split reads (score units).

    ``layers``: one row per (layer, band): the mean over heads of ``R_band`` and
    ``R_rf_attribution`` (and held-out), with the band's frequencies."""

    KEYWORD = "rotary_bands"
    TABLES = (
        Table("bands_heads", "heads",
              "RotaryBands.heads: R's exact split by RoPE band (with its error) and R' attribution (with its error)"),
        Table("bands_layers", "layers",
              "RotaryBands.layers: per layer and band, R_band and the R' attribution (mean over heads)"),
    )

    bands: pd.DataFrame
    cross: pd.DataFrame
    heads: pd.DataFrame
    layers: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "R split by RoPE frequency band (exact) and R' attributed to bands"
    HEADS = ("heads", "R")

    def headline(self) -> list[Headline]:
        """Per band, its share of ``R`` and its attribution of ``R'`` (means over heads and layers),
        then the split's and the attribution's largest errors."""
        out = []
        for (_, name), rows in self.bands.groupby(["band_index", "band"], sort=True):
            out.append(Headline("R_band", f"{name}: R_band", Estimate(float(rows["R_band"].mean())),
                                "mean over heads, a fraction of Var(log A)"))
            out.append(Headline("R_rf_attribution_heldout", f"{name}: R' attribution (held-out)",
                                Estimate(float(rows["R_rf_attribution_heldout"].mean())), "mean over heads"))
        out.append(Headline("R_split_error", "largest |R_bands + R_cross - R|",
                            Estimate(float(self.heads["R_split_error"].abs().max())), "round-off: the split is exact"))
        out.append(Headline("R_rf_attribution_error", "largest |attribution sum - R'|",
                            Estimate(float(self.heads["R_rf_attribution_error"].abs().max())),
                            "the attribution's error, stated"))
        return out


def _band_covariances(
    fit: Fitter, stats: HeadStatistics, full: HeadStatistics, n_bands: int,
    weights: Float[torch.Tensor, "replicate group"],
) -> Float[torch.Tensor, "replicate head band band"]:
    """``Cov(abs t_a, abs t_b) / V`` for every pair of bands and every weighting of the groups, from
    the absolute parts' coordinates (``Fitter``: every covariance over the analysed pairs is a dot
    product of coordinates minus the product of means)."""
    n = weights @ full.n_sequences
    scale = torch.where(n > 0, 1.0 / n, torch.nan)[:, None, None]
    n_groups, width = stats.xty_t.shape[:2]
    coords = torch.einsum("gwf,kf->gwk", stats.xty_t, fit.coords)  # [group, band*head, k]
    means = stats.xty_t @ fit.mean  # [group, band*head]
    c = torch.einsum("rg,gwk->rwk", weights, coords) * scale  # mean per sequence
    m = (weights @ means)[..., None] * scale  # [R, band*head, 1]
    n_heads = width // n_bands
    c = c.reshape(len(weights), n_bands, n_heads, -1)
    m = m.reshape(len(weights), n_bands, n_heads)
    n_pairs = fit.design.n_pairs
    cov = torch.einsum("rahk,rbhk->rhab", c, c) / n_pairs - torch.einsum("rah,rbh->rhab", m, m)
    sum_y = (weights @ full.sum_y) * scale[..., 0] / n_pairs
    sum_y2 = (weights @ full.sum_y2) * scale[..., 0] / n_pairs
    var_log_a = sum_y2 - sum_y * sum_y  # [R, head]
    return cov / var_log_a[..., None, None]


@dataclass(frozen=True)
class _Interval:
    """The interval of an estimate from its replicates (widened for few sequences per half); NaN
    without replicates."""

    per_half: int
    level: float

    def __call__(self, name: str, estimate: np.ndarray, replicates: torch.Tensor | None
                 ) -> tuple[np.ndarray, np.ndarray]:
        if replicates is None:
            return np.full(estimate.shape, np.nan), np.full(estimate.shape, np.nan)
        widened = small_sample_widening(torch.as_tensor(estimate), replicates, self.per_half).numpy()
        return bootstrap_interval(estimate, widened, self.level, interval_method(name))


@dataclass
class _LayerFits:
    """One layer's refits: the bands' covariances ``[head, band, band]`` (and their replicates), the
    components with each band's scores removed, and the base decomposition's components refitted the
    same way (for paired attributions); replicates are None when intervals are off."""

    layer: int
    bands: list[Band]
    n_heads: int
    cov: np.ndarray
    cov_reps: torch.Tensor | None
    removed: dict[str, torch.Tensor]
    removed_reps: dict[str, torch.Tensor] | None
    base_now: dict[str, torch.Tensor]
    base_reps: dict[str, torch.Tensor] | None

    @classmethod
    def of(cls, reducer: BandReducer, layer: int, weights: torch.Tensor | None) -> _LayerFits:
        full = reducer.full
        bands = reducer.bands[layer]
        fit = Fitter(full.designs[full.windows[layer]])
        stats = HeadStatistics.side_by_side(reducer.band_stats[layer]).to("cpu")  # band-major: band * head
        removed_stats = HeadStatistics.side_by_side(reducer.removed_stats[layer]).to("cpu")
        full_stats = full.stats[layer].to("cpu")
        ones = torch.ones(1, full_stats.n_groups, dtype=torch.float64)
        with_weights = weights is not None
        return cls(
            layer=layer, bands=bands, n_heads=full.loaded.spec.n_heads,
            cov=_band_covariances(fit, stats, full_stats, len(bands), ones)[0].numpy(),
            cov_reps=_band_covariances(fit, stats, full_stats, len(bands), weights) if with_weights else None,
            removed=components(fit, removed_stats),
            removed_reps=components(fit, removed_stats, weights) if with_weights else None,
            base_now=components(fit, full_stats),
            base_reps=components(fit, full_stats, weights) if with_weights else None)

    def band_rows(self, h: int, base: dict[str, float], interval: _Interval, layer_type: str) -> list[dict[str, Any]]:
        """Head ``h``'s row per band: its exact share ``R_band`` and its attribution of R'."""
        own = np.array([self.cov[h, b, b] for b in range(len(self.bands))])
        own_lo, own_hi = interval("R", own, None if self.cov_reps is None else
                                  torch.stack([self.cov_reps[:, h, b, b] for b in range(len(self.bands))], dim=1))
        rows = []
        for b, band in enumerate(self.bands):
            col = b * self.n_heads + h
            without = float(self.removed["R_rf"][0, col])
            without_ho = float(self.removed["R_rf_heldout"][0, col])
            row = {"layer": self.layer, "head": h, "layer_type": layer_type, "band": band.name,
                   "band_index": b, "first_pair": band.first_pair, "stop_pair": band.stop_pair,
                   "inv_freq_min": band.inv_freq_min, "inv_freq_max": band.inv_freq_max,
                   "wavelength_min": band.wavelength_min, "wavelength_max": band.wavelength_max,
                   "R_band": own[b], "R_band_lo": own_lo[b], "R_band_hi": own_hi[b],
                   "R_rf_without_band": without, "R_rf_without_band_heldout": without_ho,
                   "R_rf_attribution": base["R_rf"] - without,
                   "R_rf_attribution_heldout": base["R_rf_heldout"] - without_ho}
            for name, key in (("R_rf_attribution", "R_rf"), ("R_rf_attribution_heldout", "R_rf_heldout")):
                if self.removed_reps is None or self.base_reps is None:
                    row[f"{name}_lo"] = row[f"{name}_hi"] = np.nan
                    continue
                reps = (self.base_reps[key][:, h] - self.removed_reps[key][:, col])[:, None]
                estimate = np.array([float(self.base_now[key][0, h]) - float(self.removed[key][0, col])])
                lo, hi = interval(name, estimate, reps)
                row[f"{name}_lo"], row[f"{name}_hi"] = float(lo[0]), float(hi[0])
            rows.append(row)
        return rows

    def cross_rows(self, h: int, interval: _Interval) -> list[dict[str, Any]]:
        """Head ``h``'s cross-band terms ``2 Cov(abs t_a, abs t_b) / V``, one row per pair of bands."""
        rows = []
        for a in range(len(self.bands)):
            for b in range(a + 1, len(self.bands)):
                value = float(2 * self.cov[h, a, b])
                reps = None if self.cov_reps is None else 2 * self.cov_reps[:, h, a, b][:, None]
                lo, hi = interval("R", np.array([value]), reps)
                rows.append({"layer": self.layer, "head": h, "band_a": self.bands[a].name,
                             "band_b": self.bands[b].name, "C_band": value, "C_band_lo": float(lo[0]),
                             "C_band_hi": float(hi[0])})
        return rows


@public
def rotary_bands(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    layers: Sequence[int] | int | str | None = None,
    query_range: tuple[int, int] | None = None,
    n_bands: int = DEFAULT_BANDS,
    batch_size: int = BATCH_SIZE,
    bins: PositionBins = PositionBins(),
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> RotaryBands:
    """Split every head's residual component ``R`` exactly over RoPE frequency bands (plus the
    cross-band terms), and attribute its reference-free ``R'`` to bands by removing each band's
    scores, with the attribution's error against ``R'`` (module docstring).

    ``layers``, ``query_range``, ``bins``, ``bootstrap`` and ``batch_size`` are those of
    :func:`lens_position.analyses.decompose.decompose` (keys: all of ``K(i)``); ``n_bands`` is the
    number of frequency bands the rotated pairs are grouped into (contiguous frequency index,
    fastest first; at most the number of pairs).
    """
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    batch_size = check_count("batch_size", batch_size)
    reducer = BandReducer(loaded, prompts, layers=layers, query_range=query_range, n_bands=n_bands, bins=bins,
                          bootstrap=bootstrap)
    stream.body(loaded, prompts, [reducer], batch_size=batch_size, progress=progress, desc="rotary bands")
    reducer.check_scores()
    full = reducer.full
    base_heads = full.result(batch_size=batch_size).heads.set_index(["layer", "head"])
    stats0 = full.stats[full.layers[0]]
    interval = _Interval(per_half=min(int(((stats0.n_sequences > 0) & (stats0.halves == h)).sum()) for h in (0, 1)),
                         level=bootstrap.level)
    band_rows: list[dict[str, Any]] = []
    cross_rows: list[dict[str, Any]] = []
    head_rows: list[dict[str, Any]] = []
    for layer in full.layers:
        fits = _LayerFits.of(reducer, layer, full.resample_weights())
        for h in range(loaded.spec.n_heads):
            base = {key: float(base_heads.loc[(layer, h), key]) for key in ("R", "R_rf", "R_rf_heldout")}
            rows = fits.band_rows(h, base, interval, loaded.spec.layer_types[layer])
            crosses = fits.cross_rows(h, interval)
            band_rows += rows
            cross_rows += crosses
            attribution = sum(row["R_rf_attribution"] for row in rows)
            attribution_ho = sum(row["R_rf_attribution_heldout"] for row in rows)
            own, cross_total = sum(row["R_band"] for row in rows), sum(row["C_band"] for row in crosses)
            head_rows.append({
                "layer": layer, "head": h, "layer_type": loaded.spec.layer_types[layer], "n_bands": len(rows),
                "R": base["R"], "R_rf": base["R_rf"], "R_rf_heldout": base["R_rf_heldout"],
                "R_bands": float(own), "R_cross": cross_total, "R_split_error": float(own) + cross_total - base["R"],
                "R_rf_attribution_sum": attribution, "R_rf_attribution_error": attribution - base["R_rf"],
                "R_rf_attribution_sum_heldout": attribution_ho,
                "R_rf_attribution_error_heldout": attribution_ho - base["R_rf_heldout"],
                "score_error": reducer.score_error[layer],
            })
    band_frame = pd.DataFrame(band_rows)
    summary = (band_frame.groupby(["layer", "layer_type", "band_index", "band"], sort=True)
               [["R_band", "R_rf_attribution", "R_rf_attribution_heldout", "inv_freq_min", "inv_freq_max",
                 "wavelength_min", "wavelength_max"]].mean().reset_index())
    return RotaryBands(
        bands=band_frame, cross=pd.DataFrame(cross_rows, columns=["layer", "head", "band_a", "band_b", "C_band",
                                                                  "C_band_lo", "C_band_hi"]),
        heads=pd.DataFrame(head_rows), layers=summary,
        provenance=provenance.collect(
            model=loaded.spec, data=prompts.spec, seed=prompts.spec.seed,
            layers=list(full.layers), query_range=[full.query_start, full.query_stop], n_bands=n_bands,
            bins=bins.to_dict(), intervals=bootstrap.to_dict("sequence"),
            bands={str(layer): [{"name": b.name, "dims": list(b.dims), "inv_freq": [b.inv_freq_min, b.inv_freq_max]}
                                for b in reducer.bands[layer]] for layer in full.layers},
            R_split="R = sum_b Var(abs t_b)/V + sum_{a<b} 2 Cov(abs t_a, abs t_b)/V (exact: abs is linear)",
            R_rf_attribution="R'(s) - R'(s - s_b); R_rf_attribution_error = sum_b attribution - R'",
            frequencies="read from each layer's rotary_sin/rotary_cos at position 1"))
