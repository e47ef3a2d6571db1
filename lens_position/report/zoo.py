"""C3 read off the controlled zoo: does the balance of mask and residual components depend
on the position mechanism, when nothing else differs?

Input: the tables of a reproduction run over zoo models (``decompose_layers``, and when
present ``probe_layers``, ``sink_rate``, ``bos_overall``). Per model:

- ``R``, ``M``, ``total``: held-out residual, mask and total shares of Var(log A), means over
  layers, on the reference-free split the paper's claims are decided on (``R_rf_heldout``,
  ``M_rf_heldout``, ``total_heldout`` of ``lens_position.analyses.decompose``; fractions in [0, 1]);
  ``R_self``, ``M_self``: the same on the self-referenced split, beside them;
- ``R_slope``: least-squares slope of the per-layer ``R_rf_heldout`` against the layer index
  (share per layer: "does R accumulate with depth"; the slope of
  :func:`lens_position.analyses.claims.slope`);
- ``probe_r2_last``: held-out R² of the position probe at the last layer's input;
- ``sink_rate`` (natural text) and ``bos_removed`` (mean fraction of the held-out R' removed by BOS
  replacement at early queries, over replacements; NaN where that R' is not resolved from 0),
  when those steps ran.

Across seeds: mean, standard deviation and a 95 % Student-t interval
(:func:`lens_position.core.intervals.t_interval`). The C3 questions are
answered with **paired** per-seed differences: variants with the same seed start from the
same initial weights (identical shapes draw identical values) and see the same batches, so
``ntk - ntk-control`` at seed ``k`` differs only by the NTK scaling. A verdict is
``lower``/``higher`` when the interval excludes 0, else ``not resolved``; the two variants must
have been decomposed at the same ``T`` (else ``not compared``, with the lengths: a difference
across lengths measures the length).
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from lens_position.analyses.claims import HOLDS, INCONCLUSIVE, NOT_MEASURED
from lens_position.analyses.claims import slope as depth_slope
from lens_position.analyses.sentences import zoo_sinks_sentence
from lens_position.core.intervals import t_interval, t_quantile  # noqa: F401  (t_quantile: part of this module's API)
from lens_position.core.run_tables import is_zoo_request
from lens_position.findings import Findings
from lens_position.ground.errors import BadInputError
from lens_position.models.zoo.recipe import VARIANTS
from lens_position.models.zoo.store import parse_name
from lens_position.report import plots
from lens_position.report.markup import verdict_class
from lens_position.report.plots import ReportFigure

#: The zoo's attention-sink sentence, under the name this module has always given it.
sinks_sentence = zoo_sinks_sentence

LOWER, HIGHER = "lower", "higher"  # the resolved answers: the interval of a - b lies below / above 0
METRICS = ("R", "M", "total", "R_slope", "R_self", "M_self", "probe_r2_last", "sink_rate", "bos_removed")
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


# The t-interval over seeds is the one of lens_position.core.intervals; ``interval`` is its name here.
interval = t_interval


def _slope(layers: pd.Series, values: pd.Series) -> float:
    """Least-squares slope of ``values`` against ``layers`` (the claims' slope; NaN below 2 layers)."""
    x = layers.to_numpy(dtype=float)
    if len(x) < 2:
        return float("nan")
    return float(depth_slope(x, values.to_numpy(dtype=float)))


def models_table(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """One row per zoo model of a run: variant, seed and the per-model metrics (module
    docstring). BadInputError when the run has no zoo model or no decomposition."""
    if "decompose_layers" not in tables:
        raise BadInputError("the run has no decompose_layers table; run the decompose step on zoo models")
    layers = tables["decompose_layers"]
    if "key_set" in layers.columns:
        layers = layers[layers["key_set"] == "all"]
    zoo = layers[layers["model"].map(is_zoo_request)]
    if zoo.empty:
        raise BadInputError("the run has no zoo models; pass --models zoo (or zoo:<variant> names)")
    rows = []
    for model, frame in zoo.groupby("model", sort=False):
        variant, seed = parse_name(model)
        frame = frame.sort_values("layer")
        row: dict[str, Any] = {
            "model": model, "variant": variant, "seed": seed, "R": frame["R_rf_heldout"].mean(),
            "M": frame["M_rf_heldout"].mean(), "total": frame["total_heldout"].mean(),
            "R_slope": _slope(frame["layer"], frame["R_rf_heldout"]),
            "R_first_layer": frame["R_rf_heldout"].iloc[0], "R_last_layer": frame["R_rf_heldout"].iloc[-1],
            "R_self": frame["R_heldout"].mean(), "M_self": frame["M_heldout"].mean(),
            "seq_len": (int(frame["seq_len"].iloc[0]) if "seq_len" in frame.columns and frame["seq_len"].notna().all()
                        else np.nan),
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
            part = bos[bos["model"] == model]
            column = "fraction_removed_rf_heldout" if "fraction_removed_rf_heldout" in part.columns \
                else "fraction_removed"  # tables written before the held-out fraction existed
            # NaN where R'_base is not resolved from 0 (then for every replacement: one base run)
            row["bos_removed"] = part[column].mean()
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
        lengths = _lengths(models, (a, b), seeds)
        if seeds and len(lengths) != 1:
            where = f"different T ({', '.join(map(str, sorted(lengths)))})" if lengths else "an unrecorded T"
            verdict = f"not compared: measured at {where}; a comparison across T measures T"
        elif n < 2 or not np.isfinite(low):
            verdict = "not resolved (fewer than 2 paired seeds)"
        elif high < 0:
            verdict = LOWER
        elif low > 0:
            verdict = HIGHER
        else:
            verdict = "not resolved (interval includes 0)"
        rows.append({"question": question, "a": a, "b": b, "metric": metric, "a_mean": left.mean(),
                     "b_mean": right.mean(), "difference": mean, "low": low, "high": high,
                     "relative": mean / right.mean() if len(right) and right.mean() else float("nan"),
                     "n_seeds": n, "per_seed": ", ".join(f"{d:+.4f}" for d in diffs),
                     "seq_len": next(iter(lengths)) if len(lengths) == 1 else np.nan, "verdict": verdict})
    return pd.DataFrame(rows)


def _lengths(models: pd.DataFrame, variants: tuple[str, str], seeds: list[Any]) -> set[int]:
    """The sequence lengths the paired models of ``variants`` at ``seeds`` were decomposed at (empty:
    not recorded; a paired difference is made only when this is one length)."""
    part = models[models["variant"].isin(variants) & models["seed"].isin(seeds)]
    if "seq_len" not in part.columns or part["seq_len"].isna().any():
        return set()
    return {int(T) for T in part["seq_len"]}


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
    """Per-layer held-out R' (reference-free split) of each variant: mean over seeds, with the
    seeds' min-max as error bars (:func:`lens_position.report.plots.zoo_r_by_layer`)."""
    layers = tables["decompose_layers"]
    if "key_set" in layers.columns:
        layers = layers[layers["key_set"] == "all"]
    zoo = layers[layers["model"].map(is_zoo_request)].copy()
    zoo["variant"] = zoo["model"].map(lambda m: parse_name(m)[0])
    return plots.zoo_r_by_layer(zoo)


def loss_figure(checkpoints: Sequence[Any]) -> Any:
    """Held-out loss (bits per byte) against training tokens, one line per checkpoint, with
    the unigram baseline (:func:`lens_position.report.plots.training_loss`)."""
    curves = pd.concat([pd.DataFrame(c.meta["curve"]).assign(name=c.name, variant=c.variant) for c in checkpoints],
                       ignore_index=True) if checkpoints else pd.DataFrame(
        columns=["tokens", "held_out_bits", "name", "variant"])
    unigram = checkpoints[-1].meta["unigram_bits_per_byte"] if checkpoints else None
    return plots.training_loss(curves, unigram)


#: Files a run over zoo models writes beside report.html (which holds the zoo section);
#: ``zoo.html`` is what earlier versions wrote instead of the section (known, so a rerun removes it).
ZOO_OUTPUTS = ("zoo_models.csv", "zoo_variants.csv", "zoo_c3.csv", "zoo_claims.csv", "zoo.html")
_CLAIM_KEYS = ("C1", "C2", "C3", "C4", "C5")


def claims_by_model(tables: Mapping[str, pd.DataFrame], claims: pd.DataFrame) -> pd.DataFrame:
    """C1-C5 per zoo model: one row per model (variant, seed), one column per claim holding
    its verdict, and ``<claim>_measured`` with what it rests on (from ``claims``, the run's
    claims table, whose architecture labels name the models)."""
    layers = tables["decompose_layers"]
    labels = layers[layers["model"].map(is_zoo_request)].drop_duplicates("model")[["model", "architecture"]]
    rows = []
    for model, label in labels.itertuples(index=False):
        variant, seed = parse_name(model)
        row: dict[str, Any] = {"model": model, "variant": variant, "seed": seed}
        part = claims[claims["architecture"] == label].set_index("claim")
        for key in _CLAIM_KEYS:
            row[key] = part.loc[key, "verdict"] if key in part.index else NOT_MEASURED
            row[f"{key}_measured"] = part.loc[key, "measured"] if key in part.index else ""
        rows.append(row)
    order = {v: i for i, v in enumerate(VARIANTS)}
    frame = pd.DataFrame(rows)
    return frame.sort_values(["variant", "seed"], key=lambda c: c.map(order) if c.name == "variant" else c,
                             ignore_index=True)


def _answers_html(answer: pd.DataFrame) -> str:
    """The questions whose two variants are both in the run, and one line naming the others."""
    present = answer["n_seeds"] > 0
    body = []
    for r in answer[present].itertuples():
        # a resolved answer is styled as a claim that holds, an unresolved one as inconclusive
        cls = verdict_class(HOLDS if r.verdict in (LOWER, HIGHER) else INCONCLUSIVE)
        interval_text = (f"{r.difference:+.4f} [{r.low:+.4f}, {r.high:+.4f}]" if np.isfinite(r.low)
                         else f"{r.difference:+.4f}")
        body.append(f"<tr><td>{html.escape(r.question)}</td><td>{html.escape(r.a)} − {html.escape(r.b)} "
                    f"({html.escape(r.metric)})</td><td>{interval_text}</td><td>{r.a_mean:.4f} / {r.b_mean:.4f}</td>"
                    f"<td>{html.escape(r.per_seed)}</td><td>{r.n_seeds}</td>"
                    f'<td class="{cls}"><b>{html.escape(r.verdict)}</b></td></tr>')
    absent = answer[~present]
    missing = ("<p>Not asked (a variant is not in this run): " + "; ".join(
        f"{html.escape(r.a)} − {html.escape(r.b)} ({html.escape(r.metric)})" for r in absent.itertuples())
        + ".</p>") if len(absent) else ""
    return ('<table id="zoo-c3"><thead><tr><th>question</th><th>a − b (metric)</th><th>mean paired difference '
            '[95% t-interval over seeds]</th><th>a / b means</th><th>per seed</th><th>seeds</th><th>answer</th>'
            f'</tr></thead><tbody>{"".join(body)}</tbody></table>{missing}')


def _claims_html(by_model: pd.DataFrame) -> str:
    head = "".join(f"<th>{k}</th>" for k in _CLAIM_KEYS)
    body = []
    for r in by_model.to_dict("records"):
        cells = "".join(f'<td class="{verdict_class(r[k])}" title="{html.escape(str(r[k + "_measured"]))}">'
                        f"{html.escape(r[k])}</td>" for k in _CLAIM_KEYS)
        body.append(f"<tr><td>{html.escape(r['variant'])}</td><td>{r['seed']}</td>{cells}</tr>")
    counts = []
    for variant, frame in by_model.groupby("variant", sort=False):
        cells = "".join(f"<td>{(frame[k] == HOLDS).sum()} of {len(frame)}</td>" for k in _CLAIM_KEYS)
        counts.append(f"<tr><th>{html.escape(variant)}</th><td>all seeds: holds on</td>{cells}</tr>")
    return (f'<table id="zoo-claims"><thead><tr><th>variant</th><th>seed</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}{"".join(counts)}</tbody></table>')


def _summary_html(summary: pd.DataFrame) -> str:
    metrics = [m for m in METRICS if m in set(summary["metric"])]
    head = "".join(f"<th>{html.escape(m)}</th>" for m in metrics)
    body = []
    for variant, frame in summary.groupby("variant", sort=False):
        frame = frame.set_index("metric")
        cells = []
        for m in metrics:
            if m not in frame.index:
                cells.append("<td></td>")
                continue
            r = frame.loc[m]
            spread = f" ± {r['sd']:.4f} [{r['low']:.4f}, {r['high']:.4f}]" if np.isfinite(r["low"]) else ""
            cells.append(f"<td>{r['mean']:.4f}{spread}</td>")
        body.append(f"<tr><th>{html.escape(variant)}</th><td>{frame['n_seeds'].max()}</td>{''.join(cells)}</tr>")
    return (f'<table id="zoo-variants"><thead><tr><th>variant</th><th>seeds</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def report_section(tables: Mapping[str, pd.DataFrame], claims: pd.DataFrame) -> tuple[str, list[Any], str]:
    """The zoo section of ``report.html``: ``(html before the figures, figures, html after)``,
    the figures as ``lens_position.report.plots.ReportFigure`` (drawn like the report's others).

    Before: the C3 questions answered by paired per-seed differences, C1-C5 per variant and
    seed, the per-variant means with their seed-to-seed spread, and what the models' sink
    measurements say. Figures: R by layer per variant (seeds' min-max) and the loss curves."""
    from lens_position.models.zoo.store import checkpoints

    models = models_table(tables)
    summary = variant_summary(models)
    answer = answers(models)
    shipped = {c.name: c for c in checkpoints()}
    trained = [shipped[m] for m in models["model"] if m in shipped]
    variants = models.groupby("variant", sort=False)["seed"].apply(lambda s: ", ".join(map(str, sorted(s))))
    listing = "; ".join(f"{html.escape(v)} (seeds {s})" for v, s in variants.items())
    before = (
        '<section id="zoo"><h2>The controlled zoo: C3 with nothing but the position mechanism changed</h2>'
        f"<p>{len(models)} zoo models in this run: {listing}. They share one recipe (sizes, data, optimiser, "
        "token budget) and differ only in how they encode position; at the same seed two variants start from the "
        "same initial weights and see the same batches, so each question below is answered by the <b>paired</b> "
        "per-seed difference, with a 95% t-interval over seeds (the seed-to-seed spread), and is resolved only "
        "when that interval excludes 0. Shares are held-out fractions of Var(log A), means over layers; R slope "
        "is the least-squares slope of the per-layer R against the layer index.</p>"
        f"<h3>C3 on the zoo</h3>{_answers_html(answer)}"
        f"<h3>C1–C5 per variant and seed</h3>{_claims_html(claims_by_model(tables, claims))}"
        '<p class="caption">Verdicts of the claims table above for each zoo model (hover a cell for what it '
        "rests on); the last rows count the seeds on which each claim holds.</p>"
        f"<h3>Per variant: mean ± sd over seeds [95% t-interval]</h3>{_summary_html(summary)}"
        f'<h3>Attention sinks</h3><p id="zoo-sinks">{html.escape(zoo_sinks_sentence(trained))}</p>')
    figures = [ReportFigure("zoo_depth", "Zoo: R by layer per variant",
                            "Held-out residual component R (self-referenced split) of each layer, mean over the "
                            "variant's seeds; bars: the seeds' minimum and maximum.", depth_figure(tables))]
    if trained:
        figures.append(ReportFigure("zoo_loss", "Zoo: training loss curves",
                                    "Held-out loss (bits per byte) during training, one line per model, against "
                                    "training tokens; dashed: the unigram baseline of the training text.",
                                    loss_figure(trained)))
    return before, figures, "</section>"


def write_outputs(folder: Any, findings: Findings) -> dict[str, Any]:
    """If the run has zoo models, write ``zoo_models.csv`` (per-model metrics),
    ``zoo_variants.csv`` (means and seed-to-seed spread), ``zoo_c3.csv`` (the answers) and
    ``zoo_claims.csv`` (C1-C5 per model, from the findings' zoo claims) through ``folder`` (an output
    folder with a ``table`` method); otherwise write nothing. The zoo's figures and answers are a
    section of ``report.html``."""
    zoo = findings.zoo
    if not zoo or findings.zoo_claims is None:
        return {}
    models = models_table(zoo)
    return {"zoo_models": folder.table("zoo_models", models, "csv"),
            "zoo_variants": folder.table("zoo_variants", variant_summary(models), "csv"),
            "zoo_c3": folder.table("zoo_c3", answers(models), "csv"),
            "zoo_claims": folder.table("zoo_claims", claims_by_model(zoo, findings.zoo_claims), "csv")}
