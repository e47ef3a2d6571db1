"""Position-0 convergence (C4's mechanism): the replaced position-0 state against the unreplaced one,
per layer, and which attention / MLP outputs restore it."""

from __future__ import annotations

import pandas as pd

from lens_position.analyses.convergence import REPLACEMENTS, Position0Convergence, position0_convergence
from lens_position.core.estimate import ModelCost, Work
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, early_sizes, forward_passes


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts_of(sizes)  # the BOS step's prompts: the same token 0
    if not ctx.loaded.backend.has_mlp:  # no MLP to restore the state with
        empty = pd.DataFrame({"layer": pd.Series(dtype="int64")})
        return StepOutput({table.name: empty for table in STEP.tables},
                          {"skipped": f"{ctx.spec.name} has no MLPs"}, {"prompts": prompts.spec, **sizes.to_dict()})
    result = position0_convergence(ctx.loaded, prompts, seed=ctx.data.seed, bootstrap=sizes.bootstrap,
                                   progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """The unreplaced run and one per replacement; no scores are reduced."""
    return forward_passes(sizes, cost, passes=1 + len(REPLACEMENTS), reads_scores=False)


STEP = Step("convergence", "bos", sizes=early_sizes, run=run, work=work, result=Position0Convergence)
