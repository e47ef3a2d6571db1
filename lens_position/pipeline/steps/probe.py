"""Position probes on the residual stream: held-out R² of log(i + 1) per layer (C3's second view)."""

from __future__ import annotations

from lens_position.analyses.probes import PROBE_MIN_N, ProbeReducer, ProbeResult
from lens_position.core.estimate import ModelCost, Work, probe_work
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.config import Settings
from lens_position.pipeline.passes import Request
from lens_position.pipeline.steps.base import ProbeRequest, Sizes, Step, StepContext, StepOutput, model_T, restrictions


def sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes this step runs with under the run's settings, for this model (T within its context)."""
    T = model_T(s, spec)
    # enough sequences for probe_positions positions in all (at least N)
    return Sizes(T=T, N=max(s.N, -(-s.probe_positions // T)), batch_size=s.batch_size, n_resamples=s.n_resamples,
                 **restrictions(s, "layers"))


def requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    """The streamed passes this step reads, as requests (steps reading the same pass share it)."""
    prompts = ctx.prompts(sizes.T, sizes.N)
    seed = ctx.data.seed
    return [Request(ProbeRequest(layers=sizes.layers, seed=seed, n_resamples=sizes.n_resamples), prompts,
                    lambda: ProbeReducer(ctx.loaded, prompts, layers=sizes.layers, seed=seed,
                                         bootstrap=sizes.bootstrap), sizes.batch)]


def run(ctx: StepContext, sizes: Sizes) -> StepOutput:
    """Run this step on the context's model and prompts: its result tables and provenance."""
    prompts = ctx.prompts(sizes.T, sizes.N)
    result, = [ctx.passes.get(request) for request in requests(ctx, sizes)]
    return STEP.output(result, {"prompts": prompts.spec, **sizes.to_dict()})


def work(sizes: Sizes, cost: ModelCost) -> Work:
    """What this step costs (forward passes, positions, replicates), for the run's estimate."""
    layers = len(sizes.layers) if sizes.layers else cost.n_layers
    return probe_work(cost, sequences=sizes.N, positions=sizes.T, batch_size=sizes.batch,
                      replicates=sizes.n_resamples or 0, layers=layers)


STEP = Step("probe", "probe", sizes=sizes, run=run, work=work, result=ProbeResult, requests=requests,
            options=("layers",),
            min_N=(PROBE_MIN_N, "a held-out probe whose penalty is chosen by cross-validation needs one test "
                   "half and two training folds"))
