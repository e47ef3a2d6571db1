"""Gu et al.'s sink rate under their three data conditions (and repeated tokens after a BOS), with
intervals over prompts."""

from __future__ import annotations

from functools import partial
from typing import Any

from lens_position.analyses.sinks import SINK_CONDITIONS, SinkRate, SinkScoreReducer, sink_rate, sink_rate_prompts
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import SinkScoresRequest, Sizes, Step, StepContext, StepOutput, forward_passes


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    return Sizes(T=s.sink_T, N=s.N, eps=s.eps, batch_size=s.batch_size, n_resamples=s.n_resamples)


def _protocol(ctx: StepContext) -> str:
    # Gu et al.'s protocol on the default corpus (the first T tokens of each document, with the
    # tokenizer's own BOS); a run's own text (--text) reaches this step too, but arrives as one text
    # without documents, so the sink rate is then measured on its windows under the run's BOS policy.
    return "documents" if ctx.corpus_text is None else "windows"


def _prompts(ctx: StepContext, sizes: Sizes) -> dict[str, Any]:
    ctx.spec.check_context(sizes.T)
    return ctx.shared(("sink_rate", sizes.T, sizes.N), lambda: sink_rate_prompts(
        ctx.loaded, T=sizes.T, N=sizes.N, seed=ctx.data.seed, protocol=_protocol(ctx),
        bos=None if ctx.corpus_text is None else ctx.data.bos, text=ctx.corpus_text))


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    return [Request(SinkScoresRequest(), prompts, partial(SinkScoreReducer, ctx.loaded, prompts), sizes.batch)
            for prompts in _prompts(ctx, sizes).values()]


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    conditions = list(_prompts(ctx, sizes))
    scores = dict(zip(conditions, (ctx.passes.get(request) for request in requests(ctx, sizes))))
    protocol = _protocol(ctx)
    result = sink_rate(ctx.loaded, T=sizes.T, N=sizes.N, eps=sizes.threshold, seed=ctx.data.seed, protocol=protocol,
                       bos=None if protocol == "documents" else ctx.data.bos, text=ctx.corpus_text, scores=scores,
                       batch_size=sizes.batch, bootstrap=sizes.bootstrap, progress=ctx.progress)
    return STEP.output(result, {**sizes.to_dict(), "protocol": protocol, "corpus": ctx.data.corpus})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """One pass per data condition."""
    return forward_passes(sizes, cost, passes=len(SINK_CONDITIONS))


STEP = Step("sink_rate", "sinks", sizes=sizes, run=run, work=work, result=SinkRate, requests=requests)
