"""Opt-in (``--prompt-sets K``): C1's and C2's numbers on K disjoint prompt sets, and the spread
between them beside the bootstrap's."""

from __future__ import annotations

from lens_position.analyses.decompose import decompose
from lens_position.analyses.prompt_sets import PromptSetSpread, between_sets, disjoint_prompt_sets
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, decomposition_passes, model_T


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    return Sizes(T=model_T(s, spec), N=s.N, K=s.prompt_sets, batch_size=s.batch_size, n_resamples=s.n_resamples)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    ctx.spec.check_context(sizes.T)
    sets = disjoint_prompt_sets(ctx.loaded, sizes.K or 2, T=sizes.T, N=sizes.N, source=ctx.data.source,
                                bos=ctx.data.bos, seed=ctx.data.seed, text=ctx.text())
    decompositions = [decompose(ctx.loaded, prompts, batch_size=sizes.batch, bootstrap=sizes.bootstrap,
                                progress=ctx.progress) for prompts in sets]
    result = between_sets(decompositions, name=ctx.spec.name)
    return STEP.output(result, {**sizes.to_dict(), "prompts": [p.spec for p in sets]})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """One decomposition per prompt set."""
    return decomposition_passes(sizes, cost, passes=sizes.K or 2)


STEP = Step("prompt_sets", "decompose", sizes=sizes, run=run, work=work, result=PromptSetSpread,
            options=("prompt_sets",), opt_in="--prompt-sets")
