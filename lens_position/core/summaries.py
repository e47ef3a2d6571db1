"""What a result shows at a glance: the short text and HTML a notebook prints for a result,
its ``summary()`` frame and its ``top_heads()``.

A result class says what it measured (``WHAT``), which table holds one row per head and
which column ranks them (``HEADS``), and its headline numbers (``headline()``: a list of
:class:`Headline`, each an estimate with its interval); everything printed is built from
those, so it stays a few lines long however large the tables are (provenance and bootstrap
replicates stay in the tables, named at the end).
"""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from lens_position.core.intervals import LEVEL, Estimate, format_percent, from_replicates, interval_method
from lens_position.ground.errors import BadInputError

MAX_LINES = 24  # a screen: what __repr__ may print at most
WIDTH = 110


@dataclass(frozen=True)
class Headline:
    """One headline number: ``quantity`` (its column), ``label`` (how a reader calls it),
    ``estimate`` (value and interval) and ``meaning`` (what it is, in units)."""

    quantity: str
    label: str
    estimate: Estimate
    meaning: str


def layer_mean(layers: pd.DataFrame, replicates: pd.DataFrame | None, column: str,
               level: float = LEVEL) -> Estimate:
    """Mean over the rows of ``layers`` of a per-layer column, with the interval of the same
    mean taken replicate by replicate (``replicates``: one row per (replicate, layer))."""
    values = layers[column].to_numpy(dtype=float)
    keep = np.isfinite(values)
    value = float(values[keep].mean()) if keep.any() else math.nan
    n = int(layers["n_sequences"].iloc[0]) if "n_sequences" in layers.columns and len(layers) else None
    reps = None
    if replicates is not None and column in replicates.columns and len(replicates) and keep.any():
        grid = replicates.pivot(index="replicate", columns="layer", values=column)
        reps = grid.reindex(columns=layers["layer"].tolist()).to_numpy(dtype=float)[:, keep].mean(1)
    return from_replicates(value, reps, level=level, n=n, method=interval_method(column))


def missing_layers(layers: pd.DataFrame, *columns: str) -> list[int]:
    """The layers (``layers["layer"]``) where any of ``columns`` has no finite value: a mean over
    layers (:func:`layer_mean`) leaves them out, and says so (:func:`missing_layers_note`)."""
    bad: np.ndarray = np.zeros(len(layers), dtype=bool)
    for column in columns:
        if column in layers.columns:
            bad |= ~np.isfinite(layers[column].to_numpy(dtype=float))
    return [int(layer) for layer in layers["layer"].to_numpy()[bad]] if "layer" in layers.columns else []


def missing_layers_note(layers: pd.DataFrame, *columns: str) -> str:
    """`` (layer 3 has no value ...; the mean is over the other 11 layers)``, or "" when every layer
    has one: a layer without a value is named wherever a mean over layers leaves it out."""
    missing = missing_layers(layers, *columns)
    if not missing:
        return ""
    which = f"layer {missing[0]} has" if len(missing) == 1 else f"layers {', '.join(map(str, missing))} have"
    return (f" ({which} no value of {'/'.join(columns)}: nothing to measure there, e.g. a window of one key; "
            f"the mean is over the other {len(layers) - len(missing)} layers)")


def row_estimate(row: pd.Series | dict, column: str, level: float = LEVEL) -> Estimate:
    """The estimate in ``row[column]`` with its interval ``row[column_lo]``/``row[column_hi]``."""
    get = row.get
    return Estimate(float(get(column, math.nan)), float(get(f"{column}_lo", math.nan)),
                    float(get(f"{column}_hi", math.nan)), level, method=interval_method(column))


def fmt(estimate: Estimate, percent: bool = False) -> str:
    """Three significant figures, the interval in brackets; a NaN estimate is "not defined" (a
    fraction whose denominator is not resolved from 0, a quantity with no data)."""
    if not math.isfinite(estimate.value):
        return "not defined"

    def one(x: float) -> str:
        if not math.isfinite(x):
            return "nan"
        return format_percent(x) if percent else f"{x:.3g}"
    text = one(estimate.value)
    if estimate.has_interval:
        text += f" [{one(estimate.lo)}, {one(estimate.hi)}]"
        if estimate.off_centre:
            text += " (estimate outside its interval: off-centre resampling)"
    return text


def _on_what(provenance: dict[str, Any]) -> str:
    model = provenance.get("model") or {}
    data = provenance.get("data") or {}
    parts = []
    if model.get("name"):
        shape = (f" ({model['n_layers']} layers x {model['n_heads']} heads)"
                 if model.get("n_layers") and model.get("n_heads") else "")
        parts.append(f"{model['name']}{shape}")
    if isinstance(data, dict) and data.get("source") is not None:
        parts.append(f"{data['source']} text, N = {data.get('N')} x T = {data.get('T')}, bos {data.get('bos')}")
    return "; ".join(parts)


def is_untrained(provenance: dict[str, Any]) -> bool:
    """Whether the model is a random-weight one built in code (its numbers test the code and
    say nothing about trained models): the tiny registry models and the hand-set toys."""
    model = provenance.get("model") or {}
    source = str(model.get("source") or "")
    name = str(model.get("name") or "")
    return source.startswith("registry:tiny-") or name.startswith(("tiny-", "toy-"))


def _tables(result: Any) -> list[tuple[str, str]]:
    out = []
    for f in dataclasses.fields(result):
        value = getattr(result, f.name)
        if isinstance(value, pd.DataFrame):
            out.append((f.name, f"{len(value)} x {value.shape[1]}"))
        elif hasattr(value, "shape") and hasattr(value, "dtype"):
            out.append((f.name, "x".join(str(s) for s in value.shape)))
    return out


TERMINAL = 80  # what a printed summary or top-heads table fits in


class Shown(pd.DataFrame):
    """A frame that prints what a person reads: each estimate with its interval (:func:`fmt`) in a
    table that fits :data:`TERMINAL` columns, the columns left out named at the end; the frame itself,
    for code, is unchanged (every column, the numbers as numbers). ``shown``: the columns that print,
    each ``(header, column, bounds)``, ``bounds`` the ``(lo, hi)`` columns of its interval or None."""

    _metadata = ["shown"]

    @property
    def _constructor(self) -> type[pd.DataFrame]:
        return pd.DataFrame  # a frame derived from this one is a plain frame

    def _cells(self) -> tuple[list[str], list[list[str]], set[str]]:
        headers: list[str] = []
        columns: list[list[str]] = []
        used: set[str] = set()
        for header, column, bounds in getattr(self, "shown", ()):
            values = self[column].tolist()
            if bounds is not None:
                cells = [fmt(Estimate(float(v), float(lo), float(hi)))  # NaN: "not defined"
                         if isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
                         else str(v) for v, lo, hi in zip(values, self[bounds[0]], self[bounds[1]])]
            else:
                cells = [_number(v) for v in values]
            width = max([len(header), *map(len, cells)])
            if headers and sum(len(h) + 2 for h in headers) + width > TERMINAL:
                break
            headers.append(header.ljust(width))
            columns.append([c.ljust(width) for c in cells])
            used |= {column, *(bounds or ())}
        return headers, [list(row) for row in zip(*columns)], used

    def __repr__(self) -> str:
        headers, rows, used = self._cells()
        if not headers:
            return super().__repr__()
        left = [str(c) for c in self.columns if c not in used]
        lines = ["  ".join(headers).rstrip(), *("  ".join(row).rstrip() for row in rows)]
        if left:
            more = f"({len(left)} more columns in the frame: "
            for k, name in enumerate(left):
                piece = name + (", " if k < len(left) - 1 else ")")
                if len(more) + len(piece) > TERMINAL - 4:
                    more += "...)"
                    break
                more += piece
            lines.append(more)
        return "\n".join(lines)

    __str__ = __repr__

    def _repr_html_(self) -> str:
        headers, rows, _ = self._cells()
        if not headers:
            return str(super()._repr_html_())
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in row) + "</tr>" for row in rows)
        return ("<table><thead><tr>" + "".join(f"<th>{html.escape(h.strip())}</th>" for h in headers)
                + f"</tr></thead><tbody>{body}</tbody></table>")


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
            and math.isfinite(float(value)))


def _number(value: Any) -> str:
    """A count as an integer, another number to three significant figures, anything else as it is."""
    if not _is_number(value):
        return str(value)
    return f"{int(value)}" if float(value).is_integer() else f"{float(value):.3g}"


def shown(frame: pd.DataFrame, columns: Sequence[tuple[str, str, tuple[str, str] | None]]) -> Shown:
    """``frame`` as a :class:`Shown` that prints ``columns`` (those present)."""
    out = Shown(frame)
    out.shown = [c for c in columns if c[1] in frame.columns]
    return out


def summary_frame(result: Any) -> Shown:
    """One row per headline number: ``quantity``, ``label``, ``value``, ``lo``, ``hi``, ``meaning``;
    printed as the label and the value with its interval, in 80 columns."""
    rows = [{"quantity": h.quantity, "label": h.label, "value": h.estimate.value, "lo": h.estimate.lo,
             "hi": h.estimate.hi, "meaning": h.meaning} for h in result.headline()]
    frame = pd.DataFrame(rows, columns=["quantity", "label", "value", "lo", "hi", "meaning"])
    return shown(frame, [("", "label", None), ("value [95% interval]", "value", ("lo", "hi"))])


def top_heads(result: Any, n: int = 10, by: str | None = None) -> pd.DataFrame:
    """The ``n`` heads with the largest ``by`` (default: the result's ranking column) from its
    per-head table, ranking columns first."""
    heads_spec = getattr(result, "HEADS", None)
    if heads_spec is None:
        raise BadInputError(f"{type(result).__name__} has no per-head table; its tables are "
                            f"{[name for name, _ in _tables(result)]}")
    table, default = heads_spec
    frame = getattr(result, table)
    by = by or default
    if by not in frame.columns or not pd.api.types.is_numeric_dtype(frame[by]):
        numeric = [c for c in frame.columns if pd.api.types.is_numeric_dtype(frame[c]) and c not in ("layer", "head")]
        raise BadInputError(f"top_heads(by={by!r}): not a numeric column of .{table}; choose one of {numeric}")
    if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 1:
        raise BadInputError(f"top_heads(n={n!r}): n must be a positive integer")
    order = frame[by].astype(float).abs() if by.endswith("_change") else frame[by].astype(float)
    picked = frame.loc[order.sort_values(ascending=False, na_position="last").index[:n]]
    keys = [c for c in ("condition", "replacement", "patch_layer", "layer", "head") if c in picked.columns]
    interval = [c for c in (f"{by}_lo", f"{by}_hi") if c in picked.columns]
    rest = [c for c in picked.columns if c not in {*keys, by, *interval}]
    picked = picked[keys + [by] + interval + rest].reset_index(drop=True)

    def with_bounds(column: str) -> tuple[str, str, tuple[str, str] | None]:
        bounds = (f"{column}_lo", f"{column}_hi")
        return column, column, bounds if set(bounds) <= set(picked.columns) else None
    others = [c for c in RECOMMENDED_HEAD_COLUMNS if c != by and c in picked.columns]
    return shown(picked, [(k, k, None) for k in keys] + [with_bounds(c) for c in (by, *others)])


# what a printed top-heads table shows after its ranking column, as far as 80 columns go
RECOMMENDED_HEAD_COLUMNS = ("R_rf_heldout", "M_rf_heldout", "total_heldout", "sink_score", "R_change")


def _lines(result: Any) -> tuple[str, str, list[tuple[str, str, str]], list[tuple[str, str]], list[str]]:
    provenance = getattr(result, "provenance", None) or {}
    headline = [(h.label, fmt(h.estimate), h.meaning) for h in result.headline()]
    notes = []
    if is_untrained(provenance):
        notes.append("random-weight model built in code: these numbers test the code and say nothing about the paper")
    return type(result).__name__, _on_what(provenance), headline, _tables(result), notes


def _methods(result: Any) -> str:
    calls = [".summary()"]
    if getattr(result, "HEADS", None):
        calls.append(f'.top_heads(10, by="{result.HEADS[1]}")')
    return " · ".join(calls + [".save(path)"])


def text(result: Any) -> str:
    """The short ``repr``: what was measured, on what, the headline numbers, where the tables are."""
    name, on, headline, tables, notes = _lines(result)
    lines = [f"{name}: {result.WHAT}"]
    if on:
        lines.append(f"  on {on}")
    lines += [f"  ! {note}" for note in notes]
    width = max((len(label) for label, _, _ in headline), default=0)
    lines += [f"  {label:<{width}}  {value}" for label, value, _ in headline[:MAX_LINES - 6]]
    if headline and any(h.estimate.has_interval for h in result.headline()):
        lines.append(f"  (intervals: {result.INTERVALS})")
    items = [f".{t} ({shape})" for t, shape in tables]
    line = "  tables:"
    for k, item in enumerate(items):
        piece = f" {item}" + ("," if k < len(items) - 1 else "")
        if len(line) + len(piece) > WIDTH:
            lines.append(line)
            line = "   "
        line += piece
    lines.append(line)
    lines.append("  " + _methods(result))
    return "\n".join(lines)


def html_text(result: Any) -> str:
    """The same as :func:`text`, as a small HTML block (notebooks show it instead of the repr)."""
    name, on, headline, tables, notes = _lines(result)
    esc = html.escape
    rows = "".join(f"<tr><td>{esc(label)}</td><td style='text-align:right'>{esc(value)}</td>"
                   f"<td style='color:#555'>{esc(meaning)}</td></tr>" for label, value, meaning in headline)
    banner = "".join(f"<p style='background:#fde8e8;padding:2px 6px;margin:4px 0'><b>Note:</b> {esc(n)}</p>"
                     for n in notes)
    return (f"<div class='lens-position-result'><b>{esc(name)}</b>: {esc(result.WHAT)}"
            + (f"<br><span style='color:#555'>on {esc(on)}</span>" if on else "") + banner
            + (f"<table>{rows}</table>" if rows else "")
            + "<p style='color:#555;margin:2px 0'>tables: "
            + ", ".join(f"<code>.{esc(t)}</code> ({esc(s)})" for t, s in tables)
            + f"<br><code>{esc(_methods(result))}</code></p></div>")


def headlines_from_rows(frame: pd.DataFrame, key: str, columns: Sequence[tuple[str, str, str]]) -> list[Headline]:
    """One :class:`Headline` per (row of ``frame``, column): ``columns`` are (column, label, meaning);
    the row's ``key`` value goes into the label."""
    out = []
    for _, row in frame.iterrows():
        for column, label, meaning in columns:
            if column in frame.columns:
                out.append(Headline(column, f"{label} ({row[key]})", row_estimate(row, column), meaning))
    return out
