"""Sink heads (Gu et al.'s metric, eps = 0.3): mean attention on position 0 per head."""

from __future__ import annotations

from lens_position.analyses.sinks import SinkHeads, SinkScoreReducer, sink_heads
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import (
    SinkScoresRequest,
    Sizes,
    Step,
    StepContext,
    StepOutput,
    first_of,
    forward_passes,
    model_T,
)


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    main_T = model_T(s, spec)
    T = min(s.sink_T, main_T)
    return Sizes(T=T, first_of=first_of(T, main_T), N=s.N, eps=s.eps, batch_size=s.batch_size,
                 n_resamples=s.n_resamples)


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    prompts = ctx.prompts_of(sizes)
    return [Request(SinkScoresRequest(), prompts, lambda: SinkScoreReducer(ctx.loaded, prompts), sizes.batch)]


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts_of(sizes)
    scores, = [ctx.passes.get(request) for request in requests(ctx, sizes)]
    result = sink_heads(ctx.loaded, prompts, eps=sizes.threshold, scores=scores, batch_size=sizes.batch,
                        bootstrap=sizes.bootstrap, progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """What this step costs (forward passes, positions, replicates), for the run's estimate."""
    return forward_passes(sizes, cost)


STEP = Step("sink_heads", "sinks", sizes=sizes, run=run, work=work, result=SinkHeads, requests=requests)
