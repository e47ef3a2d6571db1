"""What every step is made of: the :class:`Step` value, the :class:`Sizes` it runs with, the
:class:`StepContext` it sees and the :class:`StepOutput` it returns, and the sizes and work shared
by several steps."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from lens_position.core.data import PromptSet, build_prompts
from lens_position.core.estimate import ModelCost, Work, decomposition_work, forward_work
from lens_position.core.inputs import CheckedPrompts, check_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.core.results import Table
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel, ModelSpec
from lens_position.pipeline.config import DataOptions, Settings
from lens_position.pipeline.passes import Request, SharedPasses
from lens_position.report.plots import Figure

if TYPE_CHECKING:
    from lens_position.core.results import SavedResult

#: The command-line options a step may read (``--layers``, ``--query-range``, ``--keys``,
#: ``--prompt-sets``, ``--lengths``); a sub-command shows those of its steps.
ANALYSIS_OPTIONS = ("layers", "query_range", "keys", "prompt_sets", "lengths")


@dataclass(frozen=True)
class Sizes:
    """The sizes a step runs with on one model: part of its cache key and of its provenance.
    ``T`` positions (position 0 included) of ``N`` sequences; the others only where the step
    uses them (None: not used, and left out of :meth:`to_dict`, so a step's key names only what
    it reads)."""

    T: int
    N: int
    batch_size: int | None = None
    n_resamples: int | None = None
    eps: float | None = None
    n_bands: int | None = None
    K: int | None = None
    lengths: tuple[int, ...] | None = None
    query_range: tuple[int, int] | None = None
    layers: tuple[int, ...] | None = None
    keys: str | None = None
    n_seeds: int | None = None
    #: the length of the model's main prompt set (the decomposition's) when these ``T`` positions are
    #: its first ones (:meth:`~lens_position.core.data.PromptSet.first`): the early-query and sink
    #: steps read the same tokens as the decomposition, and as :func:`lens_position.analyze`
    first_of: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The sizes that apply, as JSON-ready values (tuples as lists)."""
        out: dict[str, Any] = {}
        for name, value in dataclasses.asdict(self).items():
            if value is not None:
                out[name] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def bootstrap(self) -> Bootstrap:
        """The intervals these sizes ask for (``n_resamples`` replicates)."""
        return Bootstrap(n_resamples=self.n_resamples if self.n_resamples is not None else 0)

    @property
    def threshold(self) -> float:
        """The sink threshold ``eps`` of a step that sets one."""
        if self.eps is None:
            raise ValueError("these sizes set no sink threshold (eps)")
        return self.eps

    @property
    def batch(self) -> int:
        """Sequences per forward pass (all of them when the step sets no batch size)."""
        return self.batch_size if self.batch_size is not None else self.N


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
    by the driver, so workers need no access to the user's files), and the prompt sets and
    forward passes the model's steps share."""

    loaded: LoadedModel
    data: DataOptions
    progress: bool = False
    corpus_text: str | None = None
    corpus_name: str | None = None  # how the corpus is named in prompt specs ("file:/...", ...)
    _prompts: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    _passes: SharedPasses | None = None

    @property
    def passes(self) -> SharedPasses:
        """The forward passes shared between this model's steps (``pipeline.passes``)."""
        if self._passes is None:
            self._passes = SharedPasses(self.loaded, progress=self.progress)
        return self._passes

    @property
    def spec(self) -> ModelSpec:
        return self.loaded.spec

    def text(self) -> str | None:
        """The natural text every step builds its prompts from (None: the default corpus)."""
        return self.corpus_text if self.data.source == "natural" else None

    def prompts(self, T: int, N: int, first_of: int | None = None) -> CheckedPrompts:
        """The condition's ``N`` prompts of ``T`` positions (built once, shared between steps); with
        ``first_of``, the first ``T`` positions of the ``N`` prompts of that length."""
        if first_of is not None and first_of > T:
            return self.shared(("prompts", T, N, first_of), lambda: self.prompts(first_of, N).first(T))
        self.spec.check_context(T)
        return self.shared(("prompts", T, N), lambda: self._build(T, N))

    def prompts_of(self, sizes: Sizes) -> CheckedPrompts:
        """The prompts a step runs on at ``sizes``."""
        return self.prompts(sizes.T, sizes.N, sizes.first_of)

    def _build(self, T: int, N: int) -> CheckedPrompts:
        """The condition's prompts, built and checked for the model once (the steps' reducers take them)."""
        prompts = build_prompts(self.loaded, source=self.data.source, T=T, N=N, bos=self.data.bos,
                                seed=self.data.seed, text=self.text())
        if self.text() is not None and self.corpus_name is not None:
            # The text came from a named corpus: name it, not "text", in the prompt spec.
            prompts = dataclasses.replace(prompts, spec=dataclasses.replace(prompts.spec, corpus=self.corpus_name))
        return check_prompts.body(self.loaded, prompts)

    def shared(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Any:
        """A value the condition's steps share (prompt sets), built on first use."""
        if key not in self._prompts:
            self._prompts[key] = build()
        return self._prompts[key]

    def need_bos(self, prompts: PromptSet, what: str) -> None:
        if not prompts.has_bos:
            raise BadInputError(f"{what} needs BOS at position 0, but the prompts of {self.spec.name} have none "
                                f"under --bos {self.data.bos}; use --bos force")


def _no_requests(ctx: StepContext, sizes: Sizes) -> list[Request]:
    return []


@dataclass(frozen=True)
class Step:
    """One step of a reproduction, everything about it in one value:

    - ``name``, and ``command``: the sub-command that runs it;
    - ``sizes(settings, spec)``: the :class:`Sizes` it runs with on a model (part of its cache key);
    - ``run(ctx, sizes)``: measure, and return a :class:`StepOutput`;
    - ``work(sizes, cost)``: its work in the terms of the run-time estimate
      (:mod:`lens_position.core.estimate`: forward passes, reduced layers, interval refits);
    - ``result``: the result class whose ``TABLES`` are the tables it writes (with their columns);
    - ``figures``: the report's figures of its tables (:class:`~lens_position.report.plots.Figure`);
    - ``requests(ctx, sizes)``: the reducers it reads from passes shared with other steps
      (``pipeline.passes``), announced before the model's steps run so that one pass feeds them all;
    - ``options``: the command-line analysis options it reads (:data:`ANALYSIS_OPTIONS`);
    - ``needs_bos``: what needs BOS at position 0 (checked before any forward pass);
    - ``opt_in``: the command-line option that adds an opt-in step (in no command by default);
    - ``min_N``: the fewest sequences it can measure on, and why (checked before any model loads).
    """

    name: str
    command: str
    sizes: Callable[[Settings, ModelSpec], Sizes]
    run: Callable[[StepContext, Sizes], StepOutput]
    work: Callable[[Sizes, ModelCost], Work]
    result: type[SavedResult]
    requests: Callable[[StepContext, Sizes], list[Request]] = _no_requests
    options: tuple[str, ...] = ()
    needs_bos: str | None = None
    opt_in: str | None = None
    min_N: tuple[int, str] | None = None
    figures: tuple[Figure, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.options) - set(ANALYSIS_OPTIONS)
        if unknown:
            raise ValueError(f"step {self.name}: unknown analysis options {sorted(unknown)}")

    @property
    def tables(self) -> tuple[Table, ...]:
        """The tables this step writes (its result class's ``TABLES``)."""
        return tuple(self.result.TABLES)

    def frames(self, result: Any) -> dict[str, pd.DataFrame]:
        """The tables of this step from its result object, by name; one whose attribute is None
        (bootstrap replicates with intervals off) is left out."""
        frames = {}
        for table in self.tables:
            frame = getattr(result, table.attribute)
            if frame is not None:
                frames[table.name] = frame.reset_index(drop=True)
        return frames

    def output(self, result: Any, options: Mapping[str, Any]) -> StepOutput:
        """The :class:`StepOutput` of a step that ran its analysis to ``result``."""
        return StepOutput(self.frames(result), result.provenance, dict(options))


# --------------------------------------------------------------------------- shared sizes


def model_T(settings: Settings, spec: ModelSpec) -> int:
    """T for this model: raised to ``window_factor · window`` when it has sliding-window layers."""
    T = settings.T
    if spec.has_sliding_window and spec.window is not None:
        T = max(T, int(-(-settings.window_factor * spec.window // 1)))
    return T


def early_sizes(s: Settings, spec: ModelSpec) -> Sizes:
    """The sizes of the steps measured at early queries (BOS replacement, sink reading,
    convergence): sequences as long as the early query range."""
    main_T = model_T(s, spec)
    early_T = min(s.query_range[1], main_T)
    return Sizes(T=early_T, N=s.early_N, query_range=(s.query_range[0], early_T), batch_size=s.batch_size,
                 n_resamples=s.n_resamples, first_of=first_of(early_T, main_T))


def first_of(T: int, main_T: int) -> int | None:
    """``main_T`` when a step's ``T`` positions are the first ones of the main prompt set, else None."""
    return main_T if T < main_T else None


def restrictions(s: Settings, *names: str) -> dict[str, Any]:
    """The command line's restrictions a step uses (``layers``, ``query_range``, ``keys``), only
    where they differ from analysing everything, so an unrestricted step keeps its cache key."""
    given = {"layers": tuple(s.layers) if s.layers is not None else None,
             "query_range": tuple(s.decompose_queries) if s.decompose_queries is not None else None,
             "keys": s.keys if s.keys != "all" else None}
    return {name: given[name] for name in names if given[name] is not None}


# --------------------------------------------------------------------------- shared work


def _layers(sizes: Sizes, cost: ModelCost) -> tuple[int, int]:
    """Analysed layers and the blocks a pass runs (it stops after the last analysed one)."""
    if not sizes.layers:
        return cost.n_layers, cost.n_layers
    return len(sizes.layers), max(sizes.layers) + 1


def _common(sizes: Sizes) -> dict[str, int]:
    return {"sequences": sizes.N, "positions": sizes.T, "batch_size": sizes.batch}


def decomposition_passes(sizes: Sizes, cost: ModelCost, passes: int = 1) -> Work:
    """``passes`` decompositions at ``sizes``, with their interval refits."""
    layers, blocks = _layers(sizes, cost)
    queries = None if sizes.query_range is None else sizes.query_range[1] - sizes.query_range[0]
    return decomposition_work(cost, **_common(sizes), replicates=sizes.n_resamples or 0, layers=layers,
                              blocks=blocks, passes=passes, queries=queries)


def forward_passes(sizes: Sizes, cost: ModelCost, passes: int = 1, reads_scores: bool = True) -> Work:
    """``passes`` forward passes at ``sizes``, reading every layer's scores or none."""
    return forward_work(cost, **_common(sizes), passes=passes, score_layers=cost.n_layers if reads_scores else 0)


def early_decomposition_requests(ctx: StepContext, sizes: Sizes, *, activations: bool) -> list[Request]:
    """The un-intervened early-query pass that BOS replacement and the sink-reading detector
    compare with: its decomposition and (for the detector) the activations it reuses."""
    from lens_position.analyses.decompose import DecompositionReducer
    from lens_position.analyses.sinks import base_activation_names
    from lens_position.core.stream import WholeActivations

    prompts = ctx.prompts_of(sizes)
    query_range = sizes.query_range
    # with intervals off (n_resamples = 0) the base keeps halves, not sequences, and draws no replicates
    requests = [Request(DecompositionRequest(query_range=query_range, n_resamples=sizes.n_resamples), prompts,
                        lambda: DecompositionReducer(ctx.loaded, prompts, query_range=query_range,
                                                     bootstrap=sizes.bootstrap),
                        sizes.batch)]
    if activations:
        requests.append(Request(BaseActivationsRequest(), prompts,
                                lambda: WholeActivations(base_activation_names(ctx.loaded)), sizes.batch))
    return requests


# --------------------------------------------------------------------------- what steps read from shared passes


@dataclass(frozen=True)
class DecompositionRequest:
    """A decomposition's statistics on a shared pass, with its options."""

    layers: tuple[int, ...] | None = None
    query_range: tuple[int, int] | None = None
    keys: str = "all"
    n_resamples: int | None = None

    def __str__(self) -> str:
        return "decompose"


@dataclass(frozen=True)
class ProbeRequest:
    """A position probe's statistics on a shared pass, with its options."""

    layers: tuple[int, ...] | None = None
    seed: int = 0
    n_resamples: int | None = None

    def __str__(self) -> str:
        return "probe"


@dataclass(frozen=True)
class BaseActivationsRequest:
    """The activations the sink-reading detector reuses from the unpatched pass."""

    def __str__(self) -> str:
        return "sink-reading base activations"


@dataclass(frozen=True)
class SinkScoresRequest:
    """Sink scores (attention on position 0 per prompt, layer and head) on a shared pass."""

    def __str__(self) -> str:
        return "sink scores"


@dataclass(frozen=True)
class Position0Request:
    """The position-0 residuals the fingerprint reads."""

    def __str__(self) -> str:
        return "position-0 residuals"
