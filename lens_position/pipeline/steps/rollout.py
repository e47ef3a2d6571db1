"""Attention rollout to position 0 by depth, with and without the residual path, on the run's
prompts at the sink-rate length, with intervals over prompts.

The whole instrument is two modules and a line of the registry: the analysis, its result, its
table's columns and its sentence in :mod:`lens_position.analyses.rollout`; here, the step that runs
it in a reproduction and the figure the report draws of its table (:data:`FIGURE`)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from lens_position.analyses.rollout import AttentionRollout, attention_rollout, rollout_sentence
from lens_position.core.estimate import ModelCost, Work
from lens_position.core.run_tables import RunTables
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes
from lens_position.pipeline.steps.sink_rate import sizes
from lens_position.report.plots import Figure, layer_lines


def run(ctx: StepContext, sizes_: Sizes) -> StepOutput:
    """Run this step on the run's prompts (at the sink-rate length): its table and provenance."""
    prompts = ctx.prompts(int(sizes_.T or 0), int(sizes_.N or 0))
    result = attention_rollout(ctx.loaded, prompts, batch_size=sizes_.batch, bootstrap=sizes_.bootstrap,
                               progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes_.to_dict()})


def work(sizes_: Sizes, cost: ModelCost) -> Work:
    """One pass reading every layer's pattern."""
    return forward_passes(sizes_, cost, passes=1)


def rollout_figure(layers: pd.DataFrame, *, by: str = "architecture") -> go.Figure:
    """The flow to position 0 after each layer, in %, through attention alone (solid) and with the
    residual path (dashed), per ``by`` group (``AttentionRollout.layers``, stacked over models)."""
    return layer_lines(layers, [("flow_without_residual", "without residual", "solid"),
                                ("flow_with_residual", "with residual", "dash")],
                       title="Attention rollout to position 0 by depth", x_title="layer (rollout after the block)",
                       y_title="share of a query's input from position 0 (%)", scale=100.0, y_range=(0, 100),
                       unit="% from position 0", by=by)


def _sentences(results: Mapping[str, pd.DataFrame]) -> list[str]:
    """Per architecture, the flow to position 0 after the last layer, alone and with the residual path."""
    frame = results.get("rollout_layers")
    if frame is None or "architecture" not in frame.columns:
        return [] if frame is None or not len(frame) else [rollout_sentence(frame)]
    part = RunTables.of(results).part
    return [rollout_sentence(part("rollout_layers", arch), arch) for arch in dict.fromkeys(frame["architecture"])]


FIGURE = Figure(
    "rollout", ("rollout_layers",), "Position 0: attention rollout by depth",
    "The share of each query's input that has flowed from position 0 after each layer, following the "
    "head-averaged attention patterns through the layers (Abnar and Zuidema's rollout), mean over prompts "
    "and queries 1 <= i < T with 95% bootstrap intervals over prompts. Solid: attention alone, the product "
    "that Wu, Wang, Jegelka and Jadbabaie prove converges to the first token under causal masking; dashed: "
    "with the residual path, each layer's pattern mixed half and half with the identity.",
    rollout_figure, lead=_sentences, after="massive")

STEP = Step("rollout", "sinks", sizes=sizes, run=run, work=work, result=AttentionRollout, figures=(FIGURE,))
