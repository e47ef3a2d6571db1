"""Published numbers beside a run's own: each measure's value on the model its paper measured,
next to the same measure on the run's models, and what can and cannot be compared.

- **Positional leakage** (Ruscio, Nanni, Silvestri, "Once upon a token"; their notebook's output on
  Llama-3.2-1B, :data:`lens_position.analyses.leakage.PUBLISHED`): heads whose ΔR² gap over the
  circular-shift null is significant after their multiple-comparison step, and the largest gap with
  its interval. A run's ``leakage_heads`` table (the corrected mode: textbook Benjamini-Hochberg)
  gives the same two numbers per model.
- **Sink rate** (Gu et al. 2025, ε = 0.3 on the first 64 tokens of documents with the tokenizer's own
  BOS): the share of (layer, head) pairs whose attention on position 0, averaged over queries, exceeds
  ε, per prompt, averaged. A run's ``sink_rate`` table gives it on the natural condition with a 95%
  bootstrap interval over prompts.
- **Eviction perplexity** (StreamingLLM, Xiao et al. 2024) is shown as published only: the
  reproduction does not run it (``lp.sink_metric(model, definition="eviction")`` does).

:func:`published_beside_ours` takes a run's tables (stacked over models, as the pipeline writes them)
and returns one row per (measure, model): ``measure``, ``model``, ``published`` (True for a paper's
number), ``value`` (the number in words, with its interval), ``inputs`` (what it was measured on) and
``comparable`` (what a reader may and may not compare).
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from lens_position.analyses.leakage import AUTHORS_SAMPLES, PUBLISHED
from lens_position.ground.errors import BadInputError

__all__ = ["PUBLISHED_SINKS", "published_beside_ours"]

#: Published sink numbers: (measure, model, value in words, where and on what).
PUBLISHED_SINKS: tuple[tuple[str, str, str, str], ...] = (
    ("sink rate (Gu, ε = 0.3)", "Mistral-7B", "97.49%", "Gu et al. 2025, natural text, T = 64"),
    ("sink rate (Gu, ε = 0.3)", "LLaMA2-7B", "92.47%", "Gu et al. 2025, natural text, T = 64"),
    ("sink rate (Gu, ε = 0.3)", "LLaMA3-8B", "99.02%", "Gu et al. 2025, natural text, T = 64"),
    ("eviction perplexity (StreamingLLM)", "Llama-2-13B", "window of 1024: 5158.07; 4 sinks + 1020: 5.40",
     "Xiao et al. 2024, Table 1, PG19"),
)

LEAKAGE = "positional leakage ΔR² (significant heads; largest gap)"
_LEAKAGE_COMPARABLE = ("the largest gap is the same quantity on the same design; the count is not: the "
                       "authors' multiple-comparison step declares heads on pure noise, this run uses "
                       "Benjamini-Hochberg, and the significant set moves with the draw at small n")
_SINK_COMPARABLE = ("the same metric (eps = 0.3 on the first 64 tokens of natural-text documents, the tokenizer's "
                    "BOS) on other documents (CPython's help text, not Gu et al.'s corpus); the published models are "
                    "25-60x larger")
# a sweep's factors: a run over several conditions has one row per model and condition
_CONDITION = ("source", "bos", "seed")


def _conditions(frame: pd.DataFrame) -> list[str]:
    """The sweep factors that vary in ``frame`` (a single-condition run has none to tell apart)."""
    return [c for c in _CONDITION if c in frame.columns and frame[c].nunique() > 1]


def _label(model: object, keys: tuple[object, ...], names: list[str]) -> str:
    """The model, with the sweep condition its rows come from (``seed 1``, ...)."""
    extra = ", ".join(f"{name} {value}" for name, value in zip(names, keys))
    return f"{model} ({extra})" if extra else str(model)


def _leakage_rows(heads: pd.DataFrame | None, seeds: pd.DataFrame | None) -> list[dict[str, object]]:
    per_layer, gap = PUBLISHED.significant_per_layer, PUBLISHED.top_gap
    n_heads = len(per_layer) * PUBLISHED.heads_per_layer
    rows: list[dict[str, object]] = [{
        "measure": LEAKAGE, "model": PUBLISHED.model.removesuffix(" (published)"), "published": True,
        "value": f"{sum(per_layer)} of {n_heads} heads ({sum(per_layer) / n_heads:.0%}); "
                 "L{}H{} ".format(*PUBLISHED.top_head) + f"{gap[0]:+.3f} [{gap[1]:+.3f}, {gap[2]:+.3f}]",
        "inputs": f"their sentences without BOS, n = {AUTHORS_SAMPLES}, their multiple-comparison step",
        "comparable": _LEAKAGE_COMPARABLE}]
    if heads is None or not len(heads):
        return rows
    conditions = _conditions(heads)
    for keys, part in heads.groupby(["model", *conditions], sort=False):  # each head once per condition
        model, *values = keys if isinstance(keys, tuple) else (keys,)
        top = part.sort_values("leakage_gap", ascending=False).iloc[0]
        jaccard = None
        if seeds is not None and len(seeds) and "model" in seeds.columns:
            mine = seeds["model"] == model
            for name, value in zip(conditions, values):
                if name in seeds.columns:
                    mine &= seeds[name] == value
            overlap = seeds.loc[mine, "jaccard"]
            jaccard = float(overlap.mean()) if len(overlap) else None
        value = (f"{int(part['significant'].sum())} of {len(part)} heads ({float(part['significant'].mean()):.0%}); "
                 f"L{int(top['layer'])}H{int(top['head'])} {float(top['leakage_gap']):+.3f} "
                 f"[{float(top['leakage_gap_lo']):+.3f}, {float(top['leakage_gap_hi']):+.3f}]")
        if jaccard is not None and jaccard == jaccard:
            value += f"; overlap of the seeds' sets (Jaccard) {jaccard:.2f}"
        rows.append({"measure": LEAKAGE, "model": _label(model, tuple(values), conditions), "published": False,
                     "value": value,
                     "inputs": "sentences of the run's corpus without BOS, several seeds, Benjamini-Hochberg",
                     "comparable": _LEAKAGE_COMPARABLE})
    return rows


def _sink_rows(rates: pd.DataFrame | None) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = [
        {"measure": measure, "model": model, "published": True, "value": value, "inputs": inputs,
         "comparable": _SINK_COMPARABLE if measure.startswith("sink rate") else
         "not measured by the reproduction: lp.sink_metric(model, definition='eviction') measures it"}
        for measure, model, value, inputs in PUBLISHED_SINKS]
    if rates is None or not len(rates) or "condition" not in rates.columns:
        return rows
    natural = rates[rates["condition"] == "natural"]
    conditions = _conditions(natural)
    for _, row in natural.iterrows():
        protocol = str(row.get("protocol", "documents"))
        inputs = (f"the first {int(row['seq_len'])} tokens of {int(row['N'])} documents, the tokenizer's own BOS"
                  if protocol == "documents" else f"{int(row['N'])} windows of {int(row['seq_len'])} tokens of "
                                                  "the run's own text (not Gu et al.'s documents)")
        rows.append({"measure": PUBLISHED_SINKS[0][0], "published": False,
                     "model": _label(row["model"], tuple(row[c] for c in conditions), conditions),
                     "value": f"{100 * float(row['sink_rate']):.1f}% [{100 * float(row['sink_rate_lo']):.1f}, "
                              f"{100 * float(row['sink_rate_hi']):.1f}]",
                     "inputs": inputs, "comparable": _SINK_COMPARABLE if protocol == "documents" else
                     "the same metric on other inputs (the run's own text)"})
    return rows


_LEAKAGE_COLUMNS = ("model", "layer", "head", "significant", "leakage_gap", "leakage_gap_lo", "leakage_gap_hi")
_SINK_COLUMNS = ("model", "condition", "seq_len", "N", "sink_rate", "sink_rate_lo", "sink_rate_hi")


def _require(frame: pd.DataFrame | None, name: str, columns: tuple[str, ...]) -> None:
    """BadInputError naming the columns a table lacks, and how to get a table that has them."""
    if frame is None or not len(frame):
        return
    if not isinstance(frame, pd.DataFrame):
        raise BadInputError(f"{name} must be a DataFrame (the run's table of that name), got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        route = ("add the model's name, frame.assign(model='...'), to a result's own table" if missing == ["model"]
                 else "rerun the step with this version (the table predates these columns)")
        raise BadInputError(f"the {name} table lacks the column(s) {', '.join(missing)}: {route}")


def published_beside_ours(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The published numbers beside the run's (module docstring), one row per (measure, model): the
    papers' rows first, then the run's models, for every measure the run's tables carry
    (``leakage_heads`` with ``leakage_seeds``, ``sink_rate``)."""
    _require(tables.get("leakage_heads"), "leakage_heads", _LEAKAGE_COLUMNS)
    _require(tables.get("sink_rate"), "sink_rate", _SINK_COLUMNS)
    rows = _leakage_rows(tables.get("leakage_heads"), tables.get("leakage_seeds")) + _sink_rows(
        tables.get("sink_rate"))
    frame = pd.DataFrame(rows, columns=["measure", "model", "published", "value", "inputs", "comparable"])
    return frame.sort_values(["measure", "published"], ascending=[True, False], kind="stable").reset_index(drop=True)
