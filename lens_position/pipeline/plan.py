"""Plan a run: the cells (model x data condition x step) with their sizes and cache keys.

Planning happens in two stages. ``plan_run`` checks everything that needs no model (steps,
sizes, formats, model names, corpora) and reads each corpus once, so a bad input fails
before any model is loaded. ``cells_for_model`` then, given a model's ``ModelSpec``, checks
what needs the model (context length, BOS) and resolves every cell's sizes and cache key:
the driver does this, so only the driver needs the cache.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from lens_position.ground.errors import BadInputError
from lens_position.models.corpus import Corpus, read_corpus
from lens_position.pipeline import steps as steps_module
from lens_position.pipeline.cache import step_key
from lens_position.pipeline.config import Compute, DataOptions, RunConfig, Settings
from lens_position.pipeline.models import check_layers
from lens_position.pipeline.steps import Sizes


@dataclass(frozen=True)
class Condition:
    """One data condition of a run and its corpus, read once by the driver: the corpus's
    contents hash is what the cache key holds (not the path), and workers receive the corpus
    itself. ``corpus`` None: the default corpus, which ships with Python and is read where the
    step runs."""

    data: DataOptions
    corpus_sha256: str
    corpus: Corpus | None = field(default=None, repr=False)

    def key_dict(self) -> dict[str, Any]:
        return {**self.data.to_dict(), "corpus_sha256": self.corpus_sha256}


@dataclass(frozen=True)
class Cell:
    """One unit of work: a step on a model under a condition, with the sizes it runs with and
    its cache key. ``index`` orders the run's records the same way on every executor."""

    index: int
    model: str
    condition: Condition
    step: str
    sizes: Sizes
    key: str

    def describe(self) -> str:
        d = self.condition.data
        return f"{self.step} on {self.model} (source {d.source}, bos {d.bos}, seed {d.seed})"


@dataclass
class Plan:
    """A checked run: models, conditions and steps, the sizes and the compute options."""

    models: tuple[str, ...]
    conditions: tuple[Condition, ...]
    steps: tuple[str, ...]
    settings: Settings
    compute: Compute

    @property
    def n_cells(self) -> int:
        """Cells in the run: models x conditions x steps."""
        return len(self.models) * len(self.conditions) * len(self.steps)

    def label(self, cell: Cell) -> str:
        """How progress names a cell: model, step (and condition in a sweep), its place in the run."""
        d = cell.condition.data
        condition = f" ({d.source}, bos {d.bos}, seed {d.seed})" if len(self.conditions) > 1 else ""
        return f"[{cell.index + 1}/{self.n_cells}] {cell.model} / {cell.step}{condition}"

    def cells_for_model(self, model: str, spec: Any, model_index: int) -> list[Cell]:
        """Every cell of ``model`` with sizes and keys (model-dependent checks first: the context, the
        layers asked for, BOS; each before any pass, from the model's spec alone)."""
        spec.check_context(steps_module.model_T(self.settings, spec))
        check_layers(model, self.settings.layers, spec.n_layers)
        for condition in self.conditions:
            for name in self.steps:
                what = steps_module.get_step(name).needs_bos
                if what and condition.data.bos == "none":
                    raise BadInputError(f"{what} needs BOS at position 0, which --bos none removes; "
                                        "use --bos force or leave the step out")
        cells = []
        per_model = len(self.conditions) * len(self.steps)
        for c, condition in enumerate(self.conditions):
            for s, name in enumerate(self.steps):
                sizes = steps_module.get_step(name).sizes(self.settings, spec)
                spec.check_context(sizes.T)
                if sizes.T < 2:
                    raise BadInputError(f"T = {sizes.T} for the {name} step is too short: the analyses need "
                                        "at least 2 positions")
                config = {"data": condition.key_dict(), "sizes": sizes.to_dict(), "compute": self.compute.key_dict()}
                cells.append(Cell(index=model_index * per_model + c * len(self.steps) + s, model=model,
                                  condition=condition, step=name, sizes=sizes,
                                  key=step_key(name, spec, config)))
        return cells


def condition_of(data: DataOptions) -> Condition:
    """A condition with its corpus read once (file, folder or hf: split) and hashed; the
    default corpus ships with Python: its contents are hashed, not carried into the cells."""
    corpus = read_corpus(data.corpus)
    return Condition(data=data, corpus_sha256=corpus.sha256, corpus=None if data.corpus is None else corpus)


def plan_run(config: RunConfig, *, check_model_names: bool = True) -> Plan:
    """Check a run's configuration (BadInputError / UnknownModelError) and read its corpora."""
    from lens_position.pipeline.models import check_models

    steps = tuple(config.steps) if config.steps is not None else steps_module.step_names()
    unknown = [s for s in steps if s not in steps_module.STEPS]
    if unknown:
        raise BadInputError(f"unknown steps {unknown}; choose from {', '.join(steps_module.STEPS)}")
    if not steps:
        raise BadInputError("no steps to run")
    if config.fmt not in ("parquet", "csv"):
        raise BadInputError(f"unknown table format {config.fmt!r}; use parquet or csv")
    if config.executor not in ("serial", "ray"):
        raise BadInputError(f"unknown executor {config.executor!r}; use serial or ray")
    settings = config.settings()
    settings.check()
    if check_model_names:
        check_models(config.models)
    conditions = config.all_conditions()
    if len(set(conditions)) != len(conditions):
        raise BadInputError("a data condition is listed twice")
    read: dict[str | None, Condition] = {}
    resolved = []
    for data in conditions:
        if data.corpus not in read:
            read[data.corpus] = condition_of(data)
        resolved.append(dataclasses.replace(read[data.corpus], data=data))
    return Plan(models=tuple(config.models), conditions=tuple(resolved), steps=steps, settings=settings,
                compute=config.compute)
