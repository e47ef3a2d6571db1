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

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from lens_position.analyses.claims import CLAIMS, HOLDS, NOT_MEASURED, Criteria, Tables, evaluate
from lens_position.analyses.sentences import (  # noqa: F401  (the sentences, re-exported: this module's API)
    UNTRAINED_NOTE,
    agreement_sentence,
    bos_direction,
    bos_sentence,
    components_sentence,
    convergence_sentence,
    ground_truth_sentences,
    leakage_sentence,
    massive_sentences,
    origin_sentence,
    patch_sentences,
    probe_sentences,
    rotary_bands_sentence,
    self_patch_sentence,
    sinks_sentence,
    untrained_note,
    window_sinks_sentence,
)

HEADING = "### What the numbers show"


class Takeaway(str):
    """Markdown text; a notebook shows it rendered (``_repr_markdown_``)."""

    def _repr_markdown_(self) -> str:
        return str(self)

    def __repr__(self) -> str:
        return str(self)

    @classmethod
    def join(cls, *parts: str | Iterable[str], heading: str = HEADING) -> Takeaway:
        """One Markdown text: ``heading``, then every non-empty part (a string or a list of
        strings) as its own paragraph."""
        paragraphs = [heading]
        for part in parts:
            items = [part] if isinstance(part, str) else list(part)
            paragraphs.extend(p for p in items if p)
        return cls("\n\n".join(paragraphs))


# --------------------------------------------------------------------------- result tables

# A decomposition at early queries writes the early tables (the BOS step's base run).
EARLY_TABLES = {"decompose_layers": "decompose_early_layers", "decompose_replicates": "decompose_early_replicates"}


def result_tables(architecture: str, role: str = "standard", **results: Any) -> dict[str, pd.DataFrame]:
    """The tables of a reproduction from result objects of one model (each result's ``TABLES``),
    tagged with its ``architecture`` label and ``role`` (``"standard"``, ``"ntk"``, ``"sliding"``:
    ``ModelSpec.role``), ready for :func:`lens_position.analyses.claims.evaluate`.

    Each keyword names its result as the result class does (its ``KEYWORD``): ``decomposition``
    (all queries), ``bos``, ``probe``, ``fingerprint``, ``sinks``, ``sink_rate``, ``reading``,
    ``convergence``, ``window_sinks``, ``rotary_bands``, ``prompt_sets``; and ``early``, a
    decomposition at early queries (the early tables; an explicit ``early`` wins over the BOS
    step's base run).
    """
    tables: dict[str, pd.DataFrame] = {}
    for keyword, result in sorted(results.items(), key=lambda item: item[0] != "early"):
        if result is None:
            continue
        own = getattr(type(result), "KEYWORD", None)
        if keyword != own and not (keyword == "early" and own == "decomposition"):
            raise TypeError(f"result_tables: unknown result keyword {keyword!r} for a {type(result).__name__} "
                            f"(its keyword is {own!r}; a decomposition at early queries is 'early')")
        for table in type(result).TABLES:
            name = EARLY_TABLES.get(table.name, table.name) if keyword == "early" else table.name
            frame = getattr(result, table.attribute, None)
            if frame is None or name in tables:
                continue
            frame = frame.reset_index(drop=True).copy()
            for column in ("role", "architecture"):
                if column in frame.columns:
                    frame = frame.drop(columns=column)
            frame.insert(0, "role", role)
            frame.insert(0, "architecture", architecture)
            tables[name] = frame
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




SMALL_N = 8  # fewer sequences than this: intervals and verdicts are indicative only


def small_run_banner(provenance: Mapping[str, Any] | None) -> str | None:
    """One sentence saying that a run is quick or small, from its provenance (``quick`` and the
    ``settings`` sizes), so that its green verdicts are not read as a full reproduction; None for
    a run at full size."""
    if not provenance:
        return None
    sizes = provenance.get("settings") or {}
    n, t, reps = sizes.get("N"), sizes.get("T"), sizes.get("n_resamples")
    quick = bool(provenance.get("quick"))
    if not quick and not (isinstance(n, int) and n < SMALL_N):
        return None
    what = "Quick run" if quick else "Small run"
    size = ", ".join(part for part in (f"N = {n}" if n is not None else "", f"T = {t}" if t is not None else "",
                                       f"{reps} bootstrap replicates" if reps is not None else "") if part)
    route = "run without --quick for the reproduction's sizes" if quick else \
        f"use N ≥ {SMALL_N} sequences for verdicts to rely on"
    return f"{what} ({size}): the verdicts are indicative, not a reproduction; {route}."
