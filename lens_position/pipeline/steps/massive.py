"""Massive activations (Sun et al. 2024) per layer, the heads that read them, and, where a layer's
output holds them in half the prompts, what setting them to zero or to their mean does to the sink
rate, R' and the loss."""

from __future__ import annotations

from lens_position.analyses.massive import MODES, MassiveActivations, massive_activations, massive_intervention
from lens_position.core.estimate import ModelCost, Work
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes
from lens_position.pipeline.steps.sink_rate import sizes


def run(ctx: StepContext, sizes_: Sizes) -> StepOutput:
    """Run this step on the run's prompts (at the sink-rate length): its tables and provenance."""
    prompts = ctx.prompts(int(sizes_.T or 0), int(sizes_.N or 0))
    result = massive_activations(ctx.loaded, prompts, eps=sizes_.threshold, batch_size=sizes_.batch,
                                 bootstrap=sizes_.bootstrap, progress=ctx.progress)
    layer = result.first_layer()
    options = {"prompts": prompts.spec, **sizes_.to_dict()}
    if layer is None:
        options["intervention"] = "none: no layer's output holds a massive activation in half the prompts"
    else:
        result.interventions = massive_intervention(
            ctx.loaded, prompts, massive=result, eps=sizes_.threshold, batch_size=sizes_.batch,
            bootstrap=sizes_.bootstrap, progress=ctx.progress).frame
    return STEP.output(result, options)


def work(sizes_: Sizes, cost: ModelCost) -> Work:
    """The activation pass; where massive activations exist, the intervention's passes and decompositions
    (counted as if they always do)."""
    return forward_passes(sizes_, cost, passes=3 + 2 * len(MODES))


STEP = Step("massive", "sinks", sizes=sizes, run=run, work=work, result=MassiveActivations)
