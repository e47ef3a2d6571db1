"""The paper's claims C1-C5 as values: statement, criterion, evaluation, explanation.

Each :class:`Claim` is written once, here: the paper's statement, our criterion (built from
the thresholds in :class:`Criteria`), and the function that evaluates it from the results
tables of a reproduction (``lens_position.pipeline.steps.TABLES``), one :class:`Evaluation` per
architecture and one ``"overall"``. The report and the command line only render what this
module returns; the paper's numbers are in :data:`PAPER` and nowhere else.

**Three-state verdicts.** Every evaluation has an estimate with its bootstrap interval
(:mod:`lens_position.core.intervals`) and a verdict decided from the interval, never from the
point value alone:

- ``holds``: the whole interval satisfies the criterion;
- ``does not hold``: the whole interval violates it;
- ``inconclusive at this N``: the interval straddles the threshold. The explanation then
  says how many sequences would decide it if the estimate stayed where it is (intervals
  shrink as ``1/sqrt(N)``: ``N' = N · (half-width / distance to the threshold)²``).

A claim that compares architectures (C3) uses the interval of the *difference*, taken
replicate by replicate (paired when both analyses ran on the same prompts). A claim with
several parts holds when every part holds, does not hold when any part does not, and is
inconclusive otherwise. Without intervals (a run with ``n_resamples = 0``) nothing is
decided: the verdict is ``inconclusive at this N`` and the explanation says why.

**Which split the claims use.** C1-C3 use the held-out values of the *reference-free*
split (columns ``R_rf_heldout``, ``M_rf_heldout``; ``lens_position.analyses.decompose``): its mask
component is what the causal mask does to the offset-only part of the scores, so it is
zero wherever the mask can do nothing (a full sliding window) and it does not change with
the choice of per-query reference. The self-referenced split (``R_heldout``,
``M_heldout``) is shown beside it in every ``measured`` text.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from lens_position.core.intervals import (
    LEVEL,
    RATIO_FLOOR,
    Estimate,
    from_replicates,
    interval_method,
    units_to_decide,
)
from lens_position.core.run_tables import RunTables
from lens_position.core.summaries import missing_layers_note

Tables = Mapping[str, pd.DataFrame]

HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED = "holds", "does not hold", "inconclusive at this N", "not measured"
VERDICTS = (HOLDS, FAILS, INCONCLUSIVE, NOT_MEASURED)


@dataclass(frozen=True)
class PaperNumbers:
    """The numbers the paper states (arXiv 2606.06160), written once."""

    c4_fraction_removed: float = 0.40  # "removes about 40% of the residual component at early queries"
    early_queries: int = 32  # "early queries": i < 32


PAPER = PaperNumbers()
ROLE_NAMES = {"standard": "standard RoPE", "ntk": "NTK-scaled RoPE", "sliding": "sliding window",
              "interpolated": "position-interpolated RoPE", "no-rope": "no RoPE"}
# Roles outside C3's comparison of RoPE variants, and why
OUTSIDE_C3 = {"no-rope": "this model has no RoPE: NoPE or learned absolute positions",
              "interpolated": "this model's RoPE is linearly position-interpolated, neither standard nor NTK-scaled"}
# The split the claims are decided on (module docstring): column suffix of its components.
CLAIM_SPLIT = "_rf"


@dataclass(frozen=True)
class Criteria:
    """Our thresholds, each stated in the criterion text of the claim that uses it.

    - ``min_signal``: a component "appears" when its held-out share of Var(log A), averaged
      over layers and heads, is at least this (C1: T; C2: both R and M).
    - ``c4_tolerance``: "about 40%" means within ``PAPER.c4_fraction_removed`` ± this.
    - ``c5_noise``: auto-BOS fingerprints are "identical" when the largest relative spread
      (spread / norm) over layers is at most this (float32 noise is ~1e-7 per operation).
    - ``c5_varying``: fingerprints "vary with token 0" when the median relative spread with
      a varying token 0 is at least this.
    """

    min_signal: float = 0.01
    c4_tolerance: float = 0.15
    c5_noise: float = 1e-4
    c5_varying: float = 1e-2


@dataclass(frozen=True)
class Evaluation:
    """One (claim, architecture) cell: ``verdict`` (one of :data:`VERDICTS`), the ``estimate``
    the criterion is applied to (``quantity`` names it), ``measured`` (every number behind the
    verdict, as text, with intervals), ``n`` (sequences it rests on), ``n_to_decide`` (for an
    inconclusive verdict, the N that would decide it) and ``explanation`` (for a verdict
    other than ``holds``: where and by how much we differ from the paper, in words built from
    the numbers)."""

    claim: str
    architecture: str
    verdict: str
    quantity: str
    estimate: Estimate
    measured: str
    n: int | None = None
    n_to_decide: float = math.nan
    explanation: str = ""
    T: int | None = None  # the sequence length the estimate rests on (None: not one decomposition's)


@dataclass(frozen=True)
class Claim:
    """A claim of the paper: its ``key`` (C1..C5), the paper's ``statement``, our
    ``criterion`` (text from the thresholds), ``evaluate`` (tables -> evaluations) and a short
    ``title``."""

    key: str
    statement: str
    criterion: Callable[[Criteria], str]
    evaluate: Callable[[Tables, Criteria], list[Evaluation]] = field(repr=False)
    title: str = ""  # a few words, for the row heading of a compact table


# --------------------------------------------------------------------------- verdict rules


def at_least(estimate: Estimate, threshold: float) -> str:
    """``estimate >= threshold``, decided from its interval."""
    if not estimate.has_interval:
        return INCONCLUSIVE
    low, high = estimate.decision_bounds
    if low >= threshold:
        return HOLDS
    if high < threshold:
        return FAILS
    return INCONCLUSIVE


def below(estimate: Estimate, threshold: float) -> str:
    """``estimate < threshold``, decided from its interval."""
    if not estimate.has_interval:
        return INCONCLUSIVE
    low, high = estimate.decision_bounds
    if high < threshold:
        return HOLDS
    if low >= threshold:
        return FAILS
    return INCONCLUSIVE


def above(estimate: Estimate, threshold: float) -> str:
    """``estimate > threshold``, decided from its interval."""
    if not estimate.has_interval:
        return INCONCLUSIVE
    low, high = estimate.decision_bounds
    if low > threshold:
        return HOLDS
    if high <= threshold:
        return FAILS
    return INCONCLUSIVE


def within(estimate: Estimate, lo: float, hi: float) -> str:
    """``lo <= estimate <= hi``, decided from its interval."""
    if not estimate.has_interval:
        return INCONCLUSIVE
    low, high = estimate.decision_bounds
    if lo <= low and high <= hi:
        return HOLDS
    if high < lo or low > hi:
        return FAILS
    return INCONCLUSIVE


def combine(verdicts: list[str]) -> str:
    """All parts hold -> holds; any part fails -> does not hold; else inconclusive."""
    measured = [v for v in verdicts if v != NOT_MEASURED]
    if not measured:
        return NOT_MEASURED
    if any(v == FAILS for v in measured):
        return FAILS
    if all(v == HOLDS for v in measured):
        return HOLDS
    return INCONCLUSIVE


def _decide_text(n: int | None, estimate: Estimate, threshold: float, what: str) -> tuple[float, str]:
    """(N that would decide it, the sentence saying so) for an inconclusive comparison."""
    if not estimate.has_interval:
        if n is not None and n < 2:
            return math.nan, (f"No interval was computed for {what}: with N = {n} sequence there is nothing to "
                              "resample (and no held-out half), so nothing is decided; rerun with more sequences.")
        return math.nan, (f"No interval was computed for {what} (intervals were switched off), so nothing is "
                          "decided; rerun with intervals.")
    needed = units_to_decide(n, estimate, threshold)
    straddle = (f"its {estimate.level:.0%} interval [{estimate.lo:.4g}, {estimate.hi:.4g}] contains "
                f"{threshold:g}")
    if not math.isfinite(needed):
        return needed, (f"{what} = {estimate.value:.4g} sits on {threshold:g}: {straddle}, and no N would decide it "
                        "if the estimate stays there.")
    return needed, (f"{what} = {estimate.value:.4g}, but {straddle}. Intervals shrink as 1/√N: if the estimate "
                    f"stays at {estimate.value:.4g}, about N = {needed:.0f} sequences (now N = {n}) would decide it.")


# --------------------------------------------------------------------------- reading the tables


def _architectures(results: Tables) -> tuple[tuple[str, str], ...]:
    """(architecture label, role) in order of first appearance over all tables."""
    return RunTables.of(results).architectures


def _part(results: Tables, table: str, arch: str) -> pd.DataFrame | None:
    return RunTables.of(results).part(table, arch)


@dataclass
class _ModelSummary:
    """Per-layer means of one decomposition and, per replicate, the same means
    (``replicates[b, layer]``), for one architecture."""

    layers: pd.DataFrame
    replicates: pd.DataFrame | None
    n: int | None

    def layer_replicates(self, column: str) -> np.ndarray | None:
        """``[replicate, layer]`` array of a per-layer mean, layers in the order of ``self.layers``."""
        if self.replicates is None or column not in self.replicates.columns:
            return None
        grid = self.replicates.pivot(index="replicate", columns="layer", values=column)
        return grid.reindex(columns=self.layers["layer"].tolist()).to_numpy(dtype=float)

    def mean(self, column: str) -> tuple[float, np.ndarray | None]:
        """(mean over layers, its replicates) of a per-layer column."""
        values = self.layers[column].to_numpy(dtype=float)
        keep = np.isfinite(values)  # a layer without a value is left out, and named (gaps)
        if not keep.any():
            return math.nan, None
        reps = self.layer_replicates(column)
        return float(values[keep].mean()), (None if reps is None else reps[:, keep].mean(1))

    def gaps(self, *columns: str) -> str:
        """The note naming the layers a mean over ``columns`` leaves out ("" when none)."""
        return missing_layers_note(self.layers, *columns)

    def estimate(self, column: str) -> tuple[Estimate, np.ndarray | None]:
        value, reps = self.mean(column)
        return from_replicates(value, reps, n=self.n), reps

    def depth(self) -> np.ndarray:
        if "relative_depth" in self.layers.columns:
            return self.layers["relative_depth"].to_numpy(dtype=float)
        x = self.layers["layer"].to_numpy(dtype=float)
        return (x - x.min()) / max(x.max() - x.min(), 1.0)


def _summary(results: Tables, arch: str, prefix: str = "decompose") -> _ModelSummary | None:
    layers = _part(results, f"{prefix}_layers", arch)
    if layers is None:
        return None
    layers = layers.sort_values("layer").reset_index(drop=True)
    n = int(layers["n_sequences"].iloc[0]) if "n_sequences" in layers.columns else None
    return _ModelSummary(layers, _part(results, f"{prefix}_replicates", arch), n)


def _length(summary: _ModelSummary) -> int | None:
    """The T (positions per sequence) a decomposition was measured at (None: not recorded)."""
    if "seq_len" not in summary.layers.columns:
        return None
    lengths = summary.layers["seq_len"].dropna().unique()
    return int(lengths[0]) if len(lengths) == 1 else None


def _swept(results: Tables, arch: str, T: int) -> _ModelSummary | None:
    """The length sweep's decomposition of ``arch`` at ``T`` (None: not measured there)."""
    layers = _part(results, "length_sweep_layers", arch)
    if layers is None or "seq_len" not in layers.columns:
        return None
    layers = layers[layers["seq_len"] == T].sort_values("layer").reset_index(drop=True)
    if not len(layers):
        return None
    replicates = _part(results, "length_sweep_replicates", arch)
    if replicates is not None and "seq_len" in replicates.columns:
        replicates = replicates[replicates["seq_len"] == T]
    n = int(layers["n_sequences"].iloc[0]) if "n_sequences" in layers.columns else None
    return _ModelSummary(layers, replicates if replicates is not None and len(replicates) else None, n)


def _swept_lengths(results: Tables, arch: str) -> set[int]:
    layers = _part(results, "length_sweep_layers", arch)
    if layers is None or "seq_len" not in layers.columns:
        return set()
    return {int(T) for T in layers["seq_len"].dropna().unique()}


def window_of(results: Tables, arch: str) -> int | None:
    """The sliding window of ``arch`` (its widest local layer), None without one."""
    for table in ("length_sweep", "decompose_heads"):
        frame = _part(results, table, arch)
        if frame is None or "window" not in frame.columns:
            continue
        windows = pd.to_numeric(frame["window"], errors="coerce").dropna()
        if "layer_type" in frame.columns:
            windows = pd.to_numeric(frame.loc[frame["layer_type"] == "local", "window"], errors="coerce").dropna()
        return int(windows.max()) if len(windows) else None
    return None


@dataclass
class _Matched:
    """Decompositions of several architectures at one ``T`` (``summaries`` by architecture), where
    they come from (``source``), or why there are none (``reason``)."""

    T: int | None
    summaries: dict[str, _ModelSummary]
    source: str = ""
    reason: str = ""

    swept: tuple[str, ...] = ()  # the architectures whose numbers come from the length sweep

    @property
    def where(self) -> str:
        """"at T = 128" (with the length sweep's N when some of the numbers come from it)."""
        if self.T is None:
            return ""
        if self.swept:
            n = self.summaries[self.swept[0]].n
            return f"at T = {self.T} (length sweep, N = {n})"
        return f"at T = {self.T}"

    def where_for(self, arch: str) -> str:
        """Where ``arch``'s numbers come from: "at T = 128", with the sweep's N when from it."""
        if self.T is None or arch not in self.swept:
            return "" if self.T is None else f"at T = {self.T}"
        return f"at T = {self.T} (length sweep, N = {self.summaries[arch].n})"


def matched(results: Tables, archs: list[str], *, beyond: int | None = None, prefer: int | None = None) -> _Matched:
    """The decompositions of ``archs`` at one common ``T``, longer than ``beyond`` when given (a
    window question is asked where the window acts): their own decompositions when those share
    such a ``T``; else at a ``T`` common to their length sweeps (``prefer`` when they have it,
    else the longest), each from its own decomposition where that is at this ``T`` and from its
    sweep otherwise; else none, with the reason. A comparison across architectures reads
    its numbers from here only, so it never compares different ``T``."""
    own = {arch: _summary(results, arch) for arch in archs}
    lengths = {arch: (None if summary is None else _length(summary)) for arch, summary in own.items()}
    floor = 0 if beyond is None else beyond + 1
    if all(summary is not None for summary in own.values()) and len(set(lengths.values())) == 1:
        T = next(iter(lengths.values()))
        if T is not None and T >= floor:
            return _Matched(T, {a: s for a, s in own.items() if s is not None}, "decomposition")
    available: list[set[int]] = []
    for arch in archs:
        own_length = lengths[arch]
        available.append(_swept_lengths(results, arch) | (set() if own_length is None else {own_length}))
    common = set.intersection(*available) if archs else set()
    common = {T for T in common if T >= floor}
    if common:
        T = prefer if prefer in common else max(common)
        # an architecture's own decomposition where it is at that T (more sequences), else the sweep's
        chosen = {arch: own[arch] if lengths[arch] == T else _swept(results, arch, T) for arch in archs}
        swept = tuple(arch for arch in archs if lengths[arch] != T)
        return _Matched(T, {a: s for a, s in chosen.items() if s is not None}, "length sweep", swept=swept)
    at = ", ".join(f"{arch} at T = {lengths[arch] if lengths[arch] is not None else 'unrecorded'}" for arch in archs)
    need = f"longer than the window ({beyond})" if beyond is not None else "one"
    return _Matched(None, {}, reason=(f"not compared: measured {at}, and no common T ({need}) in a length sweep; "
                                      "a comparison across architectures at different T measures T (run the "
                                      "length_sweep step, part of decompose and reproduce)"))


def slope(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least-squares slope of ``y`` (``[..., layer]``) against ``x`` (``[layer]``)."""
    xc = x - x.mean()
    return (np.asarray(y, dtype=float) - np.asarray(y, dtype=float).mean(-1, keepdims=True)) @ xc / (xc @ xc)


def _columns(split: str) -> tuple[str, str, str]:
    return "total_heldout", f"R{split}_heldout", f"M{split}_heldout"


def _has_split(summary: _ModelSummary, split: str) -> bool:
    return all(c in summary.layers.columns for c in _columns(split))


# --------------------------------------------------------------------------- C1, C2


def _evaluate_c1(results: Tables, criteria: Criteria) -> list[Evaluation]:
    rows = []
    for arch, _ in _architectures(results):
        summary = _summary(results, arch)
        if summary is None:
            rows.append(_not_measured("C1", arch))
            continue
        total, _ = summary.estimate("total_heldout")
        verdict = at_least(total, criteria.min_signal)
        T = _length(summary)
        measured = (f"held-out total = {total.format()} (mean over layers and heads, all queries"
                    f"{'' if T is None else f', T = {T}'}{summary.gaps('total_heldout')})")
        n_needed, explanation = math.nan, ""
        if verdict == FAILS:
            explanation = (f"{arch}: the absolute-position share of Var(log A) is {total.format()}, below our "
                           f"threshold {criteria.min_signal:g} over its whole interval; the paper says RoPE "
                           "decoders distinguish absolute position in their attention patterns.")
        elif verdict == INCONCLUSIVE:
            n_needed, explanation = _decide_text(summary.n, total, criteria.min_signal, f"{arch}: held-out total")
        rows.append(Evaluation("C1", arch, verdict, "total_heldout", total, measured, summary.n, n_needed, explanation,
                               T=T))
    return rows


def _c2_matched(results: Tables) -> _Matched:
    """C2's architectures at one T: "both components appear in every architecture" is a statement
    across architectures, so each is judged at the same T (the shortest their decompositions used,
    where a length sweep has it)."""
    archs = [arch for arch, _ in _architectures(results)
             if (summary := _summary(results, arch)) is not None and _has_split(summary, CLAIM_SPLIT)]
    own = [T for arch in archs if (T := _length(_summary(results, arch))) is not None]  # type: ignore[arg-type]
    return matched(results, archs, prefer=min(own) if own else None)


def _evaluate_c2(results: Tables, criteria: Criteria) -> list[Evaluation]:
    rows = []
    at = _c2_matched(results)
    for arch, _ in _architectures(results):
        own = _summary(results, arch)
        if own is None or not _has_split(own, CLAIM_SPLIT):
            rows.append(_not_measured("C2", arch))
            continue
        summary = at.summaries.get(arch, own)
        _, r_col, m_col = _columns(CLAIM_SPLIT)
        residual, _ = summary.estimate(r_col)
        mask, _ = summary.estimate(m_col)
        verdicts = {"residual": at_least(residual, criteria.min_signal), "mask": at_least(mask, criteria.min_signal)}
        verdict = combine(list(verdicts.values())) if at.T is not None else INCONCLUSIVE
        where = at.where_for(arch) or f"at its own T = {_length(own)}"
        measured = (f"{where}, all queries: R' = {residual.format()}, M' = {mask.format()}"
                    f"{summary.gaps(r_col, m_col)}{_own_length_text(own, at)}"
                    f"{_other_split_text(summary)}{_early_text(results, arch)}")
        explanation, n_needed = [], math.nan
        if at.T is None:
            explanation.append(f"{arch}: {at.reason}.")
        for name, estimate in (("residual", residual), ("mask", mask)):
            part = verdicts[name]
            label = f"{arch}: the {name} component ({'R' if name == 'residual' else 'M'}', held-out, all queries)"
            if part == FAILS:
                explanation.append(f"{label} is {estimate.format()}, below our threshold {criteria.min_signal:g} by "
                                   f"{criteria.min_signal - estimate.value:.3g} over its whole interval; the paper "
                                   "says both components appear in every architecture.")
            elif part == INCONCLUSIVE:
                needed, text = _decide_text(summary.n, estimate, criteria.min_signal, label)
                n_needed = needed if math.isnan(n_needed) else max(n_needed, needed)
                explanation.append(text)
        rows.append(Evaluation("C2", arch, verdict, "min(R', M') held-out",
                               min(residual, mask, key=lambda e: e.value), measured, summary.n, n_needed,
                               " ".join(explanation), T=at.T))
    return rows


def _own_length_text(own: _ModelSummary, at: _Matched) -> str:
    """The decomposition at the model's own T, beside the matched one, when the two differ."""
    T = _length(own)
    if at.T is None or T is None or T == at.T:
        return ""
    _, r_col, m_col = _columns(CLAIM_SPLIT)
    residual, _ = own.estimate(r_col)
    mask, _ = own.estimate(m_col)
    return f" (at its own T = {T}: R' = {residual.format()}, M' = {mask.format()})"


def _other_split_text(summary: _ModelSummary) -> str:
    if not _has_split(summary, ""):
        return ""
    residual, _ = summary.estimate("R_heldout")
    mask, _ = summary.estimate("M_heldout")
    return f" (self-referenced split: R = {residual.format()}, M = {mask.format()})"


def _early_text(results: Tables, arch: str) -> str:
    """C2 at early queries, labelled as such: reported beside the criterion, never instead of it."""
    early = _summary(results, arch, "decompose_early")
    if early is None or not _has_split(early, CLAIM_SPLIT):
        return ""
    _, r_col, m_col = _columns(CLAIM_SPLIT)
    residual, _ = early.estimate(r_col)
    mask, _ = early.estimate(m_col)
    stop = int(early.layers["query_stop"].iloc[0]) if "query_stop" in early.layers.columns else PAPER.early_queries
    return f"; early queries i < {stop} (reported, not the criterion): R' = {residual.format()}, M' = {mask.format()}"


# --------------------------------------------------------------------------- C3


@dataclass
class _Balance:
    arch: str
    role: str
    n: int | None
    share: Estimate
    share_reps: np.ndarray | None
    slope: Estimate
    slope_reps: np.ndarray | None
    T: int | None = None


def _balance_of(summary: _ModelSummary, arch: str, role: str) -> _Balance:
    """R'/(R'+M') and the depth slope of R' of one decomposition, with their replicates."""
    _, r_col, m_col = _columns(CLAIM_SPLIT)
    r, r_reps = summary.mean(r_col)
    m, m_reps = summary.mean(m_col)
    share_value = r / (r + m) if r + m > 0 else math.nan
    share_reps = None if r_reps is None else np.where(r_reps + m_reps > 0, r_reps / (r_reps + m_reps), np.nan)
    depth = summary.depth()
    slope_value = float(slope(depth, summary.layers[r_col].to_numpy(dtype=float))) if len(depth) > 1 else math.nan
    layer_reps = summary.layer_replicates(r_col)
    slope_reps = None if layer_reps is None or len(depth) < 2 else slope(depth, layer_reps)
    return _Balance(arch, role, summary.n, from_replicates(share_value, share_reps, n=summary.n), share_reps,
                    from_replicates(slope_value, slope_reps, n=summary.n), slope_reps, _length(summary))


def _balance(results: Tables, arch: str, role: str) -> _Balance | None:
    summary = _summary(results, arch)
    if summary is None or not _has_split(summary, CLAIM_SPLIT):
        return None
    return _balance_of(summary, arch, role)


def _difference(a: Estimate, a_reps: np.ndarray | None, b: Estimate, b_reps: np.ndarray | None,
                n: int | None) -> Estimate:
    """``a - b`` with the interval of the replicate-by-replicate difference."""
    reps = None if a_reps is None or b_reps is None or len(a_reps) != len(b_reps) else a_reps - b_reps
    return from_replicates(a.value - b.value, reps, n=n)


def _min_n(*ns: int | None) -> int | None:
    known = [n for n in ns if n is not None]
    return min(known) if known else None


@dataclass
class _Part:
    """One comparison of C3: its text, verdict, the estimate it is decided on (a difference, or
    a slope), its threshold, the sequences behind it and where (``at``: the common T)."""

    text: str
    verdict: str
    estimate: Estimate
    threshold: float
    n: int | None
    at: str = ""
    T: int | None = None  # the common T of both sides (None: not compared)


def _pair(results: Tables, a: _Balance, b: _Balance, *,
          beyond: int | None = None) -> tuple[_Balance, _Balance, _Matched]:
    """``a`` and ``b`` measured at one T (longer than ``beyond``; :func:`matched`)."""
    own = [t for t in (a.T, b.T) if t is not None]
    at = matched(results, [a.arch, b.arch], beyond=beyond, prefer=min(own) if own else None)
    if at.T is None:
        return a, b, at
    return (_balance_of(at.summaries[a.arch], a.arch, a.role), _balance_of(at.summaries[b.arch], b.arch, b.role), at)


def _c3_parts(results: Tables, balances: list[_Balance]) -> dict[str, list[_Part]]:
    """Per architecture, its comparisons, each made at one T common to both sides (:func:`matched`)."""
    standard = [b for b in balances if b.role == "standard"]
    parts: dict[str, list[_Part]] = {b.arch: [] for b in balances}
    for b in balances:
        if b.role == "ntk":
            for s in standard:
                text = f"R'/(R'+M') minus that of {s.arch}"
                b2, s2, at = _pair(results, b, s)
                parts[b.arch].append(_compared(text, b2.share, b2.share_reps, s2.share, s2.share_reps,
                                               _min_n(b2.n, s2.n), below, at))
        elif b.role == "sliding":
            window = window_of(results, b.arch)
            own = matched(results, [b.arch], beyond=window)
            b1 = _balance_of(own.summaries[b.arch], b.arch, b.role) if own.T is not None else b
            parts[b.arch].append(_Part("depth slope of R'", above(b1.slope, 0.0) if own.T is not None
                                       else INCONCLUSIVE, b1.slope, 0.0, b1.n, own.where or own.reason, own.T))
            for s in standard:
                text = f"depth slope of R' minus that of {s.arch}"
                b2, s2, at = _pair(results, b, s, beyond=window)
                parts[b.arch].append(_compared(text, b2.slope, b2.slope_reps, s2.slope, s2.slope_reps,
                                               _min_n(b2.n, s2.n), above, at))
    return parts


def _compared(text: str, a: Estimate, a_reps: np.ndarray | None, b: Estimate, b_reps: np.ndarray | None,
              n: int | None, rule: Callable[[Estimate, float], str], at: _Matched) -> _Part:
    """A comparison part: the difference ``a - b`` decided by ``rule`` against 0, or inconclusive
    when the two sides could not be matched in T (``at.reason`` says why)."""
    diff = _difference(a, a_reps, b, b_reps, n)
    if at.T is None:
        return _Part(text, INCONCLUSIVE, diff, 0.0, n, at.reason)
    return _Part(text, rule(diff, 0.0), diff, 0.0, n, at.where, at.T)


def _evaluate_c3(results: Tables, criteria: Criteria) -> list[Evaluation]:
    archs = _architectures(results)
    balances = [b for b in (_balance(results, arch, role) for arch, role in archs) if b is not None]
    roles = {b.role for b in balances}
    missing = [ROLE_NAMES[r] for r in ("standard", "ntk", "sliding") if r not in roles]
    parts = _c3_parts(results, balances) if not missing else {}
    all_parts = [p for b in balances if b.role != "standard" for p in parts.get(b.arch, [])]
    rows = []
    for arch, role in archs:
        b = next((x for x in balances if x.arch == arch), None)
        if b is None:
            rows.append(_not_measured("C3", arch))
            continue
        measured = (f"at its own T = {b.T}: R'/(R'+M') = {b.share.format()}, depth slope of R' (per unit of "
                    f"relative depth) = {b.slope.format('+.3f')}")
        if role in OUTSIDE_C3:
            rows.append(Evaluation("C3", arch, NOT_MEASURED, "R'/(R'+M')", b.share,
                                   measured + f"; not part of C3, which compares standard, NTK-scaled and "
                                   f"sliding-window RoPE ({OUTSIDE_C3[role]})", b.n, T=b.T))
            continue
        if missing:
            rows.append(Evaluation("C3", arch, NOT_MEASURED, "R'/(R'+M')", b.share,
                                   measured + "; not compared: needs " + ", ".join(missing), b.n, T=b.T))
            continue
        mine = all_parts if role == "standard" else parts[arch]
        rows.append(_c3_row(arch, role, b, mine, measured, parts, balances))
    return rows


def _c3_row(arch: str, role: str, b: _Balance, mine: list[_Part], measured: str, parts: dict[str, list[_Part]],
            balances: list[_Balance]) -> Evaluation:
    """The C3 evaluation of one architecture from its comparisons (a standard model: all of them)."""
    verdict = combine([p.verdict for p in mine])
    texts, n_needed = [], math.nan
    for p in mine:
        unmatched = p.at.startswith("not compared")
        if role != "standard":
            measured += f"; {p.text}: {p.at}" if unmatched else f"; {p.text} {p.at} = {p.estimate.format('+.3f')}"
        if unmatched and role != "standard":
            texts.append(f"{arch}: {p.text} is {p.at}.")
        elif p.verdict == INCONCLUSIVE:
            needed, sentence = _decide_text(p.n, p.estimate, p.threshold, f"{arch}: {p.text} ({p.at})")
            n_needed = needed if math.isnan(n_needed) else max(n_needed, needed)
            if role != "standard":
                texts.append(sentence)
        elif p.verdict == FAILS and role != "standard":
            texts.append(_c3_fail_text(arch, f"{p.text} ({p.at})", p.estimate))
    if role == "standard" and verdict != HOLDS:
        owners = {b2.arch: combine([p.verdict for p in parts[b2.arch]]) for b2 in balances
                  if b2.role in ("ntk", "sliding")}
        texts.append(f"{arch} sits between only if every comparison holds; "
                     + "; ".join(f"{owner}: {v}" for owner, v in owners.items() if v != HOLDS)
                     + " (see those rows).")
    quantity = {"ntk": "R'/(R'+M') minus standard's", "sliding": "depth slope of R'"}.get(role, "R'/(R'+M')")
    estimate = mine[0].estimate if mine and role != "standard" else b.share
    return Evaluation("C3", arch, verdict, quantity, estimate, measured, b.n, n_needed, " ".join(texts), T=b.T)


def _c3_fail_text(arch: str, text: str, estimate: Estimate) -> str:
    if text.startswith("R'/(R'+M')"):
        return (f"{arch}: {text} is {estimate.format('+.3f')}, above 0 over its whole interval: NTK scaling does not "
                "lower the residual share here, where the paper says it suppresses the residual component.")
    return (f"{arch}: {text} is {estimate.format('+.3f')}, at most 0 over its whole interval: the residual component "
            "does not accumulate with depth faster here, where the paper says sliding-window attention lets it "
            "accumulate.")


# --------------------------------------------------------------------------- C4

# The fraction columns of BosReplacement's tables, best first: the held-out reference-free R' (what C4
# is decided on: an in-sample R' of the replaced run carries the fit's upward bias, largest where R' is
# small, so an in-sample fraction climbs with N), then the in-sample R', then R (tables of older versions)
C4_COLUMNS = {"fraction_removed_rf_heldout": "R' (held-out)", "fraction_removed_rf": "R'",
              "fraction_removed": "R (self-referenced)"}


def c4_column(frame: pd.DataFrame) -> tuple[str, str]:
    """The fraction column of a BOS-replacement table (``overall`` or ``frame``) that C4 reads, and
    how it is named: the first of :data:`C4_COLUMNS` the table has."""
    column = next((c for c in C4_COLUMNS if c in frame.columns), "fraction_removed")
    return column, C4_COLUMNS[column]


def c4_fraction(overall: pd.DataFrame, replicates: pd.DataFrame | None) -> tuple[str, str, Estimate]:
    """C4's number from ``BosReplacement.overall`` and ``.replicates``: the fraction of R' removed at
    early queries, the mean over replacements, with its interval from the same mean taken replicate by
    replicate (a paired bootstrap); NaN where R' of the unreplaced run is not resolved from 0. Returns
    the column, its name and the estimate. ``analyze``, the claims table and every sentence about C4
    read this one value."""
    column, label = c4_column(overall)
    value = float(overall[column].astype(float).mean())
    reps = None
    if replicates is not None and column in replicates.columns:
        reps = replicates.pivot(index="replicate", columns="replacement", values=column
                                ).mean(axis=1).to_numpy(dtype=float)
    n = int(overall["n_sequences"].iloc[0]) if "n_sequences" in overall.columns and len(overall) else None
    return column, label, from_replicates(value, reps, n=n, method=interval_method(column))


def _evaluate_c4(results: Tables, criteria: Criteria) -> list[Evaluation]:
    target = PAPER.c4_fraction_removed
    lo, hi = target - criteria.c4_tolerance, target + criteria.c4_tolerance
    rows = []
    for arch, _ in _architectures(results):
        overall = _part(results, "bos_overall", arch)
        if overall is None:
            rows.append(_not_measured("C4", arch))
            continue
        reps_frame = _part(results, "bos_replicates", arch)
        column, label, mean = c4_fraction(overall, reps_frame)
        n = mean.n
        per = []
        for _, row in overall.iterrows():
            est = Estimate(float(row[column]), float(row.get(f"{column}_lo", math.nan)),
                           float(row.get(f"{column}_hi", math.nan)), method=interval_method(column))
            per.append(f"{row['replacement']} {est.format('.0f', percent=True)}")
        measured = f"fraction of {label} removed: " + ", ".join(per) + f"; mean {mean.format('.0f', percent=True)}"
        explanation, n_needed = "", math.nan
        if not math.isfinite(mean.value):
            # a fraction whose denominator is not resolved from 0 is not defined (NaN in the table): no
            # verdict rests on it
            base_column = {"fraction_removed_rf_heldout": "R_rf_heldout_base", "fraction_removed_rf": "R_rf_base"}.get(
                column, "R_base")
            base = float(overall[base_column].astype(float).mean()) if base_column in overall.columns else math.nan
            rows.append(Evaluation(
                "C4", arch, INCONCLUSIVE, f"fraction of {label} removed (mean over replacements)", mean, measured, n,
                math.nan, f"{arch}: the fraction of {label} removed is not defined: {label} of the unreplaced run "
                f"({base:.4f}) is not resolved from 0 (its interval contains 0, or it is below "
                f"{RATIO_FLOOR:g}), so a ratio to it would be noise; no verdict."))
            continue
        verdict = within(mean, lo, hi)
        if verdict == FAILS:
            gap = (mean.value - target) * 100
            explanation = (f"{arch}: BOS replacement removes {mean.format('.0f', percent=True)} of {label} at early "
                           "queries "
                           f"(mean over replacements); the paper says about {target:.0%} (our tolerance "
                           f"{lo:.0%}–{hi:.0%}): {abs(gap):.0f} points {'more' if gap > 0 else 'less'} than the paper.")
        elif verdict == INCONCLUSIVE:
            edge = lo if abs(mean.value - lo) < abs(mean.value - hi) else hi
            n_needed, explanation = _decide_text(n, mean, edge, f"{arch}: fraction of {label} removed")
        rows.append(Evaluation("C4", arch, verdict, f"fraction of {label} removed (mean over replacements)", mean,
                               measured, n, n_needed, explanation))
    return rows


# --------------------------------------------------------------------------- C5


def _evaluate_c5(results: Tables, criteria: Criteria) -> list[Evaluation]:
    rows = []
    for arch, _ in _architectures(results):
        fp = _part(results, "fingerprint", arch)
        sinks = _part(results, "sink_heads", arch)
        if fp is None:
            rows.append(_not_measured("C5", arch))
            continue
        if "spread_relative" in fp.columns:
            rel = fp["spread_relative"].to_numpy(dtype=float)
        else:
            rel = fp["spread"].to_numpy(dtype=float) / np.maximum(fp["norm"].to_numpy(dtype=float), 1e-30)
        auto = rel[(fp["condition"] == "auto-bos").to_numpy()]
        vary = rel[(fp["condition"] == "varying-token0").to_numpy()]
        auto_max = float(np.max(auto)) if len(auto) else math.nan
        vary_med = float(np.median(vary)) if len(vary) else math.nan
        # The spreads are exact (a deterministic function of the inputs, no sampling): no interval.
        spread_verdict = combine([HOLDS if auto_max <= criteria.c5_noise else FAILS,
                                  HOLDS if vary_med >= criteria.c5_varying else FAILS])
        # "Attention sinks pass it forward" presupposes a sink: in a model where none formed (every
        # head's interval below ε) that part is not applicable, which leaves the claim undecided
        # (inconclusive, with that reason), never refuted.
        certain, possible, sink_verdict, no_sink = 0, 0, INCONCLUSIVE, False
        if sinks is not None:
            score = sinks["sink_score"].to_numpy(dtype=float)
            eps = float(sinks["eps"].iloc[0]) if "eps" in sinks.columns else 0.3
            lo = sinks["sink_score_lo"].to_numpy(dtype=float) if "sink_score_lo" in sinks.columns else score * np.nan
            hi = sinks["sink_score_hi"].to_numpy(dtype=float) if "sink_score_hi" in sinks.columns else score * np.nan
            certain, possible = int((lo > eps).sum()), int((hi > eps).sum())
            no_sink = not certain and not possible and not np.isnan(lo).all()
            sink_verdict = HOLDS if certain else sink_verdict
        verdict = combine([spread_verdict, sink_verdict])
        measured = (f"auto-BOS max relative spread {auto_max:.1e} (exact), varying token 0 median {vary_med:.2f}; "
                    + (f"no sink formed (largest head sink score {np.nanmax(score):.2f}, every interval below "
                       f"ε = {eps:g}): the sink part is not applicable" if no_sink else
                       f"{certain} sink heads whose whole interval lies above ε ({possible} whose interval reaches it)"
                       if sinks is not None else "sink heads not measured"))
        texts = []
        if auto_max > criteria.c5_noise:
            texts.append(f"{arch}: with the same BOS at position 0 the fingerprint still varies across inputs "
                         f"(max relative spread {auto_max:.1e} > {criteria.c5_noise:g}); the paper says it is "
                         "identical.")
        if vary_med < criteria.c5_varying:
            texts.append(f"{arch}: with a varying token 0 the fingerprint barely varies (median relative spread "
                         f"{vary_med:.2g} < {criteria.c5_varying:g}); the paper says it varies with token 0.")
        if no_sink:
            texts.append(f"{arch}: not applicable, no sink formed: no head's sink-score interval reaches ε = {eps:g} "
                         f"(largest score {np.nanmax(score):.2f}), so whether sinks pass the fingerprint forward "
                         "cannot be tested on this model; more prompts would not change that.")
        elif sinks is None:
            texts.append(f"{arch}: the sink heads were not measured (run the sinks step), so the sink part is "
                         "undecided.")
        elif sink_verdict == INCONCLUSIVE:
            texts.append(f"{arch}: {possible} heads may be sinks but none has its whole sink-score interval above ε; "
                         "more prompts would decide it.")
        rows.append(Evaluation("C5", arch, verdict, "auto-BOS max relative spread", Estimate(auto_max), measured,
                               None, math.nan, " ".join(texts)))
    return rows


def _not_measured(claim: str, arch: str) -> Evaluation:
    return Evaluation(claim, arch, NOT_MEASURED, "", Estimate(math.nan), NOT_MEASURED)


# --------------------------------------------------------------------------- the claims


CLAIMS: tuple[Claim, ...] = (
    Claim("C1", "RoPE-trained decoders distinguish absolute position in their attention patterns, although RoPE "
                "puts only relative offsets into q·k.",
          lambda c: f"held-out total signal (mean over layers and heads, all queries) ≥ {c.min_signal:g}, over its "
                    "whole "
                    f"{LEVEL:.0%} interval", _evaluate_c1, title="absolute position in attention"),
    Claim("C2", "Two sources, the mask component (causal softmax normalizer) and the residual component (absolute "
                "position carried by the residual stream), both appear in every architecture.",
          lambda c: f"held-out R' and M' of the reference-free split (means over layers and heads, all queries) both "
                    f"≥ {c.min_signal:g}, over their whole {LEVEL:.0%} intervals; early queries "
                    f"(i < {PAPER.early_queries}) are reported beside it, not used", _evaluate_c2,
          title="two sources: mask and residual"),
    Claim("C3", "The balance depends on the architecture: NTK-scaled RoPE suppresses the residual component, "
                "sliding-window attention lets it accumulate with depth, standard RoPE sits between.",
          lambda c: "the interval of R'/(R'+M') of every NTK model minus that of every standard model lies below 0; "
                    "the interval of the depth slope of R' (least squares against relative depth "
                    "layer / (n_layers − 1)) of every sliding-window model lies above 0 and above that of every "
                    "standard model (interval of the difference)", _evaluate_c3,
          title="the balance depends on the architecture"),
    Claim("C4", "Replacing the BOS embedding before the forward pass removes about 40% of the residual component at "
                "early queries.",
          lambda c: "interval of the mean over replacements of the fraction of the reference-free R' removed "
                    "(queries i < "
                    f"{PAPER.early_queries}) within {PAPER.c4_fraction_removed:.0%} ± {c.c4_tolerance:.0%}",
          _evaluate_c4, title="BOS replacement removes about 40% of R"),
    Claim("C5", "Position 0 is a closed dynamical system: its activation is a deterministic fingerprint, identical "
                "across inputs when token 0 is the auto-prepended BOS, varying with token 0 otherwise; attention "
                "sinks pass it forward.",
          lambda c: f"auto-BOS relative spread ≤ {c.c5_noise:g} at every layer, varying-token-0 median relative "
                    f"spread ≥ {c.c5_varying:g} (both exact), and at least one head whose sink-score interval lies "
                    "above ε", _evaluate_c5, title="position 0 is a deterministic fingerprint"),
)

COLUMNS = ["claim", "statement", "criterion", "architecture", "verdict", "quantity", "value", "value_lo",
           "value_hi", "level", "interval_method", "interval_note", "n_sequences", "seq_len", "n_to_decide", "measured",
           "explanation"]


def evaluate(results: Tables, criteria: Criteria = Criteria()) -> list[Evaluation]:
    """Every claim on every architecture, plus one ``"overall"`` evaluation per claim."""
    results = RunTables.of(results)  # each table sliced once per architecture, whichever claim reads it
    out = []
    for claim in CLAIMS:
        rows = claim.evaluate(results, criteria)
        out.extend(rows)
        out.append(_overall(claim.key, rows))
    return out


def _overall(key: str, rows: list[Evaluation]) -> Evaluation:
    measured_rows = [r for r in rows if r.verdict != NOT_MEASURED]
    needs = next((r.measured for r in rows if "not compared: needs" in r.measured), None)
    if key == "C3" and needs is not None:
        # C3 compares architectures: without all three roles there is nothing to decide
        return Evaluation(key, "overall", NOT_MEASURED, "", Estimate(math.nan),
                          "not measured: needs " + needs.split("needs ")[-1])
    verdict = combine([r.verdict for r in rows])
    counts = {v: sum(r.verdict == v for r in measured_rows) for v in (HOLDS, FAILS, INCONCLUSIVE)}
    text = NOT_MEASURED if not measured_rows else (
        ", ".join(f"{v} on {k}" for v, k in counts.items() if k) + f" of {len(measured_rows)} architectures")
    n_needed = max([r.n_to_decide for r in measured_rows if math.isfinite(r.n_to_decide)], default=math.nan)
    return Evaluation(key, "overall", verdict, "", Estimate(math.nan), text, None, n_needed)


def claims_table(results: Tables, criteria: Criteria = Criteria()) -> pd.DataFrame:
    """The claims as one table (``claims.csv``): one row per (claim, architecture) and one
    ``"overall"`` row per claim; columns :data:`COLUMNS`. ``value``/``value_lo``/``value_hi``
    are the estimate the criterion is applied to and its interval (``level``; ``interval_method``
    ``"percentile"`` or ``"bias-corrected percentile"``, for a quantity computed from in-sample
    fits; ``interval_note`` says when the estimate lies outside its interval; ``seq_len``: the sequence length of the
    decompositions the row rests on, the same for every architecture of a comparison)."""
    statements = {c.key: c.statement for c in CLAIMS}
    criteria_text = {c.key: c.criterion(criteria) for c in CLAIMS}
    rows = [{
        "claim": e.claim, "statement": statements[e.claim], "criterion": criteria_text[e.claim],
        "architecture": e.architecture, "verdict": e.verdict, "quantity": e.quantity,
        "value": e.estimate.value, "value_lo": e.estimate.lo, "value_hi": e.estimate.hi, "level": e.estimate.level,
        "interval_method": e.estimate.method if e.estimate.has_interval else "", "interval_note": e.estimate.note,
        "n_sequences": e.n, "seq_len": e.T, "n_to_decide": e.n_to_decide, "measured": e.measured,
        "explanation": e.explanation,
    } for e in evaluate(results, criteria)]
    return pd.DataFrame(rows, columns=COLUMNS).astype({"n_sequences": "Int64", "seq_len": "Int64"})


# --------------------------------------------------------------------------- C3 at every T

BY_LENGTH_COLUMNS = ["claim", "architecture", "versus", "quantity", "seq_len", "value", "value_lo", "value_hi",
                     "level", "verdict", "n_sequences", "window", "source"]


def _lengths_of(results: Tables, arch: str) -> set[int]:
    """Every T ``arch`` was decomposed at: its own decomposition's and its length sweep's."""
    own = _summary(results, arch)
    own_T = None if own is None else _length(own)
    return _swept_lengths(results, arch) | (set() if own_T is None else {own_T})


def _decomposed_at(results: Tables, arch: str, T: int) -> tuple[_ModelSummary | None, str]:
    """``arch``'s decomposition at ``T`` (its own where that is at ``T``: more sequences) and where from."""
    own = _summary(results, arch)
    if own is not None and _length(own) == T and _has_split(own, CLAIM_SPLIT):
        return own, "decomposition"
    swept = _swept(results, arch, T)
    return (swept, "length sweep") if swept is not None and _has_split(swept, CLAIM_SPLIT) else (None, "")


def c3_by_length(results: Tables) -> pd.DataFrame:
    """C3's comparisons at every sequence length ``T`` both sides were measured at (their own
    decompositions and their length sweeps), where the claims table decides each at one ``T``: so
    that a reader sees at which ``T`` each verdict holds, NTK scaling included beyond the original
    training length.

    Rows (columns :data:`BY_LENGTH_COLUMNS`): per NTK-scaled model, standard model and ``T``,
    R'/(R'+M') of the NTK model minus the standard one's (held-out reference-free split; holds where
    the whole interval is below 0: NTK scaling lowers the residual share); per sliding-window model
    and ``T`` longer than its window, the depth slope of R' (holds above 0) and the same slope minus
    each standard model's (holds above 0). ``value`` is the difference or slope with its interval
    (``level``, the replicate-by-replicate difference when both sides share their replicates), ``n_sequences``
    the fewer sequences of the two sides, ``source`` where the numbers come from. Empty without an
    NTK or sliding-window model beside a standard one."""
    results = RunTables.of(results)
    archs = _architectures(results)
    standard = [arch for arch, role in archs if role == "standard"]
    rows: list[dict[str, object]] = []
    for arch, role in archs:
        if role not in ("ntk", "sliding"):
            continue
        window = window_of(results, arch) if role == "sliding" else None
        for T in sorted(_lengths_of(results, arch)):
            if window is not None and T <= window:
                continue
            mine, source = _decomposed_at(results, arch, T)
            if mine is None:
                continue
            b = _balance_of(mine, arch, role)
            if role == "sliding":
                rows.append(_by_length_row(arch, "", "depth slope of R'", T, b.slope, above(b.slope, 0.0), b.n,
                                           window, source))
            for other in standard:
                theirs, their_source = _decomposed_at(results, other, T)
                if theirs is None:
                    continue
                s = _balance_of(theirs, other, "standard")
                n = _min_n(b.n, s.n)
                if role == "ntk":
                    diff = _difference(b.share, b.share_reps, s.share, s.share_reps, n)
                    rows.append(_by_length_row(arch, other, "R'/(R'+M') minus the standard model's", T, diff,
                                               below(diff, 0.0), n, window, _sources(source, their_source)))
                else:
                    diff = _difference(b.slope, b.slope_reps, s.slope, s.slope_reps, n)
                    rows.append(_by_length_row(arch, other, "depth slope of R' minus the standard model's", T, diff,
                                               above(diff, 0.0), n, window, _sources(source, their_source)))
    return pd.DataFrame(rows, columns=BY_LENGTH_COLUMNS).astype({"seq_len": "Int64", "n_sequences": "Int64"})


def _sources(a: str, b: str) -> str:
    return a if a == b else f"{a}, {b}"


def _by_length_row(arch: str, versus: str, quantity: str, T: int, estimate: Estimate, verdict: str, n: int | None,
                   window: int | None, source: str) -> dict[str, object]:
    return {"claim": "C3", "architecture": arch, "versus": versus, "quantity": quantity, "seq_len": T,
            "value": estimate.value, "value_lo": estimate.lo, "value_hi": estimate.hi, "level": estimate.level,
            "verdict": verdict, "n_sequences": n, "window": window, "source": source}
