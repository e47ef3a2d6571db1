"""Confidence intervals by resampling whole units: sequences (or groups of sequences), prompts.

Every number lens_position reports is an estimate from a finite set of prompts. Its
interval comes from a **bootstrap over whole units**: draw the units with replacement,
recompute the number from the resampled units' statistics, repeat ``n_resamples`` times,
and take the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the replicates
(the percentile interval). Resampling whole sequences keeps everything that is correlated
within a sequence together, which is what makes the interval honest for attention
patterns: two queries of the same sequence share its content.

Two rules make the replicates useful beyond one number:

- **Statistics, not forward passes.** An analysis keeps its sufficient statistics per unit
  (per sequence, or per group of sequences); a replicate only re-weights and re-sums them
  and refits. No replicate costs a forward pass.
- **The same draws everywhere.** The multiplicities of replicate ``b`` depend only on
  ``(seed, number of units, strata)`` (:func:`resample_counts`). Two analyses of the same
  prompts (a model and its NTK-scaled variant, a base run and a BOS-replaced run) therefore
  resample the same prompts in replicate ``b``, and the interval of a *difference* or a
  *ratio* taken replicate by replicate is a paired bootstrap interval. Analyses of
  different prompts are independent, and pairing their replicates by index is then a
  valid bootstrap of the difference of independent estimates.

Units can be stratified (the decomposition's held-out fit needs both halves of the
sequences): units are then drawn with replacement within each stratum, so every
replicate keeps the sizes of the strata.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
from jaxtyping import Float, Int

from lens_position.errors import BadInputError

LEVEL = 0.95
N_RESAMPLES = 200
BOOTSTRAP_SEED = 20_260_606  # fixed so that analyses of the same prompts draw the same replicates
METHOD = "percentile bootstrap over whole units, replicates widened by sqrt(m / (m - 1))"


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are computed: ``n_resamples`` replicates, a two-sided percentile
    interval at ``level`` (e.g. 0.95), draws seeded by ``seed``. ``n_resamples = 0``
    switches intervals off (the ``*_lo``/``*_hi`` columns are then NaN)."""

    n_resamples: int = N_RESAMPLES
    level: float = LEVEL
    seed: int = BOOTSTRAP_SEED

    def __post_init__(self) -> None:
        if self.n_resamples < 0 or (0 < self.n_resamples < 20):
            raise BadInputError(f"n_resamples = {self.n_resamples}: use 0 (no intervals) or at least 20 "
                                "(a percentile interval needs enough replicates in its tails)")
        if not 0 < self.level < 1:
            raise BadInputError(f"level must lie in (0, 1), got {self.level}")

    @property
    def enabled(self) -> bool:
        return self.n_resamples > 0

    def to_dict(self, unit: str = "sequence") -> dict[str, Any]:
        return {"method": f"percentile bootstrap over whole {unit}s, the replicates' spread widened by "
                          "sqrt(m / (m - 1)) for m units per stratum", "level": self.level,
                "n_resamples": self.n_resamples, "seed": self.seed}


NO_INTERVALS = Bootstrap(n_resamples=0)


def resample_counts(n_units: int, n_resamples: int, seed: int = BOOTSTRAP_SEED,
                    strata: Sequence[int] | np.ndarray | None = None) -> Int[torch.Tensor, "resample unit"]:
    """Multiplicity of every unit in every replicate (``[n_resamples, n_units]``, int64):
    each replicate draws, within each stratum, as many units as the stratum holds, with
    replacement. Deterministic in ``(n_units, n_resamples, seed, strata)``."""
    strata = np.zeros(n_units, dtype=np.int64) if strata is None else np.asarray(strata, dtype=np.int64)
    if len(strata) != n_units:
        raise BadInputError(f"strata has {len(strata)} entries for {n_units} units")
    rng = np.random.default_rng([seed, n_units])
    counts = np.zeros((n_resamples, n_units), dtype=np.int64)
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        draws = rng.integers(0, len(members), size=(n_resamples, len(members)))
        for b in range(n_resamples):
            np.add.at(counts[b], members[draws[b]], 1)
    return torch.from_numpy(counts)


def small_sample_widening(estimate: torch.Tensor | np.ndarray, replicates: torch.Tensor | np.ndarray,
                          units_per_stratum: int) -> torch.Tensor | np.ndarray:
    """Replicates moved away from the estimate by ``sqrt(m / (m - 1))`` (``m`` units per
    stratum). A bootstrap over ``m`` units underestimates the variance of a mean by the
    factor ``(m - 1) / m``; with the 8 sequences per half of a default run its percentile
    interval would cover about 93% instead of 95% (measured in tests/test_intervals.py).
    Rescaling the replicates' spread removes that bias to first order."""
    if units_per_stratum < 2:
        return replicates
    factor = math.sqrt(units_per_stratum / (units_per_stratum - 1))
    return estimate + (replicates - estimate) * factor


def percentile_interval(replicates: np.ndarray | torch.Tensor, level: float = LEVEL
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)``: the two-sided percentile interval of ``replicates`` along axis 0.
    NaN replicates (a refit that had no data) are ignored; all-NaN gives NaN."""
    values = np.asarray(replicates, dtype=float)
    tail = (1 - level) / 2
    if values.ndim == 0 or len(values) == 0:
        return _nan_percentiles(values, tail)
    # np.nanquantile works column by column in Python (apply_along_axis); columns without NaN
    # go through np.quantile in one vectorised call instead, with the same interpolation, so
    # the bounds are the same numbers
    flat = values.reshape(len(values), -1)
    clean = ~np.isnan(flat).any(axis=0)
    if clean.all():
        lo, hi = np.quantile(flat, (tail, 1 - tail), axis=0)
    else:
        lo, hi = np.full(flat.shape[1], np.nan), np.full(flat.shape[1], np.nan)
        if clean.any():
            lo[clean], hi[clean] = np.quantile(flat[:, clean], (tail, 1 - tail), axis=0)
        lo[~clean], hi[~clean] = _nan_percentiles(flat[:, ~clean], tail)
    return lo.reshape(values.shape[1:])[()], hi.reshape(values.shape[1:])[()]


def _nan_percentiles(values: np.ndarray, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentiles ``tail`` and ``1 - tail`` along axis 0, ignoring NaN."""
    with warnings.catch_warnings():  # an all-NaN column is a legitimate "no interval"
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(values, tail, axis=0), np.nanquantile(values, 1 - tail, axis=0)


@dataclass(frozen=True)
class Estimate:
    """A number with its interval: ``value`` (the estimate on all the data), ``lo``, ``hi``
    (the interval at ``level``; NaN when not computed) and ``n`` (the units it rests on)."""

    value: float
    lo: float = math.nan
    hi: float = math.nan
    level: float = LEVEL
    n: int | None = None

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def off_centre(self) -> bool:
        """Whether the estimate lies outside its own percentile interval: the resampling
        distribution is off-centre (a ratio with a small, noisy denominator, say), and the
        interval understates the uncertainty on the estimate's side."""
        return self.has_interval and not self.lo <= self.value <= self.hi

    @property
    def decision_bounds(self) -> tuple[float, float]:
        """``(lo, hi)`` widened to include the estimate: what verdicts are decided on, so that an
        off-centre interval never decides more than the estimate itself supports."""
        return min(self.lo, self.value), max(self.hi, self.value)

    def format(self, spec: str = ".3f", percent: bool = False) -> str:
        """``"0.123 [0.100, 0.140]"`` (or in percent); an off-centre interval says so."""
        scale, unit = (100.0, "%") if percent else (1.0, "")
        text = f"{self.value * scale:{spec}}{unit}"
        if self.has_interval:
            text += f" [{self.lo * scale:{spec}}{unit}, {self.hi * scale:{spec}}{unit}]"
        if self.off_centre:
            text += " (the estimate lies outside its bootstrap interval: an off-centre resampling distribution)"
        return text


def from_replicates(value: float, replicates: np.ndarray, level: float = LEVEL, n: int | None = None) -> Estimate:
    """An :class:`Estimate` of ``value`` with the percentile interval of ``replicates``."""
    if replicates is None or len(replicates) == 0:
        return Estimate(float(value), level=level, n=n)
    lo, hi = percentile_interval(np.asarray(replicates, dtype=float), level)
    return Estimate(float(value), float(lo), float(hi), level, n)


def bootstrap_mean(values: Float[np.ndarray, "unit ..."], bootstrap: Bootstrap = Bootstrap()
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over units (axis 0) of per-unit ``values`` and its percentile interval, from
    ``bootstrap.n_resamples`` resamples of the units: ``(mean, lo, hi)``."""
    values = np.asarray(values, dtype=float)
    mean = values.mean(0)
    if not bootstrap.enabled or len(values) < 2:
        nan = np.full_like(mean, np.nan, dtype=float)
        return mean, nan, nan
    counts = resample_counts(len(values), bootstrap.n_resamples, bootstrap.seed).numpy().astype(float)
    replicates = small_sample_widening(mean, np.tensordot(counts, values, axes=(1, 0)) / len(values), len(values))
    lo, hi = percentile_interval(replicates, bootstrap.level)
    return mean, lo, hi


def units_to_decide(n: int | None, estimate: Estimate, threshold: float) -> float:
    """How many units would put ``threshold`` outside the interval, if the estimate stayed
    where it is and the interval shrank as ``1/sqrt(n)``: ``n · (w / d)²`` with ``w`` the
    interval's half-width on the threshold's side and ``d`` the distance from the estimate
    to the threshold. ``inf`` when the estimate sits on the threshold; NaN without an
    interval or ``n``."""
    if n is None or not estimate.has_interval:
        return math.nan
    distance = abs(estimate.value - threshold)
    half_width = (estimate.value - estimate.lo) if threshold <= estimate.value else (estimate.hi - estimate.value)
    if distance == 0:
        return math.inf
    return float(math.ceil(n * (max(half_width, 0.0) / distance) ** 2))
