"""C3 read off the controlled zoo: does the balance of mask and residual components depend
on the position mechanism, when nothing else differs?

Input: the tables of a reproduction run over zoo models (``decompose_layers``, and when
present ``probe_layers``, ``sink_rate``, ``bos_overall``). Per model:

- ``R``, ``M``, ``T``: held-out residual, mask and total shares of Var(log A), means over
  layers (``R_heldout`` etc. of ``lens_position.decompose``; fractions in [0, 1]);
- ``R_slope``: least-squares slope of the per-layer ``R_heldout`` against the layer index
  (share per layer: "does R accumulate with depth");
- ``probe_r2_last``: held-out R² of the position probe at the last layer's input;
- ``sink_rate`` (natural text) and ``bos_removed`` (mean fraction of R removed by BOS
  replacement at early queries, over replacements), when those steps ran.

Across seeds: mean, standard deviation and a 95 % Student-t interval. The C3 questions are
answered with **paired** per-seed differences: variants with the same seed start from the
same initial weights (identical shapes draw identical values) and see the same batches, so
``ntk - ntk-control`` at seed ``k`` differs only by the NTK scaling. A verdict is
``lower``/``higher`` when the interval excludes 0, else ``not resolved``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from lens_position.errors import BadInputError
from lens_position.zoo.store import parse_name

METRICS = ("R", "M", "T", "R_slope", "probe_r2_last", "sink_rate", "bos_removed")
#: (question, variant a, variant b, metric): each answered by the paired difference a - b.
QUESTIONS: tuple[tuple[str, str, str, str], ...] = (
    ("Does NTK-aware scaling lower the residual share relative to its unscaled control?",
     "ntk", "ntk-control", "R"),
    ("Does the sliding window (all layers) let R grow with depth faster than full attention?",
     "window", "rope", "R_slope"),
    ("Does the local:global mix let R grow with depth faster than full attention?",
     "window-mix", "rope", "R_slope"),
    ("Where does NoPE sit: residual share relative to RoPE", "nope", "rope", "R"),
    ("Where does NoPE sit: mask share relative to RoPE", "nope", "rope", "M"),
    ("Where do learned absolute embeddings sit: residual share relative to RoPE", "learned", "rope", "R"),
    ("Where do learned absolute embeddings sit: mask share relative to RoPE", "learned", "rope", "M"),
    ("Does training without BOS change the residual share (RoPE)?", "rope-nobos", "rope", "R"),
)


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (numerical: the CDF
    integrated on a fine grid and inverted by interpolation; accurate to ~1e-4)."""
    if df < 1:
        return float("nan")
    x = np.linspace(0.0, 200.0, 400_001)
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = np.exp(log_norm - (df + 1) / 2 * np.log1p(x * x / df))
    cdf = 0.5 + np.concatenate([[0.0], np.cumsum((density[1:] + density[:-1]) / 2 * np.diff(x))])
    return float(np.interp(p, cdf, x))


def interval(values: Sequence[float]) -> tuple[float, float, float, float, int]:
    """``(mean, sd, low, high, n)`` of a 95 % t-interval for the mean (NaN bounds for n < 2)."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), float("nan"), float("nan"), 0
    mean = float(v.mean())
    if n < 2:
        return mean, float("nan"), float("nan"), float("nan"), n
    sd = float(v.std(ddof=1))
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n)
    return mean, sd, mean - half, mean + half, n


def _slope(layers: pd.Series, values: pd.Series) -> float:
    x = layers.to_numpy(dtype=float)
    if len(x) < 2:
        return float("nan")
    return float(np.polyfit(x, values.to_numpy(dtype=float), 1)[0])


def is_zoo_request(model: str) -> bool:
    """Whether a run's model request names a zoo checkpoint."""
    return model.startswith("zoo:")


def models_table(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per zoo model of a run: variant, seed and the per-model metrics (module
    docstring). BadInputError when the run has no zoo model or no decomposition."""
    if "decompose_layers" not in tables:
        raise BadInputError("the run has no decompose_layers table; run the decompose step on zoo models")
    layers = tables["decompose_layers"]
    if "keys" in layers.columns:
        layers = layers[layers["keys"] == "all"]
    zoo = layers[layers["model"].map(is_zoo_request)]
    if zoo.empty:
        raise BadInputError("the run has no zoo models; pass --models zoo (or zoo:<variant> names)")
    rows = []
    for model, frame in zoo.groupby("model", sort=False):
        variant, seed = parse_name(model)
        frame = frame.sort_values("layer")
        row: dict[str, Any] = {
            "model": model, "variant": variant, "seed": seed, "R": frame["R_heldout"].mean(),
            "M": frame["M_heldout"].mean(), "T": frame["T_heldout"].mean(),
            "R_slope": _slope(frame["layer"], frame["R_heldout"]),
            "R_first_layer": frame["R_heldout"].iloc[0], "R_last_layer": frame["R_heldout"].iloc[-1],
        }
        probe = tables.get("probe_layers")
        if probe is not None and (probe["model"] == model).any():
            p = probe[probe["model"] == model].sort_values("layer")
            row["probe_r2_last"] = p["r2_heldout"].iloc[-1]
        sinks = tables.get("sink_rate")
        if sinks is not None and (sinks["model"] == model).any():
            s = sinks[(sinks["model"] == model) & (sinks["condition"] == "natural")]
            row["sink_rate"] = s["sink_rate"].iloc[0] if len(s) else float("nan")
        bos = tables.get("bos_overall")
        if bos is not None and (bos["model"] == model).any():
            row["bos_removed"] = bos[bos["model"] == model]["fraction_removed"].mean()
        rows.append(row)
    return pd.DataFrame(rows)


def variant_summary(models: pd.DataFrame) -> pd.DataFrame:
    """Per variant and metric: mean over seeds, sd, 95 % t-interval, number of seeds."""
    rows = []
    for variant, frame in models.groupby("variant", sort=False):
        for metric in METRICS:
            if metric not in frame.columns:
                continue
            mean, sd, low, high, n = interval(frame[metric].tolist())
            rows.append({"variant": variant, "metric": metric, "mean": mean, "sd": sd, "low": low,
                         "high": high, "n_seeds": n, "seeds": ",".join(map(str, sorted(frame["seed"])))})
    return pd.DataFrame(rows)


def answers(models: pd.DataFrame) -> pd.DataFrame:
    """The C3 questions (``QUESTIONS``), each answered by the per-seed paired difference
    ``a - b`` of one metric: mean, 95 % t-interval, seeds used, and the verdict."""
    rows = []
    for question, a, b, metric in QUESTIONS:
        left = models[models["variant"] == a].set_index("seed")[metric] if metric in models else pd.Series()
        right = models[models["variant"] == b].set_index("seed")[metric] if metric in models else pd.Series()
        seeds = sorted(set(left.index) & set(right.index))
        diffs = [float(left[s] - right[s]) for s in seeds]
        mean, sd, low, high, n = interval(diffs)
        if n < 2 or not np.isfinite(low):
            verdict = "not resolved (fewer than 2 paired seeds)"
        elif high < 0:
            verdict = "lower"
        elif low > 0:
            verdict = "higher"
        else:
            verdict = "not resolved (interval includes 0)"
        rows.append({"question": question, "a": a, "b": b, "metric": metric, "a_mean": left.mean(),
                     "b_mean": right.mean(), "difference": mean, "low": low, "high": high,
                     "relative": mean / right.mean() if len(right) and right.mean() else float("nan"),
                     "n_seeds": n, "per_seed": ", ".join(f"{d:+.4f}" for d in diffs), "verdict": verdict})
    return pd.DataFrame(rows)


def answer_markdown(answer: pd.DataFrame) -> str:
    """The answers as a Markdown table (for the README and the docs)."""
    lines = ["| question | a − b (metric) | mean difference [95 % interval] | a / b means | seeds | verdict |",
             "|---|---|---|---|---|---|"]
    for _, r in answer.iterrows():
        lines.append(f"| {r['question']} | {r['a']} − {r['b']} ({r['metric']}) | {r['difference']:+.4f} "
                     f"[{r['low']:+.4f}, {r['high']:+.4f}] | {r['a_mean']:.4f} / {r['b_mean']:.4f} | "
                     f"{r['n_seeds']} | {r['verdict']} |")
    return "\n".join(lines)


def depth_figure(tables: Mapping[str, pd.DataFrame]) -> Any:
    """Per-layer held-out R of each variant: mean over seeds, with the seeds' min-max as error bars."""
    import plotly.graph_objects as go

    layers = tables["decompose_layers"]
    if "keys" in layers.columns:
        layers = layers[layers["keys"] == "all"]
    zoo = layers[layers["model"].map(is_zoo_request)].copy()
    zoo["variant"] = zoo["model"].map(lambda m: parse_name(m)[0])
    figure = go.Figure()
    for variant, frame in zoo.groupby("variant", sort=False):
        stats = frame.groupby("layer")["R_heldout"].agg(["mean", "min", "max", "count"])
        figure.add_trace(go.Scatter(
            x=stats.index, y=stats["mean"], mode="lines+markers", name=f"{variant} (n={stats['count'].iloc[0]})",
            error_y=dict(type="data", symmetric=False, array=stats["max"] - stats["mean"],
                         arrayminus=stats["mean"] - stats["min"])))
    figure.update_layout(title="Zoo: residual component R (held-out) by layer, mean over seeds (bars: min-max)",
                         xaxis_title="layer", yaxis_title="R = Var(abs(t)) / Var(log A)", template="plotly_white")
    return figure


def loss_figure(checkpoints: Sequence[Any]) -> Any:
    """Held-out loss (bits per byte) against training tokens, one line per checkpoint, with
    the unigram baseline."""
    import plotly.graph_objects as go

    figure = go.Figure()
    unigram = None
    for c in checkpoints:
        curve = pd.DataFrame(c.meta["curve"])
        figure.add_trace(go.Scatter(x=curve["tokens"], y=curve["held_out_bits"], mode="lines",
                                    name=c.name, legendgroup=c.variant))
        unigram = c.meta["unigram_bits_per_byte"]
    if unigram is not None:
        figure.add_hline(y=unigram, line_dash="dash", annotation_text=f"unigram {unigram:.2f} bits/byte")
    figure.update_layout(title="Zoo training: held-out loss", xaxis_title="training tokens",
                         yaxis_title="bits per byte (held out)", template="plotly_white")
    return figure


ZOO_OUTPUTS = ("zoo_models.csv", "zoo_variants.csv", "zoo_c3.csv", "zoo.html")


def zoo_html(answer: pd.DataFrame, summary: pd.DataFrame, figures: Sequence[Any]) -> str:
    """A standalone page: the C3 answers, the per-variant summary and the figures (plotly.js
    inlined once, so the page works offline)."""
    parts = ["<html><head><meta charset='utf-8'><title>lens_position zoo: C3</title></head><body>",
             "<h1>The controlled zoo: C3</h1>",
             "<p>Paired per-seed differences (same initial weights and batches at the same seed); "
             "95 % t-intervals over seeds.</p>", answer.to_html(index=False, float_format=lambda x: f"{x:.4f}"),
             "<h2>Per variant (mean over seeds)</h2>",
             summary.to_html(index=False, float_format=lambda x: f"{x:.4f}")]
    for i, figure in enumerate(figures):
        parts.append(figure.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    return "\n".join(parts)


def write_outputs(folder: Any, tables: Mapping[str, pd.DataFrame]) -> dict[str, Any]:
    """If the run has zoo models, write ``zoo_models.csv``, ``zoo_variants.csv``,
    ``zoo_c3.csv`` and ``zoo.html`` through ``folder`` (an output folder with ``table`` and
    ``text`` methods); otherwise write nothing."""
    layers = tables.get("decompose_layers")
    if layers is None or not layers["model"].map(is_zoo_request).any():
        return {}
    from lens_position.zoo.store import checkpoints

    models = models_table(tables)
    summary = variant_summary(models)
    answer = answers(models)
    shipped = {c.name: c for c in checkpoints()}
    trained = [shipped[m] for m in models["model"] if m in shipped]
    figures = [depth_figure(tables)] + ([loss_figure(trained)] if trained else [])
    return {"zoo_models": folder.table("zoo_models", models, "csv"),
            "zoo_variants": folder.table("zoo_variants", summary, "csv"),
            "zoo_c3": folder.table("zoo_c3", answer, "csv"),
            "zoo_report": folder.text("zoo_report", "zoo.html", zoo_html(answer, summary, figures))}
