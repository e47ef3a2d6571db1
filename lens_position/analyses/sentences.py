"""The answer in words: one sentence per question, built from result tables.

- :func:`components_sentence`: where the attention's absolute-position signal comes from, the
  residual stream's share (R') and the mask's (M'), held out and reference-free (what the claims
  use), with intervals; the in-sample, self-referenced split after it.
- :func:`sinks_sentence`: whether sink heads exist and which heads read them.
- :func:`bos_sentence`: what replacing the BOS embedding does to R' at early queries.

The report's sentences follow (what BOS replacement did and which way, the probes, a patch's
effect, the ground truths, position-0 convergence, the window-aware sinks, the rotary bands, the
zoo's sinks, where the sink comes from, the massive activations).
Every sentence is built here, below the report, so that ``lens_position.analyze``, the report and
the command line speak with the same words (``lens_position.report.takeaways``
re-exports them); the sink-sweep's sentences sit with the sweep
(:mod:`lens_position.analyses.zoo.sweep`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lens_position.analyses.claims import PAPER, c4_column, c4_fraction
from lens_position.core.intervals import RATIO_FLOOR, Estimate, format_percent, from_replicates
from lens_position.core.summaries import fmt, layer_mean, missing_layers_note, row_estimate

UNTRAINED_NOTE = ("These numbers come from a small model with random weights, built in code: they exercise the "
                  "code, and its verdicts say nothing about the paper's claims, which are about trained models.")


def _share(layers: pd.DataFrame, replicates: pd.DataFrame | None, part: str, whole: str) -> Estimate:
    """mean(part) / mean(whole) over layers, with the ratio's interval replicate by replicate."""
    keep = np.isfinite(layers[part].to_numpy(dtype=float)) & np.isfinite(layers[whole].to_numpy(dtype=float))
    value = float(layers[part].to_numpy(dtype=float)[keep].mean() / layers[whole].to_numpy(dtype=float)[keep].mean()) \
        if keep.any() else math.nan
    reps = None
    if replicates is not None and {part, whole} <= set(replicates.columns) and keep.any():
        grid = {c: replicates.pivot(index="replicate", columns="layer", values=c)
                .reindex(columns=layers["layer"].tolist()).to_numpy(dtype=float)[:, keep].mean(1)
                for c in (part, whole)}
        with np.errstate(divide="ignore", invalid="ignore"):
            reps = grid[part] / grid[whole]
    return from_replicates(value, reps)


def components_sentence(layers: pd.DataFrame, architecture: str | None = None,
                        replicates: pd.DataFrame | None = None, in_sample: bool = True) -> str:
    """Where absolute position in attention comes from, from ``Decomposition.layers`` (and its
    ``replicates`` for the intervals of the shares): R' and M' held out and reference-free first,
    their shares of the held-out total, then (``in_sample``) the in-sample, self-referenced split."""
    who = f"On {architecture}" if architecture else "Here"
    n = int(layers["n_sequences"].iloc[0]) if "n_sequences" in layers.columns else None
    in_sample_text = ""
    if {"total", "R", "M", "C", "layer"} <= set(layers.columns):  # a table of held-out columns only has none
        mean = layers[["total", "R", "M", "C"]].astype(float).mean()
        r, m = layers["R"].astype(float), layers["M"].astype(float)
        top = layers.loc[layers["total"].astype(float).idxmax()]
        in_sample_text = (f"In-sample, self-referenced: total = {mean['total']:.3f}, R = {mean['R']:.3f}, "
                     f"M = {mean['M']:.3f}, C = {mean['C']:.3f}; R exceeds M in {int((r > m).sum())} of {len(layers)} "
                     f"layers; the largest total, {float(top['total']):.3f}, is in layer {int(top['layer'])}.")
    recommended = {"R_rf_heldout", "M_rf_heldout", "total_heldout"}
    if n is not None and n < 2 or not recommended <= set(layers.columns) \
            or layers["total_heldout"].isna().all():
        reason = (f"held-out values need at least two sequences (one half to fit, the other to evaluate); "
                  f"this decomposition ran on N = {n}" if n is not None and n < 2 else
                  "this table has no held-out, reference-free columns")
        return f"{who}, {reason}. {in_sample_text}".rstrip()
    total = layer_mean(layers, replicates, "total_heldout")
    residual = layer_mean(layers, replicates, "R_rf_heldout")
    mask = layer_mean(layers, replicates, "M_rf_heldout")
    gaps = missing_layers_note(layers, "total_heldout", "R_rf_heldout", "M_rf_heldout")
    head = (f"{who}, absolute position accounts for {fmt(total)} of the variance of log-attention "
            f"(held out, mean over layers and heads{gaps})")
    if total.has_interval and total.lo <= 0:
        text = (head + ": not distinguishable from zero, so there is no share to split "
                f"(R' = {fmt(residual)}, M' = {fmt(mask)}).")
    else:
        r_share = _share(layers, replicates, "R_rf_heldout", "total_heldout")
        m_share = _share(layers, replicates, "M_rf_heldout", "total_heldout")
        interaction = ""
        if "C_rf_heldout" in layers.columns:  # total' = R' + M' + C': the three shares add up to 100%
            c_share = _share(layers, replicates, "C_rf_heldout", "total_heldout")
            interaction = (f" and {fmt(c_share, percent=True)} their interaction (C' = "
                           f"{fmt(layer_mean(layers, replicates, 'C_rf_heldout'))}; the three add up to 100%)")
        rr, mm = layers["R_rf_heldout"].astype(float), layers["M_rf_heldout"].astype(float)
        measured = int((rr.notna() & mm.notna()).sum())
        text = (head + f": {fmt(m_share, percent=True)} of it is the causal mask's (M' = {fmt(mask)}), "
                f"{fmt(r_share, percent=True)} the residual stream's (R' = {fmt(residual)}){interaction}, on the "
                f"reference-free split the claims use; R' exceeds M' in {int((rr > mm).sum())} of {measured} layers"
                + (f" with both values ({len(layers) - measured} without)." if measured < len(layers) else "."))
    return f"{text} {in_sample_text}".rstrip() if in_sample else text


def answer_line(layers: pd.DataFrame, architecture: str, replicates: pd.DataFrame | None = None) -> str:
    """One line per architecture for a run over many (the console summary of a reproduction): the
    held-out total and the mask's, the residual stream's and their interaction's shares of it, the
    numbers :func:`components_sentence` words at length, and the length ``T`` they were measured at."""
    if not {"R_rf_heldout", "M_rf_heldout", "total_heldout"} <= set(layers.columns) \
            or layers["total_heldout"].isna().all():
        return f"{architecture}: no held-out values (fewer than two sequences)"
    total = layer_mean(layers, replicates, "total_heldout")
    one_length = "seq_len" in layers.columns and layers["seq_len"].nunique() == 1
    at = f" at T = {int(layers['seq_len'].iloc[0])}" if one_length else ""
    text = f"{architecture}{at}: total {fmt(total)}"
    if total.has_interval and total.lo <= 0:
        return text + ", not distinguishable from 0"
    shares = [(name, _share(layers, replicates, column, "total_heldout"))
              for name, column in (("mask", "M_rf_heldout"), ("residual", "R_rf_heldout"),
                                   ("interaction", "C_rf_heldout")) if column in layers.columns]
    return text + "; " + ", ".join(f"{name} {fmt(share, percent=True)}" for name, share in shares)


def sinks_sentence(sinks: pd.DataFrame, reading: pd.DataFrame | None = None, architecture: str | None = None,
                   n_readers: int = 3) -> str:
    """Whether sink heads exist (``SinkHeads.frame``: ``is_sink``, ``sink_score``) and, from
    ``SinkReading.frame`` when given, which heads read position 0 most."""
    who = f"On {architecture}" if architecture else "Here"
    eps = float(sinks["eps"].iloc[0]) if "eps" in sinks.columns and len(sinks) else math.nan
    n_sinks, n_heads = int(sinks["is_sink"].sum()), len(sinks)
    top = sinks.loc[sinks["sink_score"].astype(float).idxmax()]
    strongest = f"L{int(top['layer'])}.H{int(top['head'])} at {fmt(row_estimate(top, 'sink_score'))}"
    at = (f" over the first {int(sinks['seq_len'].iloc[0])} positions of each prompt"
          if "seq_len" in sinks.columns and sinks["seq_len"].nunique() == 1 else "")
    if n_sinks:
        sinks_part = (f"{n_sinks} of {n_heads} heads are attention sinks (mean attention on position 0{at} above "
                      f"{eps:g}), the strongest {strongest}")
    else:
        sinks_part = (f"no head is an attention sink (mean attention on position 0{at} above {eps:g}); "
                      f"the largest is {strongest}")
    if reading is None or not len(reading):
        return f"{who}, {sinks_part}; which heads read position 0 was not measured (sink_reading_heads)."
    order = "reading_rank" if "reading_rank" in reading.columns else "R_change"
    readers = reading.sort_values(order).head(n_readers)
    named = ", ".join(f"L{int(r['layer'])}.H{int(r['head'])} (R {fmt(row_estimate(r, 'R_change'))})"
                      for _, r in readers.iterrows())
    return (f"{who}, {sinks_part}; the heads whose R changes most when their own position-0 key/value is "
            f"patched (the sink readers) are {named}.")


def early_queries_text(overall: pd.DataFrame) -> str:
    """Which queries and prompts BOS replacement was measured at, from ``BosReplacement.overall``:
    "queries 0-31 of 16 prompts" ("" for a table without the columns)."""
    if not {"query_start", "query_stop"} <= set(overall.columns) or not len(overall):
        return ""
    start, stop = int(overall["query_start"].iloc[0]), int(overall["query_stop"].iloc[0])
    n = f" of {int(overall['n_sequences'].iloc[0])} prompts" if "n_sequences" in overall.columns else ""
    return f"queries {start}–{stop - 1}{n}"


def how_much_removed(estimate: Estimate) -> str:
    """What a fraction of R' removed says, decided from its interval (the point alone without one):
    ``"little"`` (within ±:data:`LITTLE`), ``"removes"`` / ``"adds"`` (resolved from 0 and not
    little), ``"unresolved"`` (neither: its interval holds 0 and reaches past ±LITTLE), or
    ``"not defined"`` (NaN: the unreplaced R' is not resolved from 0)."""
    if not math.isfinite(estimate.value):
        return "not defined"
    lo, hi = estimate.decision_bounds if estimate.has_interval else (estimate.value, estimate.value)
    if -LITTLE < lo and hi < LITTLE:
        return "little"
    if lo > 0:
        return "removes"
    if hi < 0:
        return "adds"
    return "unresolved"


#: "Little" for a fraction of R' removed: within ±10% (the paper's 40% is four times that).
LITTLE = 0.10


def bos_sentence(overall: pd.DataFrame, architecture: str | None = None,
                 replicates: pd.DataFrame | None = None) -> str:
    """What replacing the BOS embedding does to R' at early queries (``BosReplacement.overall`` and
    ``.replicates``): each replacement's fraction and C4's number, their mean
    (:func:`lens_position.analyses.claims.c4_fraction`), with the queries and prompts they rest on."""
    where = f" on {architecture}" if architecture else ""
    column, label, mean = c4_fraction(overall, replicates)
    at = early_queries_text(overall) or "early queries"
    if not math.isfinite(mean.value):
        return (f"Replacing the BOS embedding{where}: the share of {label} it removes at {at} is not "
                f"defined, because {label} of the unreplaced run is not resolved from 0.")
    parts = [f"{row['replacement']} {fmt(row_estimate(row, column), percent=True)}" for _, row in overall.iterrows()]
    return (f"Replacing the BOS embedding{where} removes {fmt(mean, percent=True)} of {label} at {at}, the mean "
            f"over replacements C4 is decided on ({', '.join(parts)}; negative: adds).")


# --------------------------------------------------------------------------- the report's words


def bos_direction(overall: pd.DataFrame, architecture: str | None = None,
                  replicates: pd.DataFrame | None = None) -> str:
    """Which way BOS replacement moved the residual component, per replacement and on average,
    from ``BosReplacement.overall`` (and ``.replicates``, for the mean's interval), against the
    paper's fraction (``claims.PAPER``)."""
    column, label, mean = c4_fraction(overall, replicates)
    where = f" on {architecture}" if architecture else ""
    if not math.isfinite(mean.value):
        return (f"Replacing the BOS embedding{where}: the fraction of {label} it removes at early queries is not "
                f"defined, because {label} of the unreplaced run is not resolved from 0 (its interval contains 0, "
                "or it is below 0.005 of Var(log A)): a ratio to it would be noise, so nothing is said about "
                "its direction or its share.")
    parts, signs = [], []
    for _, row in overall.iterrows():
        est = row_estimate(row, column)
        parts.append(f"{row['replacement']} {est.format('+.0f', percent=True)}")
        lo, hi = est.decision_bounds if est.has_interval else (est.value, est.value)
        signs.append("removed" if lo > 0 else "added" if hi < 0 else "unchanged")
    text = (f"Replacing the BOS embedding{where} changes {label} at early queries by these fractions removed: "
            + ", ".join(parts) + f" (mean over replacements {mean.format('+.0f', percent=True)}; the paper: about "
                                 f"{PAPER.c4_fraction_removed:.0%} removed). ")
    if all(s == "removed" for s in signs):
        text += (f"Every replacement removes residual component: part of {label} at early queries depends on which "
                 "vector sits at position 0, as the paper says (C4 below compares the share with the paper's).")
    elif all(s == "added" for s in signs):
        text += (f"Every replacement *adds* residual component, the opposite sign of the paper's: here {label} at "
                 "early queries does not come from the BOS embedding itself, and a foreign vector at position 0 "
                 "makes attention depend more on absolute position, not less.")
    elif all(s == "unchanged" for s in signs):
        text += ("No replacement's change is resolved from 0 (every interval contains it): at this N it cannot be "
                 f"said whether {label} at early queries depends on which vector sits at position 0.")
    elif all(s in ("unchanged", "added") for s in signs):
        text += (f"No replacement removes residual component (intervals containing 0 or below it), where the paper "
                 f"finds about {PAPER.c4_fraction_removed:.0%} of it tied to the BOS embedding.")
    else:
        text += ("The replacements disagree "
                 f"({', '.join(f'{r}: {s}' for r, s in zip(overall['replacement'], signs))}): "
                 "what happens depends on what replaces the BOS embedding, so no single fraction describes it.")
    return text


def probe_sentences(probe_layers: pd.DataFrame) -> list[str]:
    """Per architecture, how the position probe's held-out R² changes from the first to the last
    layer (``ProbeResult.layers``, stacked with an ``architecture`` column or not)."""
    frame = probe_layers if "architecture" in probe_layers.columns else probe_layers.assign(architecture="the model")
    out = []
    for arch, g in frame.groupby("architecture", sort=False):
        g = g.sort_values("layer")
        r2 = g["r2_heldout"].astype(float).to_numpy()
        depth = np.linspace(0.0, 1.0, len(r2)) if len(r2) > 1 else np.zeros(1)
        slope = float(np.polyfit(depth, r2, 1)[0]) if len(r2) > 1 else math.nan
        trend = "rises" if slope > 0 else "falls" if slope < 0 else "stays flat"
        text = (
            f"{arch}: the probe's held-out R² for log(i+1) {trend} with depth, from {r2[0]:.3f} at layer "
            f"{int(g['layer'].iloc[0])} to {r2[-1]:.3f} at layer {int(g['layer'].iloc[-1])} (slope "
            f"{slope:+.3f} per unit of relative depth; best {r2.max():.3f} at layer "
            f"{int(g['layer'].iloc[r2.argmax()])})"
        )
        if "r2_shuffled" in g.columns:
            text += f"; with shuffled positions at most {float(g['r2_shuffled'].astype(float).max()):.3f}"
        out.append(text + ".")
    return out


def patch_sentences(base: pd.DataFrame, patched: Mapping[str, pd.DataFrame], component: str = "R") -> list[str]:
    """Per patch, how ``component`` changed, layer by layer, against ``base`` (``.layers``
    frames of decompositions of the same prompts)."""
    out = []
    for label, frame in patched.items():
        change = frame[component].astype(float).to_numpy() - base[component].astype(float).to_numpy()
        k = int(np.abs(change).argmax())
        unchanged = int((np.abs(change) <= 1e-6 * max(1.0, float(base[component].abs().max()))).sum())
        out.append(f"{label}: {component} changes by at most {change[k]:+.3g} (layer {int(base['layer'].iloc[k])}, "
                   f"from {float(base[component].iloc[k]):.3g} to {float(frame[component].iloc[k]):.3g}); "
                   f"{unchanged} of {len(change)} layers unchanged.")
    return out


def self_patch_sentence(difference: float, tolerance: float = 1e-6) -> str:
    """The self-patch check: a patch with the run's own activations must change nothing.
    ``difference``: the largest absolute change of any component, a fraction of Var(log A)."""
    verdict = "passes" if difference <= tolerance else "FAILS"
    return (f"The self-patch check {verdict}: patching the run with its own activations changes the components "
            f"(total, R, M, C and the held-out R', M') by at most {difference:.1e} (tolerance {tolerance:.0e}).")


def agreement_sentence(what: str, reference: str, difference: float, tolerance: float) -> str:
    """``what`` against ``reference``: the largest absolute difference and whether it is within
    ``tolerance`` (float round-off, say)."""
    if difference <= tolerance:
        return f"{what} agrees with {reference}: the largest difference is {difference:.1e} (within {tolerance:.0e})."
    return (f"{what} does NOT agree with {reference}: the largest difference is {difference:.1e} "
            f"(tolerance {tolerance:.0e}).")


def untrained_note(untrained: bool) -> str:
    """For results of random-weight models (the notebooks' fast mode): what their verdicts mean."""
    if not untrained:
        return ""
    return f"*{UNTRAINED_NOTE}*"


def ground_truth_sentences(frame: pd.DataFrame, components: Sequence[str] = ("total", "R", "M", "C")) -> list[str]:
    """One line per row of a table of toy cases (index: the case; columns: the components)."""
    return [f"- {case}: " + ", ".join(f"{c} = {float(row[c]):.3g}" for c in components if c in row.index)
            for case, row in frame.iterrows()]


def convergence_sentence(convergence: pd.DataFrame, bos_layers: pd.DataFrame | None = None,
                         bos_overall: pd.DataFrame | None = None, architecture: str | None = None,
                         bos_replicates: pd.DataFrame | None = None) -> str:
    """Whether the position-0 state's convergence accounts for the C4 result, from the numbers:
    ``Position0Convergence.layers`` (``converged``, ``cosine``, ``tolerance``) and, when given,
    ``BosReplacement.frame`` / ``.overall`` / ``.replicates`` (the fraction of R' removed, held-out
    when present; C4's mean over replacements, :func:`lens_position.analyses.claims.c4_fraction`).

    "Accounts" needs both halves: the replaced state has re-formed over most of the depth (at least
    half of the layers converged) *and* BOS replacement removes little (:func:`how_much_removed`:
    the mean's interval within ±10%). Where the interval is too wide to tell little from much, the
    sentence says so and draws no conclusion."""
    layers = convergence.sort_values("layer")
    where = f"On {architecture}, t" if architecture else "T"
    converged = layers["converged"].astype(bool).to_numpy()
    n_layers, n_converged = len(layers), int(converged.sum())
    tolerance = float(layers["tolerance"].iloc[0])
    runs = _runs_of(layers["layer"].astype(int).tolist(), converged.tolist())
    state = (f"{where}he replaced position-0 state is within cosine {1 - tolerance:.2f} of the unreplaced one at "
             f"{n_converged} of {n_layers} layers (layers {runs})" if n_converged else
             f"{where}he replaced position-0 state is not within cosine {1 - tolerance:.2f} of the unreplaced one at "
             f"any layer (mean cosine {layers['cosine'].astype(float).mean():.2f})")
    if bos_layers is None or len(bos_layers) == 0:
        return state + "; BOS replacement was not measured, so whether this accounts for C4 is not said."
    column, label = c4_column(bos_layers)

    def pooled(group_layers: Any) -> float:
        """The fraction removed over a group of layers, pooled (1 - mean replaced / mean base over the
        group's layers and the replacements); NaN where that base is not resolved from 0."""
        part = bos_layers[bos_layers["layer"].isin(list(group_layers))]
        sides = _fraction_sides(part, column)
        if sides is None:  # a table without the R' columns: the per-layer fractions' mean, as stored
            return float(part[column].astype(float).mean())
        base, replaced = (float(part[side].astype(float).mean()) for side in sides)
        return 1 - replaced / base if abs(base) >= RATIO_FLOOR else math.nan

    def said(value: float) -> str:
        return format_percent(value, "+.0f") if math.isfinite(value) else \
            f"a fraction not defined ({label} not resolved from 0)"

    if bos_overall is not None and column in bos_overall.columns and len(bos_overall):
        _, _, overall = c4_fraction(bos_overall, bos_replicates)
    else:
        overall = Estimate(pooled(layers["layer"]))
    converged_layers, other_layers = layers.loc[converged, "layer"], layers.loc[~converged, "layer"]
    if len(converged_layers):
        split = f"pooled over the layers where the state has converged it removes {said(pooled(converged_layers))}"
        if len(other_layers):
            split += f", over those where it has not {said(pooled(other_layers))}"
    else:
        split = f"pooled over the layers, none of which has converged, {said(pooled(other_layers))}"
    reformed = n_converged >= n_layers / 2
    how_much = how_much_removed(overall)
    if how_much == "not defined":
        return (state + f"; the fraction of {label} BOS replacement removes is not defined: {label} of the unreplaced "
                f"run is not resolved from 0 ({split}), so whether convergence accounts for C4 is not said.")
    verb = "adds" if how_much == "adds" else "removes"
    numbers = f"; BOS replacement removes {fmt(overall, percent=True)} of {label} (mean over replacements; {split})"
    if how_much == "unresolved":
        verdict = (f": whether the replacement's effect is small (within ±{LITTLE:.0%}) or not is not resolved at "
                   "this N, so whether convergence accounts for the C4 result is not said.")
    elif reformed and how_much == "little":
        verdict = (": convergence accounts for the C4 result. Whatever vector sits at position 0, the state that "
                   "later heads read there re-forms, so there is little for the replacement to remove.")
    elif reformed:
        verdict = (f": convergence does not account for the C4 result. The state re-forms, yet the replacement "
                   f"{verb} residual component, so part of R' is read before the state has converged or does not "
                   "go through the position-0 state.")
    elif how_much != "little":
        verdict = (f": the state does not re-form and the replacement {verb} residual component, as a residual "
                   "component read from a position-0 state that depends on its token would make it; convergence "
                   "is absent here and does not explain the C4 result.")
    else:
        verdict = (": the state does not re-form, yet the replacement removes little: R' here does not depend on the "
                   "position-0 state, and convergence does not account for the C4 result.")
    return state + numbers + verdict


def _fraction_sides(frame: pd.DataFrame, column: str) -> tuple[str, str] | None:
    """The (base, replaced) columns of BOS replacement's ``frame`` that ``column``'s fraction divides."""
    stem = {"fraction_removed_rf_heldout": "R_rf_heldout", "fraction_removed_rf": "R_rf"}.get(column, "R")
    for replaced in (f"{stem}_replaced", f"{stem}_condition"):
        if f"{stem}_base" in frame.columns and replaced in frame.columns:
            return f"{stem}_base", replaced
    return None


def _runs_of(layers: Sequence[int], flags: Sequence[bool]) -> str:
    """The flagged layers as ranges: ``"2-8, 11-27"``."""
    runs: list[list[int]] = []
    for layer, flag in zip(layers, flags):
        if flag and runs and runs[-1][1] == layer - 1:
            runs[-1][1] = layer
        elif flag:
            runs.append([layer, layer])
    return ", ".join(f"{a}" if a == b else f"{a}–{b}" for a, b in runs)


def window_sinks_sentence(layer_types: pd.DataFrame, architecture: str | None = None) -> str:
    """How the sink heads of each layer type count under Gu et al.'s metric, the window-aware one
    and attention on position 0 while visible (``WindowSinks.layer_types``), and what that says."""
    where = f" on {architecture}" if architecture else ""
    frame = layer_types.set_index(["layer_type", "metric"])
    parts = []
    for kind in dict.fromkeys(layer_types["layer_type"]):
        counts = {metric: int(frame.loc[(kind, metric), "n_sink_heads"]) for metric in ("gu", "window_aware", "visible")
                  if (kind, metric) in frame.index}
        n_heads = int(frame.loc[(kind, "gu"), "n_heads"])
        parts.append(f"{kind} layers: {counts.get('gu', 0)} of {n_heads} heads under Gu et al.'s metric, "
                     f"{counts.get('window_aware', 0)} window-aware, {counts.get('visible', 0)} on position 0 "
                     "while it is visible")
    text = f"Sink heads (score above ε){where}: " + "; ".join(parts) + "."
    if "local" in set(layer_types["layer_type"]):
        local = {m: frame.loc[("local", m)] for m in ("gu", "window_aware", "visible") if ("local", m) in frame.index}
        gain = local["window_aware"]["mean_score"] - local["gu"]["mean_score"]
        if int(local["window_aware"]["n_sink_heads"]) > int(local["gu"]["n_sink_heads"]):
            text += (" The window-aware metric finds local sink heads Gu et al.'s misses: heads that attend to "
                     "the first key of each window once position 0 has left it.")
        else:
            text += (f" The window-aware score adds {gain:.1e} to the local layers' mean score: their heads do not "
                     "move their sink to the window's first key once position 0 has left the window.")
        if int(local["visible"]["n_sink_heads"]) > int(local["gu"]["n_sink_heads"]):
            text += (" Counting only the queries that can see position 0 finds more: Gu et al.'s score of a local "
                     "head is diluted by the queries past the window, whatever the head does.")
    return text


def rotary_bands_sentence(heads: pd.DataFrame, layers: pd.DataFrame, architecture: str | None = None) -> str:
    """Which RoPE band carries the residual component (``RotaryBands.heads`` and ``.layers``), how
    exact the split is and how far the R' attribution is from adding up."""
    where = f" on {architecture}" if architecture else ""
    own = layers.groupby(["band_index", "band"])["R_band"].mean().reset_index().sort_values("band_index")
    top = own.loc[own["R_band"].idxmax()]
    shares = ", ".join(f"{row.band} {row.R_band:.3f}" for row in own.itertuples())
    return (f"The residual component{where} (mean R {heads['R'].mean():.3f}) splits by RoPE band as {shares}, "
            f"with cross-band terms {heads['R_cross'].mean():+.3f}: it rides mostly on {top['band']} "
            f"({'the slowest' if int(top['band_index']) == int(own['band_index'].max()) else 'not the slowest'} "
            f"band). The split is exact to {heads['R_split_error'].abs().max():.1e}. The attribution of R' by "
            f"removing a band adds up to R' only within {heads['R_rf_attribution_error'].abs().mean():.3f} "
            f"(mean |error| per head, against a mean R' of {heads['R_rf'].mean():.3f}).")


# --------------------------------------------------------------------------- the controlled zoo


def zoo_sinks_sentence(checkpoints_in_run: Sequence[Any], eps: float = 0.3) -> str:
    """What the zoo models' own sink measurements say (recorded in their JSON by
    :func:`lens_position.analyses.zoo.measure.measure_sinks`), in words built from the numbers."""
    measured = [c for c in checkpoints_in_run if c.meta.get("sinks")]
    if not measured:
        return "The sink rate of these checkpoints was not measured."
    top = max(measured, key=lambda c: c.meta["sinks"]["max_sink_score"])
    score = top.meta["sinks"]["max_sink_score"]
    with_sinks = [c for c in measured if c.meta["sinks"]["max_sink_score"] > eps]
    rates = [c.meta["sinks"]["sink_rate"] for c in measured]
    if with_sinks:
        return (f"{len(with_sinks)} of {len(measured)} zoo models have a head whose mean attention on position 0 "
                f"exceeds ε = {eps:g} (the largest, {score:.3f}, in {top.name}); sink rates "
                f"{min(rates):.3f}–{max(rates):.3f}.")
    return (f"No zoo model formed an attention sink: no head's mean attention on position 0 reaches ε = {eps:g} "
            f"in any of the {len(measured)} models (the largest, {score:.3f}, is a head of {top.name}; Gu et al.'s "
            f"sink rate, per prompt, is {min(rates):.3f}–{max(rates):.3f}). The zoo's training budget is too small "
            "for sinks to form, so C5's sink part is not applicable on it and the zoo's C3 answers are answers for "
            "models without sinks; `lens-position zoo sink-sweep` looks for the budget at which they form.")


def origin_sentence(verdict: pd.DataFrame, architecture: str | None = None) -> str:
    """Where the sink comes from (``SinkOrigin.verdict``): the verdict and the reason it gives, with
    the share of the with-BOS sink rate kept without BOS."""
    row = verdict.iloc[0]
    who = architecture or "The model"
    return f"{who}: {row['verdict']} ({row['reason']})."


def massive_sentences(layers: pd.DataFrame, intervention: pd.DataFrame | None = None,
                      architecture: str | None = None) -> list[str]:
    """The largest activation of any layer's output (``MassiveActivations.layers``) and, where the
    massive entries were set to zero or to their mean (``MassiveActivations.interventions``), what
    that changed, with intervals."""
    who = architecture or "The model"
    top = layers.loc[layers["top1"].astype(float).idxmax()]
    out = [f"{who}: the largest entry is {top['top1']:,.0f} (layer {int(top['layer'])}, position "
           f"{int(top['top1_position'])}, dimension {int(top['top1_dim'])}), {top['ratio']:,.0f}x the median."]
    for _, row in (intervention if intervention is not None else pd.DataFrame()).iterrows():
        out.append(f"{who}, {row['intervention']} at layer {int(row['layer'])} on {row['entries']}: sink rate "
                   f"{row['sink_rate_change']:+.3f} [{row['sink_rate_change_lo']:+.3f}, "
                   f"{row['sink_rate_change_hi']:+.3f}], R' {row['R_rf_change']:+.4f} "
                   f"[{row['R_rf_change_lo']:+.4f}, {row['R_rf_change_hi']:+.4f}], loss "
                   f"{row['loss_change']:+.3f} [{row['loss_change_lo']:+.3f}, {row['loss_change_hi']:+.3f}] "
                   "nats per token.")
    return out


def leakage_sentence(heads: pd.DataFrame, seeds: pd.DataFrame | None, architecture: str | None = None) -> str:
    """Positional leakage in words (``PositionalLeakage.heads`` and ``.seeds``): how many heads the
    corrected test keeps on the first seed, how much the seeds' sets overlap, the largest gap with its
    interval, and that ΔR² reads the scores before the softmax."""
    who = architecture or "The model"
    top = heads.sort_values("leakage_gap", ascending=False).iloc[0]
    n_significant = int(heads["significant"].sum())
    overlap = ""
    if seeds is not None and len(seeds):
        pairs = f"{len(seeds)} pair" + ("s" if len(seeds) != 1 else "")
        overlap = (f"; over {pairs} of seeds the significant sets overlap by a mean Jaccard of "
                   f"{float(seeds['jaccard'].mean()):.2f}")
    return (f"{who}: positional leakage ΔR² (the authors' statistic, Benjamini-Hochberg at 5%) keeps "
            f"{n_significant} of {len(heads)} heads{overlap}; the largest gap over the shifted null is "
            f"{float(top['leakage_gap']):+.3f} [{float(top['leakage_gap_lo']):+.3f}, "
            f"{float(top['leakage_gap_hi']):+.3f}] "
            f"(layer {int(top['layer'])}, head {int(top['head'])}). ΔR² reads the scores before the softmax: it "
            "cannot see the mask component, and counts query-position trends the attention ignores.")
