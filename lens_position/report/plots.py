"""Figures: each one a function of a results DataFrame, returning a ``plotly`` Figure.

Every function takes the tidy frames that the experiments return (``Decomposition.layers``,
``Decomposition.heads``, ``ProbeResult.layers``, ``BosReplacement.frame`` / ``.overall``,
``Fingerprint.frame``, ``SinkHeads.frame``, ``SinkReading.frame``, ``SinkRate.frame``),
stacked over models with one extra column naming the architecture (``by``, default
``"architecture"``). A frame without that column is drawn as a single group.

Traces are built from plain Python lists (never numpy arrays), so a figure's JSON holds the
numbers literally, and every trace carries ``meta`` = ``{"group": ..., "quantity": ...}``
saying which slice of which table it draws; the report's tests use both to check that each
figure shows exactly the numbers in the results tables.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from lens_position.analyses.claims import PAPER, c4_column
from lens_position.core.intervals import benjamini_hochberg, interval_method, interval_note
from lens_position.ground.errors import BadInputError
from lens_position.ground.paths import checked_path

_PALETTE = qualitative.Plotly
_DASHES = ("solid", "dash", "dot", "dashdot", "longdash")
PAPER_C4_FRACTION = PAPER.c4_fraction_removed

COMPONENT_NAMES = {
    "total": "total absolute signal",
    "R": "residual component R (self-referenced)",
    "M": "mask component M (self-referenced)",
    "C": "interaction C (self-referenced)",
    "R_rf": "residual component R' (reference-free)",
    "M_rf": "mask component M' (reference-free)",
    "C_rf": "interaction C' (reference-free)",
}


def _require(frame: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise BadInputError(
            f"{what} needs columns {missing} but the frame has {list(frame.columns)}; "
            "pass the frame returned by the matching lens_position experiment"
        )


def _groups(frame: pd.DataFrame, by: str) -> list[tuple[str, pd.DataFrame]]:
    """Split ``frame`` by ``by`` in order of first appearance. Without that column the frame is
    one unnamed group (name ``""``): its traces are named by what they show, not "all"."""
    if by not in frame.columns:
        return [("", frame)]
    order = list(dict.fromkeys(frame[by].tolist()))
    return [(str(name), frame[frame[by] == name]) for name in order]


def _as_list(values: Sequence) -> list:
    """Plain Python numbers for a trace: NaN becomes None (a gap), numpy scalars become floats."""
    out: list[Any] = []
    for v in np.asarray(values, dtype=object).tolist():
        if v is None or (isinstance(v, float) and np.isnan(v)):
            out.append(None)
        elif isinstance(v, (np.integer,)):
            out.append(int(v))
        elif isinstance(v, (np.floating,)):
            out.append(float(v))
        else:
            out.append(v)
    return out


def _error_bars(frame: pd.DataFrame, column: str, scale: float = 1.0) -> dict | None:
    """plotly ``error_y`` drawing the interval ``[column_lo, column_hi]`` around ``column``
    (None when the frame has no interval columns). Bars are asymmetric: a bootstrap
    interval need not be centred on the estimate. An interval that excludes its estimate
    cannot be drawn around it: its bar spans the interval and the estimate, and the point
    says so (:func:`_interval_marks`: an open marker or a hatched bar, and the hover text)."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in frame.columns or hi not in frame.columns:
        return None
    value = frame[column].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):
        above = _as_list(scale * np.maximum(frame[hi].to_numpy(dtype=float) - value, 0.0))
        under = _as_list(scale * np.maximum(value - frame[lo].to_numpy(dtype=float), 0.0))
    return dict(type="data", symmetric=False, array=above, arrayminus=under, thickness=1.2, width=3)


def _interval_marks(frame: pd.DataFrame, column: str, scale: float = 1.0, spec: str = ".4f"
                    ) -> tuple[list[bool], list[str]]:
    """Per point of ``column``: whether its estimate lies outside its own interval, and the hover
    text of the interval, ``"interval [lo, hi]"`` and its note (:func:`lens_position.core.intervals.interval_note`:
    the method when it is the bias-corrected one, an estimate outside). No interval: all False, ""."""
    if f"{column}_lo" not in frame.columns or f"{column}_hi" not in frame.columns:
        return [False] * len(frame), [""] * len(frame)
    method = interval_method(column)
    outside, texts = [], []
    for value, lo, hi in frame[[column, f"{column}_lo", f"{column}_hi"]].to_numpy(dtype=float):
        if not (np.isfinite(lo) and np.isfinite(hi)):
            outside.append(False)
            texts.append("")
            continue
        note = interval_note(method, value, lo, hi)
        outside.append(not lo <= value <= hi)
        texts.append(f"interval [{scale * lo:{spec}}, {scale * hi:{spec}}]" + (f" ({note})" if note else ""))
    return outside, texts


def _marker_symbols(outside: list[bool], symbol: str = "circle") -> list[str]:
    """An open marker where the estimate lies outside its interval."""
    return [f"{symbol}-open" if out else symbol for out in outside]


def _relative_depth(frame: pd.DataFrame) -> list:
    """x of a depth figure: ``relative_depth`` (layer / (n_layers − 1)) when the frame has it."""
    return _as_list(frame["relative_depth"] if "relative_depth" in frame.columns else frame["layer"])


def _integer_ticks(ids: Sequence[int], most: int = 16) -> dict:
    """Axis ticks on whole layers or heads (a heatmap's autoscaled ticks fall on -0.5, 0.5, ...):
    every index, or every k-th when there are more than ``most``."""
    ids = [int(i) for i in ids]
    step = max(1, -(-len(ids) // most))
    return dict(tickmode="array", tickvals=ids[::step], ticktext=[str(i) for i in ids[::step]])


def _color(i: int) -> str:
    return _PALETTE[i % len(_PALETTE)]


def _drop_unnamed_group(fig: go.Figure) -> None:
    """Names and titles built as ``"<group>: <what>"`` for the unnamed single group (a frame
    without the ``by`` column) read ``"<what>"``; a trace named by its group alone leaves the legend."""
    for trace in fig.data:
        if (trace.meta or {}).get("group") == "":
            label = (trace.name or "").removeprefix(": ")
            trace.name = label or None
            if not label:
                trace.showlegend = False
    for annotation in fig.layout.annotations:
        if annotation.text and annotation.text.startswith(": "):
            annotation.text = annotation.text[2:]


DEFAULT_WIDTH = 700  # plotly's width when a figure sets none (what save_figure exports)
GLYPH_WIDTH = 0.6  # average glyph width in em of plotly's default font, rounded up
LINE_HEIGHT = 1.3  # line height in em


def _fit_titles(fig: go.Figure, title: str) -> tuple[str, int]:
    """Wrap the figure title and each panel title (a make_subplots annotation) at words so that
    each fits its width at the figure's size; return the wrapped title and the top margin that
    holds it above the tallest panel title, so no title overlaps another when exported at the
    default size."""
    width = fig.layout.width or DEFAULT_WIDTH
    plot_width = width - 60 - 20
    title_lines = textwrap.wrap(title, max(20, int((width - 0.05 * width - 10) // (17 * GLYPH_WIDTH)))) or [""]
    titles = [a for a in fig.layout.annotations if a.showarrow is False and a.yanchor == "bottom"]
    tallest = 0
    for annotation in titles:
        same_row = sorted(float(b.x) for b in titles if b.y == annotation.y)
        gaps = [abs(x - float(annotation.x)) for x in same_row if x != float(annotation.x)]
        room = min(min(gaps) if gaps else 1.0, 2 * min(float(annotation.x), 1 - float(annotation.x))) * plot_width - 8
        size = (annotation.font.size if annotation.font and annotation.font.size else 12)
        per_line = max(8, int(room // (size * GLYPH_WIDTH)))
        lines = textwrap.wrap(str(annotation.text).replace("<br>", " "), per_line) or [""]
        annotation.text = "<br>".join(lines)
        if annotation.y == max(float(b.y) for b in titles):
            tallest = max(tallest, int(len(lines) * size * LINE_HEIGHT) + 6)
    top = 10 + int(len(title_lines) * 17 * LINE_HEIGHT) + tallest + 12
    return "<br>".join(title_lines), max(top, 70)


def component_title(column: str) -> str:
    """A component column's name in words: ``R_rf_heldout`` -> "residual component R'
    (reference-free), held-out"."""
    for suffix, words in (("_heldout", ", held-out"), ("", "")):
        base = column.removesuffix(suffix) if suffix else column
        if (not suffix or column.endswith(suffix)) and base in COMPONENT_NAMES:
            return COMPONENT_NAMES[base] + words
    return column


#: What an empty panel says where no reason of its own is given.
NO_FINITE_VALUE = "nothing to draw: no finite value here"


def _finite(values: object) -> bool:
    if values is None:
        return False
    array = np.asarray(values, dtype=object).ravel()
    return any(isinstance(v, (int, float, np.number)) and np.isfinite(float(v)) for v in array)


def note_empty_panels(fig: go.Figure, why: str = NO_FINITE_VALUE) -> list[str]:
    """Write ``why`` in the middle of every panel whose traces hold no finite value (all values
    undefined, or no trace at all), so an empty panel never looks like a drawing error; returns
    the axes of the panels noted."""
    noted = []
    for key in [k for k in fig.layout.to_plotly_json() if k.startswith("xaxis")]:
        axis = "x" + key.removeprefix("xaxis")
        traces = [t for t in fig.data if (getattr(t, "xaxis", None) or "x") == axis]
        if any(_finite(getattr(t, "y", None)) or _finite(getattr(t, "z", None)) for t in traces):
            continue
        y_axis = (getattr(traces[0], "yaxis", None) if traces else None) or "y" + key.removeprefix("xaxis")
        fig.add_annotation(text="<br>".join(textwrap.wrap(why, 34)), showarrow=False, xref=f"{axis} domain",
                           yref=f"{y_axis} domain", x=0.5, y=0.5, font=dict(size=12, color="grey"))
        noted.append(axis)
    return noted


def _base_layout(fig: go.Figure, title: str, height: int = 420, empty: str = NO_FINITE_VALUE) -> go.Figure:
    """The shared layout: titles fitted, the legend below, and every panel with nothing finite to
    draw saying ``empty`` in its place."""
    note_empty_panels(fig, empty)
    _drop_unnamed_group(fig)
    title, top = _fit_titles(fig, title)
    fig.update_layout(
        title=dict(text=title, y=1.0, yref="container", yanchor="top", pad=dict(t=10)),
        height=height + top - 70, template="plotly_white",
        legend=dict(orientation="h", yanchor="top", y=-0.18, xanchor="left", x=0),
        margin=dict(l=60, r=20, t=top, b=80),
    )
    return fig


def layer_components(layers: pd.DataFrame, *, by: str = "architecture",
                     components: Sequence[str] = ("R_rf", "M_rf", "R", "M"), heldout: bool = True) -> go.Figure:
    """Per-layer components of the absolute-position signal, one line per architecture (C2, C3).

    ``layers`` is ``Decomposition.layers`` stacked over models: columns ``layer`` and the
    components (``R_rf``, ``M_rf``, ``R``, ``M``, ...; with ``heldout``, the ``*_heldout``
    columns), each a fraction of Var(log A) averaged over the layer's heads. One panel per
    component: the reference-free split (``R_rf``, ``M_rf``) beside the self-referenced one.
    x = relative depth layer / (n_layers − 1) when the frame has ``relative_depth`` (the
    axis C3's depth slope is computed on), else the layer index; error bars = the
    ``*_lo``/``*_hi`` interval when present (an open marker: the estimate lies outside its
    interval; hovering a point gives the interval and its method).
    """
    cols = [c + ("_heldout" if heldout else "") for c in components]
    _require(layers, ["layer", *cols], "layer_components")
    fig = make_subplots(rows=1, cols=len(cols), shared_yaxes=False,
                        subplot_titles=[COMPONENT_NAMES.get(c, c) + (", held-out" if heldout else ", in-sample")
                                        for c in components])
    x_title = "relative depth (layer / (n_layers − 1))" if "relative_depth" in layers.columns else "layer"
    for gi, (name, frame) in enumerate(_groups(layers, by)):
        frame = frame.sort_values("layer")
        for ci, col in enumerate(cols):
            outside, texts = _interval_marks(frame, col)
            fig.add_trace(go.Scatter(
                x=_relative_depth(frame), y=_as_list(frame[col]), mode="lines+markers",
                error_y=_error_bars(frame, col), customdata=_as_list(frame["layer"]), text=texts,
                marker=dict(symbol=_marker_symbols(outside), size=7),
                name=name, legendgroup=name, showlegend=ci == 0,
                line=dict(color=_color(gi)), meta={"group": name, "quantity": col},
                hovertemplate=f"{name}<br>layer %{{customdata}}<br>{col} = %{{y:.4f}}<br>%{{text}}<extra></extra>",
            ), row=1, col=ci + 1)
            fig.update_xaxes(title_text=x_title, row=1, col=ci + 1)
    fig.update_yaxes(title_text="fraction of Var(log A)", row=1, col=1)
    fig.update_annotations(font_size=11)
    return _base_layout(fig, "Absolute-position components per layer", height=440)


def head_heatmaps(heads: pd.DataFrame, *, by: str = "architecture",
                  components: Sequence[str] = ("R_rf_heldout", "M_rf_heldout", "total_heldout")) -> go.Figure:
    """Heatmaps of per-head components: one row per architecture, one column per component.

    ``heads`` is ``Decomposition.heads`` stacked over models (columns ``layer``, ``head`` and
    the components, fractions of Var(log A)); by default the held-out total and the reference-free
    R' and M'. Colour = fraction, one shared scale from min(0, smallest) to the largest value
    shown; ``z[layer][head]``; hovering a cell shows its interval when the frame has
    ``*_lo``/``*_hi`` columns, and says when the estimate lies outside it.
    """
    _require(heads, ["layer", "head", *components], "head_heatmaps")
    groups = _groups(heads, by)
    titles = [f"{name}: {component_title(c)}" for name, _ in groups for c in components]
    fig = make_subplots(rows=len(groups), cols=len(components), subplot_titles=titles,
                        horizontal_spacing=0.06, vertical_spacing=0.5 / max(len(groups), 1) / 2)
    values = heads[list(components)].to_numpy(dtype=float)
    zmax = float(np.nanmax(values)) if len(heads) else 1.0
    zmax = zmax if np.isfinite(zmax) and zmax > 0 else 1.0
    zmin = float(np.nanmin(values)) if len(heads) else 0.0
    zmin = min(zmin, 0.0) if np.isfinite(zmin) else 0.0
    for gi, (name, frame) in enumerate(groups):
        layer_ids = layer_rows(frame["layer"])  # a layer subset keeps its real indices (blank rows between)
        head_ids = sorted(frame["head"].unique().tolist())
        for ci, col in enumerate(components):
            grid = frame.pivot_table(index="layer", columns="head", values=col, aggfunc="first")
            grid = grid.reindex(index=layer_ids, columns=head_ids)
            interval, hover_interval = None, ""
            if f"{col}_lo" in frame.columns and f"{col}_hi" in frame.columns:
                bounds = [frame.pivot_table(index="layer", columns="head", values=f"{col}_{side}", aggfunc="first")
                          .reindex(index=layer_ids, columns=head_ids).to_numpy(dtype=float) for side in ("lo", "hi")]
                estimates = grid.to_numpy(dtype=float)
                method = interval_method(col)
                interval = [[[_as_list([lo])[0], _as_list([hi])[0], interval_note(method, value, lo, hi)]
                             for value, lo, hi in zip(row_value, row_lo, row_hi)]
                            for row_value, row_lo, row_hi in zip(estimates, *bounds)]
                hover_interval = " [%{customdata[0]:.4f}, %{customdata[1]:.4f}] %{customdata[2]}"
            fig.add_trace(
                go.Heatmap(
                    z=[_as_list(row) for row in grid.to_numpy(dtype=float)],
                    x=[int(h) for h in head_ids],
                    y=[int(layer) for layer in layer_ids],
                    customdata=interval,
                    coloraxis="coloraxis",
                    meta={"group": name, "quantity": col},
                    hovertemplate=f"{name}<br>layer %{{y}}, head %{{x}}<br>{col} = "
                                  f"%{{z:.4f}}{hover_interval}<extra></extra>",
                ),
                row=gi + 1,
                col=ci + 1,
            )
            fig.update_xaxes(title_text="head", row=gi + 1, col=ci + 1, **_integer_ticks(head_ids))
            fig.update_yaxes(title_text="layer" if ci == 0 else None, row=gi + 1, col=ci + 1,
                             **_integer_ticks(layer_ids))
    fig.update_layout(coloraxis=dict(colorscale="Viridis", cmin=zmin, cmax=zmax,
                                     colorbar=dict(title="fraction of<br>Var(log A)")))
    fig.update_annotations(font_size=11)
    return _base_layout(fig, "Per-head components: " + ", ".join(components), height=max(320, 300 * len(groups)))


def probe_r2(probe: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """Held-out R² of a ridge probe from the residual stream to log(position + 1), per layer.

    ``probe`` is ``ProbeResult.layers`` stacked over models (``layer``, ``r2_heldout``,
    ``r2_shuffled``). Solid line: held-out R² (unitless, ≤ 1); dotted: the same probe
    trained on shuffled positions (a chance baseline). Error bars: the ``*_lo``/``*_hi``
    interval (held-out bootstrap and refit jackknife, lens_position.analyses.probes) when the frame has it.
    """
    _require(probe, ["layer", "r2_heldout", "r2_shuffled"], "probe_r2")
    fig = go.Figure()
    for gi, (name, frame) in enumerate(_groups(probe, by)):
        frame = frame.sort_values("layer")
        outside, texts = _interval_marks(frame, "r2_heldout")
        fig.add_trace(go.Scatter(
            x=_as_list(frame["layer"]), y=_as_list(frame["r2_heldout"]), mode="lines+markers",
            name=name, legendgroup=name, line=dict(color=_color(gi)), text=texts,
            marker=dict(symbol=_marker_symbols(outside), size=7),
            hovertemplate=f"{name}<br>layer %{{x}}<br>r2_heldout = %{{y:.4f}}<br>%{{text}}<extra></extra>",
            error_y=_error_bars(frame, "r2_heldout"), meta={"group": name, "quantity": "r2_heldout"},
        ))
        _, texts = _interval_marks(frame, "r2_shuffled")
        fig.add_trace(
            go.Scatter(
                x=_as_list(frame["layer"]),
                y=_as_list(frame["r2_shuffled"]),
                mode="lines",
                name=f"{name} (shuffled positions)",
                legendgroup=name,
                text=texts,
                hovertemplate=f"{name} (shuffled)<br>layer %{{x}}<br>r2_shuffled = "
                              f"%{{y:.4f}}<br>%{{text}}<extra></extra>",
                line=dict(color=_color(gi), dash="dot"),
                error_y=_error_bars(frame, "r2_shuffled"),
                meta={"group": name, "quantity": "r2_shuffled"},
            )
        )
    fig.update_xaxes(title_text="layer (residual stream before the layer)")
    fig.update_yaxes(title_text="held-out R² of log(position + 1)")
    values = pd.concat([probe["r2_heldout"], probe["r2_shuffled"]]).astype(float)
    if len(values) and np.nanmin(values) < -1:
        # R² below -1 is "worse than predicting the mean" in any case; clipping the axis keeps
        # the informative range [-1, 1] readable (the traces keep every value, see hover).
        fig.update_yaxes(range=[-1.05, 1.05])
    return _base_layout(fig, "Position probe on the residual stream")


def length_sweep(by_length: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """The decomposition's components against sequence length ``T``, one panel per component.

    ``by_length`` is ``LengthSweep.by_length`` stacked over models (``T``, ``quantity``, ``value``
    with ``lo``/``hi``): the mean over layers and heads of the held-out total, R', M' and C' (shares
    of Var(log A), unitless). x: ``T`` on a log axis; a line per model; error bars: the 95%
    percentile bootstrap interval over sequences; a dotted vertical line at a model's sliding window."""
    _require(by_length, ["seq_len", "quantity", "value"], "length_sweep")
    quantities = [q for q in ("total_heldout", "R_rf_heldout", "M_rf_heldout", "C_rf_heldout")
                  if q in set(by_length["quantity"])]
    titles = {"total_heldout": "total", "R_rf_heldout": "R' (residual)", "M_rf_heldout": "M' (mask)",
              "C_rf_heldout": "C' (interaction)"}
    fig = make_subplots(rows=1, cols=len(quantities), subplot_titles=[titles[q] for q in quantities])
    for gi, (name, frame) in enumerate(_groups(by_length, by)):
        for col, quantity in enumerate(quantities, start=1):
            part = frame[frame["quantity"] == quantity].sort_values("seq_len")
            fig.add_trace(go.Scatter(
                x=_as_list(part["seq_len"]), y=_as_list(part["value"]), mode="lines+markers", name=name,
                legendgroup=name, showlegend=col == 1, line=dict(color=_color(gi)),
                error_y=_error_bars(part.rename(columns={"lo": "value_lo", "hi": "value_hi"}), "value"),
                hovertemplate=f"{name}<br>T = %{{x}}<br>{titles[quantity]} = %{{y:.4f}}<extra></extra>",
                meta={"group": name, "quantity": quantity}), row=1, col=col)
            windows = pd.to_numeric(part.get("window", pd.Series(dtype=float)), errors="coerce").dropna()
            if len(windows) and len(part):  # the window, where a model has one: a dotted vertical segment
                values = by_length.loc[by_length["quantity"] == quantity, "value"].astype(float)
                w = float(windows.iloc[0])
                fig.add_trace(go.Scatter(
                    x=[w, w], y=[float(values.min()), float(values.max())], mode="lines", showlegend=False,
                    name=f"{name}: window {w:.0f}", line=dict(color=_color(gi), dash="dot", width=1),
                    hovertemplate=f"{name}: sliding window of {w:.0f} keys<extra></extra>",
                    meta={"group": name, "quantity": "window"}), row=1, col=col)
    fig.update_xaxes(type="log", title_text="T (positions per sequence)")
    fig.update_yaxes(title_text="share of Var(log A), held out", col=1)
    return _base_layout(fig, "The components against sequence length T")


CLIP_FRACTION = 2.0  # a per-layer fraction panel is clipped to ±this (200%) where a layer goes beyond


def bos_fraction_removed(layers: pd.DataFrame, overall: pd.DataFrame | None = None, *,
                         by: str = "architecture", column: str | None = None) -> go.Figure:
    """Fraction of the residual component R removed by each BOS replacement at early queries (C4).

    ``layers`` is ``BosReplacement.frame`` (``replacement``, ``layer``, ``fraction_removed``),
    ``overall`` is ``BosReplacement.overall`` (``replacement``, ``fraction_removed``), both
    stacked over models. ``fraction_removed`` = 1 − R_replaced / R_base (unitless; 1 = all
    of R gone, negative = R grew). Left panel: overall, grouped by replacement; the others:
    per layer, one panel per replacement. The dashed line marks the paper's 40%. ``column``:
    the fraction drawn (default ``fraction_removed_rf_heldout``, the held-out reference-free R'
    that claim C4 is decided on, when the frame has it; else ``fraction_removed_rf``, else
    ``fraction_removed``); error bars: its
    ``_lo``/``_hi`` interval (percentile for the held-out fraction, bias-corrected for an in-sample
    one, :mod:`lens_position.core.intervals`; a hatched bar or an open marker: the estimate lies
    outside it; hovering gives the interval and its method). The overall panel, which C4 is decided
    on, has its own y axis; a per-layer panel is clipped to [-2, 2] (200% either way) where a layer's
    fraction goes beyond, so one small denominator cannot flatten the rest (hover keeps every value).
    """
    column = column or c4_column(layers)[0]
    _require(layers, ["replacement", "layer", column], "bos_fraction_removed")
    replacements = list(dict.fromkeys(layers["replacement"].tolist()))
    n_panels = len(replacements) + (overall is not None)
    titles = (["overall"] if overall is not None else []) + [f"per layer: {r}" for r in replacements]
    fig = make_subplots(rows=1, cols=n_panels, subplot_titles=titles)
    offset = 0
    if overall is not None:
        _require(overall, ["replacement", column], "bos_fraction_removed")
        offset = 1
        for gi, (name, frame) in enumerate(_groups(overall, by)):
            outside, texts = _interval_marks(frame, column, spec=".3f")
            fig.add_trace(go.Bar(
                x=_as_list(frame["replacement"]), y=_as_list(frame[column]),
                error_y=_error_bars(frame, column), text=texts, textposition="none",
                hovertemplate=f"{name}<br>%{{x}}: {column} = %{{y:.3f}}<br>%{{text}}<extra></extra>",
                name=name, legendgroup=name, marker_color=_color(gi),
                marker_pattern_shape=["/" if out else "" for out in outside],
                meta={"group": name, "quantity": f"{column} (overall)"},
            ), row=1, col=1)
        fig.update_xaxes(title_text="replacement of the BOS embedding", row=1, col=1)
    groups = _groups(layers, by)
    for ri, rep in enumerate(replacements):
        for gi, (name, frame) in enumerate(groups):
            frame = frame[frame["replacement"] == rep].sort_values("layer")
            outside, texts = _interval_marks(frame, column, spec=".3f")
            fig.add_trace(go.Scatter(
                x=_as_list(frame["layer"]), y=_as_list(frame[column]),
                error_y=_error_bars(frame, column), text=texts,
                marker=dict(symbol=_marker_symbols(outside), size=7),
                hovertemplate=f"{name}<br>layer %{{x}}: {column} = %{{y:.3f}}<br>%{{text}}<extra></extra>",
                mode="lines+markers", name=name, legendgroup=name,
                showlegend=overall is None and ri == 0, line=dict(color=_color(gi)),
                meta={"group": name, "quantity": f"{column} ({rep})"},
            ), row=1, col=offset + ri + 1)
            fig.update_xaxes(title_text="layer", row=1, col=offset + ri + 1)
    for col in range(1, n_panels + 1):
        fig.add_hline(y=PAPER_C4_FRACTION, line_dash="dash", line_color="grey", row=1, col=col)
    per_layer = layers[column].astype(float).to_numpy()
    if len(per_layer) and np.nanmax(np.abs(np.nan_to_num(per_layer))) > CLIP_FRACTION:
        for col in range(offset + 1, n_panels + 1):
            fig.update_yaxes(range=[-CLIP_FRACTION - 0.1, CLIP_FRACTION + 0.1], row=1, col=col)
    fig.update_yaxes(title_text="fraction of R' removed" if "_rf" in column else "fraction of R removed",
                     row=1, col=1)
    fig.update_layout(barmode="group")
    return _base_layout(fig, "BOS replacement: fraction of the residual component removed at early queries",
                        empty="no finite value: the fraction removed is undefined wherever R' before the "
                              "replacement is not resolved from zero")


def fingerprint_layers(frame: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """The position-0 fingerprint per layer: spread across inputs and norm, with and without BOS (C5).

    ``frame`` is ``Fingerprint.frame`` stacked over models (``layer``, ``condition``:
    ``"auto-bos"`` / ``"varying-token0"``, ``spread``, ``norm``; both in residual-stream
    units). Left: spread of ``resid[:, 0]`` across inputs (log scale; auto-BOS should sit at
    float noise); right: its norm. Solid = auto-BOS, dashed = varying token 0.

    A spread of exactly 0 has no place on a log axis: the line leaves a gap there, and a
    cross marks it at the bottom of the axis, on a tick labelled "0 (exact)", so a zero is
    never invisible.
    """
    _require(frame, ["layer", "condition", "spread", "norm"], "fingerprint_layers")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["spread of resid[:, 0] across inputs",
                                                        "norm of resid[:, 0]"])
    conditions = list(dict.fromkeys(frame["condition"].tolist()))
    spreads = frame["spread"].to_numpy(dtype=float)
    positive = spreads[np.isfinite(spreads) & (spreads > 0)]
    # the floor that stands for 0: one decade below the smallest positive spread
    floor = 10.0 ** (np.floor(np.log10(positive.min())) - 1) if len(positive) else 1e-12
    any_zero = False
    for gi, (name, group) in enumerate(_groups(frame, by)):
        for ki, cond in enumerate(conditions):
            part = group[group["condition"] == cond].sort_values("layer")
            dash = _DASHES[ki % len(_DASHES)]
            spread = [None if (v is None or v <= 0) else v for v in _as_list(part["spread"])]
            fig.add_trace(go.Scatter(
                x=_as_list(part["layer"]), y=spread, mode="lines+markers",
                name=f"{name}: {cond}", legendgroup=f"{name}: {cond}",
                line=dict(color=_color(gi), dash=dash), meta={"group": name, "quantity": f"spread ({cond})"},
            ), row=1, col=1)
            zeros = part[part["spread"].to_numpy(dtype=float) == 0]
            if len(zeros):
                any_zero = True
                fig.add_trace(go.Scatter(
                    x=_as_list(zeros["layer"]), y=[floor] * len(zeros), mode="markers",
                    marker=dict(symbol="x", size=9, color=_color(gi)), name=f"{name}: {cond}, spread exactly 0",
                    legendgroup=f"{name}: {cond}", showlegend=False,
                    meta={"group": name, "quantity": f"spread == 0 ({cond})"},
                    hovertemplate=f"{name}: {cond}<br>layer %{{x}}<br>spread = 0 exactly<extra></extra>",
                ), row=1, col=1)
            fig.add_trace(go.Scatter(
                x=_as_list(part["layer"]), y=_as_list(part["norm"]), mode="lines+markers",
                name=f"{name}: {cond}", legendgroup=f"{name}: {cond}", showlegend=False,
                line=dict(color=_color(gi), dash=dash), meta={"group": name, "quantity": f"norm ({cond})"},
            ), row=1, col=2)
    top = float(positive.max()) if len(positive) else 1.0
    decades = 10.0 ** np.arange(np.log10(floor) + 1, np.ceil(np.log10(top)) + 1)
    if any_zero:
        fig.update_yaxes(tickvals=[floor, *decades.tolist()],
                         ticktext=["0 (exact)", *[f"{v:.0e}" for v in decades]], row=1, col=1)
    fig.update_yaxes(type="log", title_text="spread (residual units)", row=1, col=1)
    fig.update_yaxes(title_text="norm (residual units)", row=1, col=2)
    fig.update_xaxes(title_text="layer")
    return _base_layout(fig, "Position-0 fingerprint per layer", height=460)


def sink_heads_map(sinks: pd.DataFrame, reading: pd.DataFrame | None = None, *,
                   by: str = "architecture", top_reading: int = 5, eps: float | None = None) -> go.Figure:
    """Sink heads and sink-reading heads per (layer, head), one panel per architecture.

    ``sinks`` is ``SinkHeads.frame`` (``layer``, ``head``, ``sink_score`` = mean attention on
    position 0, in [0, 1], ``is_sink``). ``reading`` is ``SinkReading.frame`` (``layer``,
    ``head``, ``output_change``, ``reading_rank``): its ``top_reading`` best-ranked heads are marked
    with a red ring. Colour = sink score; a white dot marks a sink head (score > ε).
    """
    _require(sinks, ["layer", "head", "sink_score", "is_sink"], "sink_heads_map")
    groups = _groups(sinks, by)
    fig = make_subplots(rows=1, cols=len(groups), subplot_titles=[name for name, _ in groups])
    reading_groups = dict(_groups(reading, by)) if reading is not None else {}
    for gi, (name, frame) in enumerate(groups):
        layer_ids = sorted(frame["layer"].unique().tolist())
        head_ids = sorted(frame["head"].unique().tolist())
        grid = frame.pivot_table(index="layer", columns="head", values="sink_score", aggfunc="first")
        grid = grid.reindex(index=layer_ids, columns=head_ids)
        fig.add_trace(go.Heatmap(
            z=[_as_list(row) for row in grid.to_numpy(dtype=float)],
            x=[int(h) for h in head_ids], y=[int(layer) for layer in layer_ids],
            coloraxis="coloraxis", meta={"group": name, "quantity": "sink_score"},
            hovertemplate=f"{name}<br>layer %{{y}}, head %{{x}}<br>sink score %{{z:.3f}}<extra></extra>",
        ), row=1, col=gi + 1)
        sink = frame[frame["is_sink"].astype(bool)]
        fig.add_trace(go.Scatter(
            x=_as_list(sink["head"]), y=_as_list(sink["layer"]), mode="markers",
            marker=dict(color="white", size=5, line=dict(color="black", width=0.5)),
            name="sink head", legendgroup="sink", showlegend=gi == 0,
            meta={"group": name, "quantity": "is_sink"},
        ), row=1, col=gi + 1)
        if name in reading_groups:
            _require(reading, ["layer", "head", "reading_rank"], "sink_heads_map")
            top = reading_groups[name].sort_values("reading_rank").head(top_reading)
            fig.add_trace(go.Scatter(
                x=_as_list(top["head"]), y=_as_list(top["layer"]), mode="markers",
                marker=dict(symbol="circle-open", color="red", size=14, line=dict(width=2)),
                name=f"top {top_reading} sink-reading heads", legendgroup="reading", showlegend=gi == 0,
                meta={"group": name, "quantity": "sink_reading_top"},
            ), row=1, col=gi + 1)
        fig.update_xaxes(title_text="head", row=1, col=gi + 1, **_integer_ticks(head_ids))
        fig.update_yaxes(row=1, col=gi + 1, **_integer_ticks(layer_ids))
    fig.update_yaxes(title_text="layer", row=1, col=1)
    title = "Sink heads (mean attention on position 0)" + (f", ε = {eps}" if eps is not None else "")
    fig.update_layout(coloraxis=dict(colorscale="Cividis", cmin=0.0, cmax=1.0,
                                     colorbar=dict(title="sink score")))
    fig.update_annotations(font_size=11)  # long architecture names as panel titles
    return _base_layout(fig, title, height=480)


def sink_rate_bars(rates: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """Sink rate per data condition and architecture, in %, as Gu et al. compute it.

    ``rates`` is ``SinkRate.frame`` stacked over models (``condition``, ``sink_rate``: Gu et
    al.'s metric, the fraction of (prompt, layer, head) triples whose attention on position
    0, averaged over queries, exceeds ε; ``sink_rate_lo``/``_hi``: its interval over
    prompts). Bars: that metric with its interval; hollow diamonds: ``sink_rate_pooled``
    (scores averaged over prompts first, thresholded once) when present.
    """
    _require(rates, ["condition", "sink_rate"], "sink_rate_bars")
    fig = go.Figure()
    for gi, (name, frame) in enumerate(_groups(rates, by)):
        fig.add_trace(go.Bar(
            x=_as_list(frame["condition"]), y=[None if v is None else 100.0 * v for v in _as_list(frame["sink_rate"])],
            error_y=_error_bars(frame, "sink_rate", scale=100.0), offsetgroup=str(gi),
            text=_interval_marks(frame, "sink_rate", scale=100.0, spec=".1f")[1], textposition="none",
            hovertemplate=f"{name}<br>%{{x}}: sink rate %{{y:.1f}}%<br>%{{text}}<extra></extra>",
            marker_pattern_shape=["/" if out else "" for out in _interval_marks(frame, "sink_rate")[0]],
            name=name, marker_color=_color(gi), meta={"group": name, "quantity": "sink_rate_percent"},
        ))
        if "sink_rate_pooled" in frame.columns:
            fig.add_trace(go.Scatter(
                x=_as_list(frame["condition"]),
                y=[None if v is None else 100.0 * v for v in _as_list(frame["sink_rate_pooled"])],
                mode="markers", offsetgroup=str(gi), name=f"{name}: pooled scores", legendgroup=f"pooled{gi}",
                marker=dict(symbol="diamond-open", size=10, color="black", line=dict(width=1.5)),
                meta={"group": name, "quantity": "sink_rate_pooled_percent"},
            ))
    fig.update_layout(barmode="group", scattermode="group")
    fig.update_xaxes(title_text="data condition")
    fig.update_yaxes(title_text="sink rate (% of prompt × layer × head)", range=[0, 100])
    return _base_layout(fig, "Sink rate by data condition (Gu et al.'s metric)")


def sink_ablation(ablation: pd.DataFrame, *, by: str = "architecture", heldout: bool = True) -> go.Figure:
    """The residual component R per layer before and after ablating the sink-reading heads.

    ``ablation`` is ``SinkReading.ablation`` stacked over models (``ablation``: ``"zero"`` or
    ``"mean"``, ``layer``, ``R_before``, ``R_after`` and their held-out versions
    ``R_heldout_before``, ``R_heldout_after``; fractions of Var(log A)). Held-out by default.
    Error bars on "after": the paired bootstrap interval of the change (``R_change_lo``/``_hi``
    or ``R_heldout_change_lo``/``_hi``, when present) drawn around the after value, so a bar
    that reaches the "before" line is a change the interval does not tell from 0.
    """
    before, after = ("R_heldout_before", "R_heldout_after") if heldout else ("R_before", "R_after")
    change = "R_heldout_change" if heldout else "R_change"
    _require(ablation, ["ablation", "layer", before, after], "sink_ablation")
    kinds = list(dict.fromkeys(ablation["ablation"].tolist()))
    fig = make_subplots(rows=1, cols=len(kinds), subplot_titles=[f"{k} ablation" for k in kinds],
                        shared_yaxes=True)
    for gi, (name, group) in enumerate(_groups(ablation, by)):
        for ki, kind in enumerate(kinds):
            part = group[group["ablation"] == kind].sort_values("layer")
            fig.add_trace(go.Scatter(
                x=_as_list(part["layer"]), y=_as_list(part[before]), mode="lines",
                name=f"{name}: before", legendgroup=f"{name}b", showlegend=ki == 0,
                line=dict(color=_color(gi)), meta={"group": name, "quantity": f"{before} ({kind})"},
            ), row=1, col=ki + 1)
            outside, texts = _interval_marks(part, change)
            fig.add_trace(go.Scatter(
                x=_as_list(part["layer"]), y=_as_list(part[after]), mode="lines+markers",
                name=f"{name}: after", legendgroup=f"{name}a", showlegend=ki == 0,
                text=[f"change {t}" if t else "" for t in texts],
                marker=dict(symbol=_marker_symbols(outside), size=7),
                hovertemplate=f"{name}: after<br>layer %{{x}}: {after} = %{{y:.4f}}<br>%{{text}}<extra></extra>",
                line=dict(color=_color(gi), dash="dash"), error_y=_change_bars(part, change),
                meta={"group": name, "quantity": f"{after} ({kind})"},
            ), row=1, col=ki + 1)
            fig.update_xaxes(title_text="layer", row=1, col=ki + 1)
    fig.update_yaxes(title_text=f"{'held-out ' if heldout else ''}R (fraction of Var(log A))", row=1, col=1)
    return _base_layout(fig, "Ablating the sink-reading heads: R downstream")


def _change_bars(frame: pd.DataFrame, change: str) -> dict | None:
    """``error_y`` for an after value: the interval ``[change_lo, change_hi]`` of the change
    (after − before) placed around the point estimate of the change (None without it)."""
    if not {change, f"{change}_lo", f"{change}_hi"} <= set(frame.columns):
        return None
    value = frame[change].to_numpy(dtype=float)
    with np.errstate(invalid="ignore"):  # a change outside its interval: the bar spans both (_error_bars)
        return dict(type="data", symmetric=False, thickness=1.2, width=3,
                    array=_as_list(np.maximum(frame[f"{change}_hi"].to_numpy(dtype=float) - value, 0.0)),
                    arrayminus=_as_list(np.maximum(value - frame[f"{change}_lo"].to_numpy(dtype=float), 0.0)))


def trace_data(fig: go.Figure) -> list[dict]:
    """The figure's traces as plain dicts (``meta``, ``x``, ``y``, ``z``), for checks and tests."""
    return [t.to_plotly_json() for t in fig.data]


# --------------------------------------------------------------------------- layer subsets, sweeps, export


def layer_rows(layer_ids: Iterable[int]) -> list[int]:
    """The rows of a layer axis: every layer from the first to the last analysed one, so a subset
    such as ``[0, 4, 8, 12]`` is drawn at its real indices, with blank rows between, never as if
    the layers were contiguous."""
    ids = sorted({int(layer) for layer in layer_ids})
    return list(range(ids[0], ids[-1] + 1)) if ids else []


def patching_sweep(sweep, *, token_labels: Sequence[str] | None = None,
                   metric_name: str = "metric", title: str = "Activation patching sweep") -> go.Figure:
    """Heatmap of a patching sweep: y = layer, x = position, colour = the metric of each condition.

    ``sweep`` is a ``PatchSweep`` (or its ``frame``: columns ``layer``, ``position``, ``metric``,
    one scalar per patched (layer, position)). ``token_labels``: one string per position of the
    sequence (e.g. ``model.to_str_tokens(tokens[0])``); each tick reads ``"<position> <token>"``,
    so repeated tokens stay distinct columns. Layers keep their real indices (blank rows for
    layers not swept). Diverging colours centred on 0: the metric's sign is kept.
    """
    frame = getattr(sweep, "frame", sweep)
    _require(frame, ["layer", "position", "metric"], "patching_sweep")
    layer_ids = layer_rows(frame["layer"].tolist())
    positions = sorted({int(p) for p in frame["position"].tolist()})
    grid = frame.pivot_table(index="layer", columns="position", values="metric", aggfunc="first")
    grid = grid.reindex(index=layer_ids, columns=positions)
    if token_labels is not None:
        labels = list(token_labels)
        if max(positions, default=-1) >= len(labels):
            raise BadInputError(f"token_labels has {len(labels)} entries but the sweep patches position "
                                f"{max(positions)}: pass one label per position of the sequence")
        ticktext = [f"{p} {labels[p]!s}" for p in positions]
    else:
        ticktext = [str(p) for p in positions]
    fig = go.Figure(go.Heatmap(
        z=[_as_list(row) for row in grid.to_numpy(dtype=float)], x=positions, y=layer_ids,
        colorscale="RdBu", zmid=0.0, colorbar=dict(title=metric_name), text=[ticktext] * len(layer_ids),
        meta={"group": "sweep", "quantity": "metric"},
        hovertemplate=f"layer %{{y}}, position %{{text}}<br>{metric_name} = %{{z:.4f}}<extra></extra>",
    ))
    fig.update_xaxes(title_text="patched position", tickvals=positions, ticktext=ticktext, tickangle=-60)
    fig.update_yaxes(title_text="patched layer (resid_pre)", tickmode="array", tickvals=layer_ids, autorange="reversed")
    return _base_layout(fig, title, height=max(320, 24 * len(layer_ids) + 200))


#: The false discovery rate at which :func:`patching_sweep_intervals` marks cells.
DISCOVERY_RATE = 0.05


def patching_sweep_intervals(sweep, *, head: int | None = None, token_labels: Sequence[str] | None = None,
                             metric_name: str = "effect", title: str = "Activation patching sweep: effect per cell"
                             ) -> go.Figure:
    """Heatmap of a sweep's mean effect per cell (the patched run's metric minus the unpatched
    target run's, averaged over target prompts), with a mark on every cell that is a discovery at
    a false discovery rate of 5%: its Benjamini-Hochberg q-value among all the cells of the sweep
    (``q_value``; from ``p_value`` where a saved frame has no ``q_value``) below
    :data:`DISCOVERY_RATE`. A cell-by-cell mark from each interval alone would flag about 5% of
    the cells that have no effect, a dozen or more in a sweep of hundreds.

    ``sweep`` is a ``PatchSweep`` run with ``reduce="none"`` (or its ``frame``: columns ``layer``,
    ``position``, ``effect``, ``effect_lo``, ``effect_hi``, ``p_value``; the interval, p and q are
    shown on hover). A per-head sweep (a ``head`` column) is drawn one ``head`` at a time (its
    q-values stay those among all heads). Layers keep their real indices; diverging colours
    centred on 0.
    """
    frame = getattr(sweep, "frame", sweep)
    _require(frame, ["layer", "position", "effect", "effect_lo", "effect_hi", "p_value"], "patching_sweep_intervals")
    if "q_value" not in frame.columns:  # a frame saved before the q-values: among the whole sweep, as they are
        frame = frame.assign(q_value=benjamini_hochberg(frame["p_value"].to_numpy(dtype=float)))
    if "head" in frame.columns:
        if head is None:
            raise BadInputError("this sweep has one cell per head: pass head= to draw one head")
        frame = frame[frame["head"] == head]
        if frame.empty:
            raise BadInputError(f"the sweep has no cells for head {head}")
    elif head is not None:
        raise BadInputError("this sweep has no head axis; drop head=")
    layer_ids = layer_rows(frame["layer"].tolist())
    positions = sorted({int(p) for p in frame["position"].tolist()})
    grid = frame.pivot_table(index="layer", columns="position", values="effect", aggfunc="first")
    grid = grid.reindex(index=layer_ids, columns=positions)
    if token_labels is not None:
        labels = list(token_labels)
        if max(positions, default=-1) >= len(labels):
            raise BadInputError(f"token_labels has {len(labels)} entries but the sweep patches position "
                                f"{max(positions)}: pass one label per position of the sequence")
        ticktext = [f"{p} {labels[p]!s}" for p in positions]
    else:
        ticktext = [str(p) for p in positions]
    fig = go.Figure(go.Heatmap(
        z=[_as_list(row) for row in grid.to_numpy(dtype=float)], x=positions, y=layer_ids,
        colorscale="RdBu", zmid=0.0, colorbar=dict(title=metric_name),
        meta={"group": "sweep", "quantity": "effect"},
        hovertemplate=f"layer %{{y}}, position %{{x}}<br>{metric_name} = %{{z:.4f}}<extra></extra>",
    ))
    marked = frame[frame["q_value"] < DISCOVERY_RATE]
    hover = [f"[{lo:.4f}, {hi:.4f}], p = {p:.3g}, q = {q:.3g}"
             for lo, hi, p, q in zip(marked["effect_lo"], marked["effect_hi"], marked["p_value"], marked["q_value"])]
    fig.add_trace(
        go.Scatter(
            x=[int(p) for p in marked["position"]],
            y=[int(layer) for layer in marked["layer"]],
            mode="markers",
            marker=dict(symbol="circle-open", size=9, color="black", line=dict(width=1.5)),
            text=hover,
            name=f"BH q < {DISCOVERY_RATE:g}",
            meta={"group": "sweep", "quantity": "bh_discovery"},
            hovertemplate="layer %{y}, position %{x}<br>interval %{text}<extra></extra>",
        )
    )
    fig.update_xaxes(title_text="patched position", tickvals=positions, ticktext=ticktext, tickangle=-60)
    fig.update_yaxes(title_text="patched layer", tickmode="array", tickvals=layer_ids, autorange="reversed")
    return _base_layout(fig, title, height=max(320, 24 * len(layer_ids) + 200))


EXPORT_FORMATS = ("png", "pdf", "svg", "html")


def save_figure(fig: go.Figure, path, format: str | None = None, *, width: int | None = None,
                height: int | None = None, scale: float = 2.0):
    """Write ``fig`` to ``path`` as ``"png"``, ``"pdf"``, ``"svg"`` or ``"html"`` (default: from
    the file's suffix) and return the path.

    Static formats need the optional ``kaleido`` package (``pip install "lens_position[export]"``)
    and a Chrome or Chromium on the machine; HTML needs neither and embeds plotly.js, so the file
    opens offline. ``width``/``height`` in pixels (default: the figure's own size), ``scale``
    multiplies the PNG resolution.
    """
    path = checked_path(path, "the figure's file")
    fmt = (format or path.suffix.lstrip(".")).lower()
    if fmt not in EXPORT_FORMATS:
        raise BadInputError(f"cannot save a figure as {fmt!r}: choose one of {list(EXPORT_FORMATS)} "
                            "(as the format argument or the file's suffix)")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "html":
            fig.write_html(path, include_plotlyjs=True, full_html=True)
            return path
    except OSError as error:
        raise BadInputError(f"cannot write the figure to {path}: {error.strerror or error}; choose a file you "
                            "can write to") from error
    import importlib.util

    if importlib.util.find_spec("kaleido") is None:
        from lens_position.ground.errors import MissingPackageError

        raise MissingPackageError(f"saving a figure as {fmt} needs kaleido, the optional 'export' extra: "
                                  'pip install "lens_position[export]" (or pip install kaleido); '
                                  "save_figure(fig, path, 'html') needs nothing extra")
    try:
        image = _render_static(fig, fmt, width=width, height=height, scale=scale)
    except Exception as error:  # kaleido's own errors: most often no browser to render with
        if "chrome" in str(error).lower() or "browser" in str(error).lower():
            from lens_position.ground.errors import MissingPackageError

            raise MissingPackageError(f"kaleido found no Chrome/Chromium to render the {fmt}: install one "
                                      "(apt-get install chromium) or set BROWSER_PATH") from error
        raise
    try:
        path.write_bytes(image)
    except OSError as error:
        raise BadInputError(f"cannot write the figure to {path}: {error.strerror or error}; choose a file you "
                            "can write to") from error
    return path


def _render_static(fig: go.Figure, fmt: str, *, width: int | None, height: int | None, scale: float) -> bytes:
    """``fig`` as PNG, PDF or SVG bytes, rendered by kaleido in a Chromium whose network is off
    (:func:`lens_position.report.browser.kaleido_options`; ``fig.write_image`` would start one that
    fetches MathJax from a CDN). Size: ``width`` × ``height`` pixels, else the figure's own, else
    plotly's defaults (700 × 500)."""
    import kaleido
    from plotly.io import defaults

    from lens_position.report.browser import kaleido_options

    spec = fig.to_dict()
    layout = spec.get("layout", {})
    opts = {"format": fmt, "width": width or layout.get("width") or defaults.default_width,
            "height": height or layout.get("height") or defaults.default_height, "scale": scale}
    return kaleido.calc_fig_sync(spec, opts=opts, kopts=kaleido_options())


@dataclass(frozen=True)
class Figure:
    """One figure of the report, declared beside what it draws (the report's own list, or a
    reproduction step's ``figures``): its ``key``, the ``tables`` it draws (the first must be present
    and non-empty), its ``title`` and ``caption``, ``make`` (the plot of those tables), ``lead`` and
    ``more`` (sentences built from the run's tables, before and after the caption) and ``after`` (the
    key of the figure it follows in the report; None: at the end)."""

    key: str
    tables: tuple[str, ...]
    title: str
    caption: str
    make: Callable[..., go.Figure]
    more: Callable[[Mapping[str, pd.DataFrame]], list[str]] | None = None
    lead: Callable[[Mapping[str, pd.DataFrame]], list[str]] | None = None
    after: str | None = None

    def draw(self, results: Mapping[str, pd.DataFrame]) -> ReportFigure | None:
        """The figure of ``results`` with its caption, or None where its first table is missing or empty."""
        frames = [results.get(t) for t in self.tables]
        if frames[0] is None or len(frames[0]) == 0:
            return None
        caption = (" ".join(self.lead(results)) + " " if self.lead is not None else "") + self.caption
        caption += " ".join(self.more(results)) if self.more is not None else ""
        return ReportFigure(self.key, self.title, caption.strip(), self.make(*frames))


def in_report_order(figures: Iterable[Figure]) -> list[Figure]:
    """``figures`` in the order the report shows them: each after the figure its ``after`` names
    (where present), the others in their order."""
    ordered: list[Figure] = []
    for figure in figures:
        at = next((k + 1 for k, f in enumerate(ordered) if f.key == figure.after), len(ordered))
        ordered.insert(at, figure)
    return ordered


@dataclass
class ReportFigure:
    """One figure of the report: a ``key`` naming it, its ``title``, the ``caption`` saying
    what is measured and in what units, and the plotly ``figure``."""

    key: str
    title: str
    caption: str
    figure: go.Figure


def window_sink_layers(heads: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """Sink scores per layer under Gu et al.'s metric and the window-aware one.

    ``heads`` is ``WindowSinks.heads`` stacked over models (``layer``, ``layer_type``,
    ``gu_score``, ``window_score``, ``visible_score``; each a mean attention in [0, 1]). Per layer,
    the mean over its heads: Gu et al.'s score (solid), the window-aware score (dashed; attention on
    the first key a query can see) and, dotted, attention on position 0 over the queries that
    see it. Markers: circles for local (sliding-window) layers, diamonds for global ones; in a
    global layer the three are the same number.
    """
    _require(heads, ["layer", "layer_type", "gu_score", "window_score", "visible_score"], "window_sink_layers")
    fig = go.Figure()
    metrics = (("gu_score", "Gu et al. (position 0)", "solid"), ("window_score", "window-aware (first visible key)",
                                                                "dash"),
               ("visible_score", "position 0, queries that see it", "dot"))
    for gi, (name, group) in enumerate(_groups(heads, by)):
        per_layer = group.groupby(["layer", "layer_type"], sort=True)[[m for m, _, _ in metrics]].mean().reset_index()
        symbols = ["circle" if kind == "local" else "diamond" for kind in per_layer["layer_type"]]
        for column, label, dash in metrics:
            fig.add_trace(go.Scatter(
                x=_as_list(per_layer["layer"]), y=_as_list(per_layer[column]), mode="lines+markers",
                name=f"{name}: {label}", line=dict(color=_color(gi), dash=dash),
                marker=dict(symbol=symbols, size=8), meta={"group": name, "quantity": column},
                text=_as_list(per_layer["layer_type"]),
                hovertemplate=f"{name}: {label}<br>layer %{{x}} (%{{text}}): %{{y:.4f}}<extra></extra>",
            ))
    fig.update_xaxes(title_text="layer (circle: local, diamond: global)")
    fig.update_yaxes(title_text="mean attention over the layer's heads", range=[0, 1])
    return _base_layout(fig, "Sink scores per layer: Gu et al.'s and window-aware")


def rotary_band_layers(layers: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """Where the residual component sits in RoPE frequency, per layer.

    ``layers`` is ``RotaryBands.layers`` stacked over models (``layer``, ``band``,
    ``band_index``, ``R_band``: Var(abs t_b)/V, the band's own term of the exact split of R;
    ``R_rf_attribution``: R' minus R' with the band's scores removed; both fractions of Var(log
    A), mean over the layer's heads). Left: ``R_band``; right: the attribution of R'. One colour per
    band (band 0 the fastest), one dash per architecture.
    """
    _require(layers, ["layer", "band", "band_index", "R_band", "R_rf_attribution"], "rotary_band_layers")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["R by band (exact split, own terms)",
                                                        "R' attribution by band (removal)"])
    bands = layers.sort_values("band_index")["band"].drop_duplicates().tolist()
    for gi, (name, group) in enumerate(_groups(layers, by)):
        for bi, band in enumerate(bands):
            part = group[group["band"] == band].sort_values("layer")
            if part.empty:
                continue
            for col, column in ((1, "R_band"), (2, "R_rf_attribution")):
                fig.add_trace(go.Scatter(
                    x=_as_list(part["layer"]), y=_as_list(part[column]), mode="lines+markers",
                    name=f"{name}: {band}", legendgroup=f"{name}: {band}", showlegend=col == 1,
                    line=dict(color=_color(bi), dash=_DASHES[gi % len(_DASHES)]), marker=dict(size=5),
                    meta={"group": name, "quantity": f"{column} ({band})"},
                ), row=1, col=col)
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="fraction of Var(log A)", row=1, col=1)
    return _base_layout(fig, "Residual component by RoPE frequency band", height=460)


def convergence_c4(convergence: pd.DataFrame, bos_layers: pd.DataFrame | None = None, *,
                   by: str = "architecture") -> go.Figure:
    """The position-0 state's convergence per layer beside the fraction of R' that BOS replacement
    removes there (C4).

    ``convergence`` is ``Position0Convergence.layers`` stacked over models (``layer``, ``cosine``
    with ``cosine_lo``/``_hi``: cosine of the replaced position-0 state to the unreplaced one,
    mean over replacements; ``tolerance``). Left: that cosine with its interval; dotted: ``1 -
    tolerance``, above which a layer counts as converged. Right (with ``bos_layers``,
    ``BosReplacement.frame``): the fraction of R' removed per layer, mean over replacements (the
    held-out fraction when the frame has it, as C4 is decided).
    """
    _require(convergence, ["layer", "cosine", "tolerance"], "convergence_c4")
    panels = ["cosine of the replaced position-0 state to the unreplaced one"]
    column = None
    if bos_layers is not None and len(bos_layers):
        column = c4_column(bos_layers)[0]
        _require(bos_layers, ["replacement", "layer", column], "convergence_c4")
        panels.append("fraction of R' removed per layer (mean over replacements)")
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=panels)
    for gi, (name, group) in enumerate(_groups(convergence, by)):
        part = group.sort_values("layer")
        fig.add_trace(go.Scatter(
            x=_as_list(part["layer"]), y=_as_list(part["cosine"]), mode="lines+markers", name=f"{name}: cosine",
            legendgroup=name, line=dict(color=_color(gi)), error_y=_error_bars(part, "cosine"),
            meta={"group": name, "quantity": "cosine"},
        ), row=1, col=1)
        tolerance = float(part["tolerance"].iloc[0])
        fig.add_trace(go.Scatter(
            x=_as_list(part["layer"]), y=[1 - tolerance] * len(part), mode="lines", name=f"{name}: 1 − tolerance",
            legendgroup=name, showlegend=False, line=dict(color=_color(gi), dash="dot", width=1),
            meta={"group": name, "quantity": "converged_threshold"},
        ), row=1, col=1)
    if column is not None:
        for gi, (name, group) in enumerate(_groups(bos_layers, by)):
            per_layer = group.groupby("layer", sort=True)[column].mean().reset_index()
            fig.add_trace(go.Scatter(
                x=_as_list(per_layer["layer"]), y=_as_list(per_layer[column]), mode="lines+markers",
                name=f"{name}: fraction removed", legendgroup=name, line=dict(color=_color(gi), dash="dash"),
                meta={"group": name, "quantity": column},
            ), row=1, col=2)
        fig.update_yaxes(title_text="fraction removed", row=1, col=2)
    fig.update_xaxes(title_text="layer")
    fig.update_yaxes(title_text="cosine", row=1, col=1)
    return _base_layout(fig, "C4: position-0 convergence beside the fraction of R' removed", height=460)


def zoo_r_by_layer(layers: pd.DataFrame) -> go.Figure:
    """Per-layer held-out R' (``R_rf_heldout``, reference-free split) of each ``variant`` of a
    zoo decomposition table: mean over seeds, with the seeds' min-max as error bars."""
    figure = go.Figure()
    for variant, frame in layers.groupby("variant", sort=False):
        stats = frame.groupby("layer")["R_rf_heldout"].agg(["mean", "min", "max", "count"])
        figure.add_trace(go.Scatter(
            x=stats.index, y=stats["mean"], mode="lines+markers", name=f"{variant} (n={stats['count'].iloc[0]})",
            error_y=dict(type="data", symmetric=False, array=stats["max"] - stats["mean"],
                         arrayminus=stats["mean"] - stats["min"])))
    figure.update_layout(title="Zoo: residual component R' (held-out, reference-free) by layer, mean over seeds "
                         "(bars: min-max)", xaxis_title="layer", yaxis_title="R' (share of Var(log A))",
                         template="plotly_white")
    return figure


def training_loss(curves: pd.DataFrame, unigram_bits_per_byte: float | None = None) -> go.Figure:
    """Held-out loss (``held_out_bits``, bits per byte) against training ``tokens``, one line per
    ``name`` (grouped by ``variant``), with the unigram baseline when given."""
    figure = go.Figure()
    for (name, variant), curve in curves.groupby(["name", "variant"], sort=False):
        figure.add_trace(go.Scatter(x=curve["tokens"], y=curve["held_out_bits"], mode="lines",
                                    name=name, legendgroup=variant))
    if unigram_bits_per_byte is not None:
        figure.add_hline(y=unigram_bits_per_byte, line_dash="dash",
                         annotation_text=f"unigram {unigram_bits_per_byte:.2f} bits/byte")
    figure.update_layout(title="Zoo training: held-out loss", xaxis_title="training tokens",
                         yaxis_title="bits per byte (held out)", template="plotly_white")
    return figure


def sink_origin_bars(origin: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """Sink rate at position 0 and at the BOS under each BOS condition, in %, per architecture.

    ``origin`` is ``SinkOrigin.frame`` stacked over models (``condition``, ``location``,
    ``sink_rate`` with ``_lo``/``_hi``: Gu et al.'s rate at that location, a fraction). Left panel:
    at position 0; right panel: at the BOS token wherever it is (absent without BOS)."""
    _require(origin, ["condition", "location", "sink_rate"], "sink_origin_bars")
    locations = [("position0", "at position 0"), ("bos", "at the BOS token")]
    fig = make_subplots(rows=1, cols=2, subplot_titles=[title for _, title in locations], shared_yaxes=True)
    for gi, (name, group) in enumerate(_groups(origin, by)):
        for li, (location, _) in enumerate(locations):
            frame = group[(group["location"] == location) & group["sink_rate"].notna()]
            fig.add_trace(go.Bar(
                x=_as_list(frame["condition"]), y=[100.0 * v for v in _as_list(frame["sink_rate"])],
                error_y=_error_bars(frame, "sink_rate", scale=100.0), offsetgroup=str(gi), name=name,
                legendgroup=name, showlegend=li == 0, marker_color=_color(gi),
                hovertemplate=f"{name}<br>%{{x}} ({location}): sink rate %{{y:.1f}}%<extra></extra>",
                meta={"group": name, "quantity": f"sink_rate_{location}_percent"}), row=1, col=li + 1)
    fig.update_layout(barmode="group")
    fig.update_yaxes(title_text="sink rate (% of prompt × layer × head)", range=[0, 100], row=1, col=1)
    return _base_layout(fig, "Where the sink comes from: BOS present, absent, moved, doubled, replaced")


def massive_layers(layers: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """The largest |activation| of each layer's output and its median (log scale), per architecture.

    ``layers`` is ``MassiveActivations.layers`` stacked over models (``layer``, ``top1`` with
    ``_lo``/``_hi``, ``median_abs``; residual-stream units)."""
    _require(layers, ["layer", "top1", "median_abs"], "massive_layers")
    fig = go.Figure()
    for gi, (name, frame) in enumerate(_groups(layers, by)):
        fig.add_trace(go.Scatter(x=_as_list(frame["layer"]), y=_as_list(frame["top1"]), mode="lines+markers",
                                 name=f"{name}: largest", marker_color=_color(gi), legendgroup=name,
                                 error_y=_error_bars(frame, "top1"), meta={"group": name, "quantity": "top1"}))
        fig.add_trace(go.Scatter(x=_as_list(frame["layer"]), y=_as_list(frame["median_abs"]), mode="lines",
                                 name=f"{name}: median", line=dict(dash="dot", color=_color(gi)), legendgroup=name,
                                 meta={"group": name, "quantity": "median_abs"}))
    fig.update_xaxes(title_text="layer (output of the block)")
    fig.update_yaxes(title_text="|activation| (residual-stream units)", type="log")
    return _base_layout(fig, "Massive activations: the largest entry of each layer's output")


def layer_lines(frame: pd.DataFrame, series: Sequence[tuple[str, str, str]], *, title: str, x_title: str,
                y_title: str, scale: float = 1.0, y_range: Sequence[float] | None = None, unit: str = "",
                by: str = "architecture") -> go.Figure:
    """One line per group (``by``) and series against ``layer``, with the interval of each value.

    ``series``: ``(column, label, dash)`` per line, each ``column`` with its ``_lo``/``_hi`` interval
    where the frame has one; values are multiplied by ``scale`` (100 for a fraction shown in %) and
    the hover text names ``unit``. Each trace's ``meta`` is ``{"group", "quantity"}``, ``quantity``
    the column (``_percent`` appended when ``scale`` is 100)."""
    _require(frame, ["layer", *(column for column, _, _ in series)], title)
    fig = go.Figure()
    for gi, (name, part) in enumerate(_groups(frame, by)):
        for column, label, dash in series:
            fig.add_trace(go.Scatter(
                x=_as_list(part["layer"]), y=[None if v is None else scale * v for v in _as_list(part[column])],
                mode="lines+markers", name=f"{name}: {label}", legendgroup=name, line=dict(dash=dash, color=_color(gi)),
                error_y=_error_bars(part, column, scale=scale),
                hovertemplate=f"{name}<br>layer %{{x}}: %{{y:.3g}}{unit} ({label})<extra></extra>",
                meta={"group": name, "quantity": column + ("_percent" if scale == 100.0 else "")}))
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text=y_title, range=list(y_range) if y_range is not None else None)
    return _base_layout(fig, title)


def leakage_layers(leakage: pd.DataFrame, decompose: pd.DataFrame | None = None, *,
                   by: str = "architecture") -> go.Figure:
    """Positional leakage per layer beside the decomposition's components, per architecture.

    ``leakage`` is ``PositionalLeakage.layers`` stacked over models (``layer``, ``delta_r2``,
    ``delta_r2_null``: means over the layer's heads of ΔR² on the texts and on their shifted nulls,
    unitless). ``decompose`` is ``Decomposition.layers`` (``R_rf_heldout``, ``M_rf_heldout``: fractions
    of Var(log A)); without it only the left panel is drawn."""
    _require(leakage, ["layer", "delta_r2", "delta_r2_null"], "leakage_layers")
    panels = 2 if decompose is not None and len(decompose) else 1
    titles = ["positional leakage ΔR² (before the softmax)", "R' and M' (held-out, after the softmax)"][:panels]
    fig = make_subplots(rows=1, cols=panels, subplot_titles=titles)
    for gi, (name, frame) in enumerate(_groups(leakage, by)):
        frame = frame.sort_values("layer")
        for column, dash, label in (("delta_r2", "solid", "ΔR² on texts"), ("delta_r2_null", "dot", "ΔR² on nulls")):
            fig.add_trace(go.Scatter(
                x=_as_list(frame["layer"]), y=_as_list(frame[column]), mode="lines+markers", name=f"{name}: {label}",
                legendgroup=name, line=dict(dash=dash, color=_color(gi)), meta={"group": name, "quantity": column},
                hovertemplate=f"{name}<br>layer %{{x}}<br>{label} = %{{y:.4f}}<extra></extra>"), row=1, col=1)
        if decompose is not None and panels == 2:
            part = decompose[decompose[by] == name] if by in decompose.columns else decompose
            part = part.sort_values("layer")
            for column, dash, label in (("R_rf_heldout", "solid", "R'"), ("M_rf_heldout", "dash", "M'")):
                if column not in part.columns or not len(part):
                    continue
                fig.add_trace(go.Scatter(
                    x=_as_list(part["layer"]), y=_as_list(part[column]), mode="lines+markers", name=f"{name}: {label}",
                    legendgroup=name, line=dict(dash=dash, color=_color(gi)), error_y=_error_bars(part, column),
                    meta={"group": name, "quantity": column},
                    hovertemplate=f"{name}<br>layer %{{x}}<br>{label} = %{{y:.4f}}<extra></extra>"), row=1, col=2)
    for col in range(1, panels + 1):
        fig.update_xaxes(title_text="layer", row=1, col=col)
    fig.update_yaxes(title_text="ΔR² (unitless)", row=1, col=1)
    if panels == 2:
        fig.update_yaxes(title_text="fraction of Var(log A)", row=1, col=2)
    fig.update_annotations(font_size=11)
    return _base_layout(fig, "Positional leakage beside R' and M' per layer", height=440)
