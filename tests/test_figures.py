"""Figures a researcher adds to a paper: patching sweeps, layer subsets, static export."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

from lens_position import plots
from lens_position.errors import BadInputError, MissingPackageError
from lens_position.patching import resid_pre_sweep


def _sweep_frame(layers, positions) -> pd.DataFrame:
    rows = [(layer, p, float(layer * 100 + p)) for layer in layers for p in positions]
    return pd.DataFrame(rows, columns=["layer", "position", "metric"])


def test_sweep_heatmap_keeps_repeated_tokens_as_distinct_columns():
    labels = ["<bos>", "the", "cat", "the", "cat"]
    fig = plots.patching_sweep(_sweep_frame([0, 1], range(5)), token_labels=labels)
    (trace,) = fig.data
    assert trace.meta == {"group": "sweep", "quantity": "metric"}
    assert list(trace.x) == [0, 1, 2, 3, 4]
    ticks = list(fig.layout.xaxis.ticktext)
    assert len(set(ticks)) == 5 and ticks[1] != ticks[3] and "the" in ticks[1] and "the" in ticks[3]
    assert [list(row) for row in trace.z] == [[0, 1, 2, 3, 4], [100, 101, 102, 103, 104]]


def test_sweep_heatmap_draws_a_layer_subset_at_its_real_indices():
    fig = plots.patching_sweep(_sweep_frame([0, 4, 8], [0, 1]))
    (trace,) = fig.data
    assert list(trace.y) == list(range(9))
    rows = {layer: list(row) for layer, row in zip(trace.y, trace.z)}
    assert rows[4] == [400, 401] and rows[8] == [800, 801] and rows[3] == [None, None]


def test_sweep_heatmap_of_a_real_sweep_shows_its_values(tiny_llama):
    tokens = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(0))
    other = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(1))
    sweep = resid_pre_sweep(tiny_llama, tokens, other, lambda logits: logits[:, -1, 5].mean(), layers=[0, 2])
    fig = plots.patching_sweep(sweep, token_labels=tiny_llama.model.to_str_tokens(tokens[0]))
    (trace,) = fig.data
    by_cell = {(y, x): z for y, row in zip(trace.y, trace.z) for x, z in zip(trace.x, row)}
    for row in sweep.frame.itertuples():
        assert by_cell[(row.layer, row.position)] == pytest.approx(row.metric, rel=1e-6)
    assert all(z is None for (y, _), z in by_cell.items() if y == 1)


def test_sweep_heatmap_refuses_too_few_token_labels():
    with pytest.raises(BadInputError, match="one label per position"):
        plots.patching_sweep(_sweep_frame([0], range(4)), token_labels=["a", "b"])


@pytest.mark.parametrize("fmt,magic", [("png", b"\x89PNG"), ("pdf", b"%PDF"), ("svg", b"<svg")])
def test_save_figure_writes_the_static_format(tmp_path, fmt, magic):
    if importlib.util.find_spec("kaleido") is None:
        pytest.fail("kaleido (the export extra) is a dev dependency: pip install -e '.[dev]'")
    fig = plots.patching_sweep(_sweep_frame([0, 1], range(3)))
    path = plots.save_figure(fig, tmp_path / f"sweep.{fmt}")
    head = path.read_bytes()[:400]
    assert magic in head, head[:40]


def test_save_figure_html_needs_no_extra_and_embeds_plotly(tmp_path):
    path = plots.save_figure(plots.patching_sweep(_sweep_frame([0], range(2))), tmp_path / "f", "html")
    text = path.read_text()
    assert "cdn.plot.ly/plotly" not in text and len(text) > 1_000_000  # plotly.js inline


def test_save_figure_without_kaleido_names_the_extra(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "kaleido" else real_find_spec(name, *a, **k))
    with pytest.raises(MissingPackageError, match=r"lens_position\[export\]"):
        plots.save_figure(plots.patching_sweep(_sweep_frame([0], range(2))), tmp_path / "f.pdf")
    with pytest.raises(BadInputError, match="choose one of"):
        plots.save_figure(plots.patching_sweep(_sweep_frame([0], range(2))), tmp_path / "f.jpeg2000")
