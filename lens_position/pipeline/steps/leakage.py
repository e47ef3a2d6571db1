"""Positional leakage ΔR² per head (the measure of "Once upon a token"), in the corrected mode over
several seeds, on single sentences of the run's corpus without BOS: the report shows it per layer
beside the decomposition's R' and M'."""

from __future__ import annotations

import pandas as pd

from lens_position.analyses.leakage import (
    AUTHORS_SEED,
    MAX_LENGTH,
    PositionalLeakage,
    leakage_texts,
    positional_leakage,
)
from lens_position.core.estimate import ModelCost, Work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.steps.base import Sizes, Step, StepContext, StepOutput, forward_passes

#: seeds of a full run; a quick run (N <= 4 texts) takes two, enough for one overlap
SEEDS, QUICK_SEEDS = 3, 2


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """``N`` texts per seed (the run's ``N``), each cut to ``T`` tokens: the authors' 256, or twice the
    run's sink length when that is shorter (a quick run), within the model's context."""
    return Sizes(T=min(MAX_LENGTH, 2 * max(s.T, s.sink_T), spec.n_ctx), N=s.N,
                 n_seeds=SEEDS if s.N > 4 else QUICK_SEEDS)


def run(ctx: StepContext, sizes_: Sizes) -> StepOutput:
    """Run this step on the context's model: its tables and provenance (empty tables with the reason on
    a model without RoPE, whose rotated queries and keys do not exist)."""
    if ctx.spec.rope_kind == "none":
        empty = pd.DataFrame({"layer": pd.Series(dtype="int64")})
        return StepOutput({table.name: empty for table in STEP.tables},
                          {"skipped": f"{ctx.spec.name} has no rotary embedding"}, sizes_.to_dict())
    result = positional_leakage(ctx.loaded, leakage_texts(text=ctx.corpus_text), mode="corrected",
                                n_samples=sizes_.N, n_seeds=sizes_.n_seeds, seed=AUTHORS_SEED + ctx.data.seed,
                                max_length=sizes_.T, progress=ctx.progress)
    return STEP.output(result, sizes_.to_dict())


def work(sizes_: Sizes, cost: ModelCost) -> Work:
    """Two passes of one text per text and seed (the text and its shifted null)."""
    seeds = sizes_.n_seeds or 1
    return forward_passes(Sizes(T=sizes_.T, N=sizes_.N * seeds, batch_size=1), cost, passes=2)


STEP = Step("leakage", "leakage", sizes=sizes, run=run, work=work, result=PositionalLeakage)
