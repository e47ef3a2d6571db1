"""Figures a researcher adds to a paper: patching sweeps, layer subsets, static export."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import torch

from lens_position.analyses.patching import resid_pre_sweep
from lens_position.ground.errors import BadInputError, MissingPackageError
from lens_position.report import plots


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


# ---------------------------------------------------------------- the traces each figure draws

from fake_results import ARCHS, fake_results  # noqa: E402

GROUPS = {arch for arch, _, _ in ARCHS}

# figure -> (how to draw it from the fake results, the quantities its traces carry). Renaming a
# quantity in plots.py, or dropping a trace, fails here: the per-value tests below look traces
# up by these names, so without this check they could pass on a figure that lacks them.
FIGURES = {
    # Held-out values by default, both splits side by side (self-referenced R/M, reference-free R_rf/M_rf).
    "layer_components": (lambda t: plots.layer_components(t["decompose_layers"]),
                         {"R_heldout", "M_heldout", "R_rf_heldout", "M_rf_heldout"}),
    "layer_components_heldout": (lambda t: plots.layer_components(t["decompose_layers"], heldout=True),
                                 {"R_heldout", "M_heldout", "R_rf_heldout", "M_rf_heldout"}),
    "head_heatmaps": (lambda t: plots.head_heatmaps(t["decompose_heads"]),
                      {"total_heldout", "R_rf_heldout", "M_rf_heldout"}),
    "probe_r2": (lambda t: plots.probe_r2(t["probe_layers"]), {"r2_heldout", "r2_shuffled"}),
    "bos_fraction_removed": (lambda t: plots.bos_fraction_removed(t["bos_layers"], t["bos_overall"]),
                             {"fraction_removed_rf (overall)", "fraction_removed_rf (token)",
                              "fraction_removed_rf (mean)", "fraction_removed_rf (random)"}),
    "fingerprint_layers": (lambda t: plots.fingerprint_layers(t["fingerprint"]),
                           # the fake auto-BOS spread is exactly 0: drawn as markers on the log axis
                           {"spread (auto-bos)", "spread (varying-token0)", "norm (auto-bos)",
                            "norm (varying-token0)", "spread == 0 (auto-bos)"}),
    "sink_heads_map": (lambda t: plots.sink_heads_map(t["sink_heads"], t["sink_reading"]),
                       {"sink_score", "is_sink", "sink_reading_top"}),
    "sink_rate_bars": (lambda t: plots.sink_rate_bars(t["sink_rate"]),
                       {"sink_rate_percent", "sink_rate_pooled_percent"}),
    "sink_ablation": (lambda t: plots.sink_ablation(t["sink_ablation"]),
                      {"R_heldout_before (zero)", "R_heldout_after (zero)", "R_heldout_before (mean)",
                       "R_heldout_after (mean)"}),
}


@pytest.mark.parametrize("name", list(FIGURES))
def test_each_figure_draws_exactly_its_traces_for_every_architecture(name):
    draw, quantities = FIGURES[name]
    fig = draw(fake_results())
    drawn = {(t.meta["group"], t.meta["quantity"]) for t in fig.data}
    assert drawn == {(g, q) for g in GROUPS for q in quantities}, sorted(drawn)


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_frame_without_an_architecture_column_has_no_all_in_its_legend(name):
    draw, quantities = FIGURES[name]
    tables = {k: v[v["architecture"] == ARCHS[0][0]].drop(columns="architecture") for k, v in fake_results().items()}
    fig = draw(tables)
    assert {t.meta["quantity"] for t in fig.data} == quantities
    texts = [t.name or "" for t in fig.data if t.showlegend is not False] + [
        a.text or "" for a in fig.layout.annotations
    ]
    assert not [x for x in texts if x == "all" or x.startswith(("all:", ": "))], texts


def test_head_heatmap_of_a_layer_subset_keeps_real_layer_indices():
    heads = fake_results(n_layers=13)["decompose_heads"]
    heads = heads[heads["layer"].isin([0, 4, 8, 12])]
    fig = plots.head_heatmaps(heads)
    for trace in fig.data:
        assert list(trace.y) == list(range(13))
        part = heads[heads["architecture"] == trace.meta["group"]]
        rows = dict(zip(trace.y, trace.z))
        for row in part.itertuples():
            assert rows[row.layer][list(trace.x).index(row.head)] == pytest.approx(getattr(row, trace.meta["quantity"]))
        assert all(v is None for layer in (1, 2, 3, 5, 9, 11) for v in rows[layer])
