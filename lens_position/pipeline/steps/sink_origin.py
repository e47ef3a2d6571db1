"""Where each model's attention sink comes from: the sink at position 0, at the BOS and at the first
delimiter with BOS, without it, moved, doubled and replaced, and the verdict (position-driven,
BOS-driven, mixed, none) from intervals over prompts."""

from __future__ import annotations

import pandas as pd

from lens_position.analyses.sink_origin import CONDITIONS, SinkOrigin, sink_origin
from lens_position.core.estimate import ModelCost, Work
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes
from lens_position.pipeline.steps.sink_rate import sizes


def _bos_id(ctx: StepContext) -> int | None:
    tokenizer = ctx.loaded.tokenizer
    own = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else None
    return own if own is not None else ctx.spec.bos_token_id


def run(ctx: StepContext, sizes_: Sizes) -> StepOutput:
    """Run this step on the context's model: its result tables and provenance (an empty table with the
    reason where the model has no BOS token to move or remove)."""
    T, N = int(sizes_.T or 0), int(sizes_.N or 0)
    ctx.spec.check_context(T)
    if _bos_id(ctx) is None:
        empty = pd.DataFrame({"condition": pd.Series(dtype="object")})
        return StepOutput({table.name: empty for table in STEP.tables},
                          {"skipped": f"{ctx.spec.name} has no BOS token"}, sizes_.to_dict())
    result = sink_origin(ctx.loaded, T=T, N=N, seed=ctx.data.seed, text=ctx.corpus_text,
                         eps=sizes_.threshold, batch_size=sizes_.batch,
                         bootstrap=sizes_.bootstrap, progress=ctx.progress)
    return STEP.output(result, sizes_.to_dict())


def work(sizes_: Sizes, cost: ModelCost) -> Work:
    """One pass per condition."""
    return forward_passes(sizes_, cost, passes=len(CONDITIONS))


STEP = Step("sink_origin", "sinks", sizes=sizes, run=run, work=work, result=SinkOrigin)
