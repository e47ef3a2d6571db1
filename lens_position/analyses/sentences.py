"""The answer in words: one sentence per question, built from result tables.

- :func:`components_sentence`: where the attention's absolute-position signal comes from, the
  residual stream's share (R') and the mask's (M'), held out and reference-free (what the claims
  use), with intervals; the in-sample, self-referenced split after it.
- :func:`sinks_sentence`: whether sink heads exist and which heads read them.
- :func:`bos_sentence`: what replacing the BOS embedding does to R' at early queries.

They sit below the report so that ``lens_position.analyze`` and the report speak with the same
words (``lens_position.report.takeaways`` re-exports them).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from lens_position.core.intervals import Estimate, from_replicates
from lens_position.core.summaries import fmt, layer_mean, row_estimate

UNTRAINED_NOTE = ("These numbers come from a small model with random weights, built in code: they exercise the "
                  "code, and its verdicts say nothing about the paper's claims, which are about trained models.")


def _share(layers: pd.DataFrame, replicates: pd.DataFrame | None, part: str, whole: str) -> Estimate:
    """mean(part) / mean(whole) over layers, with the ratio's interval replicate by replicate."""
    value = float(layers[part].astype(float).mean()) / float(layers[whole].astype(float).mean())
    reps = None
    if replicates is not None and {part, whole} <= set(replicates.columns):
        grid = {c: replicates.pivot(index="replicate", columns="layer", values=c)
                .reindex(columns=layers["layer"].tolist()).to_numpy(dtype=float).mean(1) for c in (part, whole)}
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
    head = (f"{who}, absolute position accounts for {fmt(total)} of the variance of log-attention "
            f"(held out, mean over layers and heads)")
    if total.has_interval and total.lo <= 0:
        text = (head + ": not distinguishable from zero, so there is no share to split "
                f"(R' = {fmt(residual)}, M' = {fmt(mask)}).")
    else:
        r_share = _share(layers, replicates, "R_rf_heldout", "total_heldout")
        m_share = _share(layers, replicates, "M_rf_heldout", "total_heldout")
        rr, mm = layers["R_rf_heldout"].astype(float), layers["M_rf_heldout"].astype(float)
        text = (head + f": {fmt(m_share, percent=True)} of it is the causal mask's (M' = {fmt(mask)}) and "
                f"{fmt(r_share, percent=True)} the residual stream's (R' = {fmt(residual)}), on the reference-free "
                f"split the claims use; R' exceeds M' in {int((rr > mm).sum())} of {len(layers)} layers.")
    return f"{text} {in_sample_text}".rstrip() if in_sample else text


def sinks_sentence(sinks: pd.DataFrame, reading: pd.DataFrame | None = None, architecture: str | None = None,
                   n_readers: int = 3) -> str:
    """Whether sink heads exist (``SinkHeads.frame``: ``is_sink``, ``sink_score``) and, from
    ``SinkReading.frame`` when given, which heads read position 0 most."""
    who = f"On {architecture}" if architecture else "Here"
    eps = float(sinks["eps"].iloc[0]) if "eps" in sinks.columns and len(sinks) else math.nan
    n_sinks, n_heads = int(sinks["is_sink"].sum()), len(sinks)
    top = sinks.loc[sinks["sink_score"].astype(float).idxmax()]
    strongest = f"L{int(top['layer'])}.H{int(top['head'])} at {fmt(row_estimate(top, 'sink_score'))}"
    if n_sinks:
        sinks_part = (f"{n_sinks} of {n_heads} heads are attention sinks (mean attention on position 0 above "
                      f"{eps:g}), the strongest {strongest}")
    else:
        sinks_part = (f"no head is an attention sink (mean attention on position 0 above {eps:g}); "
                      f"the largest is {strongest}")
    if reading is None or not len(reading):
        return f"{who}, {sinks_part}; which heads read position 0 was not measured (sink_reading_heads)."
    order = "reading_rank" if "reading_rank" in reading.columns else "R_change"
    readers = reading.sort_values(order).head(n_readers)
    named = ", ".join(f"L{int(r['layer'])}.H{int(r['head'])} (R {fmt(row_estimate(r, 'R_change'))})"
                      for _, r in readers.iterrows())
    return (f"{who}, {sinks_part}; the heads whose R changes most when their own position-0 key/value is "
            f"patched (the sink readers) are {named}.")


def bos_sentence(overall: pd.DataFrame, architecture: str | None = None) -> str:
    """What replacing the BOS embedding does to R' at early queries (``BosReplacement.overall``)."""
    where = f" on {architecture}" if architecture else ""
    column = "fraction_removed_rf" if "fraction_removed_rf" in overall.columns else "fraction_removed"
    parts = [f"{row['replacement']} {fmt(row_estimate(row, column), percent=True)}" for _, row in overall.iterrows()]
    label = "R'" if column.endswith("_rf") else "R"
    return (f"Replacing the BOS embedding{where} removes these shares of {label} at early queries "
            f"(negative: adds): {', '.join(parts)}.")
