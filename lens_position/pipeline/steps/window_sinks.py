"""Window-aware sinks: Gu et al.'s score beside the score on the first key each query can see."""

from __future__ import annotations

from lens_position.analyses.sinks import WindowSinks, window_sinks
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes, model_T


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    # past the window the two metrics differ: the model's T (raised above a sliding window), early_N sequences
    return Sizes(T=model_T(s, spec), N=s.early_N, eps=s.eps, batch_size=s.batch_size, n_resamples=s.n_resamples)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts(sizes.T, sizes.N)
    result = window_sinks(ctx.loaded, prompts, eps=sizes.threshold, batch_size=sizes.batch, bootstrap=sizes.bootstrap,
                          progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """What this step costs (forward passes, positions, replicates), for the run's estimate."""
    return forward_passes(sizes, cost)


STEP = Step("window_sinks", "sinks", sizes=sizes, run=run, work=work, result=WindowSinks)
