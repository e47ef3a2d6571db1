"""The self-contained HTML report.

A reproduction produces a set of tidy tables, stacked over models, each with the columns
``model``, ``architecture`` (a display label) and ``role`` (``"standard"``, ``"ntk"`` or
``"sliding"``, read off the ``ModelSpec``); ``lens_position.pipeline.steps.TABLES`` lists them.
This module renders them; it decides nothing. The claims, their criteria, verdicts and the words that explain a
disagreement come from :mod:`lens_position.analyses.claims`.

- ``claims_html``: the claims table (verdicts with the intervals behind them, their cells styled
  by :mod:`lens_position.report.markup`) and, for every claim that does not hold or is
  inconclusive, the explanation;
- ``build_report`` / ``write_report``: one HTML file that opens with that table and then
  shows every figure from ``lens_position.report.plots`` with a caption saying what is measured;
  when the run has controlled-zoo models, a zoo section follows (the C3 answers from paired
  seeds, C1-C5 per variant and seed, the seed-to-seed spread, sinks, R by layer and the loss
  curves; :func:`lens_position.report.zoo.report_section`).
  plotly.js is inlined once, each figure's JSON sits in a ``<script type="application/json">``
  block and is drawn by ``Plotly.newPlot``; the file works offline;
- ``check_in_browser``: opens the report in headless Chromium, fails on any JavaScript error
  or undrawn figure, and saves a screenshot.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.offline

from lens_position.analyses import claims as claim_registry
from lens_position.analyses.claims import FAILS, INCONCLUSIVE, PAPER, Criteria
from lens_position.analyses.sentences import (
    UNTRAINED_NOTE,
    components_sentence,
    leakage_sentence,
    massive_sentences,
    origin_sentence,
    sinks_sentence,
)
from lens_position.core.intervals import Estimate
from lens_position.core.run_tables import RunTables
from lens_position.core.summaries import fmt, is_untrained
from lens_position.findings import Findings
from lens_position.ground.errors import BadInputError
from lens_position.ground.paths import checked_path
from lens_position.report import plots
from lens_position.report.browser import NETWORK_OFF, find_chromium
from lens_position.report.by_length import by_length_html
from lens_position.report.markup import verdict_class
from lens_position.report.plots import Figure, ReportFigure, in_report_order
from lens_position.report.takeaways import small_run_banner

# --------------------------------------------------------------------------- figures


def _per_architecture(frame: pd.DataFrame | None) -> list[tuple[str, pd.DataFrame]]:
    if frame is None or len(frame) == 0:
        return []
    if "architecture" not in frame.columns:
        return [("the model", frame)]
    return [(str(arch), part) for arch, part in frame.groupby("architecture", sort=False)]


def _origin_sentences(results: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per architecture, the sink-origin verdict in words, with the share kept without BOS."""
    return [origin_sentence(part, arch) for arch, part in _per_architecture(results.get("sink_origin_verdict"))]


def _massive_sentences(results: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per architecture, the largest activation and what zeroing the massive entries did."""
    interventions = dict(_per_architecture(results.get("massive_intervention")))
    return [sentence for arch, layers in _per_architecture(results.get("massive_layers"))
            for sentence in massive_sentences(layers, interventions.get(arch), arch)]


def _leakage_sentences(results: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per architecture, positional leakage in words: heads kept, the seeds' overlap, the largest gap."""
    seeds = dict(_per_architecture(results.get("leakage_seeds")))
    return [leakage_sentence(heads, seeds.get(arch), arch)
            for arch, heads in _per_architecture(results.get("leakage_heads"))]


def _convergence_sentences(results: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per architecture, whether the position-0 state's convergence accounts for C4
    (:func:`lens_position.report.takeaways.convergence_sentence`)."""
    from lens_position.report.takeaways import convergence_sentence

    convergence = results.get("convergence_layers")
    if convergence is None or len(convergence) == 0:
        return []
    part = RunTables.of(results).part
    archs = (list(dict.fromkeys(convergence["architecture"])) if "architecture" in convergence.columns else [None])
    return [convergence_sentence(part("convergence_layers", arch), part("bos_layers", arch),
                                 part("bos_overall", arch), arch, part("bos_replicates", arch)) for arch in archs]


#: The report's own figures, in order; a reproduction step declares its own beside it (``Step.figures``),
#: and the reproduction hands the report both (:func:`report_figures`).
FIGURES = (
    Figure("layer_components", ("decompose_layers",), "C2, C3: mask and residual components per layer",
        "For every layer, the share of the variance of log-attention Var(log A) that absolute position "
        "explains and that comes from the residual stream or from the causal softmax normalizer (the mask), "
        "averaged over the layer's heads, all queries, all keys, held-out (fitted on half of the sequences, "
        "evaluated on the other half). Two splits side by side: the reference-free one (R', M': the mask "
        "component is what the mask does to the offset-only part of the scores), on which the claims are "
        "decided, and the self-referenced one (R, M: scores referenced to s[i, i]). x: relative depth "
        "layer / (n_layers − 1), the axis C3's depth slope is computed on. Error bars: 95% bootstrap "
        "intervals over whole sequences.",
        lambda f: plots.layer_components(f, components=_available(f, ("R_rf", "M_rf", "R", "M"), "_heldout"))),
    Figure("layer_components_early", ("decompose_early_layers",),
        "C2 at early queries (a labelled analysis, not the criterion)",
        "The same components as above, restricted to early queries (i < the early-query bound, 32 by "
        "default; all keys, the base run of BOS replacement), per layer, held-out, with 95% bootstrap "
        "intervals. The mask component is concentrated at early queries; claim C2 is decided over all "
        "queries, and this figure is shown beside it, never instead of it.",
        lambda f: plots.layer_components(f, components=_available(f, ("R_rf", "M_rf", "R", "M"), "_heldout"))),
    Figure("length_sweep", ("length_sweep",), "The components against sequence length T",
        "The held-out total and the reference-free R', M' and their interaction C' (shares of Var(log A), means "
        "over layers and heads, all queries) of each model decomposed at several lengths T on prompts drawn the "
        "same way, with 95% percentile bootstrap intervals over sequences; dotted: a model's sliding window. "
        "The mask component shrinks as T grows on every model, so two models are compared only at one T: "
        "the claims compare architectures at a T both were measured at (the first with a window: beyond it), "
        "and say which.",
        lambda f: plots.length_sweep(f)),
    Figure("head_heatmaps", ("decompose_heads",), "Per-head R', M' and total (held-out)",
        "Held-out total absolute signal T and the reference-free residual (R') and mask (M') components of "
        "every head, as fractions of Var(log A); hover a cell for its 95% bootstrap interval. A single "
        "head's held-out value is noisy: read the interval before the colour.",
        lambda f: plots.head_heatmaps(f, components=[c + "_heldout" for c in
                                                     _available(f, ("total", "R_rf", "M_rf"), "_heldout")])),
    Figure("probe", ("probe_layers",), "Position probe on the residual stream",
        "Held-out R² of a ridge probe from resid_pre at each layer to log(position + 1); dotted: the "
        "same probe fitted to shuffled positions (the axis is clipped at -1 when a value falls below; hover "
        "shows every value). Error bars: 95% intervals that hold which sequences were held out (a bootstrap "
        "over them) and which ones the probe was trained on (a jackknife of the refitted probe); in "
        "SmolLM2's middle layers the spread between independent prompt sets is still about twice as wide. An "
        "independent view of absolute position in the residual stream (C3: accumulation with depth).",
        lambda f: plots.probe_r2(f)),
    Figure("bos", ("bos_layers", "bos_overall"), "C4: BOS replacement",
        "Fraction of the reference-free residual component R' removed at early queries (the number claim C4 "
        "is decided on) when the embedding at position 0 "
        "is replaced before the forward pass by another token's embedding, the mean embedding, or a "
        "random vector of the same norm; overall and per layer, with 95% bootstrap intervals over whole "
        "sequences (paired: the base and the replaced runs resample the same sequences; percentile intervals of "
        "the held-out fraction, fitted on one half of the sequences and evaluated on the other; a hatched bar or an "
        "open marker: the estimate lies outside its interval). Dashed: the paper's "
        f"{PAPER.c4_fraction_removed:.0%}.",
        lambda f, o: plots.bos_fraction_removed(f, o)),
    Figure("convergence", ("convergence_layers", "bos_layers"), "C4: does the position-0 state forget its token?",
        "Left: cosine of the residual state at position 0 after each block, with its embedding replaced (other "
        "tokens, the mean embedding, random vectors of the same norm), to the unreplaced state; mean over "
        "replacements with a 95% bootstrap interval over them; dotted: 1 − tolerance, above which a layer counts "
        "as converged. Right: the fraction of R' that the same kind of replacement removes per layer (C4). ",
        lambda c, b: plots.convergence_c4(c, b), more=_convergence_sentences),
    Figure("fingerprint", ("fingerprint",), "C5: the position-0 fingerprint",
        "Spread of the residual stream at position 0 across inputs (left, log scale) and its norm "
        "(right), per layer, with the auto-prepended BOS at position 0 (solid) and with a varying "
        "token 0 (dashed). A spread of exactly 0 is marked with a cross on the tick labelled "
        "\"0 (exact)\" at the bottom of the log axis.",
        lambda f: plots.fingerprint_layers(f)),
    Figure("sinks", ("sink_heads", "sink_reading"), "Sink heads and sink-reading heads",
        "Mean attention on position 0 per head (sink score); white dots: sink heads (score above ε); "
        "red rings: the five top-ranked sink-reading heads, ranked by how much their residual component R "
        "changes (ties broken by the change of their output) when only their own key/value at position 0 "
        "is patched with the counterfactual fingerprint.",
        lambda s, r: plots.sink_heads_map(s, r)),
    Figure("sink_rate", ("sink_rate",), "Sink rate by data condition",
        "Gu et al.'s sink rate as its authors compute it: for every prompt, layer and head, the attention on "
        "position 0 averaged over queries is compared with ε, and the 0/1 outcomes are averaged over "
        "prompts, layers and heads; bars: that percentage with its 95% bootstrap interval over prompts, on "
        "natural text, random tokens, repeated tokens as Gu et al. define them (one token repeated from "
        "position 0, no BOS) and the same repeated tokens after a BOS (repeated_bos, not one of their "
        "conditions). Hollow diamonds: the pooled rate (scores averaged "
        "over prompts first, thresholded once), which is not the authors' metric.",
        lambda f: plots.sink_rate_bars(f)),
    Figure("sink_origin", ("sink_origin",), "Position 0: where the sink comes from",
        "The same texts with the model's BOS first (bos), without it (no_bos), with BOS moved to a later "
        "position (bos_moved), doubled (bos_doubled) and with its embedding replaced (another token, the mean "
        "embedding, a random vector); bars: Gu et al.'s sink rate at position 0 (left) and at the BOS token "
        "wherever it is (right), with 95% bootstrap intervals over prompts. The verdict comes from the share of "
        "the with-BOS rate kept without BOS (paired interval): at least 2/3 position-driven, at most 1/3 "
        "BOS-driven, between them mixed.",
        lambda f: plots.sink_origin_bars(f), lead=_origin_sentences),
    Figure("massive", ("massive_layers",), "Position 0: massive activations",
        "The largest |activation| of each layer's output (solid, mean over prompts with its 95% interval) and "
        "the median |activation| (dotted), log scale; Sun et al. call an entry massive at 100 and 1000x the "
        "median. Where a layer's output holds massive entries in half the prompts, they were set to zero and to "
        "their mean over the prompts (Sun et al.'s set_zero / set_mean) at that layer; paired changes with 95% "
        "intervals: ",
        lambda f: plots.massive_layers(f), more=_massive_sentences),
    Figure("window_sinks", ("window_sinks_heads",), "Sinks under a sliding window: both metrics",
        "Per layer, the mean over its heads of Gu et al.'s sink score (attention on position 0 averaged over "
        "all queries, solid), of the window-aware score (attention on the first key each query can see: "
        "position 0 while visible, the window's first key past it; normalised over the visible keys; dashed) "
        "and of attention on position 0 over the queries that can see it (dotted). Circles: local "
        "(sliding-window) layers, diamonds: global ones, where the three coincide. In a local layer of W keys "
        "measured at T > W, Gu et al.'s score counts a 0 for every query past the window.",
        lambda f: plots.window_sink_layers(f)),
    Figure("rotary_bands", ("bands_layers",), "The residual component by RoPE frequency band",
        "Left: each band's own term Var(abs t_b)/V of the exact split of the residual component R over RoPE "
        "frequency bands (band 0 the fastest pairs; the cross-band terms, which complete the sum to R, are in "
        "the bands_heads table with the split's error). Right: the attribution of the reference-free R' to "
        "each band, R' minus R' of the scores with that band removed; these attributions do not add up to R' "
        "(R' passes through the softmax normaliser) and their error is in the bands_heads table. Mean over "
        "each layer's heads.",
        lambda f: plots.rotary_band_layers(f)),
    Figure("leakage", ("leakage_layers", "decompose_layers"), "Positional leakage (ΔR²) beside R' and M'",
        "Left: per layer, the mean over heads of positional leakage ΔR² (the held-out R² that query and key "
        "position add to the offset on the unscaled scores before the softmax; the measure of Ruscio, Nanni and "
        "Silvestri's \"Once upon a token\") on single sentences without BOS (solid) and on the same sentences' "
        "tokens circularly shifted (dotted), with the first seed's texts. Right: the decomposition's held-out R' "
        "(solid) and M' (dashed) per layer, on the run's prompts. The two read different quantities: ΔR² counts "
        "linear trends in the query position, which the softmax removes, and cannot see the mask component; "
        "R' and M' are read off log A, after the normaliser.",
        lambda leakage, decompose: plots.leakage_layers(leakage, decompose), lead=_leakage_sentences),
    Figure("sink_ablation", ("sink_ablation",), "Ablating the sink-reading heads",
        "Held-out residual component R per layer before (solid) and after (dashed) zero- and mean-ablating "
        "the sink-reading heads. Error bars on the after values: the 95% paired bootstrap interval of the "
        "change (the ablated and unablated runs resample the same sequences); a bar that reaches the solid "
        "line is a change the interval does not tell from 0.",
        lambda f: plots.sink_ablation(f, heldout="R_heldout_before" in f.columns)),
)


def report_figures(results: Mapping[str, pd.DataFrame], figures: Sequence[Figure] = FIGURES) -> list[ReportFigure]:
    """The ``figures`` (default: the report's own), in report order
    (:func:`~lens_position.report.plots.in_report_order`), drawn for the tables present in ``results``."""
    drawn = (figure.draw(results) for figure in in_report_order(figures))
    return [figure for figure in drawn if figure is not None]


def _available(frame: pd.DataFrame, components: tuple[str, ...], suffix: str) -> list[str]:
    """The components whose ``<component><suffix>`` column the frame has (tables from an older
    version lack the reference-free split)."""
    return [c for c in components if f"{c}{suffix}" in frame.columns]


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1250px; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.35em 0.6em; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
td.yes { background: #e5f5e0; } td.no { background: #fde0dd; } td.maybe { background: #fff7bc; } td.na { background:
#f7f7f7; color: #777; }
.caption { color: #444; max-width: 70em; }
.plot { width: 100%; }
details pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
#js-errors { color: #b00; }
#answers .answer { border-left: 4px solid #4a7bd0; padding: 0.1em 0.8em; margin: 0.6em 0; }
#answers .answer h3 { margin: 0.2em 0; } #answers .answer p { margin: 0.25em 0; }
.untrained { background: #fde0dd; border: 1px solid #d33; padding: 0.3em 0.6em; margin: 0.3em 0; font-weight: bold; }
#claims td, #claims th { max-width: 22em; }
#claims details summary { color: #555; cursor: pointer; font-size: 0.9em; }
.banner { background: #fff3cd; border: 1px solid #e0c36c; padding: 0.5em 0.8em; }
#claims details div { font-size: 0.9em; color: #333; }
table.compact td, table.compact th { padding: 0.15em 0.5em; font-size: 0.85em; }
"""

# Collects JavaScript errors, draws every figure from its JSON block, and records the outcome
# on <body> (data-figures-drawn, data-js-errors) so a headless browser can check it.
_RENDER_JS = """
(function () {
  var plots = document.querySelectorAll('div.plot');
  var pending = plots.length, drawn = 0;
  function finish() {
    // what the first screen shows, and how tall the claim cells are (in lines), for the browser check
    var answers = document.querySelectorAll('#answers .answer');
    var seen = 0;
    answers.forEach(function (a) { if (a.getBoundingClientRect().bottom <= window.innerHeight) seen += 1; });
    document.body.setAttribute('data-answers', String(answers.length));
    document.body.setAttribute('data-answers-on-first-screen', String(seen));
    var most = 0;
    document.querySelectorAll('#claims div.cell').forEach(function (c) {
      var line = parseFloat(getComputedStyle(c).lineHeight) || 16;
      most = Math.max(most, Math.round(c.getBoundingClientRect().height / line));
    });
    document.body.setAttribute('data-claim-cell-lines', String(most));
    document.body.setAttribute('data-figures-drawn', String(drawn));
    document.body.setAttribute('data-js-errors', String(window.__lensErrors.length));
    document.getElementById('js-errors').textContent = window.__lensErrors.join('\\n');
    document.body.setAttribute('data-render-complete', '1');
  }
  if (!pending) { finish(); return; }
  plots.forEach(function (div) {
    try {
      var spec = JSON.parse(document.getElementById(div.getAttribute('data-source')).textContent);
      Plotly.newPlot(div, spec.data, spec.layout, {responsive: true, displaylogo: false})
        .then(function () { div.setAttribute('data-drawn', '1'); drawn += 1; })
        .catch(function (e) { window.__lensErrors.push(String(e)); })
        .then(function () { pending -= 1; if (!pending) finish(); });
    } catch (e) {
      window.__lensErrors.push(String(e)); pending -= 1; if (!pending) finish();
    }
  });
})();
"""

_ERROR_TRAP_JS = ("window.__lensErrors = [];"
                  "window.addEventListener('error', function (e) { window.__lensErrors.push(String(e.message)); });"
                  "window.addEventListener('unhandledrejection', function (e) {"
                  " window.__lensErrors.push(String(e.reason)); });")


def _script_json(obj: Any) -> str:
    """JSON safe to place inside <script>: no '</' can close the tag early."""
    return json.dumps(obj, allow_nan=False).replace("</", "<\\/")


def _verdict_cell(verdict: str) -> tuple[str, str]:
    return verdict_class(verdict), verdict


def _estimate_text(row: pd.Series) -> str:
    """The number a verdict rests on (its quantity is named in the cell's detail), to 3 significant
    figures with its interval."""
    value = row.get("value")
    if value is None or pd.isna(value):
        return ""
    estimate = Estimate(float(value), float(row.get("value_lo", math.nan)), float(row.get("value_hi", math.nan)))
    return fmt(estimate)


def _cell(cls: str, lines: list[str], detail: str) -> str:
    """A claims-table cell: at most two short lines and the detail folded away."""
    folded = f"<details><summary>detail</summary><div>{html.escape(detail)}</div></details>" if detail else ""
    return f'<td class="{cls}"><div class="cell">{"<br>".join(lines)}{folded}</div></td>'


def claims_html(claims: pd.DataFrame) -> str:
    """The claims table as HTML: one row per claim (its short title; the paper's statement and our
    criterion folded away), one column per architecture (the verdict and the number it rests on,
    to 3 significant figures with its interval; what was measured folded away), the overall
    verdict; then, for every claim that does not hold or is inconclusive, its explanation in words
    built from the numbers."""
    archs = [a for a in dict.fromkeys(claims["architecture"].tolist()) if a != "overall"]
    titles = {c.key: c.title for c in claim_registry.CLAIMS}
    head = "".join(f"<th>{html.escape(a)}</th>" for a in archs)
    body = []
    for claim in dict.fromkeys(claims["claim"].tolist()):
        part = claims[claims["claim"] == claim].set_index("architecture")
        cells = []
        for arch in archs:
            if arch not in part.index:
                cells.append(_cell("na", ["not measured"], ""))
                continue
            row = part.loc[arch]
            cls, word = _verdict_cell(row["verdict"])
            number = _estimate_text(row)
            lines = [f"<b>{html.escape(word)}</b>"] + ([html.escape(number)] if number else [])
            quantity = str(row.get("quantity") or "")
            cells.append(_cell(cls, lines, f"{quantity}: {row['measured']}" if quantity else str(row["measured"])))
        cls, word = _verdict_cell(part.loc["overall", "verdict"])
        what = (f"<b>{html.escape(claim)}</b> {html.escape(titles.get(claim, ''))}<details><summary>the paper, our "
                f"criterion</summary><div>{html.escape(part['statement'].iloc[0])} Our criterion: "
                f"{html.escape(part['criterion'].iloc[0])}.</div></details>")
        body.append(f'<tr id="claim-{claim}"><td><div class="cell">{what}</div></td>{"".join(cells)}'
                    f'{_cell(cls, [f"<b>{html.escape(word)}</b>"], str(part.loc["overall", "measured"]))}</tr>')
    table = (f'<table id="claims"><thead><tr><th>claim</th>{head}<th>overall</th></tr></thead>'
             f'<tbody>{"".join(body)}</tbody></table>')
    return table + _disagreements_html(claims)


def _disagreements_html(claims: pd.DataFrame) -> str:
    """One list item per (claim, architecture) whose verdict is not ``holds``, with its explanation."""
    items: list[str] = []
    for row in claims.itertuples():
        text = row.explanation if isinstance(row.explanation, str) else ""
        if row.architecture == "overall" or row.verdict not in (FAILS, INCONCLUSIVE) or not text:
            continue
        items.append(f'<li id="why-{html.escape(row.claim)}-{len(items)}"><b>{html.escape(row.claim)}, '
                     f'{html.escape(row.verdict)}.</b> {html.escape(text)}</li>')
    if not items:
        return ""
    return ('<h3 id="disagreements">Where our numbers differ from the paper, or do not yet decide</h3>'
            f'<ul class="why">{"".join(items)}</ul>')


def _model_of(frame: pd.DataFrame | None, arch: str) -> str | None:
    if frame is None or "model" not in frame.columns or "architecture" not in frame.columns:
        return None
    names = frame.loc[frame["architecture"] == arch, "model"]
    return str(names.iloc[0]) if len(names) else None


def answers_html(tables: Mapping[str, pd.DataFrame], provenance: Mapping[str, Any] | None = None) -> str:
    """The answer first: per model, one sentence on where its attention's absolute position comes
    from (the mask's share and the residual stream's, held out and reference-free, with intervals)
    and one on its sink heads and who reads them, built from the tables
    (:mod:`lens_position.analyses.sentences`); a banner over a random-weight model."""
    layers_all = tables.get("decompose_layers")
    if layers_all is None or not len(layers_all):
        return ""
    archs = list(dict.fromkeys(layers_all["architecture"])) if "architecture" in layers_all.columns else [None]
    sources = {str(m.get("name")): str(m.get("source") or "") for m in (provenance or {}).get("models", [])}
    blocks = []
    part_of = RunTables.of(tables).part  # architecture None: the whole table
    for k, arch in enumerate(archs):
        part = part_of("decompose_layers", arch)
        if part is None:
            continue
        layers = part.sort_values("layer")
        model = _model_of(layers_all, arch) if arch is not None else None
        sentences = [components_sentence(layers, arch, part_of("decompose_replicates", arch), in_sample=False)]
        sinks = part_of("sink_heads", arch)
        if sinks is not None:
            sentences.append(sinks_sentence(sinks, part_of("sink_reading", arch), arch))
        untrained = model is not None and is_untrained({"model": {"name": model, "source": sources.get(model, "")}})
        banner = f'<p class="untrained">{html.escape(UNTRAINED_NOTE)}</p>' if untrained else ""
        label = html.escape(str(arch or model or "the model")) + (f" <small>({html.escape(model)})</small>"
                                                                   if model and model != arch else "")
        blocks.append(f'<div class="answer" id="answer-{k}"><h3>{label}</h3>{banner}'
                      + "".join(f"<p>{html.escape(t)}</p>" for t in sentences) + "</div>")
    return ('<section id="answers"><h2>Where absolute position comes from, per model</h2>'
            + "".join(blocks) + "</section>")


def models_html(provenance: Mapping[str, Any] | None) -> str:
    """The models of the run as a compact table (architecture, model, source)."""
    models = (provenance or {}).get("models", [])
    if not models:
        return ""
    rows = "".join(f"<tr><td>{html.escape(str(m.get('architecture', '')))}</td><td>{html.escape(str(m.get('name')))}"
                   f"</td><td>{html.escape(str(m.get('source')))}</td></tr>" for m in models)
    return (f'<details id="models"><summary>{len(models)} model{"s" if len(models) != 1 else ""}</summary>'
            '<table class="compact"><thead><tr><th>architecture</th><th>model</th><th>source</th></tr></thead>'
            f"<tbody>{rows}</tbody></table></details>")


def _provenance_html(provenance: Mapping[str, Any] | None) -> str:
    if not provenance:
        return ""
    rows = []
    for model in provenance.get("models", []):
        sha = model.get("weights_sha256") or "–"
        rows.append(f"<tr><td>{html.escape(str(model.get('architecture', '')))}</td>"
                    f"<td>{html.escape(str(model.get('name')))}</td><td>{html.escape(str(model.get('source')))}</td>"
                    f"<td><code>{html.escape(str(sha)[:16])}</code></td></tr>")
    table = ("<table><thead><tr><th>architecture</th><th>model</th><th>source</th><th>weights sha256</th>"
             f"</tr></thead><tbody>{''.join(rows)}</tbody></table>") if rows else ""
    facts = []
    for key in ("seed", "wall_time_s", "quick", "created"):
        if key in provenance:
            facts.append(f"{key}: <code>{html.escape(str(provenance[key]))}</code>")
    full = html.escape(json.dumps(provenance, indent=1, default=str))
    return (f"<h2>Provenance</h2><p>{' · '.join(facts)}</p>{table}"
            f"<details><summary>full provenance (data spec, options, package versions, timings)</summary>"
            f"<pre>{full}</pre></details>")


def _small_run_html(provenance: Mapping[str, Any] | None) -> str:
    """The quick- or small-run banner above everything else (empty for a run at full size)."""
    banner = small_run_banner(provenance)
    return f'<p id="small-run" class="banner">{html.escape(banner)}</p>' if banner else ""


def _run_summary_html(provenance: Mapping[str, Any] | None) -> str:
    """One paragraph saying what was run: models, data, BOS policy, sizes, seed."""
    if not provenance:
        return ""
    parts = []
    data = provenance.get("data") or {}
    if data:
        parts.append(f"data: {html.escape(str(data.get('source')))} "
                     f"({html.escape(str(data.get('corpus') or 'default corpus'))}), BOS policy "
                     f"<code>{html.escape(str(data.get('bos')))}</code>, seed {html.escape(str(data.get('seed')))}")
    sizes = provenance.get("settings") or {}
    if sizes:
        lo, hi = sizes.get("query_range", (None, None))
        parts.append(f"sizes: decomposition on N = {sizes.get('N')} sequences of T = {sizes.get('T')} "
                     f"positions (sliding-window models: at least {sizes.get('window_factor')} × their window), "
                     f"probes on at least {sizes.get('probe_positions')} positions; "
                     f"BOS replacement and sink reading at queries {lo} ≤ i &lt; {hi} on {sizes.get('early_N')} "
                     f"sequences; sinks and fingerprint at T = {sizes.get('sink_T')}; sink threshold "
                     f"ε = {sizes.get('eps')}")
    if "wall_time_s" in provenance:
        text = f"wall time of this run {float(provenance['wall_time_s']):.0f} s"
        if provenance.get("steps_reused"):
            text += f", {provenance['steps_reused']} steps reused from the result cache"
            if "steps_computed_wall_s" in provenance:
                text += f" (computing every step took {float(provenance['steps_computed_wall_s']):.0f} s)"
        parts.append(text)
    return f'<p id="run-summary">{"<br>".join(parts)}</p>' if parts else ""


def published_html(tables: Mapping[str, pd.DataFrame]) -> str:
    """The published numbers beside the run's own
    (:func:`lens_position.analyses.published.published_beside_ours`), as a table; empty when the run
    measured none of the published measures."""
    from lens_position.analyses.published import published_beside_ours

    frame = published_beside_ours(tables)
    if frame["published"].all():
        return ""
    rows = "".join(
        f'<tr class="{"published" if row.published else "ours"}"><td>{html.escape(row.measure)}</td>'
        f"<td>{html.escape(row.model)}{' <small>(published)</small>' if row.published else ''}</td>"
        f"<td>{html.escape(row.value)}</td><td>{html.escape(row.inputs)}</td>"
        f"<td>{html.escape(row.comparable)}</td></tr>" for row in frame.itertuples())
    return ('<section id="published"><h2>Published numbers beside ours</h2><p>Each measure as its paper '
            "reported it on the model it measured, beside the same measure on this run's models (95% intervals "
            "over prompts or sequences), and what can be compared.</p><table class=\"compact\"><thead><tr>"
            "<th>measure</th><th>model</th><th>value</th><th>inputs</th><th>comparable</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></section>")


def _figure_section(fig: ReportFigure, heading: str = "h2") -> str:
    """One figure: title, caption, the div the render script draws into, and its JSON."""
    spec = fig.figure.to_plotly_json()
    return (f'<section class="figure" id="figure-{fig.key}"><{heading}>{html.escape(fig.title)}</{heading}>'
            f'<p class="caption">{html.escape(fig.caption)}</p>'
            f'<div class="plot" id="plot-{fig.key}" data-source="data-{fig.key}"></div>'
            f'<script type="application/json" id="data-{fig.key}">{_script_json(spec)}</script></section>')


def prompt_sets_html(summary: pd.DataFrame | None) -> str:
    """The opt-in check across independent prompt sets (``prompt_sets_summary``) as a table:
    per architecture and quantity, the between-set SD beside the bootstrap's and their ratio
    with its interval, in words that say whether they agree. Empty without the table."""
    if summary is None or len(summary) == 0:
        return ""
    rows = []
    for _, r in summary.iterrows():
        ratio = f"{r['sd_ratio']:.2f} [{r['sd_ratio_lo']:.2f}, {r['sd_ratio_hi']:.2f}]"
        reading = ("as wide as the spread between sets" if r["sd_ratio_lo"] <= 1 <= r["sd_ratio_hi"] else
                   "wider than the spread between sets (conservative)" if r["sd_ratio_hi"] < 1 else
                   "narrower than the spread between sets")
        rows.append(f"<tr><td>{html.escape(str(r.get('architecture', '')))}</td><td>{html.escape(r['claim'])}</td>"
                    f"<td>{html.escape(r['quantity'])}</td><td>{int(r['n_sets'])}</td><td>{r['mean_over_sets']:.4f}</td>"
                    f"<td>{r['between_sd']:.4f}</td><td>{r['bootstrap_sd']:.4f}</td><td>{ratio}</td>"
                    f"<td>bootstrap interval {reading}</td><td>{html.escape(str(r['verdicts']))}</td></tr>")
    return ('<section id="prompt-sets"><h2>Across independent prompt sets</h2><p class="caption">The numbers claims '
            "C1 and C2 are decided on, measured on K disjoint prompt sets (distinct corpus windows, or seeds): the "
            "standard deviation of the K estimates beside the one each set's 95% bootstrap interval predicts "
            "(width / 3.92), and their ratio with its 95% interval (chi-square, K − 1 degrees of freedom).</p>"
            "<table><thead><tr><th>architecture</th><th>claim</th><th>quantity</th><th>K</th><th>mean</th>"
            "<th>between-set SD</th><th>bootstrap SD</th><th>ratio</th><th>reading</th><th>verdicts</th></tr>"
            f"</thead><tbody>{''.join(rows)}</tbody></table></section>")


def build_report(results: Mapping[str, pd.DataFrame] | Findings, *, provenance: Mapping[str, Any] | None = None,
                 criteria: Criteria = Criteria(), title: str = "lens_position: where does absolute position come from?",
                 figures: Sequence[Figure] = FIGURES) -> str:
    """The whole report as one HTML string (plotly.js inlined once; works offline), from a run's
    :class:`~lens_position.findings.Findings` (or its tables, whose findings are then computed here
    under ``criteria``): the report renders the findings' claims, never computes them again."""
    from lens_position.report import zoo as zoo_c3

    findings = results if isinstance(results, Findings) else Findings.of(results, criteria)
    main, zoo, claims = findings.main, findings.zoo, findings.claims
    sections = [_figure_section(fig) + (by_length_html(findings.by_length) if fig.key == "length_sweep" else "")
                for fig in report_figures(main, figures)]
    if zoo and findings.zoo_claims is not None:
        before, figures, after = zoo_c3.report_section(zoo, findings.zoo_claims)
        sections.append(before + "".join(_figure_section(fig, heading="h3") for fig in figures) + after)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{_ERROR_TRAP_JS}</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        f"{_small_run_html(provenance)}"
        f"{answers_html(main, provenance)}"
        "<h2>Claims</h2><p>A reproduction of arXiv 2606.06160's claims C1–C5 with lens_position. Every number "
        "below is measured by this run; open a cell for what was measured, a claim for the paper's statement and "
        "the criterion that decides it.</p>"
        f"{claims_html(claims)}{models_html(provenance)}{_run_summary_html(provenance)}"
        f"{prompt_sets_html(main.get('prompt_sets_summary'))}"
        f"{''.join(sections)}{published_html(main)}{_provenance_html(provenance)}"
        '<pre id="js-errors"></pre>'
        f"<script>{_RENDER_JS}</script></body></html>\n"
    )


def write_report(path: str | Path, results: Mapping[str, pd.DataFrame], **kwargs: Any) -> Path:
    """Write ``build_report(results, **kwargs)`` to ``path`` (UTF-8) and return the path."""
    path = checked_path(path, "the report's file")
    path.write_text(build_report(results, **kwargs), encoding="utf-8")
    return path


def report_figure_specs(html_text: str) -> dict[str, dict]:
    """The figure JSON embedded in a report, by figure key (what the browser draws)."""
    found = re.findall(r'<script type="application/json" id="data-([\w-]+)">(.*?)</script>', html_text, re.S)
    return {key: json.loads(body.replace("<\\/", "</")) for key, body in found}


# --------------------------------------------------------------------------- browser check


@dataclass
class BrowserCheck:
    """What headless Chromium saw when it opened the report."""

    figures_expected: int
    figures_drawn: int
    undrawn: list[str]
    js_errors: list[str]
    screenshot: Path | None
    console: list[str] = field(default_factory=list)
    page: dict[str, str] = field(default_factory=dict)  # <body>'s data-* attributes after rendering

    @property
    def ok(self) -> bool:
        return not self.js_errors and not self.undrawn and self.figures_drawn == self.figures_expected

    def to_dict(self) -> dict[str, Any]:
        return {"figures_expected": self.figures_expected, "figures_drawn": self.figures_drawn,
                "undrawn": self.undrawn, "js_errors": self.js_errors, "ok": self.ok,
                "screenshot": str(self.screenshot) if self.screenshot else None}


def _chromium_args(binary: str, profile: str) -> list[str]:
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            *NETWORK_OFF, "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]


def check_in_browser(report: str | Path, *, screenshot: str | Path | None = None,
                     width: int = 1300, height: int | None = None, timeout_s: float = 120.0) -> BrowserCheck:
    """Open ``report`` in headless Chromium and check it: no JavaScript error, every figure drawn.

    Chromium dumps the DOM after the page's scripts finish (each figure div must carry
    ``data-drawn`` and contain plotly's ``svg.main-svg``; ``<body data-js-errors>`` must be 0;
    the console log on stderr must have no error) and, when asked, saves a PNG screenshot of the
    page (``width`` × ``height`` pixels; the height defaults to the figures' total height), both
    from one launch; a Chromium that does one thing per launch is started again for the
    screenshot.
    """
    report = checked_path(report, "the report to check").resolve()
    text = report.read_text(encoding="utf-8")
    keys = re.findall(r'<div class="plot" id="plot-([\w-]+)"', text)
    binary = find_chromium()
    url = report.as_uri()
    shot = None if screenshot is None else checked_path(screenshot, "the screenshot's file").resolve()
    shot_args: list[str] = []
    if shot is not None:
        if height is None:
            specs = report_figure_specs(text)
            height = 1400 + sum(int(s["layout"].get("height", 450)) + 160 for s in specs.values())
        shot_args = [f"--window-size={width},{height}", f"--screenshot={shot}"]
        shot.unlink(missing_ok=True)  # so that only this launch's file counts
    with tempfile.TemporaryDirectory(prefix="lens-position-chromium-") as profile:
        args = _chromium_args(binary, profile) + ["--virtual-time-budget=30000", *shot_args, "--dump-dom", url]
        # Chromium writes its shared memory and caches under $TMPDIR; one that names no folder (Python's
        # tempfile then falls back to /tmp) would leave figures undrawn: it gets the folder Python uses.
        env = {**os.environ, "TMPDIR": tempfile.gettempdir()}
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s, env=env)
        except subprocess.TimeoutExpired as exc:
            raise BadInputError(f"Chromium did not finish rendering {report} within {timeout_s:.0f} s") from exc
    dom = proc.stdout
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    js_errors = [line for line in console if re.search(r"error|uncaught", line, re.I)]
    body = re.search(r"<body([^>]*)>", dom)
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(1))) if body else {}
    if attrs.get("data-render-complete") != "1":
        js_errors.append("the report's render script did not complete (no data-render-complete on <body>)")
    if attrs.get("data-js-errors", "0") != "0":
        trapped = re.search(r'<pre id="js-errors">(.*?)</pre>', dom, re.S)
        js_errors.append("page errors: " + html.unescape(trapped.group(1) if trapped else "?"))
    undrawn = []
    divs = {m.group(1): m.start() for m in re.finditer(r'<div class="plot[^"]*" id="plot-([\w-]+)"', dom)}
    for key in keys:
        start = divs.get(key)
        chunk = dom[start:start + 400_000] if start is not None else ""
        end = chunk.find('<script type="application/json"')
        chunk = chunk[:end] if end > 0 else chunk
        if start is None or 'data-drawn="1"' not in chunk[:2000] or "main-svg" not in chunk:
            undrawn.append(key)
    if shot is not None:
        if not shot.exists():
            with tempfile.TemporaryDirectory(prefix="lens-position-chromium-") as profile:
                args = _chromium_args(binary, profile) + ["--virtual-time-budget=30000", *shot_args, url]
                subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
        if not shot.exists():
            js_errors.append(f"Chromium wrote no screenshot to {shot}")
            shot = None
    return BrowserCheck(figures_expected=len(keys), figures_drawn=len(keys) - len(undrawn), undrawn=undrawn,
                        js_errors=js_errors, screenshot=shot, console=console,
                        page={k: v for k, v in attrs.items() if k.startswith("data-")})
