"""Position by rotary band: R split exactly over RoPE frequency bands, R' attributed to them."""

from __future__ import annotations

import pandas as pd

from lens_position.analyses.rotary_bands import RotaryBands, rotary_bands
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.steps.base import (
    Sizes,
    Step,
    StepContext,
    StepOutput,
    decomposition_passes,
    first_of,
    model_T,
)

N_BANDS = 4


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    main_T = model_T(s, spec)
    T = min(s.sink_T, main_T)
    return Sizes(T=T, first_of=first_of(T, main_T), N=s.early_N, n_bands=N_BANDS, batch_size=s.batch_size,
                 n_resamples=s.n_resamples)


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts_of(sizes)
    if ctx.spec.rope_kind == "none":  # NoPE, learned positions: no rotary frequencies to split by
        empty = pd.DataFrame({"layer": pd.Series(dtype="int64")})
        return StepOutput({table.name: empty for table in STEP.tables},
                          {"skipped": f"{ctx.spec.name} has no rotary embedding"},
                          {"prompts": prompts.spec, **sizes.to_dict()})
    result = rotary_bands(ctx.loaded, prompts, n_bands=sizes.n_bands or N_BANDS, batch_size=sizes.batch,
                          bootstrap=sizes.bootstrap, progress=ctx.progress)
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """The full decomposition and one per band."""
    return decomposition_passes(sizes, cost, passes=1 + (sizes.n_bands or N_BANDS))


STEP = Step("rotary_bands", "bands", sizes=sizes, run=run, work=work, result=RotaryBands)
