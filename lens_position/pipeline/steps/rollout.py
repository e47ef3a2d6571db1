"""Attention rollout to position 0 by depth, with and without the residual path, on the run's
prompts at the sink-rate length, with intervals over prompts."""

from __future__ import annotations

from lens_position.analyses.rollout import AttentionRollout, attention_rollout
from lens_position.core.estimate import ModelCost, Work
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes
from lens_position.pipeline.steps.sink_rate import sizes


def run(ctx: StepContext, sizes_: Sizes) -> StepOutput:
    """Run this step on the run's prompts (at the sink-rate length): its table and provenance."""
    prompts = ctx.prompts(int(sizes_.T or 0), int(sizes_.N or 0))
    result = attention_rollout(ctx.loaded, prompts, batch_size=sizes_.batch, bootstrap=sizes_.bootstrap,
                               progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes_.to_dict()})


def work(sizes_: Sizes, cost: ModelCost) -> Work:
    """One pass reading every layer's pattern."""
    return forward_passes(sizes_, cost, passes=1)


STEP = Step("rollout", "sinks", sizes=sizes, run=run, work=work, result=AttentionRollout)
