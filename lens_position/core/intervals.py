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

**Two interval methods, chosen by the estimator.** A held-out value (a cross-fit), a mean
of scores or rates, and what is computed from them, keep the *percentile* interval: their
replicates are centred on the estimate. An *in-sample* fit (the decomposition's ``T``,
``R``, ``M``, ``C``, ``R'``, ``M'``, ``C'`` without ``_heldout``, and the fractions and
changes computed from them) is biased: its fitted absolute part also fits noise, by an
amount that shrinks as ``1/N``. A bootstrap replicate refits on a resample and takes the same
bias once more, so its replicates sit beside the estimate by about that bias and the
percentile interval lies on the wrong side (on SmolLM2-135M the in-sample ``T`` and ``R'``,
averaged over layers, lie below every one of their replicates; on synthetic scores the
percentile intervals of the in-sample ``M`` and ``C`` cover the truth in 7% and 0% of
repetitions). Such quantities get the *bias-corrected percentile* interval: the percentile
interval moved by twice the bootstrap's median bias ``β = median(replicates) − estimate``,
``[q_lo − 2β, q_hi − 2β]``, centred on the bias-corrected estimate ``estimate − β`` with the
replicates' own (possibly skewed) spread. It is the location form of Efron's bias
correction; Efron's BC and BCa intervals correct the same bias by picking other percentiles
instead, which for a bias of more than about a third of the replicates' standard deviation lie beyond the
outermost of 200 replicates (and with every replicate on one side of the estimate, as for
Gemma-3's fraction of ``R'`` removed by BOS replacement, are undefined). The *basic* interval
``2·estimate − (q_hi, q_lo)`` corrects it too, but reflects the replicates' skew the wrong
way for a ratio. tests/unit/core/test_intervals.py measures all four.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.core.checks import check_int, check_seed
from lens_position.ground.errors import BadInputError

LEVEL = 0.95
N_RESAMPLES = 200
BOOTSTRAP_SEED = 20_260_606  # fixed so that analyses of the same prompts draw the same replicates
PERCENTILE, BIAS_CORRECTED = "percentile", "bias-corrected percentile"
INTERVAL_METHODS = {
    PERCENTILE: "percentile interval: the (1 - level) / 2 and (1 + level) / 2 quantiles of the replicates",
    BIAS_CORRECTED: "bias-corrected percentile interval: those quantiles minus twice the bootstrap's median bias "
                    "(median of the replicates - estimate), for in-sample fits and what is computed from them, "
                    "whose replicates take the fit's bias once more",
}
# The in-sample quantities (module docstring), by column name wherever they are written: the
# decomposition's in-sample components, and the fractions and changes lens_position.analyses.compare
# computes from them. Each gets the bias-corrected percentile interval; every other quantity the
# percentile one.
BIAS_CORRECTED_QUANTITIES = frozenset({"total", "R", "M", "C", "R_rf", "M_rf", "C_rf",
                              "fraction_removed", "fraction_removed_rf", "R_change", "R_rf_change"})


def interval_method(quantity: str) -> str:
    """The interval method of a quantity (a column name): :data:`BIAS_CORRECTED` for
    :data:`BIAS_CORRECTED_QUANTITIES`, else :data:`PERCENTILE`."""
    return BIAS_CORRECTED if quantity in BIAS_CORRECTED_QUANTITIES else PERCENTILE


METHOD = ("bootstrap over whole units, replicates widened by sqrt(m / (m - 1)); percentile interval, "
          "bias-corrected percentile interval for in-sample fits and the quantities computed from them")


MAX_RESAMPLES = 100_000  # replicates are kept per quantity and head: beyond this, memory, not accuracy, decides


@dataclass(frozen=True)
class Bootstrap:
    """How intervals are computed: ``n_resamples`` replicates, a two-sided percentile
    interval at ``level`` (e.g. 0.95), draws seeded by ``seed``. ``n_resamples = 0``
    switches intervals off (the ``*_lo``/``*_hi`` columns are then NaN)."""

    n_resamples: int = N_RESAMPLES
    level: float = LEVEL
    seed: int = BOOTSTRAP_SEED

    def __post_init__(self) -> None:
        n_resamples = check_int("n_resamples", self.n_resamples)  # 50.5 or "100" would fail deep in numpy
        if n_resamples < 0 or (0 < n_resamples < 20):
            raise BadInputError(f"n_resamples = {self.n_resamples}: use 0 (no intervals) or at least 20 "
                                "(a percentile interval needs enough replicates in its tails)")
        if n_resamples > MAX_RESAMPLES:
            raise BadInputError(f"n_resamples = {self.n_resamples} is more than {MAX_RESAMPLES} replicates, which "
                                "would not fit in memory and gains no accuracy that matters; use 200 (the default) "
                                "to 10000")
        if isinstance(self.level, bool) or not isinstance(self.level, (int, float)) or not 0 < self.level < 1:
            raise BadInputError(f"level must be a number in (0, 1) such as 0.95, got {self.level!r}")
        object.__setattr__(self, "n_resamples", n_resamples)
        object.__setattr__(self, "seed", check_seed(self.seed))

    @property
    def enabled(self) -> bool:
        return self.n_resamples > 0

    def to_dict(self, unit: str = "sequence", bias_corrected: Sequence[str] = ()) -> dict[str, Any]:
        """The provenance of the intervals; ``bias_corrected`` names the quantities whose interval
        is the bias-corrected percentile one, every other interval being the percentile one."""
        out = {"method": f"bootstrap over whole {unit}s, the replicates' spread widened by sqrt(m / (m - 1)) "
                         "for m units per stratum; " + (
                             f"{INTERVAL_METHODS[BIAS_CORRECTED]} (the quantities under 'bias_corrected'), else "
                             f"the {INTERVAL_METHODS[PERCENTILE]}" if bias_corrected else INTERVAL_METHODS[PERCENTILE]),
               "level": self.level, "n_resamples": self.n_resamples, "seed": self.seed}
        if bias_corrected:
            out["bias_corrected"] = list(bias_corrected)
        return out


NO_INTERVALS = Bootstrap(n_resamples=0)

# Fewest units (sequences, prompts) an interval is computed from and a verdict decided on. The
# decomposition resamples within its two halves (even / odd sequences); below two units per half
# a half of one sequence resamples to itself, every replicate equals the estimate and the "95%
# interval" has zero width: with N = 2 claims would "hold" on noise. With 4 units (2 per half)
# the spread is the smallest a resample can show; below that no interval is computed, the
# ``*_lo``/``*_hi`` columns are NaN and every verdict that needs one is "inconclusive at this N".
MIN_INTERVAL_UNITS = 4


def resample_counts(n_units: int, n_resamples: int, seed: int = BOOTSTRAP_SEED,
                    strata: Sequence[int] | np.ndarray | None = None) -> Int[torch.Tensor, "resample unit"]:
    """Multiplicity of every unit in every replicate (``[n_resamples, n_units]``, int64):
    each replicate draws, within each stratum, as many units as the stratum holds, with
    replacement. Deterministic in ``(n_units, n_resamples, seed, strata)``."""
    strata = np.zeros(n_units, dtype=np.int64) if strata is None else np.asarray(strata, dtype=np.int64)
    if len(strata) != n_units:
        raise BadInputError(f"strata has {len(strata)} entries for {n_units} units")
    rng = np.random.default_rng([seed, n_units])
    counts: np.ndarray = np.zeros((n_resamples, n_units), dtype=np.int64)
    for stratum in np.unique(strata):
        members = np.flatnonzero(strata == stratum)
        draws = rng.integers(0, len(members), size=(n_resamples, len(members)))
        for b in range(n_resamples):
            np.add.at(counts[b], members[draws[b]], 1)
    return torch.from_numpy(counts)


def small_sample_widening(estimate: Any, replicates: Any, units_per_stratum: int) -> Any:
    """Replicates moved away from the estimate by ``sqrt(m / (m - 1))`` (``m`` units per
    stratum). A bootstrap over ``m`` units underestimates the variance of a mean by the
    factor ``(m - 1) / m``; with the 8 sequences per half of a default run its percentile
    interval would cover about 93% instead of 95% (measured in tests/unit/core/test_intervals.py).
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


def bootstrap_interval(estimate: float | np.ndarray, replicates: np.ndarray | torch.Tensor, level: float = LEVEL,
                       method: str = PERCENTILE) -> tuple[np.ndarray, np.ndarray]:
    """``(lo, hi)`` from ``replicates`` (axis 0) of ``estimate`` (shape ``replicates.shape[1:]``):
    the percentile interval, or with ``method = BIAS_CORRECTED`` the same moved by twice the
    median bias ``median(replicates) − estimate`` (module docstring: which quantities get which).
    NaN replicates are ignored, as in :func:`percentile_interval`."""
    lo, hi = percentile_interval(replicates, level)
    if method == PERCENTILE:
        return lo, hi
    if method != BIAS_CORRECTED:
        raise BadInputError(f"unknown interval method {method!r}; use {PERCENTILE!r} or {BIAS_CORRECTED!r}")
    values = np.asarray(replicates, dtype=float)
    with warnings.catch_warnings():  # an all-NaN column is a legitimate "no interval"
        warnings.simplefilter("ignore", RuntimeWarning)
        median = np.nanmedian(values, axis=0) if np.isnan(values).any() else np.median(values, axis=0)
    shift = 2 * (median - np.asarray(estimate, dtype=float))
    return (lo - shift)[()], (hi - shift)[()]


# A fraction 1 - condition / base is reported only where its denominator is resolved from 0: its
# interval excludes 0 and its size is at least this (a share of Var(log A)); elsewhere it is not
# defined (a ratio of a near-zero denominator is noise, at any size).
RATIO_FLOOR = 0.005


def denominator_resolved(value: float, replicates: np.ndarray | None, level: float = LEVEL,
                         method: str = PERCENTILE) -> bool:
    """Whether a ratio's denominator ``value`` is resolved from 0: at least :data:`RATIO_FLOOR` in
    size and, with bootstrap ``replicates``, its interval (``method``, at ``level``) excludes 0."""
    if not np.isfinite(value) or abs(value) < RATIO_FLOOR:
        return False
    if replicates is None:
        return True
    lo, hi = bootstrap_interval(value, replicates, level, method)
    return bool(np.isfinite(lo) and np.isfinite(hi) and (lo > 0 or hi < 0))


def _nan_percentiles(values: np.ndarray, tail: float) -> tuple[np.ndarray, np.ndarray]:
    """The percentiles ``tail`` and ``1 - tail`` along axis 0, ignoring NaN."""
    with warnings.catch_warnings():  # an all-NaN column is a legitimate "no interval"
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanquantile(values, tail, axis=0), np.nanquantile(values, 1 - tail, axis=0)


@dataclass(frozen=True)
class Estimate:
    """A number with its interval: ``value`` (the estimate on all the data), ``lo``, ``hi``
    (the interval at ``level``; NaN when not computed), ``n`` (the units it rests on) and
    ``method`` (:data:`PERCENTILE`, or :data:`BIAS_CORRECTED` for an in-sample fit)."""

    value: float
    lo: float = math.nan
    hi: float = math.nan
    level: float = LEVEL
    n: int | None = None
    method: str = PERCENTILE

    @property
    def has_interval(self) -> bool:
        """Whether an interval exists to decide on: finite bounds from at least
        :data:`MIN_INTERVAL_UNITS` units (when ``n`` is known)."""
        if self.n is not None and self.n < MIN_INTERVAL_UNITS:
            return False
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def off_centre(self) -> bool:
        """Whether the estimate lies outside its own interval. For a percentile interval the
        resampling distribution is off-centre and the interval understates the uncertainty on
        the estimate's side; for a bias-corrected interval (an in-sample fit) the
        bootstrap's bias is larger than the interval's half-width on the estimate's side, and the
        interval has corrected it."""
        return self.has_interval and not self.lo <= self.value <= self.hi

    @property
    def decision_bounds(self) -> tuple[float, float]:
        """What verdicts are decided on: a bias-corrected interval as it is (an estimate outside it
        is the bias it corrected); a percentile interval widened to include the estimate, so that
        an off-centre one never decides more than the estimate itself supports."""
        if self.method == BIAS_CORRECTED:
            return self.lo, self.hi
        return min(self.lo, self.value), max(self.hi, self.value)

    @property
    def note(self) -> str:
        """What a reader needs to know about the interval beyond its bounds ("" for a centred
        percentile interval): :func:`interval_note`."""
        return interval_note(self.method, self.value, self.lo, self.hi)

    def format(self, spec: str = ".3f", percent: bool = False) -> str:
        """``"0.123 [0.100, 0.140]"`` (or in percent, :func:`format_percent`), followed by :attr:`note`
        in brackets; a NaN estimate is "not defined" (a fraction whose denominator is not resolved
        from 0)."""
        if math.isnan(self.value):
            return "not defined"

        def one(x: float) -> str:
            return format_percent(x, spec) if percent else f"{x:{spec}}"
        text = one(self.value)
        if self.has_interval:
            text += f" [{one(self.lo)}, {one(self.hi)}]"
        if self.note:
            text += f" ({self.note})"
        return text


#: A percentage beyond this (a fraction of ±3) is printed as "> 300%" / "< -300%": a ratio gets there
#: when its denominator, or one of its bootstrap replicates, comes near 0, and the digits would be noise.
PERCENT_LIMIT = 3.0
#: A percentage of smaller size than this (a fraction of 1e-4) is printed as "< 0.01%" (or "> -0.01%").
PERCENT_RESOLUTION = 1e-4


def format_percent(fraction: float, spec: str = ".3g") -> str:
    """``fraction`` as a percentage, the one way every door prints one: with ``spec`` (``".3g"``,
    ``"+.0f"``) inside ±:data:`PERCENT_LIMIT`, as "> 300%" / "< -300%" beyond it, and as "< 0.01%" /
    "> -0.01%" below :data:`PERCENT_RESOLUTION` in size (exact 0 is "0%"). NaN is "nan"."""
    if math.isnan(fraction):
        return "nan"
    if fraction > PERCENT_LIMIT:
        return f"> {PERCENT_LIMIT:.0%}"
    if fraction < -PERCENT_LIMIT:
        return f"< -{PERCENT_LIMIT:.0%}"
    if fraction != 0 and abs(fraction) < PERCENT_RESOLUTION:
        return f"< {PERCENT_RESOLUTION:.2%}" if fraction > 0 else f"> -{PERCENT_RESOLUTION:.2%}"
    text = f"{fraction * 100:{spec}}"
    return "0%" if text.lstrip("+-").strip("0.") == "" else f"{text}%"  # rounded to 0 by spec: no sign


def interval_note(method: str, value: float, lo: float, hi: float) -> str:
    """The words that go with an interval wherever it is written (``Estimate.format``, the
    tables' ``interval_notes``, the figures' hover text): its method when it is not the
    percentile one, and whether the estimate lies outside it ("" for a centred percentile
    interval or no interval)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    side = "above" if value > hi else "below" if value < lo else ""
    if method == BIAS_CORRECTED:
        return f"bias-corrected interval; the in-sample estimate lies {side} it" if side else "bias-corrected interval"
    return "the estimate lies outside its bootstrap interval: an off-centre resampling distribution" if side else ""


def annotate_intervals(frame: pd.DataFrame,
                       bias_corrected: Sequence[str] | frozenset[str] = BIAS_CORRECTED_QUANTITIES) -> pd.DataFrame:
    """``frame`` with two columns that say what its ``*_lo``/``*_hi`` columns are:
    ``interval_method`` (which quantities have the bias-corrected percentile interval; the same
    on every row) and ``outside_interval`` (per row, the quantities whose estimate lies outside
    its own interval, comma-separated; "" when none). Nothing is added to a frame without
    interval columns, or whose intervals were not computed."""
    quantities = [c[:-3] for c in frame.columns if c.endswith("_lo") and f"{c[:-3]}_hi" in frame.columns
                  and c[:-3] in frame.columns]
    if not quantities or frame[[f"{q}_lo" for q in quantities]].isna().all().all():
        return frame
    frame = frame.copy()
    corrected = [q for q in quantities if q in set(bias_corrected)]
    frame["interval_method"] = (f"bias-corrected percentile: {', '.join(corrected)}; percentile: the others"
                                if corrected else "percentile")
    outside: np.ndarray = np.zeros((len(frame), len(quantities)), dtype=bool)
    for k, q in enumerate(quantities):
        value, lo, hi = (frame[c].to_numpy(dtype=float) for c in (q, f"{q}_lo", f"{q}_hi"))
        with np.errstate(invalid="ignore"):
            outside[:, k] = (value < lo) | (value > hi)
    frame["outside_interval"] = [", ".join(q for q, out in zip(quantities, row) if out) for row in outside]
    return frame


def from_replicates(value: float, replicates: np.ndarray | None, level: float = LEVEL, n: int | None = None,
                    method: str = PERCENTILE) -> Estimate:
    """An :class:`Estimate` of ``value`` with the interval (``method``) of ``replicates``."""
    if replicates is None or len(replicates) == 0:
        return Estimate(float(value), level=level, n=n, method=method)
    lo, hi = bootstrap_interval(float(value), np.asarray(replicates, dtype=float), level, method)
    return Estimate(float(value), float(lo), float(hi), level, n, method)


PROBABILITY = (0.0, 1.0)


@functools.lru_cache(maxsize=256)
def student_factor(n_units: int, level: float = LEVEL) -> float:
    """How much wider a Student-t interval of a mean over ``n_units`` is than a normal one at
    ``level``: ``t_{n-1} / z`` at ``(1 + level) / 2`` (1.21 at 8 units, 1.07 at 20, 1 in the limit).
    A percentile bootstrap of a mean spreads its replicates like the normal, so at 8 units its 95%
    interval misses a zero mean about 9% of the time; its replicates' spread times this factor
    brings that to 5% (tests/unit/core/test_cell_intervals.py measures it on null cells)."""
    if n_units < 2:
        return 1.0
    tail = (1 + level) / 2
    return t_quantile(tail, n_units - 1) / NormalDist().inv_cdf(tail)


def bootstrap_mean(values: Float[np.ndarray, "unit ..."], bootstrap: Bootstrap = Bootstrap(),
                   bounds: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean over units (axis 0) of per-unit ``values`` and its calibrated percentile interval,
    from ``bootstrap.n_resamples`` resamples of the units: ``(mean, lo, hi)``. The replicates'
    spread about the mean is widened for the bootstrap's small-sample variance bias
    (:func:`small_sample_widening`) and to Student's t (:func:`student_factor`), so that the
    interval of a mean over few prompts covers at its stated level; the replicates keep their
    own shape (a skewed quantity keeps a skewed interval). ``bounds``: the range the quantity
    cannot leave (:data:`PROBABILITY` for a probability or a rate): the widening can push an
    end past it, and the end is then put back on the bound."""
    values = np.asarray(values, dtype=float)
    mean = values.mean(0)
    if not bootstrap.enabled or len(values) < MIN_INTERVAL_UNITS:
        nan = np.full_like(mean, np.nan, dtype=float)
        return mean, nan, nan
    counts = resample_counts(len(values), bootstrap.n_resamples, bootstrap.seed).numpy().astype(float)
    replicates = small_sample_widening(mean, np.tensordot(counts, values, axes=(1, 0)) / len(values), len(values))
    replicates = mean + (replicates - mean) * student_factor(len(values), bootstrap.level)
    lo, hi = percentile_interval(replicates, bootstrap.level)
    if bounds is not None:
        lo, hi = np.clip(lo, *bounds), np.clip(hi, *bounds)
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


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (numerical: the CDF
    integrated on a fine grid and inverted by interpolation; accurate to ~1e-4)."""
    if df < 1:
        return float("nan")
    x = np.linspace(0.0, 200.0, 400_001)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(x * x / df))
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(x))])
    return float(np.interp(p, cdf, x))


def t_interval(values: Sequence[float | None]) -> tuple[float, float, float, float, int]:
    """``(mean, sd, low, high, n)`` of a 95 % Student-t interval for the mean of the finite
    ``values`` (independent units, e.g. training seeds, too few for a bootstrap); NaN bounds
    for n < 2."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n < 2:
        return mean, float("nan"), float("nan"), float("nan"), n
    sd = float(v.std(ddof=1))
    half = t_quantile((1 + LEVEL) / 2, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half, n


def benjamini_hochberg(p_values: Float[np.ndarray, "..."]) -> Float[np.ndarray, "..."]:
    """Benjamini-Hochberg q-values of the p-values of one family of tests (the cells or heads of
    one sweep), same shape: ``q_(i) = min_{j >= i} m p_(j) / j`` over the p-values sorted
    ascending (ranks ``j`` of the sorted order), capped at 1. Calling the tests with ``q < α``
    discoveries controls the false discovery rate at ``α`` (for independent or positively
    dependent tests). NaN p-values (too few prompts) stay NaN and are not counted in ``m``."""
    p = np.asarray(p_values, dtype=float)
    flat = p.reshape(-1)
    q = np.full(flat.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(flat))
    if len(finite):
        order = finite[np.argsort(flat[finite], kind="stable")]
        m = len(order)
        scaled = flat[order] * m / np.arange(1, m + 1)
        q[order] = np.minimum(1.0, np.minimum.accumulate(scaled[::-1])[::-1])
    return q.reshape(p.shape)[()]


EXACT_SIGN_FLIPS = 12  # up to 2^12 = 4096 sign vectors: enumerate them all, else draw them


def sign_flip_pvalue(effects: Float[np.ndarray, "unit ..."], n_permutations: int = 1000,
                     seed: int = BOOTSTRAP_SEED) -> np.ndarray:
    """Two-sided sign-flip permutation p-value of "the mean over units (axis 0) is zero", per
    cell of ``effects``: the share of sign vectors (each unit's effect kept or negated) whose
    mean is at least as far from zero as the observed one. Under the null hypothesis each
    unit's effect is symmetric about zero, so every sign vector is as likely as the observed.
    Exact (all ``2^m`` sign vectors) for ``m <= 12`` units, otherwise ``n_permutations`` draws
    seeded by ``seed``, counted with the observed one (``(1 + hits) / (1 + draws)``, never 0).
    Fewer than 2 units give NaN. A cell whose effects are all zero gets 1."""
    values = np.asarray(effects, dtype=float)
    n_units = len(values)
    if n_units < 2:
        return np.full(values.shape[1:], np.nan)[()]
    flat = values.reshape(n_units, -1)
    observed = np.abs(flat.mean(0))
    if n_units <= EXACT_SIGN_FLIPS:
        codes = np.arange(2 ** n_units)[:, None] >> np.arange(n_units)[None, :] & 1
        signs = 1.0 - 2.0 * codes
        hits = (np.abs(signs @ flat / n_units) >= observed - 1e-12 * (1 + observed)).sum(0)
        pvalue = hits / len(signs)
    else:
        rng = np.random.default_rng([seed, n_units])
        signs = rng.choice((-1.0, 1.0), size=(n_permutations, n_units))
        hits = (np.abs(signs @ flat / n_units) >= observed - 1e-12 * (1 + observed)).sum(0)
        pvalue = (1 + hits) / (1 + n_permutations)
    return pvalue.reshape(values.shape[1:])[()]
