"""Shared passes in a reproduction: steps that read the same prompts share one forward pass,
and sharing changes no number."""

import pandas as pd
import pytest

from lens_position.models import load_model
from lens_position.pipeline.config import QUICK, DataOptions
from lens_position.pipeline.steps import STEPS, StepContext


def run_steps(loaded, *, share):
    ctx = StepContext(loaded=loaded, data=DataOptions())
    sizes = {name: step.sizes(QUICK, loaded.spec) for name, step in STEPS.items()}
    if share:
        for name, step in STEPS.items():
            ctx.passes.expect(step.requests(ctx, sizes[name]))
    tables = {}
    for name, step in STEPS.items():
        tables.update(step.run(ctx, sizes[name]).tables)
    return tables, ctx.passes.n_passes


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-gemma3"])
def test_steps_sharing_passes_give_the_same_tables_with_fewer_passes(model):
    loaded = load_model(model, offline=True)
    shared, shared_passes = run_steps(loaded, share=True)
    alone, alone_passes = run_steps(loaded, share=False)
    assert set(shared) == set(alone)
    for name in shared:
        pd.testing.assert_frame_equal(shared[name], alone[name], check_exact=True, obj=name)
    # decompose + probe share a pass; bos + sink reading share the base; the sink scores,
    # the natural sink rate and the auto-BOS fingerprint share one (same tokens, one batch)
    assert shared_passes <= alone_passes - 3, (shared_passes, alone_passes)
