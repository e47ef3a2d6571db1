"""Every report figure exports cleanly at its default size: no title overlaps another (boxes
estimated from the layout's annotations and the font size), and heatmaps tick whole layers."""

from __future__ import annotations

import itertools

import pytest
from fake_results import fake_results

from lens_position.pipeline.steps import FIGURES
from lens_position.report import html as report
from lens_position.report import plots

GLYPH = 0.62  # em per character, a little wider than plotly's default font's average
LINE = 1.25   # em per line


def _boxes(fig):
    """(text, x0, y0, x1, y1) in pixels from the top-left, for the title and every annotation."""
    layout = fig.layout
    width, height = layout.width or 700, layout.height or 450
    m = layout.margin
    left, right, top, bottom = (m.l if m.l is not None else 80), (m.r if m.r is not None else 80), \
        (m.t if m.t is not None else 100), (m.b if m.b is not None else 80)
    plot_w, plot_h = width - left - right, height - top - bottom
    out = []
    for a in layout.annotations:
        size = a.font.size if a.font and a.font.size else 12
        lines = str(a.text).split("<br>")
        w, h = max(map(len, lines)) * size * GLYPH, len(lines) * size * LINE
        x = left + float(a.x) * plot_w if a.xref in (None, "paper") else None
        y = top + (1 - float(a.y)) * plot_h if a.yref in (None, "paper") else None
        if x is None or y is None:
            continue
        x0 = {"left": x, "right": x - w}.get(a.xanchor, x - w / 2)
        y0 = {"bottom": y - h, "top": y}.get(a.yanchor, y - h / 2)
        out.append((a.text, x0, y0, x0 + w, y0 + h))
    title = layout.title
    if title.text:
        size = title.font.size if title.font and title.font.size else 17
        lines = str(title.text).split("<br>")
        w, h = max(map(len, lines)) * size * GLYPH, len(lines) * size * LINE
        x0 = (title.x if title.x is not None else 0.05) * width
        pad = title.pad.t if title.pad and title.pad.t else 0
        y0 = pad if title.yanchor == "top" and title.y == 1.0 else (top - h) / 2
        out.append((title.text, x0, y0, x0 + w, y0 + h))
    return out, width


def _overlap(a, b):
    return a[1] < b[3] and b[1] < a[3] and a[2] < b[4] and b[2] < a[4]


def _figures():
    return {fig.key: fig.figure for fig in report.report_figures(fake_results(), FIGURES)}  # the steps' figures too


@pytest.mark.parametrize("key", sorted(_figures()))
def test_no_title_overlaps_another_at_the_default_size(key, tmp_path):
    fig = _figures()[key]
    boxes, width = _boxes(fig)
    for a, b in itertools.combinations(boxes, 2):
        assert not _overlap(a, b), f"{key}: {a[0]!r} overlaps {b[0]!r}"
    for text, x0, _, x1, _ in boxes:
        assert x0 >= -1 and x1 <= width + 1, f"{key}: {text!r} runs off the figure"
    path = plots.save_figure(fig, tmp_path / f"{key}.png")  # the export itself renders
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("key", ["head_heatmaps", "sinks"])
def test_heatmaps_tick_whole_layers_and_heads(key):
    fig = _figures()[key]
    axes = [getattr(fig.layout, name) for name in fig.layout if name.startswith(("xaxis", "yaxis"))]
    ticked = [ax for ax in axes if ax.tickvals is not None]
    assert ticked, key
    for ax in ticked:
        assert all(float(v).is_integer() for v in ax.tickvals)
        assert list(ax.ticktext) == [str(int(v)) for v in ax.tickvals]
