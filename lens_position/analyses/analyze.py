"""One call that answers the paper's question for a model: where does absolute position in its
attention come from?

``analyze(model, prompts)`` runs the three analyses the answer rests on and returns one
:class:`Analysis` whose ``answer`` says it in words built from the numbers:

1. the decomposition over all queries (:func:`lens_position.analyses.decompose.decompose`): how
   much of the attention's absolute-position signal is the causal mask's (M') and how much the
   residual stream's (R'), held out and reference-free, with intervals;
2. the sink heads (:func:`lens_position.analyses.sinks.sink_heads`) on the first ``sink_length``
   positions of the prompts (Gu et al.'s T = 64): whether any head attends mostly to position 0;
3. BOS replacement at early queries (:func:`lens_position.analyses.bos.bos_replacement`) on the
   first ``early_queries`` positions of the prompts: how much of R' depends on the vector at
   position 0, per replacement and as C4's mean over replacements
   (:func:`lens_position.analyses.claims.c4_fraction`), only when the prompts start with BOS (the
   answer says when it was not run, and why).

These are the prompt sets, estimators and code of the reproduction's ``decompose``, ``sink_heads``
and ``bos`` steps, which cut their early-query and sink prompts from the decomposition's in the
same way: ``analyze(model, build_prompts(model, T=T, N=N, seed=seed))`` and ``lens-position
reproduce`` at the same model, ``T``, ``N`` and seed print the same numbers.

Example::

    import lens_position as lp
    model = lp.load_model("smollm2-135m")
    prompts = lp.build_prompts(model, source="natural", T=128, N=16, bos="force")
    result = lp.analyze(model, prompts)
    result                      # the answer, the headline numbers, where the tables are
    result.decomposition.heads  # every result in full

Its run time on SmolLM2-135M at these defaults is in ``docs/getting-started.md``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float

from lens_position.analyses.bos import REPLACEMENTS, BosReplacement, bos_replacement
from lens_position.analyses.claims import PAPER, c4_fraction
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.analyses.sentences import (
    UNTRAINED_NOTE,
    bos_sentence,
    components_sentence,
    early_queries_text,
    sinks_sentence,
)
from lens_position.analyses.sinks import SINK_EPS, SINK_T, SinkHeads, sink_heads
from lens_position.core import summaries
from lens_position.core.checks import check_query_range
from lens_position.core.estimate import ModelCost, calibrate, decomposition_work, estimate, forward_work
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.core.results import SavedResult
from lens_position.core.stream import BATCH_SIZE
from lens_position.core.summaries import Headline, is_untrained, row_estimate
from lens_position.ground.progress import note
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public


@dataclass(repr=False)
class Analysis(SavedResult):
    """Result of :func:`analyze`: ``answer`` (the sentences), and the tables of the three results it
    rests on, flat so that the result saves as one folder: the decomposition's ``heads``,
    ``layers``, ``replicates``, ``head_replicates``; the sink heads' ``sinks`` (frame),
    ``sink_scores`` (``[layer, head]``), ``sink_prompt_scores`` (``[prompt, layer, head]``); BOS
    replacement's ``bos`` (overall, one row per replacement), ``bos_layers``, ``bos_heads``,
    ``bos_replicates`` (None when it was not run). ``decomposition``, ``sink_heads`` and
    ``bos_replacement`` give the results back as their own objects. ``provenance``: each
    result's, under ``decomposition``, ``sinks`` and ``bos``."""

    answer: str
    heads: pd.DataFrame
    layers: pd.DataFrame
    sinks: pd.DataFrame
    sink_scores: Float[torch.Tensor, "layer head"]
    eps: float
    provenance: dict[str, Any] = field(default_factory=dict)
    replicates: pd.DataFrame | None = None
    head_replicates: pd.DataFrame | None = None
    sink_prompt_scores: Float[torch.Tensor, "prompt layer head"] | None = None
    bos: pd.DataFrame | None = None
    bos_layers: pd.DataFrame | None = None
    bos_heads: pd.DataFrame | None = None
    bos_replicates: pd.DataFrame | None = None

    WHAT = "where absolute position in attention comes from: decomposition, sink heads, BOS replacement"
    HEADS = ("heads", "R_rf_heldout")

    @property
    def decomposition(self) -> Decomposition:
        return Decomposition(heads=self.heads, layers=self.layers, provenance=self.provenance.get("decomposition", {}),
                             replicates=self.replicates, head_replicates=self.head_replicates)

    @property
    def sink_heads(self) -> SinkHeads:
        return SinkHeads(frame=self.sinks, scores=self.sink_scores, eps=self.eps,
                         prompt_scores=self.sink_prompt_scores, provenance=self.provenance.get("sinks", {}))

    @property
    def bos_replacement(self) -> BosReplacement | None:
        if self.bos is None:
            return None
        return BosReplacement(frame=self.bos_layers, overall=self.bos, heads=self.bos_heads,
                              provenance=self.provenance.get("bos", {}), replicates=self.bos_replicates)

    def headline(self) -> list[Headline]:
        """R', M' and the total (held out), the number of sink heads, and the share of R' each BOS
        replacement removes at early queries."""
        out = self.decomposition.headline()
        out += self.sink_heads.headline()[:1]
        if self.bos is not None:
            column, _, mean = c4_fraction(self.bos, self.bos_replicates)
            at = early_queries_text(self.bos) or "early queries"
            out.append(Headline(column, "R' removed by BOS replacement (C4: mean)", mean,
                                f"held-out, {at}; the paper: about {PAPER.c4_fraction_removed:.0%}"))
            out += [Headline(column, f"  of which {row['replacement']}", row_estimate(row, column),
                             "the fraction with this replacement") for _, row in self.bos.iterrows()]
        return out

    def __repr__(self) -> str:
        return "\n".join(textwrap.wrap(self.answer, summaries.WIDTH)) + "\n\n" + super().__repr__()

    def _repr_html_(self) -> str:
        import html
        return f"<p>{html.escape(self.answer)}</p>{super()._repr_html_()}"


def _estimate(
    loaded: LoadedModel, prompts: CheckedPrompts, early_queries: int, sink_length: int, batch_size: int,
    bootstrap: Bootstrap
) -> str:
    """How long :func:`analyze` should take here (:mod:`lens_position.core.estimate`)."""
    cost = ModelCost.of(loaded)
    n_seq, length = (int(x) for x in prompts.tokens.shape)
    replicates = bootstrap.n_resamples if bootstrap.enabled else 0
    work = decomposition_work(cost, sequences=n_seq, positions=length, batch_size=batch_size, replicates=replicates)
    work = work + forward_work(cost, sequences=n_seq, positions=sink_length, batch_size=batch_size,
                               score_layers=cost.n_layers)
    if prompts.has_bos:  # the unreplaced decomposition at early queries and one per replacement
        work = work + decomposition_work(
            cost,
            sequences=n_seq,
            positions=min(early_queries, length),
            batch_size=batch_size,
            replicates=replicates,
            passes=1 + len(REPLACEMENTS),
        )
    dtype = str(loaded.backend.dtype).removeprefix("torch.")
    return estimate([(work, cost)], calibrate(loaded.backend.device.type, dtype, model=loaded))[1]


@public
def analyze(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    early_queries: int = PAPER.early_queries,
    sink_length: int = SINK_T,
    eps: float = SINK_EPS,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> Analysis:
    """Decompose ``prompts`` (all queries), find the sink heads (threshold ``eps`` on mean attention
    to position 0) on their first ``sink_length`` positions and, when the prompts start with BOS,
    replace the BOS embedding and measure the share of R' removed on their first ``early_queries``
    positions; return one :class:`Analysis` with the answer in words (module docstring). Every
    number has its bootstrap interval over sequences (``bootstrap``). ``prompts``: anything
    :func:`lens_position.core.inputs.checked_prompts` accepts."""
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    length = prompts.tokens.shape[1]
    early = check_query_range((0, early_queries), length, "early_queries")  # checked whether BOS replacement runs
    sink_length = check_query_range((0, sink_length), length, "sink_length")[1]
    seed = prompts.spec.seed if prompts.spec.seed is not None else 0  # the reproduction's: its data seed
    name = loaded.spec.name
    with progress_bar("analyze", enabled=progress):  # the three analyses count into one bar
        if progress:
            note(f"analyze on {name}: {_estimate(loaded, prompts, early[1], sink_length, batch_size, bootstrap)}")
        decomposition = decompose.body(loaded, prompts, batch_size=batch_size, bootstrap=bootstrap, progress=progress)
        sinks = sink_heads.body(loaded, prompts.first(sink_length), eps=eps, batch_size=batch_size, bootstrap=bootstrap,
                           progress=progress)
        bos = None
        if prompts.has_bos:
            bos = bos_replacement.body(loaded, prompts.first(early[1]), query_range=early, seed=seed,
                                  batch_size=batch_size, bootstrap=bootstrap, progress=progress)
    sentences = [components_sentence(decomposition.layers, name, decomposition.replicates, in_sample=False),
                 sinks_sentence(sinks.frame, None, name)]
    sentences.append(bos_sentence(bos.overall, name, bos.replicates) if bos is not None else
                     "BOS replacement was not run: these prompts do not start with BOS (build them with "
                     "build_prompts(..., bos='force')).")
    if is_untrained(decomposition.provenance):
        sentences.insert(0, UNTRAINED_NOTE)
    return Analysis(
        answer=" ".join(sentences), heads=decomposition.heads, layers=decomposition.layers,
        replicates=decomposition.replicates, head_replicates=decomposition.head_replicates,
        sinks=sinks.frame, sink_scores=sinks.scores, sink_prompt_scores=sinks.prompt_scores, eps=sinks.eps,
        bos=None if bos is None else bos.overall, bos_layers=None if bos is None else bos.frame,
        bos_heads=None if bos is None else bos.heads, bos_replicates=None if bos is None else bos.replicates,
        provenance={"decomposition": decomposition.provenance, "sinks": sinks.provenance,
                    "bos": None if bos is None else bos.provenance,
                    "model": decomposition.provenance.get("model"), "data": decomposition.provenance.get("data")},
    )


