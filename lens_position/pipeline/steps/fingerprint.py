"""The position-0 fingerprint (C5): the spread of resid[:, 0] across inputs with auto-BOS and with
varying token 0, its norm, its cosine to the BOS fingerprint."""

from __future__ import annotations

from typing import Any

from lens_position.analyses.fingerprint import (
    Fingerprint,
    fingerprint,
    fingerprint_prompts,
    fingerprint_tokens,
    position0_reducer,
)
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import Position0Request, Sizes, Step, StepContext, StepOutput, forward_passes


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    return Sizes(T=s.sink_T, N=s.N, batch_size=s.batch_size)


def _prompts(ctx: StepContext, sizes: Sizes) -> dict[str, Any]:
    ctx.spec.check_context(sizes.T)
    return ctx.shared(("fingerprint", sizes.T, sizes.N), lambda: fingerprint_prompts(
        ctx.loaded, T=sizes.T, N=sizes.N, seed=ctx.data.seed, source=ctx.data.source, text=ctx.text()))


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    # each prompt set in batches of the run's size (one batch at the defaults), over the positions it runs
    return [Request(Position0Request(), fingerprint_tokens(condition, prompts), lambda: position0_reducer(ctx.loaded),
                    min(sizes.batch, len(prompts.tokens)))
            for condition, prompts in _prompts(ctx, sizes).items()]


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    conditions = list(_prompts(ctx, sizes))
    position0 = dict(zip(conditions, (ctx.passes.get(request) for request in requests(ctx, sizes))))
    result = fingerprint(ctx.loaded, T=sizes.T, N=sizes.N, seed=ctx.data.seed, source=ctx.data.source,
                         text=ctx.text(), position0=position0, batch_size=sizes.batch, progress=ctx.progress)
    return STEP.output(result, {**sizes.to_dict(), "corpus": ctx.data.corpus})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """With and without BOS, each set in batches of the run's size."""
    return forward_passes(sizes, cost, passes=2, reads_scores=False)


STEP = Step("fingerprint", "fingerprint", sizes=sizes, run=run, work=work, result=Fingerprint, requests=requests)
