"""Where cells run: a ``ModelWorker`` holds one loaded model and runs that model's cells.

Both executors use it: the serial executor in this process, the Ray executor inside one
actor per model. It returns results; it never writes the cache or the outputs.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lens_position.ground.errors import LensPositionError
from lens_position.ground.provenance import jsonable
from lens_position.pipeline.measure import measure
from lens_position.pipeline.plan import Cell, Condition
from lens_position.pipeline.steps import Step, StepContext


@dataclass
class CellResult:
    """A computed cell: its tables and provenance (the experiment's own, plus the options it ran
    with and ``computed_cost``: wall s, CPU s and peak MB of computing it)."""

    tables: dict[str, pd.DataFrame]
    provenance: dict[str, Any]
    cost: dict[str, float]


@dataclass
class Loaded:
    """A model's spec and what loading it cost (wall s, CPU s, peak MB); ``block_overhead_s``: the
    fixed cost of one block of one batch, timed on the loaded model for the run-time estimate
    (:func:`lens_position.core.estimate.block_overhead`; None when progress is off)."""

    spec: Any
    cost: dict[str, float]
    block_overhead_s: float | None = None


class ModelWorker:
    """One loaded model and a step context per data condition (prompt sets are shared
    between the steps of a condition)."""

    def __init__(self, request: str, steps: Mapping[str, Step], *, compute: Any = None,
                 load: Callable[[str], Any] | None = None, progress: bool = False):
        from lens_position.pipeline.models import load_request

        self.request = request
        self.steps = dict(steps)
        self.progress = progress
        with measure() as cost:
            self.loaded = load(request) if load is not None else load_request(request, compute)
        self.load_cost = dict(cost)
        self._contexts: dict[Condition, StepContext] = {}
        self._block_overhead_s: float | None = None

    def describe(self) -> Loaded:
        if self.progress and self._block_overhead_s is None:  # two short passes, for the estimate printed
            from lens_position.core.estimate import block_overhead

            self._block_overhead_s = block_overhead(self.loaded)
        return Loaded(spec=self.loaded.spec, cost=self.load_cost, block_overhead_s=self._block_overhead_s)

    def context(self, condition: Condition) -> StepContext:
        if condition not in self._contexts:
            self._contexts[condition] = StepContext(
                loaded=self.loaded, data=condition.data, progress=self.progress,
                corpus_text=condition.corpus.text if condition.corpus else None,
                corpus_name=condition.corpus.name if condition.corpus else None)
        return self._contexts[condition]

    def expect(self, cells: Sequence[Cell]) -> None:
        """Announce the cells about to run, so that steps reading the same prompts share one
        forward pass (``pipeline.passes``); a request that cannot be formed here (a bad
        input) is left for the step itself to report."""
        for cell in cells:
            ctx = self.context(cell.condition)
            try:
                ctx.passes.expect(self.steps[cell.step].requests(ctx, cell.sizes))
            except LensPositionError:
                continue

    def run(self, cell: Cell) -> CellResult:
        ctx = self.context(cell.condition)
        with measure() as cost:
            output = self.steps[cell.step].run(ctx, cell.sizes)
        # The cost of computing the step travels with its cached result, so a resumed run
        # still reports what every step cost.
        provenance = {**jsonable(output.provenance), "step_options": jsonable(output.options),
                      "computed_cost": {k: round(v, 6) for k, v in cost.items()}}
        return CellResult(tables=output.tables, provenance=provenance, cost=dict(cost))

    def close(self) -> None:
        self._contexts.clear()
        self.loaded = None
        gc.collect()
