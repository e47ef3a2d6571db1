"""At what training budget do attention sinks form? A small sweep on the standard-RoPE recipe.

No model of the default zoo forms an attention sink (Gu et al.'s sink rate at ε = 0.3 is 0
everywhere). This sweep asks whether the budget is why: it trains the ``rope`` recipe with
more steps (tokens), a longer context and a wider model, one factor at a time, and measures
each model's sink rate and largest per-head sink score exactly as the zoo's checkpoints are
measured (:func:`lens_position.analyses.zoo.measure.measure_sinks`: pydoc topics, T = 64, N = 32,
BOS at position 0).

Points (``SINK_SWEEP``), each a change of the ``rope`` recipe, in increasing cost; each is
sized to about 10 minutes of one CPU core on an idle machine (16 000 tokens/s at d_model 64):

- ``zoo``: the shipped recipe (300 steps, 0.6 M tokens); read from the shipped ``zoo:rope``
  checkpoint when its recipe is the same, so it costs nothing;
- ``steps-4x``: 1 200 steps (2.5 M tokens);
- ``context-512``: 1 200 steps at 512 positions (batch 4: the same tokens per step);
- ``width-128``: 1 200 steps with d_model 128, d_mlp 512 (four heads of 32; 4× the parameters);
- ``steps-12x``: 3 600 steps (7.4 M tokens);
- ``steps-64x``: 19 200 steps (39.3 M tokens; about 50 minutes of one core), the sinks measured at
  each of its 24 evaluations (:func:`sink_trajectory`);
- ``steps-64x-constant-lr``: the same without learning-rate decay (is the decay what moves the score?);
- ``wd-0.5``, ``wd-0``: ``steps-12x`` with weight decay 0.5 and 0 (the recipe's is 0.1); Gu et al.
  (2025, Table 2) found moderate weight decay the strongest lever towards sinks;
- ``text-0.25``, ``text-0.0625``: ``steps-12x`` on a quarter and a sixteenth of the train text (the
  same number of training tokens, repeated more often); Gu et al. found that sinks need enough
  *distinct* text (none at 50 M tokens of it, at 60 M parameters), and the zoo's whole train split
  is 4.6 MB: does less distinct text lower the score here too?
- ``steps-64x-wd-0.5``: ``steps-64x`` with weight decay 0.5, measured along the run (the two
  levers that raised the score most, together).

Each trained point is a checkpoint (safetensors + JSON, as the zoo's) in the sweep folder
(default ``$LENS_POSITION_CACHE/zoo/sink-sweep``); a point whose checkpoint of the same
recipe is there is read, not retrained, so an interrupted sweep resumes point by point.

The table measured when the zoo was trained ships as ``sink_sweep.csv`` beside this module
(:func:`measured_sweep`; written by ``lens-position zoo sink-sweep --out``), so the docs and
the tutorial notebook read it without retraining.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lens_position.ground.errors import BadInputError
from lens_position.models.zoo.recipe import Recipe, recipe_for

if TYPE_CHECKING:
    import pandas as pd
    from transformer_lens import HookedTransformer

log = logging.getLogger(__name__)

#: The sweep's table as measured on the 2-core machine the zoo was trained on.
MEASURED = Path(__file__).parent / "sink_sweep.csv"
#: The sink score along the longest point's training (:func:`sink_trajectory`), as measured.
MEASURED_TRAJECTORY = Path(__file__).parent / "sink_trajectory.csv"
#: The points whose sinks are measured along training (at every evaluation).
TRAJECTORY_POINTS = ("steps-64x", "steps-64x-constant-lr", "steps-64x-wd-0.5")

#: (point, what changes, changes to the ``rope`` recipe), cheapest first.
SINK_SWEEP: tuple[tuple[str, str, dict], ...] = (
    ("zoo", "the shipped recipe", {}),
    ("steps-4x", "4x the steps", {"steps": 1200}),
    ("context-512", "4x the steps, context 512 (batch 4)", {"steps": 1200, "context": 512, "batch": 4}),
    ("width-128", "4x the steps, d_model 128, d_mlp 512", {"steps": 1200, "d_model": 128, "d_mlp": 512}),
    ("steps-12x", "12x the steps", {"steps": 3600}),
    ("steps-64x", "64x the steps (sinks measured along the run)", {"steps": 19200, "evaluations": 24}),
    ("steps-64x-constant-lr", "64x the steps, no learning-rate decay (sinks measured along the run)",
     {"steps": 19200, "evaluations": 24, "final_lr_fraction": 1.0}),
    ("wd-0.5", "12x the steps, weight decay 0.5 (5x)", {"steps": 3600, "weight_decay": 0.5}),
    ("wd-0", "12x the steps, no weight decay", {"steps": 3600, "weight_decay": 0.0}),
    ("text-0.25", "12x the steps on a quarter of the train text", {"steps": 3600, "train_fraction": 0.25}),
    ("text-0.0625", "12x the steps on a sixteenth of the train text", {"steps": 3600, "train_fraction": 0.0625}),
    ("steps-64x-wd-0.5", "64x the steps, weight decay 0.5 (sinks measured along the run)",
     {"steps": 19200, "evaluations": 24, "weight_decay": 0.5}),
)


def default_sweep_dir() -> Path:
    """Where the sweep's checkpoints go (``$LENS_POSITION_CACHE/zoo/sink-sweep``)."""
    from lens_position.analyses.zoo.training import default_work_dir

    return default_work_dir().parent / "sink-sweep"


def point_recipe(point: str, seed: int = 0) -> Recipe:
    """The recipe of sweep point ``point`` (the ``rope`` recipe with the point's changes;
    evaluations every sixth of the run). BadInputError naming the points otherwise."""
    points = {name: changes for name, _, changes in SINK_SWEEP}
    if point not in points:
        raise BadInputError(f"unknown sink-sweep point {point!r}; the points are " + ", ".join(points))
    base = recipe_for("rope", seed)
    if not points[point]:
        return base
    changes = dict(points[point])
    steps = changes.get("steps", base.steps)
    every = max(1, steps // changes.pop("evaluations", 6))
    return dataclasses.replace(base, variant=f"sink-{point}", eval_every=every, checkpoint_every=every, **changes)


def sink_sweep(points: Sequence[str] | None = None, *, root: Path | None = None, seed: int = 0,
               device: str | None = None, progress: bool = True) -> pd.DataFrame:
    """Train (or read) every sweep point with training seed ``seed`` and measure its sinks;
    one row per point: the seed, its budget (steps, tokens, d_model, context, parameters),
    held-out bits per byte, training seconds and tokens/s, the sink rate (fraction of heads above ε = 0.3), the largest
    per-head sink score and the largest per layer."""
    import pandas as pd

    from lens_position.analyses.zoo.measure import measure_sinks
    from lens_position.analyses.zoo.training import default_work_dir
    from lens_position.models.zoo.corpus import training_split, unigram_bits_per_byte
    from lens_position.models.zoo.store import SHIPPED, checkpoints, model_name, save_checkpoint
    from lens_position.models.zoo.train import train

    root = root or default_sweep_dir()
    names = list(points) if points else [p for p, _, _ in SINK_SWEEP]
    recipes = {p: point_recipe(p, seed) for p in names}
    described = {p: d for p, d, _ in SINK_SWEEP}
    corpus, unigram = None, None
    rows = []
    for point, recipe in recipes.items():
        found = {c.name: c for c in [*checkpoints(root), *checkpoints(SHIPPED)]}
        checkpoint = found.get(model_name(recipe.variant, recipe.seed))
        if checkpoint is None or checkpoint.meta["recipe_sha256"] != recipe.sha256():
            if corpus is None or unigram is None:
                corpus = training_split()
                unigram = unigram_bits_per_byte(corpus)
            result = train(recipe, work_dir=default_work_dir(), device=device, progress=progress, corpus=corpus,
                           on_eval=partial(sinks_along_training, recipe=recipe))
            checkpoint = save_checkpoint(root, result, corpus, unigram)
        if "sinks" not in checkpoint.meta:
            checkpoint = measure_sinks(checkpoint, root=checkpoint.weights.parents[1])
        sinks = checkpoint.meta["sinks"]
        rows.append({
            "point": point, "seed": seed, "change": described[point], "steps": recipe.steps, "tokens": recipe.tokens,
            "d_model": recipe.d_model, "context": recipe.context, "parameters": checkpoint.meta["n_parameters"],
            "weight_decay": recipe.weight_decay, "train_text_bytes": train_text_bytes(recipe.train_fraction),
            "held_out_bits": checkpoint.meta["held_out_bits_per_byte"],
            "train_seconds": checkpoint.meta["train_seconds"],
            "tokens_per_second": checkpoint.meta["tokens_per_second"],
            "sink_rate": sinks["sink_rate"], "max_sink_score": sinks["max_sink_score"],
            "max_sink_score_by_layer": " ".join(f"{x:.3f}" for x in sinks["sink_score_by_layer"]),
        })
        log.info("sink sweep %s: sink rate %.3f, max score %.3f", point, sinks["sink_rate"], sinks["max_sink_score"])
    return pd.DataFrame(rows)


def train_text_bytes(fraction: float) -> int:
    """Bytes of distinct text a recipe with this ``train_fraction`` trains on (this Python's corpus)."""
    from lens_position.models.zoo.corpus import train_subset, training_split

    return len(train_subset(training_split().train, fraction))


def sinks_along_training(model: HookedTransformer, *, recipe: Recipe) -> dict[str, float]:
    """The sink measurement of a model still training (on a copy, in eval mode): its sink
    rate and largest per-head sink score, as :func:`measure.sink_measurement` measures a
    finished checkpoint. ``train``'s ``on_eval`` adds them to each point of the loss curve."""
    from lens_position.analyses.zoo.measure import sink_measurement
    from lens_position.models.zoo.store import as_loaded_model

    loaded = as_loaded_model(copy.deepcopy(model), recipe, name=f"zoo:{recipe.variant} (training)",
                             source="training")
    sinks = sink_measurement(loaded)
    return {"sink_rate": sinks["sink_rate"], "max_sink_score": sinks["max_sink_score"]}


def sink_trajectory(point: str, *, root: Path | None = None, seed: int = 0) -> pd.DataFrame:
    """How the sink score grew along one sweep point's training with ``seed``: one row per
    evaluation (``seed``, ``step``, ``tokens``, learning rate at that step, held-out bits per
    byte, sink rate, largest per-head sink score), read from the finished checkpoint or, while the point is
    still training (or was interrupted), from its resume file. Empty when the point has not
    been trained with sink measurements (points trained before they were added)."""
    import pandas as pd

    from lens_position.analyses.zoo.training import default_work_dir
    from lens_position.models.zoo.store import checkpoints, model_name
    from lens_position.models.zoo.train import read_resume

    recipe = point_recipe(point, seed)
    root = root or default_sweep_dir()
    found = {c.name: c for c in checkpoints(root)}.get(model_name(recipe.variant, recipe.seed))
    curve: list[dict] = []
    finished = found is not None and found.meta["recipe_sha256"] == recipe.sha256()
    if found is not None and finished:
        curve = found.meta["curve"]
    else:
        resume = default_work_dir() / f"{recipe.variant}-seed{recipe.seed}.resume.pt"
        if resume.is_file():
            state = read_resume(resume)
            if state["recipe_sha256"] == recipe.sha256():
                curve = state["curve"]
    rows = [{"point": point, "seed": seed, "step": c["step"], "tokens": c["tokens"],
             "lr": recipe.lr_at(c["step"] - 1),
             "held_out_bits": c["held_out_bits"], "sink_rate": c["sink_rate"],
             "max_sink_score": c["max_sink_score"], "finished": finished}
            for c in curve if "max_sink_score" in c]
    columns = ["point", "seed", "step", "tokens", "lr", "held_out_bits", "sink_rate", "max_sink_score", "finished"]
    return pd.DataFrame(rows, columns=columns)


def sweep_markdown(table: pd.DataFrame) -> str:
    """The sweep's table as Markdown (for the docs)."""
    lines = ["| point | seed | change | steps | tokens | d_model | context | parameters | weight decay | "
             "distinct text | held-out bits/byte | train s | sink rate | max sink score | max score by layer |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in _with_seeds(table).itertuples():
        lines.append(f"| `{r.point}` | {r.seed} | {r.change} | {r.steps} | {r.tokens / 1e6:.1f} M | {r.d_model} | "
                     f"{r.context} | {r.parameters / 1e6:.2f} M | {r.weight_decay:g} | "
                     f"{r.train_text_bytes / 1e6:.2f} MB | "
                     f"{r.held_out_bits:.3f} | {r.train_seconds:.0f} | "
                     f"{r.sink_rate:.3f} | {r.max_sink_score:.3f} | {r.max_sink_score_by_layer} |")
    return "\n".join(lines)


def _with_seeds(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with a ``seed`` column (tables written before seeds were recorded are seed 0's)."""
    return table if "seed" in table.columns else table.assign(seed=0)


def measured_sweep() -> pd.DataFrame:
    """The shipped sweep table (``MEASURED``): the columns of :func:`sink_sweep`."""
    import pandas as pd

    return pd.read_csv(MEASURED)


def measured_trajectory() -> pd.DataFrame:
    """The shipped trajectory table (``MEASURED_TRAJECTORY``): the columns of :func:`sink_trajectory`."""
    import pandas as pd

    return pd.read_csv(MEASURED_TRAJECTORY)


def trajectory_sentence(trajectory: pd.DataFrame, eps: float = 0.3) -> str:
    """When, along one long training run (the rows of one point and seed), a head's sink score first exceeded
    ``eps``, in words built from the trajectory's numbers (or how far it got if it never did)."""
    if trajectory.empty:
        return "No trajectory measured (the long sweep point has not been trained with sink measurements)."
    trajectory = _with_seeds(trajectory)
    if trajectory[["point", "seed"]].drop_duplicates().shape[0] > 1:
        raise ValueError("trajectory_sentence reads one run's trajectory; pass the rows of one point and seed")
    point, seed = trajectory["point"].iloc[0], int(trajectory["seed"].iloc[0])
    last = trajectory.iloc[-1]
    recipe = point_recipe(point)
    total = recipe.tokens
    schedule = ("constant learning rate after warm-up" if recipe.final_lr_fraction == 1.0
                else f"cosine learning-rate decay to {recipe.final_lr_fraction:g} of its peak")
    if recipe.weight_decay != recipe_for("rope").weight_decay:
        schedule += f", weight decay {recipe.weight_decay:g}"
    run = (f"along `{point}` seed {seed} ({total / 1e6:.1f} M tokens, {schedule}"
           + ("" if bool(last["finished"]) else f"; measured up to {last['tokens'] / 1e6:.1f} M tokens so far") + ")")
    first = trajectory.iloc[0]
    crossed = trajectory[trajectory["max_sink_score"] > eps]
    if len(crossed):
        at = crossed.iloc[0]
        before = trajectory[trajectory["step"] < at["step"]]
        since = (f", after {before['max_sink_score'].iloc[-1]:.3f} at {before['tokens'].iloc[-1] / 1e6:.1f} M"
                 if len(before) else "")
        after = trajectory[trajectory["step"] >= at["step"]]
        held = int((after["max_sink_score"] > eps).sum())
        return (f"Sinks form {run}: the largest head score first exceeds ε = {eps:g} at {at['tokens'] / 1e6:.1f} M "
                f"tokens (step {int(at['step'])}, learning rate {at['lr']:.2g}): {at['max_sink_score']:.3f}{since}; "
                f"it is above ε at {held} of the {len(after)} measurements from there on; "
                f"sink rate {at['sink_rate']:.3f} there and {last['sink_rate']:.3f} at the last measurement "
                f"({last['tokens'] / 1e6:.1f} M tokens, largest score {last['max_sink_score']:.3f}).")
    top = trajectory.loc[trajectory["max_sink_score"].idxmax()]
    return (f"No sink {run}: the largest head score went from {first['max_sink_score']:.3f} at "
            f"{first['tokens'] / 1e6:.1f} M tokens to {last['max_sink_score']:.3f} at {last['tokens'] / 1e6:.1f} M "
            f"(highest {top['max_sink_score']:.3f}, at {top['tokens'] / 1e6:.1f} M), never above ε = {eps:g}.")


def seeds_sentence(trajectory: pd.DataFrame, eps: float = 0.3) -> str:
    """In how many of one point's seeds a head's sink score exceeded ``eps`` along training, with
    when each one first did and how high the others got, in words built from the trajectories
    (the rows of one point, any number of seeds)."""
    trajectory = _with_seeds(trajectory)
    if trajectory.empty:
        return "No trajectory measured."
    if trajectory["point"].nunique() > 1:
        raise ValueError("seeds_sentence reads one point's trajectories; pass the rows of one point")
    point = trajectory["point"].iloc[0]
    formed, never, partial = [], [], []
    for seed, rows in trajectory.groupby("seed", sort=True):
        last = rows.iloc[-1]
        if not bool(last["finished"]):
            partial.append(f"seed {seed} up to {last['tokens'] / 1e6:.1f} M")
        crossed = rows[rows["max_sink_score"] > eps]
        if len(crossed):
            formed.append(f"seed {seed} (first at {crossed['tokens'].iloc[0] / 1e6:.1f} M tokens, "
                          f"{last['max_sink_score']:.3f} at the last measurement)")
        else:
            never.append((seed, rows["max_sink_score"].max()))
    n = trajectory["seed"].nunique()
    tokens = point_recipe(point).tokens
    text = (f"Across {n} seed{'s' * (n != 1)} of `{point}` ({tokens / 1e6:.1f} M tokens each), a head's sink "
            f"score exceeded ε = {eps:g} in {len(formed)}" + (": " + "; ".join(formed) if formed else "") + ".")
    if never:
        seeds = _in_words([f"{seed}" for seed, _ in never])
        highest = _in_words([f"{top:.3f}" for _, top in never])
        text += (f" It never did in seed{'s' * (len(never) > 1)} {seeds} "
                 f"(highest score {highest}{' respectively' * (len(never) > 1)}).")
    if partial:
        text += f" Still training: {', '.join(partial)} tokens measured."
    return text


def trajectory_sentences(trajectory: pd.DataFrame, eps: float = 0.3) -> list[str]:
    """Every run's :func:`trajectory_sentence` (one per point and seed, in the table's order), then
    :func:`seeds_sentence` for each point measured with more than one seed."""
    trajectory = _with_seeds(trajectory)
    runs = [trajectory_sentence(rows, eps) for _, rows in trajectory.groupby(["point", "seed"], sort=False)]
    seeded = [seeds_sentence(rows, eps) for _, rows in trajectory.groupby("point", sort=False)
              if rows["seed"].nunique() > 1]
    return runs + seeded


def _in_words(items: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def trajectory_markdown(trajectory: pd.DataFrame, every: int = 1) -> str:
    """The trajectory as a Markdown table (every ``every``-th evaluation of each point, and
    always its last), for the docs."""
    lines = ["| point | seed | step | tokens | learning rate | held-out bits/byte | sink rate | max sink score |",
             "|---|---|---|---|---|---|---|---|"]
    for _, rows in _with_seeds(trajectory).groupby(["point", "seed"], sort=False):
        keep = [k for k in range(len(rows)) if (k + 1) % every == 0 or k == len(rows) - 1]
        for r in rows.iloc[keep].itertuples():
            lines.append(f"| `{r.point}` | {r.seed} | {r.step} | {r.tokens / 1e6:.1f} M | {r.lr:.2g} | "
                         f"{r.held_out_bits:.3f} | {r.sink_rate:.3f} | {r.max_sink_score:.3f} |")
    return "\n".join(lines)


def trajectory_figure(trajectory: pd.DataFrame, eps: float = 0.3) -> Any:
    """The largest head sink score (solid) and the sink rate (dotted) along training, one
    colour per sweep point and seed (x: tokens seen, millions), with ε drawn: where the score
    crosses it, a sink has formed."""
    import plotly.graph_objects as go
    from plotly.colors import qualitative

    figure = go.Figure()
    for k, ((point, seed), rows) in enumerate(_with_seeds(trajectory).groupby(["point", "seed"], sort=False)):
        colour = qualitative.Plotly[k % len(qualitative.Plotly)]
        millions = rows["tokens"] / 1e6
        figure.add_scatter(x=millions, y=rows["max_sink_score"], mode="lines+markers", line_color=colour,
                           name=f"{point} seed {seed}: largest head sink score")
        figure.add_scatter(x=millions, y=rows["sink_rate"], mode="lines", line=dict(color=colour, dash="dot"),
                           name=f"{point} seed {seed}: sink rate (fraction of (prompt, head) > ε)")
    figure.add_hline(y=eps, line_dash="dash", annotation_text=f"ε = {eps:g}")
    figure.update_layout(title="Attention sinks along training (the rope recipe with more steps)",
                         xaxis_title="training tokens (millions)", yaxis_title="score / rate (fraction)",
                         yaxis_range=[0, 1], template="plotly_white")
    return figure


def sweep_sentence(table: pd.DataFrame, eps: float = 0.3) -> str:
    """What the sweep found, in words built from its numbers: the cheapest point where a head's
    mean attention on position 0 exceeds ``eps``, or (none) how the largest head score moved
    from the zoo's budget to the largest budget tried."""
    table = _with_seeds(table)
    formed = table[table["max_sink_score"] > eps]
    first = table.iloc[0]
    if len(formed):
        point = formed.iloc[0]
        seeds = table[table["point"] == point["point"]]
        which = ("" if len(seeds) == 1 else
                 f" in seed {point['seed']}, and above ε in {int((seeds['max_sink_score'] > eps).sum())} of the "
                 f"{len(seeds)} seeds measured there")
        return (f"Sinks form at `{point['point']}` ({point['change']}: {point['tokens'] / 1e6:.1f} M tokens, "
                f"{point['parameters'] / 1e6:.2f} M parameters, context {point['context']}): largest head score "
                f"{point['max_sink_score']:.3f} > ε = {eps:g}, sink rate {point['sink_rate']:.3f}{which}, against "
                f"{first['max_sink_score']:.3f} at the zoo's budget.")
    biggest = table.loc[(table["tokens"] * table["parameters"]).idxmax()]
    top = table.loc[table["max_sink_score"].idxmax()]
    low, high = table["sink_rate"].min(), table["sink_rate"].max()
    rates = f"sink rate {low:.3f} at every point" if low == high else f"sink rates {low:.3f}–{high:.3f}"
    highest = "" if top["point"] == biggest["point"] else (
        f" The highest score, {top['max_sink_score']:.3f}, is at `{top['point']}` ({top['change']}).")
    extremes = "; ".join(
        f"the most {what}: `{row['point']}`, {fmt(row[column])}"
        for what, column, fmt in (("tokens", "tokens", lambda x: f"{x / 1e6:.1f} M"),
                                  ("parameters", "parameters", lambda x: f"{x / 1e6:.2f} M"),
                                  ("context", "context", lambda x: f"{x}"))
        for row in [table.loc[table[column].idxmax()]])
    return (f"No point of the sweep formed a sink (every head's mean score ≤ ε = {eps:g}; {rates}). The largest "
            f"head score went from {first['max_sink_score']:.3f} at the zoo's budget ({first['tokens'] / 1e6:.1f} M "
            f"tokens) to {biggest['max_sink_score']:.3f} at the largest budget tried (`{biggest['point']}`: "
            f"{biggest['tokens'] / 1e6:.1f} M tokens, {biggest['parameters'] / 1e6:.2f} M parameters).{highest} "
            f"Sinks need a larger budget than any point tried here ({extremes}).")
