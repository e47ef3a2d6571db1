"""The claims table and the self-contained HTML report.

A reproduction produces a set of tidy tables, stacked over models, each with the columns
``model``, ``architecture`` (a display label) and ``role`` (``"standard"``, ``"ntk"`` or
``"sliding"``, read off the ``ModelSpec``); see ``TABLES``. This module turns them into

- ``claims_table``: for each claim C1-C5 the paper's statement, the number we measured on
  each architecture, and whether it holds, by a criterion that is stated next to it and
  computed from the tables (``Criteria`` holds the thresholds; nothing is hard-coded per
  model);
- ``build_report`` / ``write_report``: one HTML file that opens with that table and then
  shows every figure from ``lens_position.plots`` with a caption saying what is measured.
  plotly.js is inlined once, each figure's JSON sits in a ``<script type="application/json">``
  block and is drawn by ``Plotly.newPlot``; the file works offline;
- ``check_in_browser``: opens the report in headless Chromium, fails on any JavaScript error
  or undrawn figure, and saves a screenshot.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.offline

from lens_position import plots
from lens_position.errors import BadInputError, MissingPackageError

# The tables a reproduction writes, with the experiment that produces each.
TABLES: dict[str, str] = {
    "decompose_layers": "Decomposition.layers (all queries, all keys)",
    "decompose_heads": "Decomposition.heads (all queries, all keys)",
    "probe_layers": "ProbeResult.layers",
    "bos_layers": "BosReplacement.frame",
    "bos_overall": "BosReplacement.overall",
    "fingerprint": "Fingerprint.frame",
    "sink_heads": "SinkHeads.frame",
    "sink_rate": "SinkRate.frame",
    "sink_reading": "SinkReading.frame",
    "sink_ablation": "SinkReading.ablation",
}

ROLE_NAMES = {"standard": "standard RoPE", "ntk": "NTK-scaled RoPE", "sliding": "sliding window"}

CLAIMS: dict[str, str] = {
    "C1": "RoPE-trained decoders distinguish absolute position in their attention patterns, "
          "although RoPE puts only relative offsets into q·k.",
    "C2": "Two sources, the mask component (causal softmax normalizer) and the residual component "
          "(absolute position carried by the residual stream), both appear in every architecture.",
    "C3": "The balance depends on the architecture: NTK-scaled RoPE suppresses the residual "
          "component, sliding-window attention lets it accumulate with depth, standard RoPE sits between.",
    "C4": "Replacing the BOS embedding before the forward pass removes about 40% of the residual "
          "component at early queries.",
    "C5": "Position 0 is a closed dynamical system: its activation is a deterministic fingerprint, "
          "identical across inputs when token 0 is the auto-prepended BOS, varying with token 0 "
          "otherwise; attention sinks pass it forward.",
}


def role_of(spec: Any) -> str:
    """The architecture role of a model, read off its ``ModelSpec``.

    ``"sliding"`` if any layer is local (a sliding window), else ``"ntk"`` if its RoPE is
    NTK-scaled (aware or by-parts), else ``"standard"``.
    """
    return spec.role


@dataclass(frozen=True)
class Criteria:
    """The thresholds that decide whether a claim holds. Each is stated in the report.

    - ``min_signal``: a component "appears" when its held-out share of Var(log A),
      averaged over layers, is at least this (C1: T; C2: both R and M).
    - ``c4_target`` ± ``c4_tolerance``: "about 40%" means the mean over replacements of the
      overall fraction of R removed lies in this interval.
    - ``c5_noise``: auto-BOS fingerprints are "identical" when the largest relative spread
      (spread / norm of the mean) over layers is at most this (float32 noise is ~1e-7 per operation).
    - ``c5_varying``: fingerprints "vary with token 0" when the median relative spread over
      layers with a varying token 0 is at least this.
    """

    min_signal: float = 0.01
    c4_target: float = 0.40
    c4_tolerance: float = 0.15
    c5_noise: float = 1e-4
    c5_varying: float = 1e-2

    def text(self, claim: str) -> str:
        return {
            "C1": f"held-out T (mean over layers) ≥ {self.min_signal:g}",
            "C2": f"held-out R and M (means over layers) both ≥ {self.min_signal:g}",
            "C3": "residual share R/(R+M) of every NTK model < that of every standard model, and the "
                  "depth slope of R (least-squares, per unit of relative depth) of every sliding-window "
                  "model > 0 and > that of every standard model",
            "C4": f"mean over replacements of the overall fraction of R removed within "
                  f"{self.c4_target:.0%} ± {self.c4_tolerance:.0%}",
            "C5": f"auto-BOS relative spread ≤ {self.c5_noise:g} at every layer, varying-token-0 "
                  f"median relative spread ≥ {self.c5_varying:g}, and at least one sink head",
        }[claim]


@dataclass
class ClaimRow:
    """One cell of the claims table: ``measured`` (our number, as text), ``value`` (the number
    the criterion is applied to; NaN when not measured) and ``holds`` (None: not measured)."""

    claim: str
    architecture: str
    measured: str
    value: float
    holds: bool | None


def _heldout(frame: pd.DataFrame, col: str) -> str:
    return f"{col}_heldout" if f"{col}_heldout" in frame.columns else col


def _architectures(results: Mapping[str, pd.DataFrame]) -> list[tuple[str, str]]:
    """(architecture label, role) in order of first appearance over all tables."""
    seen: dict[str, str] = {}
    for frame in results.values():
        if frame is None or "architecture" not in frame.columns:
            continue
        roles = frame["role"] if "role" in frame.columns else pd.Series(["standard"] * len(frame))
        for arch, role in zip(frame["architecture"].tolist(), roles.tolist()):
            seen.setdefault(arch, role)
    return list(seen.items())


def _part(results: Mapping[str, pd.DataFrame], table: str, arch: str) -> pd.DataFrame | None:
    frame = results.get(table)
    if frame is None or len(frame) == 0:
        return None
    if "architecture" in frame.columns:
        frame = frame[frame["architecture"] == arch]
    return frame if len(frame) else None


def _depth_slope(layers: pd.DataFrame, col: str) -> float:
    """Least-squares slope of ``col`` against relative depth layer / (n_layers - 1)."""
    x = layers["layer"].to_numpy(dtype=float)
    y = layers[col].to_numpy(dtype=float)
    ok = np.isfinite(y)
    x, y = x[ok], y[ok]
    if len(x) < 2 or x.max() == x.min():
        return float("nan")
    x = (x - x.min()) / (x.max() - x.min())
    return float(np.polyfit(x, y, 1)[0])


def claims_table(results: Mapping[str, pd.DataFrame], criteria: Criteria = Criteria()) -> pd.DataFrame:
    """One row per (claim, architecture), plus one row per claim with ``architecture == "overall"``.

    Columns: ``claim``, ``statement`` (the paper's), ``criterion`` (ours, with thresholds),
    ``architecture``, ``measured`` (our number, as text), ``value`` (the number the
    criterion is applied to, NaN when not measured), ``holds`` (True / False / None when
    not measured or not applicable per architecture). The overall ``holds`` is True when
    every measured architecture holds (C3: when the cross-architecture comparison holds).
    """
    archs = _architectures(results)
    rows: list[ClaimRow] = []

    per_arch_c3: dict[str, tuple[str, float, float]] = {}
    for arch, role in archs:
        layers = _part(results, "decompose_layers", arch)
        if layers is None:
            for claim in ("C1", "C2"):
                rows.append(ClaimRow(claim, arch, "not measured", math.nan, None))
        else:
            t_col, r_col, m_col = (_heldout(layers, c) for c in ("T", "R", "M"))
            t, r, m = (float(layers[c].mean()) for c in (t_col, r_col, m_col))
            rows.append(ClaimRow("C1", arch, f"T = {t:.3f}", t, bool(t >= criteria.min_signal)))
            rows.append(ClaimRow("C2", arch, f"R = {r:.3f}, M = {m:.3f}", min(r, m),
                                 bool(r >= criteria.min_signal and m >= criteria.min_signal)))
            share = r / (r + m) if (r + m) > 0 else math.nan
            slope = _depth_slope(layers.sort_values("layer"), r_col)
            per_arch_c3[arch] = (role, share, slope)
            rows.append(ClaimRow("C3", arch, f"R/(R+M) = {share:.3f}, depth slope of R = {slope:+.3f}",
                                 share, None))

        overall = _part(results, "bos_overall", arch)
        if overall is None:
            rows.append(ClaimRow("C4", arch, "not measured", math.nan, None))
        else:
            fracs = {str(k): float(v) for k, v in zip(overall["replacement"], overall["fraction_removed"])}
            mean = float(np.mean(list(fracs.values())))
            text = ", ".join(f"{k} {v:.0%}" for k, v in fracs.items()) + f" (mean {mean:.0%})"
            rows.append(ClaimRow("C4", arch, text, mean,
                                 bool(abs(mean - criteria.c4_target) <= criteria.c4_tolerance)))

        fp = _part(results, "fingerprint", arch)
        sinks = _part(results, "sink_heads", arch)
        if fp is None:
            rows.append(ClaimRow("C5", arch, "not measured", math.nan, None))
        else:
            if "spread_relative" in fp.columns:
                rel = fp["spread_relative"].to_numpy(dtype=float)
            else:
                rel = fp["spread"].to_numpy(dtype=float) / np.maximum(fp["norm"].to_numpy(dtype=float), 1e-30)
            auto = rel[(fp["condition"] == "auto-bos").to_numpy()]
            vary = rel[(fp["condition"] == "varying-token0").to_numpy()]
            auto_max = float(np.max(auto)) if len(auto) else math.nan
            vary_med = float(np.median(vary)) if len(vary) else math.nan
            n_sinks = int(sinks["is_sink"].astype(bool).sum()) if sinks is not None else 0
            holds = bool(auto_max <= criteria.c5_noise and vary_med >= criteria.c5_varying and n_sinks > 0)
            rows.append(ClaimRow(
                "C5", arch, f"auto-BOS max relative spread {auto_max:.1e}, varying token 0 median "
                f"{vary_med:.2f}, {n_sinks} sink heads", auto_max, holds))

    out = pd.DataFrame([r.__dict__ for r in rows], columns=["claim", "architecture", "measured", "value", "holds"])
    overall_rows = []
    for claim in CLAIMS:
        part = out[out["claim"] == claim]
        if claim == "C3":
            holds, measured = _c3_verdict(per_arch_c3)
        else:
            verdicts = [h for h in part["holds"].tolist() if h is not None]
            holds = None if not verdicts else bool(all(verdicts))
            measured = "not measured" if not verdicts else f"holds on {sum(verdicts)} of {len(verdicts)}"
        overall_rows.append({"claim": claim, "architecture": "overall", "measured": measured,
                             "value": math.nan, "holds": holds})
    out = pd.concat([out, pd.DataFrame(overall_rows)], ignore_index=True)
    out.insert(1, "statement", out["claim"].map(CLAIMS))
    out.insert(2, "criterion", out["claim"].map(criteria.text))
    out["holds"] = out["holds"].astype(object)
    return out


def _c3_verdict(per_arch: dict[str, tuple[str, float, float]]) -> tuple[bool | None, str]:
    by_role: dict[str, list[tuple[float, float]]] = {}
    for role, share, slope in per_arch.values():
        by_role.setdefault(role, []).append((share, slope))
    missing = [ROLE_NAMES[r] for r in ("standard", "ntk", "sliding") if r not in by_role]
    if missing:
        return None, "not measured: needs " + ", ".join(missing)
    ntk_below = max(s for s, _ in by_role["ntk"]) < min(s for s, _ in by_role["standard"])
    slide_grows = min(d for _, d in by_role["sliding"]) > max(0.0, max(d for _, d in by_role["standard"]))
    parts = [f"NTK share below standard: {'yes' if ntk_below else 'no'}",
             f"sliding-window R grows with depth faster than standard: {'yes' if slide_grows else 'no'}"]
    return bool(ntk_below and slide_grows), "; ".join(parts)


# --------------------------------------------------------------------------- figures


@dataclass
class ReportFigure:
    """One figure of the report: a ``key`` naming it, its ``title``, the ``caption`` saying
    what is measured and in what units, and the plotly ``figure``."""

    key: str
    title: str
    caption: str
    figure: go.Figure


def report_figures(results: Mapping[str, pd.DataFrame]) -> list[ReportFigure]:
    """The report's figures, in order, for the tables present in ``results``."""
    figs: list[ReportFigure] = []

    def add(key: str, tables: tuple[str, ...], title: str, caption: str,
            make: Callable[..., go.Figure]) -> None:
        frames = [results.get(t) for t in tables]
        if frames[0] is None or len(frames[0]) == 0:
            return
        figs.append(ReportFigure(key, title, caption, make(*frames)))

    add("layer_components", ("decompose_layers",), "C2, C3: mask and residual components per layer",
        "For every layer, the share of the variance of log-attention Var(log A) explained by absolute "
        "position that comes from the residual stream (R, left) and from the causal softmax normalizer "
        "(M, right), averaged over the layer's heads, all queries, all keys, held-out sequences.",
        lambda f: plots.layer_components(f, heldout="R_heldout" in f.columns))
    add("head_heatmaps", ("decompose_heads",), "Per-head T, R and M",
        "Total absolute signal T and its residual (R) and mask (M) components for every head, as "
        "fractions of Var(log A) (in-sample; T = R + M + C).",
        lambda f: plots.head_heatmaps(f))
    add("probe", ("probe_layers",), "Position probe on the residual stream",
        "Held-out R² of a ridge probe from resid_pre at each layer to log(position + 1); dotted: the "
        "same probe fitted to shuffled positions (the axis is clipped at -1 when a value falls below; hover "
        "shows every value). An independent view of absolute position in the residual stream (C3: "
        "accumulation with depth).",
        lambda f: plots.probe_r2(f))
    add("bos", ("bos_layers", "bos_overall"), "C4: BOS replacement",
        "Fraction of the residual component R removed at early queries when the embedding at position 0 "
        "is replaced before the forward pass by another token's embedding, the mean embedding, or a "
        "random vector of the same norm; overall and per layer. Dashed: the paper's 40%.",
        lambda f, o: plots.bos_fraction_removed(f, o))
    add("fingerprint", ("fingerprint",), "C5: the position-0 fingerprint",
        "Spread of the residual stream at position 0 across inputs (left, log scale) and its norm "
        "(right), per layer, with the auto-prepended BOS at position 0 (solid) and with a varying "
        "token 0 (dashed). Zero spread is drawn as a gap.",
        lambda f: plots.fingerprint_layers(f))
    add("sinks", ("sink_heads", "sink_reading"), "Sink heads and sink-reading heads",
        "Mean attention on position 0 per head (sink score); white dots: sink heads (score above ε); "
        "red rings: the heads whose output changes most when only their own key/value at position 0 "
        "is patched with the counterfactual fingerprint (sink-reading heads).",
        lambda s, r: plots.sink_heads_map(s, r))
    add("sink_rate", ("sink_rate",), "Sink rate by data condition",
        "Percentage of heads whose mean attention on position 0 exceeds ε, on natural text, random "
        "tokens and repeated tokens (Gu et al.'s three conditions).",
        lambda f: plots.sink_rate_bars(f))
    add("sink_ablation", ("sink_ablation",), "Ablating the sink-reading heads",
        "Residual component R per layer before (solid) and after (dashed) zero- and mean-ablating the "
        "sink-reading heads.",
        lambda f: plots.sink_ablation(f))
    return figs


# --------------------------------------------------------------------------- HTML

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 2em auto;
       max-width: 1250px; color: #222; line-height: 1.4; }
h1 { margin-bottom: 0.2em; } h2 { margin-top: 1.6em; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.35em 0.6em; vertical-align: top; text-align: left; }
th { background: #f3f3f3; }
td.yes { background: #e5f5e0; } td.no { background: #fde0dd; } td.na { background: #f7f7f7; color: #777; }
.caption { color: #444; max-width: 70em; }
.plot { width: 100%; }
details pre { background: #f7f7f7; padding: 1em; overflow-x: auto; font-size: 0.8em; }
#js-errors { color: #b00; }
"""

# Collects JavaScript errors, draws every figure from its JSON block, and records the outcome
# on <body> (data-figures-drawn, data-js-errors) so a headless browser can check it.
_RENDER_JS = """
(function () {
  var plots = document.querySelectorAll('div.plot');
  var pending = plots.length, drawn = 0;
  function finish() {
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


def _holds_cell(holds: Any) -> tuple[str, str]:
    if holds is None or (isinstance(holds, float) and math.isnan(holds)):
        return "na", "–"
    return ("yes", "holds") if bool(holds) else ("no", "does not hold")


def claims_html(claims: pd.DataFrame) -> str:
    """The claims table as HTML: one row per claim, one column per architecture, and a verdict."""
    archs = [a for a in dict.fromkeys(claims["architecture"].tolist()) if a != "overall"]
    head = "".join(f"<th>{html.escape(a)}</th>" for a in archs)
    body = []
    for claim in dict.fromkeys(claims["claim"].tolist()):
        part = claims[claims["claim"] == claim].set_index("architecture")
        cells = []
        for arch in archs:
            if arch not in part.index:
                cells.append('<td class="na">not measured</td>')
                continue
            cls, word = _holds_cell(part.loc[arch, "holds"])
            verdict = f"<br><b>{word}</b>" if cls != "na" else ""
            cells.append(f'<td class="{cls}">{html.escape(str(part.loc[arch, "measured"]))}{verdict}</td>')
        cls, word = _holds_cell(part.loc["overall", "holds"])
        overall = html.escape(str(part.loc["overall", "measured"]))
        word = word if cls != "na" else "undecided"
        body.append(
            f'<tr id="claim-{claim}"><th>{claim}</th><td>{html.escape(part["statement"].iloc[0])}</td>'
            f'<td>{html.escape(part["criterion"].iloc[0])}</td>{"".join(cells)}'
            f'<td class="{cls}"><b>{word}</b><br>{overall}</td></tr>'
        )
    return (f'<table id="claims"><thead><tr><th>claim</th><th>paper\'s statement</th><th>our criterion</th>'
            f'{head}<th>verdict</th></tr></thead><tbody>{"".join(body)}</tbody></table>')


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


def _run_summary_html(provenance: Mapping[str, Any] | None) -> str:
    """One paragraph saying what was run: models, data, BOS policy, sizes, seed."""
    if not provenance:
        return ""
    parts = []
    models = [m.get("architecture") or m.get("name") for m in provenance.get("models", [])]
    if models:
        parts.append("models: " + "; ".join(html.escape(str(m)) for m in models))
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


def build_report(results: Mapping[str, pd.DataFrame], *, provenance: Mapping[str, Any] | None = None,
                 criteria: Criteria = Criteria(), title: str = "lens_position: where does absolute position come from?"
                 ) -> str:
    """The whole report as one HTML string (plotly.js inlined once; works offline)."""
    claims = claims_table(results, criteria)
    sections = []
    for i, fig in enumerate(report_figures(results)):
        spec = fig.figure.to_plotly_json()
        sections.append(
            f'<section class="figure" id="figure-{fig.key}"><h2>{html.escape(fig.title)}</h2>'
            f'<p class="caption">{html.escape(fig.caption)}</p>'
            f'<div class="plot" id="plot-{fig.key}" data-source="data-{fig.key}"></div>'
            f'<script type="application/json" id="data-{fig.key}">{_script_json(spec)}</script></section>'
        )
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script>{_ERROR_TRAP_JS}</script>"
        f"<script>{plotly.offline.get_plotlyjs()}</script></head><body>"
        f"<h1>{html.escape(title)}</h1>"
        "<p>A reproduction of arXiv 2606.06160's claims C1–C5 with lens_position. Every number below is "
        "measured by this run; the criterion that decides each verdict is stated next to it.</p>"
        f"{_run_summary_html(provenance)}<h2>Claims</h2>{claims_html(claims)}"
        f"{''.join(sections)}{_provenance_html(provenance)}"
        '<pre id="js-errors"></pre>'
        f"<script>{_RENDER_JS}</script></body></html>\n"
    )


def write_report(path: str | Path, results: Mapping[str, pd.DataFrame], **kwargs: Any) -> Path:
    """Write ``build_report(results, **kwargs)`` to ``path`` (UTF-8) and return the path."""
    path = Path(path)
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

    @property
    def ok(self) -> bool:
        return not self.js_errors and not self.undrawn and self.figures_drawn == self.figures_expected

    def to_dict(self) -> dict[str, Any]:
        return {"figures_expected": self.figures_expected, "figures_drawn": self.figures_drawn,
                "undrawn": self.undrawn, "js_errors": self.js_errors, "ok": self.ok,
                "screenshot": str(self.screenshot) if self.screenshot else None}


def find_chromium() -> str:
    """Path of a Chromium/Chrome binary, or MissingPackageError saying how to install one."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    raise MissingPackageError(
        "no Chromium found for the report's browser check: install it with "
        "`apt-get install -y chromium` (scripts/setup.sh does this when run as root)"
    )


def _chromium_args(binary: str, profile: str) -> list[str]:
    return [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--disable-extensions", "--disable-dev-shm-usage", "--hide-scrollbars",
            f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0"]


def check_in_browser(report: str | Path, *, screenshot: str | Path | None = None,
                     width: int = 1300, height: int | None = None, timeout_s: float = 120.0) -> BrowserCheck:
    """Open ``report`` in headless Chromium and check it: no JavaScript error, every figure drawn.

    Two runs: one dumps the DOM after the page's scripts finish (each figure div must carry
    ``data-drawn`` and contain plotly's ``svg.main-svg``; ``<body data-js-errors>`` must be 0;
    the console log on stderr must have no error), one saves a PNG screenshot of the page
    (``width`` × ``height`` pixels; the height defaults to the figures' total height).
    """
    report = Path(report).resolve()
    text = report.read_text(encoding="utf-8")
    keys = re.findall(r'<div class="plot" id="plot-([\w-]+)"', text)
    binary = find_chromium()
    url = report.as_uri()
    with tempfile.TemporaryDirectory(prefix="lens-position-chromium-") as profile:
        args = _chromium_args(binary, profile) + ["--virtual-time-budget=30000", "--dump-dom", url]
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
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
    shot = None
    if screenshot is not None:
        shot = Path(screenshot).resolve()
        if height is None:
            specs = report_figure_specs(text)
            height = 1400 + sum(int(s["layout"].get("height", 450)) + 160 for s in specs.values())
        with tempfile.TemporaryDirectory(prefix="lens-position-chromium-") as profile:
            args = _chromium_args(binary, profile) + [
                "--virtual-time-budget=30000", f"--window-size={width},{height}", f"--screenshot={shot}", url]
            subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)
        if not shot.exists():
            js_errors.append(f"Chromium wrote no screenshot to {shot}")
            shot = None
    return BrowserCheck(figures_expected=len(keys), figures_drawn=len(keys) - len(undrawn), undrawn=undrawn,
                        js_errors=js_errors, screenshot=shot, console=console)
