"""The decomposition's components against sequence length T (part of ``decompose``): how much T
alone moves R', M' and C', and the common T at which the claims compare architectures."""

from __future__ import annotations

import dataclasses

from lens_position.analyses.length_sweep import LengthSweep, length_sweep, lengths_within
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, decomposition_passes


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The run's grid of lengths and its own T, those that fit the model's context (the longest is ``T``)."""
    grid = lengths_within(sorted(set(s.lengths) | {s.T}), spec.n_ctx) or (min(s.T, spec.n_ctx),)
    return Sizes(T=max(grid), N=s.sweep_N, lengths=tuple(grid), batch_size=s.batch_size, n_resamples=s.n_resamples)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Decompose the context's model at every length of the grid, on the condition's prompts."""
    lengths = sizes.lengths or (sizes.T,)
    result = length_sweep(ctx.loaded, lengths, N=sizes.N, source=ctx.data.source, bos=ctx.data.bos,
                          seed=ctx.data.seed, text=ctx.text(), batch_size=sizes.batch, bootstrap=sizes.bootstrap,
                          progress=ctx.progress, leave_out_short_text=True)
    return STEP.output(result, {**sizes.to_dict(), "prompts": result.provenance.get("data")})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """One decomposition per length; each is estimated at its own T."""
    parts = [decomposition_passes(dataclasses.replace(sizes, T=T), cost) for T in (sizes.lengths or (sizes.T,))]
    return sum(parts[1:], parts[0])


STEP = Step("length_sweep", "decompose", sizes=sizes, run=run, work=work, result=LengthSweep, options=("lengths",))
