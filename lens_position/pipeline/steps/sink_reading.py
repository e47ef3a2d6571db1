"""Sink-reading heads: the heads whose output or R changes when only their own position-0 key and
value are patched with the counterfactual fingerprint; the top ones ablated."""

from __future__ import annotations

from lens_position.analyses.sinks import SinkReading, sink_reading_heads
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

NEEDS_BOS = "finding sink-reading heads (position 0 with and without BOS)"


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    return early_decomposition_requests(ctx, sizes, activations=True)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts_of(sizes)
    ctx.need_bos(prompts, NEEDS_BOS)
    base = tuple(ctx.passes.get(request) for request in requests(ctx, sizes))
    result = sink_reading_heads(ctx.loaded, prompts, counterfactual="no-bos",
                                query_range=sizes.query_range or (0, sizes.T), base=base,
                                batch_size=sizes.batch, bootstrap=sizes.bootstrap, progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """The base run, the counterfactual's, the patched run and the zero and mean ablations."""
    return decomposition_passes(sizes, cost, passes=5)


STEP = Step("sink_reading", "sinks", sizes=early_sizes, run=run, work=work, result=SinkReading, requests=requests,
            options=("query_range",), needs_bos=NEEDS_BOS)
