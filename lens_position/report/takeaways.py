"""What a set of results shows, in words built from the numbers: the takeaways the tutorial
notebooks end with, usable on any results.

Every sentence here is computed from result tables. The comparison with the paper is not
written here: :func:`claims_markdown` evaluates the claims with :mod:`lens_position.analyses.claims`
(the paper's numbers live there, once) and renders their verdicts, measured values with
intervals and explanations. The rest adds only what the claims do not say: what the
components are on average (:func:`components_sentence`), which way BOS replacement moves the
residual component (:func:`bos_direction`), how the probe's R² changes with depth
(:func:`probe_sentences`), what a patch did (:func:`patch_sentences`).

Typical use, as the last cell of an analysis::

    tables = takeaways.result_tables("SmolLM2", "standard", decomposition=result)
    takeaways.Takeaway.join(takeaways.components_sentence(result.layers),
                            takeaways.claims_markdown(tables, ["C1", "C2"]))

:class:`Takeaway` is a ``str`` that a notebook displays as Markdown.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from lens_position.analyses.claims import CLAIMS, HOLDS, NOT_MEASURED, PAPER, Criteria, Tables, evaluate
from lens_position.analyses.sentences import (UNTRAINED_NOTE, bos_sentence, components_sentence,  # noqa: F401
                                             sinks_sentence)  # the answer's sentences, shared with analyze()
from lens_position.analyses.tables import result_sources
from lens_position.core.intervals import Estimate


HEADING = "### What the numbers show"


class Takeaway(str):
    """Markdown text; a notebook shows it rendered (``_repr_markdown_``)."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return str(self)

    @classmethod
    def join(cls, *parts: str | Iterable[str], heading: str = HEADING) -> "Takeaway":
        """One Markdown text: ``heading``, then every non-empty part (a string or a list of
        strings) as its own paragraph."""
        paragraphs = [heading]
        for part in parts:
            items = [part] if isinstance(part, str) else list(part)
            paragraphs.extend(p for p in items if p)
        return cls("\n\n".join(paragraphs))


# --------------------------------------------------------------------------- result tables

# result attribute -> table name, per keyword of result_tables (lens_position.analyses.tables)
_TABLES = result_sources()


def result_tables(architecture: str, role: str = "standard", **results: Any) -> dict[str, pd.DataFrame]:
    """The tables of a reproduction (``lens_position.analyses.tables.TABLES``) from result objects of
    one model, tagged with its ``architecture`` label and ``role`` (``"standard"``, ``"ntk"``,
    ``"sliding"``: ``ModelSpec.role``), ready for :func:`lens_position.analyses.claims.evaluate`.

    Keywords (each optional): ``decomposition`` (all queries), ``early`` (a decomposition at
    early queries), ``bos``, ``probe``, ``fingerprint``, ``sinks``, ``sink_rate``, ``reading``,
    ``prompt_sets``.
    """
    unknown = set(results) - set(_TABLES)
    if unknown:
        raise TypeError(f"result_tables: unknown result keyword(s) {sorted(unknown)}; known: {sorted(_TABLES)}")
    tables: dict[str, pd.DataFrame] = {}
    for keyword, result in results.items():
        if result is None:
            continue
        for attribute, table in _TABLES[keyword].items():
            frame = getattr(result, attribute, None)
            if frame is None or table in tables:  # an explicit ``early`` wins over the BOS base run
                continue
            frame = frame.reset_index(drop=True).copy()
            for column in ("role", "architecture"):
                if column in frame.columns:
                    frame = frame.drop(columns=column)
            frame.insert(0, "role", role)
            frame.insert(0, "architecture", architecture)
            tables[table] = frame
    return tables


def stack_tables(*parts: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables of several models, stacked table by table (as a reproduction writes them)."""
    names = dict.fromkeys(name for part in parts for name in part)
    return {name: pd.concat([p[name] for p in parts if name in p], ignore_index=True) for name in names}


# --------------------------------------------------------------------------- the claims, rendered


def claims_markdown(tables: Tables, keys: Sequence[str], criteria: Criteria = Criteria()) -> str:
    """The claims ``keys`` (e.g. ``["C4", "C5"]``) evaluated on ``tables``, as Markdown: per
    claim the paper's statement and our criterion, then per architecture the verdict (holds /
    does not hold / inconclusive at this N), what was measured (with intervals) and, where it
    does not hold, the explanation :mod:`lens_position.analyses.claims` builds from the numbers."""
    by_key = {c.key: c for c in CLAIMS}
    unknown = [k for k in keys if k not in by_key]
    if unknown:
        raise KeyError(f"unknown claim(s) {unknown}; known: {sorted(by_key)}")
    evaluations = evaluate(tables, criteria)
    paragraphs = []
    for key in keys:
        claim = by_key[key]
        rows = [e for e in evaluations if e.claim == key and e.architecture != "overall"]
        lines = [f"**{key}.** The paper: *{claim.statement}* Our criterion: {claim.criterion(criteria)}."]
        for e in rows:
            line = f"- {e.architecture}: **{e.verdict}**"
            if e.verdict != NOT_MEASURED:
                line += f". Measured: {e.measured}."
            if e.n is not None and e.n < 2 and e.verdict != NOT_MEASURED:
                line += (f" With N = {e.n} sequence there is neither a held-out half nor a bootstrap interval, so "
                         "nothing is decided on this run; decompose at least a few sequences to decide it.")
            elif e.explanation and e.verdict != HOLDS:
                line += f" {e.explanation}"
            elif e.verdict == NOT_MEASURED and "needs" in e.measured:
                line += f" ({e.measured.split('; ')[-1]})"
            lines.append(line)
        overall = next(e for e in evaluations if e.claim == key and e.architecture == "overall")
        if len(rows) > 1 or key == "C3":
            lines.append(f"- overall: **{overall.verdict}** ({overall.measured})")
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def verdicts(tables: Tables, keys: Sequence[str], criteria: Criteria = Criteria()) -> dict[tuple[str, str], str]:
    """``{(claim, architecture): verdict}`` for the claims ``keys`` (``"overall"`` included)."""
    return {(e.claim, e.architecture): e.verdict for e in evaluate(tables, criteria) if e.claim in keys}


# --------------------------------------------------------------------------- what the claims do not say


def bos_direction(overall: pd.DataFrame, architecture: str | None = None) -> str:
    """Which way BOS replacement moved the residual component, per replacement and on average,
    from ``BosReplacement.overall``, against the paper's fraction (``claims.PAPER``)."""
    column = ([c for c in ("fraction_removed_rf_heldout", "fraction_removed_rf") if c in overall.columns]
              or ["fraction_removed"])[0]
    label = {"fraction_removed_rf_heldout": "R' (held-out)", "fraction_removed_rf": "R'"}.get(column, "R")
    where = f" on {architecture}" if architecture else ""
    parts, signs = [], []
    for _, row in overall.iterrows():
        est = Estimate(float(row[column]), float(row.get(f"{column}_lo", math.nan)), float(row.get(f"{column}_hi", math.nan)))
        parts.append(f"{row['replacement']} {est.format('+.0f', percent=True)}")
        if est.has_interval:
            signs.append("removed" if est.lo > 0 else "added" if est.hi < 0 else "unchanged")
        else:
            signs.append("removed" if est.value > 0 else "added" if est.value < 0 else "unchanged")
    mean = float(overall[column].astype(float).mean())
    text = (f"Replacing the BOS embedding{where} changes {label} at early queries by these fractions removed: "
            + ", ".join(parts) + f" (average over replacements {mean:+.0%}; the paper: about {PAPER.c4_fraction_removed:.0%} removed). ")
    if all(s == "removed" for s in signs):
        text += (f"Every replacement removes residual component: part of {label} at early queries depends on which "
                 "vector sits at position 0, as the paper says (C4 below compares the share with the paper's).")
    elif all(s == "added" for s in signs):
        text += (f"Every replacement *adds* residual component, the opposite sign of the paper's: here {label} at early "
                 "queries does not come from the BOS embedding itself, and a foreign vector at position 0 makes "
                 "attention depend more on absolute position, not less.")
    elif all(s in ("unchanged", "added") for s in signs):
        text += (f"No replacement removes residual component (intervals containing 0 or below it): here {label} at "
                 f"early queries does not depend on which vector sits at position 0, where the paper finds about "
                 f"{PAPER.c4_fraction_removed:.0%} of it tied to the BOS embedding.")
    else:
        text += (f"The replacements disagree ({', '.join(f'{r}: {s}' for r, s in zip(overall['replacement'], signs))}): "
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
        text = (f"{arch}: the probe's held-out R² for log(i+1) {trend} with depth, from {r2[0]:.3f} at layer "
                f"{int(g['layer'].iloc[0])} to {r2[-1]:.3f} at layer {int(g['layer'].iloc[-1])} (slope "
                f"{slope:+.3f} per unit of relative depth; best {r2.max():.3f} at layer {int(g['layer'].iloc[r2.argmax()])})")
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
    return f"{what} does NOT agree with {reference}: the largest difference is {difference:.1e} (tolerance {tolerance:.0e})."


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
                         bos_overall: pd.DataFrame | None = None, architecture: str | None = None) -> str:
    """Whether the position-0 state's convergence accounts for the C4 result, from the numbers:
    ``Position0Convergence.layers`` (``converged``, ``cosine``, ``tolerance``) and, when given,
    ``BosReplacement.frame`` / ``.overall`` (the fraction of R' removed, held-out when present).

    "Accounts" needs both halves: the replaced state has re-formed over most of the depth (at least
    half of the layers converged) *and* BOS replacement removes little (|mean fraction| < 10%, or
    every replacement's interval holding 0)."""
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
    column = ([c for c in ("fraction_removed_rf_heldout", "fraction_removed_rf") if c in bos_layers.columns]
              or ["fraction_removed"])[0]
    label = {"fraction_removed_rf_heldout": "held-out R'", "fraction_removed_rf": "R'"}.get(column, "R")
    per_layer = bos_layers.groupby("layer")[column].mean()
    in_converged = per_layer.reindex(layers.loc[converged, "layer"]).dropna()
    in_other = per_layer.reindex(layers.loc[~converged, "layer"]).dropna()
    if bos_overall is not None and column in bos_overall.columns and len(bos_overall):
        overall = float(bos_overall[column].astype(float).mean())
        holds_zero = all(float(r.get(f"{column}_lo", math.nan)) <= 0 <= float(r.get(f"{column}_hi", math.nan))
                         for _, r in bos_overall.iterrows())
    else:
        overall, holds_zero = float(per_layer.mean()), False
    little = abs(overall) < 0.1 or holds_zero
    if len(in_converged):
        split = f"per layer it removes {in_converged.mean():+.0%} on average where the state has converged"
        if len(in_other):
            split += f" and {in_other.mean():+.0%} where it has not"
    else:
        split = f"per layer {in_other.mean():+.0%} on average, at layers none of which has converged"
    reformed = n_converged >= n_layers / 2
    numbers = f"; BOS replacement removes {overall:+.0%} of {label} (mean over replacements; {split})"
    if reformed and little:
        verdict = (": convergence accounts for the C4 result. Whatever vector sits at position 0, the state that "
                   "later heads read there re-forms, so there is little for the replacement to remove.")
    elif reformed:
        verdict = (": convergence does not account for the C4 result. The state re-forms, yet the replacement "
                   "removes residual component, so part of R' is read before the state has converged or does not "
                   "go through the position-0 state.")
    elif not little:
        verdict = (": the state does not re-form and the replacement removes residual component, as a residual "
                   "component read from a position-0 state that depends on its token would make it; convergence "
                   "is absent here and does not explain the C4 result.")
    else:
        verdict = (": the state does not re-form, yet the replacement removes little: R' here does not depend on the "
                   "position-0 state, and convergence does not account for the C4 result.")
    return state + numbers + verdict


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
