"""BOS replacement (C4): the share of R' removed at early queries when the BOS embedding is replaced."""

from __future__ import annotations

from lens_position.analyses.bos import REPLACEMENTS, BosReplacement, bos_replacement
from lens_position.core.estimate import ModelCost, Work
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import (
    Sizes,
    Step,
    StepContext,
    StepOutput,
    decomposition_passes,
    early_decomposition_requests,
    early_sizes,
)

NEEDS_BOS = "BOS replacement"


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    return early_decomposition_requests(ctx, sizes, activations=False)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts_of(sizes)
    ctx.need_bos(prompts, NEEDS_BOS)
    base, = [ctx.passes.get(request) for request in requests(ctx, sizes)]
    result = bos_replacement(ctx.loaded, prompts, query_range=sizes.query_range or (0, sizes.T), seed=ctx.data.seed,
                             base=base, batch_size=sizes.batch, bootstrap=sizes.bootstrap, progress=ctx.progress)
    # the base run is the decomposition at early queries: C2 reports it beside the all-queries criterion
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """The unreplaced decomposition and one per replacement."""
    return decomposition_passes(sizes, cost, passes=1 + len(REPLACEMENTS))


STEP = Step("bos", "bos", sizes=early_sizes, run=run, work=work, result=BosReplacement, requests=requests,
            options=("query_range",), needs_bos=NEEDS_BOS)
