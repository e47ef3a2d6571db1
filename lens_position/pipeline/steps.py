"""The steps of a reproduction, each one value in one registry (``STEPS``).

A ``Step`` says its name (the tables it writes are the registry's, ``analyses.tables``), the
sub-command that runs it, how its sizes follow from the run's ``Settings`` and the model's
``ModelSpec``, and how it runs on a loaded model. The command line, the step cache, the
report and the executors all read this registry; adding a step is adding one value here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pandas as pd

from lens_position.analyses.tables import step_frames, tables_of_step
from lens_position.ground.errors import BadInputError
from lens_position.pipeline.config import DataOptions, Settings
from lens_position.pipeline.passes import Request, SharedPasses


@dataclass
class StepOutput:
    """What running a step returns: its tables, the experiment's provenance, and the
    options it ran with (prompt spec and sizes) for the run's provenance."""

    tables: dict[str, pd.DataFrame]
    provenance: dict[str, Any]
    options: dict[str, Any]


@dataclass
class StepContext:
    """What a step sees: the loaded model, one data condition with its corpus text (read once
    by the driver, so workers need no access to the user's files), and a prompt-set memo
    (most steps share a prompt set)."""

    loaded: Any
    data: DataOptions
    progress: bool = False
    corpus_text: str | None = None
    corpus_name: str | None = None  # how the corpus is named in prompt specs ("file:/...", ...)
    _prompts: dict[tuple, Any] = field(default_factory=dict)
    _passes: SharedPasses | None = None

    @property
    def passes(self) -> SharedPasses:
        """The forward passes shared between this model's steps (``pipeline.passes``)."""
        if self._passes is None:
            self._passes = SharedPasses(self.loaded, progress=self.progress)
        return self._passes

    @property
    def spec(self) -> Any:
        return self.loaded.spec

    def text(self) -> str | None:
        """The natural text every step builds its prompts from (None: the default corpus)."""
        return self.corpus_text if self.data.source == "natural" else None

    def prompts(self, T: int, N: int) -> Any:
        from lens_position.core.data import build_prompts

        self.spec.check_context(T)
        key = (T, N)
        if key not in self._prompts:
            prompts = build_prompts(self.loaded, source=self.data.source, T=T, N=N, bos=self.data.bos,
                                    seed=self.data.seed, text=self.text())
            if self.text() is not None and self.corpus_name is not None:
                # The text came from a named corpus: name it, not "text", in the prompt spec.
                prompts = dataclasses.replace(prompts, spec=dataclasses.replace(prompts.spec,
                                                                                corpus=self.corpus_name))
            self._prompts[key] = prompts
        return self._prompts[key]

    def need_bos(self, prompts: Any, what: str) -> None:
        if not prompts.has_bos:
            raise BadInputError(f"{what} needs BOS at position 0, but the prompts of {self.spec.name} have none "
                                f"under --bos {self.data.bos}; use --bos force")


@dataclass(frozen=True)
class Step:
    """One step: ``sizes(settings, spec)`` gives the sizes it runs with on a model (they are
    part of its cache key); ``run(ctx, sizes)`` measures and returns a ``StepOutput``.
    ``needs_bos`` names what needs BOS at position 0 (checked before any forward pass).
    ``requests(ctx, sizes)``: the reducers it reads from shared passes (``pipeline.passes``),
    announced before the model's steps run so that one pass feeds them all. ``opt_in``: the
    command-line option that adds an opt-in step (such a step is in no command by default)."""

    name: str
    command: str
    sizes: Callable[[Settings, Any], dict[str, Any]]
    run: Callable[[StepContext, Mapping[str, Any]], StepOutput]
    needs_bos: str | None = None
    requests: Callable[[StepContext, Mapping[str, Any]], list[Request]] = lambda ctx, sizes: []
    opt_in: str | None = None

    @property
    def tables(self) -> tuple[str, ...]:
        """The tables this step writes (``lens_position.analyses.tables.TABLES``)."""
        return tables_of_step(self.name)


def model_T(settings: Settings, spec: Any) -> int:
    """T for this model: raised to ``window_factor · window`` when it has sliding-window layers."""
    T = settings.T
    if spec.has_sliding_window:
        T = max(T, int(-(-settings.window_factor * spec.window // 1)))
    return T


def _early(s: Settings, spec: Any) -> dict[str, Any]:
    early_T = min(s.query_range[1], model_T(s, spec))
    return {"T": early_T, "N": s.early_N, "query_range": (s.query_range[0], early_T), "batch_size": s.batch_size,
            "n_resamples": s.n_resamples}


def _restrictions(s: Settings, *names: str) -> dict[str, Any]:
    """The command line's restrictions a step uses (``layers``, ``query_range``, ``keys``), only
    where they differ from analysing everything, so an unrestricted step keeps its cache key."""
    given = {"layers": list(s.layers) if s.layers is not None else None,
             "query_range": list(s.decompose_queries) if s.decompose_queries is not None else None,
             "keys": s.keys if s.keys != "all" else None}
    return {name: given[name] for name in names if given[name] is not None}


def _bootstrap(sizes: Mapping[str, Any]) -> Any:
    from lens_position.core.intervals import Bootstrap

    return Bootstrap(n_resamples=sizes["n_resamples"])


def _decompose_requests(ctx: StepContext, sizes: Mapping[str, Any]) -> list[Request]:
    from lens_position.analyses.decompose import DecompositionReducer

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    query_range = tuple(sizes["query_range"]) if sizes.get("query_range") is not None else None
    options = dict(layers=sizes.get("layers"), query_range=query_range, keys=sizes.get("keys", "all"))
    return [Request(f"decompose {options} n_resamples={sizes['n_resamples']}", prompts,
                    lambda: DecompositionReducer(ctx.loaded, prompts, bootstrap=_bootstrap(sizes), **options),
                    sizes["batch_size"])]


def _run_decompose(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result, = [ctx.passes.get(request) for request in _decompose_requests(ctx, sizes)]
    return StepOutput(step_frames("decompose", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _probe_requests(ctx: StepContext, sizes: Mapping[str, Any]) -> list[Request]:
    from lens_position.analyses.probes import ProbeReducer

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    options = dict(layers=sizes.get("layers"), seed=ctx.data.seed)
    return [Request(f"probe {options} n_resamples={sizes['n_resamples']}", prompts,
                    lambda: ProbeReducer(ctx.loaded, prompts, bootstrap=_bootstrap(sizes), **options),
                    sizes["batch_size"])]


def _run_probe(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result, = [ctx.passes.get(request) for request in _probe_requests(ctx, sizes)]
    return StepOutput(step_frames("probe", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _early_requests(ctx: StepContext, sizes: Mapping[str, Any], *, activations: bool) -> list[Request]:
    """The un-intervened early-query pass that BOS replacement and the sink-reading detector
    compare with: its decomposition and (for the detector) the activations it reuses."""
    from lens_position.analyses.decompose import DecompositionReducer
    from lens_position.analyses.sinks import base_activation_names
    from lens_position.core.stream import WholeActivations

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    query_range = tuple(sizes["query_range"])
    # with intervals off (n_resamples = 0) the base keeps halves, not sequences, and draws no replicates
    requests = [Request(f"decompose query_range={query_range} n_resamples={sizes['n_resamples']}", prompts,
                        lambda: DecompositionReducer(ctx.loaded, prompts, query_range=query_range,
                                                     bootstrap=_bootstrap(sizes)),
                        sizes["batch_size"])]
    if activations:
        requests.append(Request("sink-reading base activations", prompts,
                                lambda: WholeActivations(base_activation_names(ctx.loaded)), sizes["batch_size"]))
    return requests


def _run_bos(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.bos import bos_replacement

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    ctx.need_bos(prompts, "BOS replacement")
    base, = [ctx.passes.get(request) for request in _early_requests(ctx, sizes, activations=False)]
    result = bos_replacement(ctx.loaded, prompts, query_range=tuple(sizes["query_range"]), seed=ctx.data.seed,
                             base=base, batch_size=sizes["batch_size"], bootstrap=_bootstrap(sizes),
                             progress=ctx.progress)
    # the base run is the decomposition at early queries: C2 reports it beside the all-queries criterion
    return StepOutput(step_frames("bos", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _sink_heads_requests(ctx: StepContext, sizes: Mapping[str, Any]) -> list[Request]:
    from lens_position.analyses.sinks import SinkScoreReducer

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    return [Request("sink scores", prompts, lambda: SinkScoreReducer(ctx.loaded, prompts), sizes["batch_size"])]


def _run_sink_heads(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.sinks import sink_heads

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    scores, = [ctx.passes.get(request) for request in _sink_heads_requests(ctx, sizes)]
    result = sink_heads(ctx.loaded, prompts, eps=sizes["eps"], scores=scores, batch_size=sizes["batch_size"],
                        bootstrap=_bootstrap(sizes), progress=ctx.progress)
    return StepOutput(step_frames("sink_heads", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _sink_rate_prompts(ctx: StepContext, sizes: Mapping[str, Any]) -> dict[str, Any]:
    from lens_position.analyses.sinks import sink_rate_prompts

    ctx.spec.check_context(sizes["T"])
    # Gu et al.'s protocol on the default corpus (the first T tokens of each document, with the
    # tokenizer's own BOS); a run's own text (--text) reaches this step too, but arrives as one text
    # without documents, so the sink rate is then measured on its windows under the run's BOS policy.
    key = ("sink_rate", sizes["T"], sizes["N"])
    if key not in ctx._prompts:
        ctx._prompts[key] = sink_rate_prompts(ctx.loaded, T=sizes["T"], N=sizes["N"], seed=ctx.data.seed,
                                              protocol=_sink_rate_protocol(ctx),
                                              bos=None if ctx.corpus_text is None else ctx.data.bos,
                                              text=ctx.corpus_text)
    return ctx._prompts[key]


def _sink_rate_protocol(ctx: StepContext) -> str:
    return "documents" if ctx.corpus_text is None else "windows"


def _sink_rate_requests(ctx: StepContext, sizes: Mapping[str, Any]) -> list[Request]:
    from lens_position.analyses.sinks import SinkScoreReducer

    return [Request("sink scores", prompts, lambda prompts=prompts: SinkScoreReducer(ctx.loaded, prompts),
                    sizes["batch_size"]) for prompts in _sink_rate_prompts(ctx, sizes).values()]


def _run_sink_rate(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.sinks import sink_rate

    conditions = list(_sink_rate_prompts(ctx, sizes))
    scores = dict(zip(conditions, (ctx.passes.get(request) for request in _sink_rate_requests(ctx, sizes))))
    protocol = _sink_rate_protocol(ctx)
    result = sink_rate(ctx.loaded, T=sizes["T"], N=sizes["N"], eps=sizes["eps"], seed=ctx.data.seed,
                       protocol=protocol, bos=None if protocol == "documents" else ctx.data.bos,
                       text=ctx.corpus_text, scores=scores, batch_size=sizes["batch_size"],
                       bootstrap=_bootstrap(sizes),
                       progress=ctx.progress)
    return StepOutput(step_frames("sink_rate", result), result.provenance,
                      {**sizes, "protocol": protocol, "corpus": ctx.data.corpus})


def _run_sink_reading(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.sinks import sink_reading_heads

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    ctx.need_bos(prompts, "finding sink-reading heads (position 0 with and without BOS)")
    base = tuple(ctx.passes.get(request) for request in _early_requests(ctx, sizes, activations=True))
    result = sink_reading_heads(ctx.loaded, prompts, counterfactual="no-bos",
                                query_range=tuple(sizes["query_range"]), base=base, batch_size=sizes["batch_size"],
                                bootstrap=_bootstrap(sizes), progress=ctx.progress)
    return StepOutput(step_frames("sink_reading", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _run_prompt_sets(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.decompose import decompose
    from lens_position.analyses.prompt_sets import between_sets, disjoint_prompt_sets

    ctx.spec.check_context(sizes["T"])
    sets = disjoint_prompt_sets(ctx.loaded, sizes["K"], T=sizes["T"], N=sizes["N"], source=ctx.data.source,
                                bos=ctx.data.bos, seed=ctx.data.seed, text=ctx.text())
    decompositions = [decompose(ctx.loaded, prompts, batch_size=sizes["batch_size"], bootstrap=_bootstrap(sizes),
                                progress=ctx.progress) for prompts in sets]
    result = between_sets(decompositions, name=ctx.spec.name)
    return StepOutput(step_frames("prompt_sets", result), result.provenance,
                      {**sizes, "prompts": [p.spec for p in sets]})


def _fingerprint_prompts(ctx: StepContext, sizes: Mapping[str, Any]) -> dict[str, Any]:
    from lens_position.analyses.fingerprint import fingerprint_prompts

    ctx.spec.check_context(sizes["T"])
    key = ("fingerprint", sizes["T"], sizes["N"])
    if key not in ctx._prompts:
        ctx._prompts[key] = fingerprint_prompts(ctx.loaded, T=sizes["T"], N=sizes["N"], seed=ctx.data.seed,
                                                source=ctx.data.source, text=ctx.text())
    return ctx._prompts[key]


def _fingerprint_requests(ctx: StepContext, sizes: Mapping[str, Any]) -> list[Request]:
    from lens_position.analyses.fingerprint import fingerprint_tokens, position0_reducer

    # each prompt set in one batch, as fingerprint() runs it, over the positions it runs
    return [Request("position-0 residuals", fingerprint_tokens(condition, prompts),
                    lambda: position0_reducer(ctx.loaded), len(prompts.tokens))
            for condition, prompts in _fingerprint_prompts(ctx, sizes).items()]


def _run_fingerprint(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.fingerprint import fingerprint

    conditions = list(_fingerprint_prompts(ctx, sizes))
    position0 = dict(zip(conditions, (ctx.passes.get(request) for request in _fingerprint_requests(ctx, sizes))))
    result = fingerprint(ctx.loaded, T=sizes["T"], N=sizes["N"], seed=ctx.data.seed, source=ctx.data.source,
                         text=ctx.text(), position0=position0, progress=ctx.progress)
    return StepOutput(step_frames("fingerprint", result), result.provenance,
                      {**sizes, "corpus": ctx.data.corpus})


def _window_sinks_sizes(s: Settings, spec: Any) -> dict[str, Any]:
    # past the window the two metrics differ: the model's T (raised above a sliding window), early_N sequences
    return {"T": model_T(s, spec), "N": s.early_N, "eps": s.eps, "batch_size": s.batch_size,
            "n_resamples": s.n_resamples}


def _run_window_sinks(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.sinks import window_sinks

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    result = window_sinks(ctx.loaded, prompts, eps=sizes["eps"], batch_size=sizes["batch_size"],
                          bootstrap=_bootstrap(sizes), progress=ctx.progress)
    return StepOutput(step_frames("window_sinks", result),
                      result.provenance, {"prompts": prompts.spec, **sizes})


def _run_rotary_bands(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.rotary_bands import rotary_bands

    prompts = ctx.prompts(sizes["T"], sizes["N"])
    if ctx.spec.rope_kind == "none":  # NoPE, learned positions: no rotary frequencies to split by
        empty = pd.DataFrame({"layer": pd.Series(dtype="int64")})
        return StepOutput({"bands_heads": empty, "bands_layers": empty},
                          {"skipped": f"{ctx.spec.name} has no rotary embedding"}, {"prompts": prompts.spec, **sizes})
    result = rotary_bands(ctx.loaded, prompts, n_bands=sizes["n_bands"], batch_size=sizes["batch_size"],
                          bootstrap=_bootstrap(sizes), progress=ctx.progress)
    return StepOutput(step_frames("rotary_bands", result), result.provenance,
                      {"prompts": prompts.spec, **sizes})


def _run_convergence(ctx: StepContext, sizes: Mapping[str, Any]) -> StepOutput:
    from lens_position.analyses.convergence import position0_convergence

    prompts = ctx.prompts(sizes["T"], sizes["N"])  # the BOS step's prompts: the same token 0
    if ctx.loaded.model.cfg.attn_only:  # no MLP to restore the state with
        empty = pd.DataFrame({"layer": pd.Series(dtype="int64")})
        return StepOutput({"convergence_layers": empty, "convergence_restoration": empty},
                          {"skipped": f"{ctx.spec.name} has no MLPs"}, {"prompts": prompts.spec, **sizes})
    result = position0_convergence(ctx.loaded, prompts, seed=ctx.data.seed, bootstrap=_bootstrap(sizes),
                                   progress=ctx.progress)
    return StepOutput(step_frames("convergence", result),
                      result.provenance, {"prompts": prompts.spec, **sizes})


_STEP_LIST = (
    Step("decompose", "decompose",
         lambda s, spec: {"T": model_T(s, spec), "N": s.N, "batch_size": s.batch_size, "n_resamples": s.n_resamples,
                          **_restrictions(s, "layers", "query_range", "keys")}, _run_decompose,
         requests=_decompose_requests),
    Step("probe", "probe",
         lambda s, spec: {"T": model_T(s, spec), "N": max(s.N, -(-s.probe_positions // model_T(s, spec))),
                          "batch_size": s.batch_size, "n_resamples": s.n_resamples,
                          **_restrictions(s, "layers")}, _run_probe,
         requests=_probe_requests),
    Step("bos", "bos", _early,
         _run_bos, needs_bos="BOS replacement",
         requests=lambda ctx, sizes: _early_requests(ctx, sizes, activations=False)),
    Step("convergence", "bos", _early, _run_convergence),
    Step("sink_heads", "sinks",
         lambda s, spec: {"T": min(s.sink_T, model_T(s, spec)), "N": s.N, "eps": s.eps,
                          "batch_size": s.batch_size, "n_resamples": s.n_resamples}, _run_sink_heads,
         requests=_sink_heads_requests),
    Step("sink_rate", "sinks",
         lambda s, spec: {"T": s.sink_T, "N": s.N, "eps": s.eps, "batch_size": s.batch_size,
                          "n_resamples": s.n_resamples}, _run_sink_rate,
         requests=_sink_rate_requests),
    Step("sink_reading", "sinks", _early, _run_sink_reading,
         needs_bos="finding sink-reading heads (position 0 with and without BOS)",
         requests=lambda ctx, sizes: _early_requests(ctx, sizes, activations=True)),
    Step("window_sinks", "sinks", _window_sinks_sizes, _run_window_sinks),
    Step("rotary_bands", "bands",
         lambda s, spec: {"T": min(s.sink_T, model_T(s, spec)), "N": s.early_N, "n_bands": 4,
                          "batch_size": s.batch_size, "n_resamples": s.n_resamples}, _run_rotary_bands),
    Step("fingerprint", "fingerprint",
         lambda s, spec: {"T": s.sink_T, "N": s.N}, _run_fingerprint, requests=_fingerprint_requests),
    Step("prompt_sets", "decompose",
         lambda s, spec: {"T": model_T(s, spec), "N": s.N, "K": s.prompt_sets, "batch_size": s.batch_size,
                          "n_resamples": s.n_resamples}, _run_prompt_sets, opt_in="--prompt-sets"),
)

# The registry: step name -> Step, in the order a run executes them.
STEPS: dict[str, Step] = {step.name: step for step in _STEP_LIST}


def step_names() -> tuple[str, ...]:
    """Every step's name a run makes by default, in run order (opt-in steps left out)."""
    return tuple(name for name, step in STEPS.items() if step.opt_in is None)


def commands() -> dict[str, tuple[str, ...]]:
    """Sub-commands of the command line and the steps each runs by default (``reproduce``: all
    but the opt-in ones, which their option adds)."""
    out: dict[str, tuple[str, ...]] = {"reproduce": step_names()}
    for name in step_names():
        step = STEPS[name]
        out[step.command] = out.get(step.command, ()) + (step.name,)
    return out


def get_step(name: str) -> Step:
    """The registry's step called ``name`` (BadInputError naming the known steps otherwise)."""
    try:
        return STEPS[name]
    except KeyError:
        raise BadInputError(f"unknown step {name!r}; choose from {', '.join(STEPS)}") from None


def tables_of(steps: tuple[str, ...]) -> tuple[str, ...]:
    """The tables the given steps write, in order."""
    return tuple(table for name in steps for table in get_step(name).tables)
