"""Shared passes in a reproduction: steps that read the same prompts share one forward pass,
and sharing changes no number."""

import dataclasses

import pandas as pd
import pytest

from lens_position.models import load_model
from lens_position.pipeline.config import QUICK, DataOptions
from lens_position.pipeline.steps import STEPS, StepContext, step_names


def run_steps(loaded, *, share):
    steps = {name: STEPS[name] for name in step_names()}  # a default reproduction's steps (no opt-in ones)
    ctx = StepContext(loaded=loaded, data=DataOptions())
    sizes = {name: step.sizes(QUICK, loaded.spec) for name, step in steps.items()}
    if share:
        for name, step in steps.items():
            ctx.passes.expect(step.requests(ctx, sizes[name]))
    tables = {}
    for name, step in steps.items():
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
    # decompose + probe share a pass; bos + sink reading share the base; the natural sink rate and the
    # auto-BOS fingerprint share one (same tokens, one batch); the sink heads read the first positions
    # of the decomposition's prompts, as analyze() does, in a pass of their own
    assert shared_passes <= alone_passes - 2, (shared_passes, alone_passes)


def test_without_intervals_the_shared_early_base_draws_no_replicates():
    loaded = load_model("tiny-llama", offline=True)
    settings = dataclasses.replace(QUICK, n_resamples=0)
    ctx = StepContext(loaded=loaded, data=DataOptions())
    sizes = {name: STEPS[name].sizes(settings, loaded.spec) for name in ("bos", "sink_reading")}
    for name in sizes:
        ctx.passes.expect(STEPS[name].requests(ctx, sizes[name]))
    tables = {}
    for name in sizes:
        tables.update(STEPS[name].run(ctx, sizes[name]).tables)
    assert ctx.passes.n_passes == 1  # BOS replacement and the detector still share the base
    bases = [result for (_, request), result in ctx.passes._results.items() if str(request) == "decompose"]
    assert len(bases) == 1 and bases[0].replicates is None
    assert bases[0].provenance["options"]["intervals"]["n_resamples"] == 0
    assert "bos_replicates" not in tables and "decompose_early_replicates" not in tables
    for table, column in (("bos_overall", "fraction_removed_lo"), ("sink_reading", "R_change_lo"),
                          ("sink_ablation", "R_change_hi")):
        assert tables[table][column].isna().all(), (table, column)


def test_analyze_defaults_are_the_reproductions_sizes():
    """analyze's early queries and sink length are the full reproduction's: one number either way."""
    import inspect

    from lens_position.analyses.analyze import analyze
    from lens_position.pipeline.config import FULL

    defaults = {name: p.default for name, p in inspect.signature(analyze).parameters.items()}
    assert (defaults["early_queries"], defaults["sink_length"]) == (FULL.query_range[1], FULL.sink_T)
    assert FULL.query_range[0] == 0 and FULL.early_N == FULL.N
