"""The decomposition over all queries (C1, C2): R', M' and the total per head and layer."""

from __future__ import annotations

from lens_position.analyses.decompose import Decomposition, DecompositionReducer
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import (
    DecompositionRequest,
    Sizes,
    Step,
    StepContext,
    StepOutput,
    decomposition_passes,
    model_T,
    restrictions,
)


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    return Sizes(T=model_T(s, spec), N=s.N, batch_size=s.batch_size, n_resamples=s.n_resamples,
                 **restrictions(s, "layers", "query_range", "keys"))


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    prompts = ctx.prompts(sizes.T, sizes.N)
    keys = sizes.keys or "all"
    what = DecompositionRequest(layers=sizes.layers, query_range=sizes.query_range, keys=keys,
                                n_resamples=sizes.n_resamples)
    return [Request(what, prompts, lambda: DecompositionReducer(
        ctx.loaded, prompts, layers=sizes.layers, query_range=sizes.query_range, keys=keys,  # type: ignore[arg-type]
        bootstrap=sizes.bootstrap), sizes.batch)]


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts(sizes.T, sizes.N)
    result, = [ctx.passes.get(request) for request in requests(ctx, sizes)]
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """What this step costs (forward passes, positions, replicates), for the run's estimate."""
    return decomposition_passes(sizes, cost)


STEP = Step("decompose", "decompose", sizes=sizes, run=run, work=work, result=Decomposition, requests=requests,
            options=("layers", "query_range", "keys"))
