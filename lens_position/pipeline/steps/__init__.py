"""The steps of a reproduction, each one value (:class:`~lens_position.pipeline.steps.base.Step`) in a
module of its own, registered here, in :data:`STEPS`, in the order a run executes them.

A step's module says everything about it: the sub-command that runs it, the sizes it runs with on
a model, how it runs, its work for the run-time estimate, the command-line options it reads and,
through its result class, the tables it writes. The command line, the plan and its cache keys, the
estimate, the executors, the output folder and the report all read this registry; adding a step is
adding its module and one line to :data:`STEPS` (the docs' contributing page has a worked example).
"""

from __future__ import annotations

from lens_position.core.results import Table
from lens_position.ground.errors import BadInputError
from lens_position.pipeline.steps import (
    bos,
    convergence,
    decompose,
    fingerprint,
    leakage,
    length_sweep,
    massive,
    probe,
    prompt_sets,
    rollout,
    rotary_bands,
    sink_heads,
    sink_origin,
    sink_rate,
    sink_reading,
    window_sinks,
)
from lens_position.pipeline.steps.base import (
    ANALYSIS_OPTIONS,
    Sizes,
    Step,
    StepContext,
    StepOutput,
    early_sizes,
    model_T,
)
from lens_position.report import html as report_html
from lens_position.report.plots import Figure

#: The registry: step name -> Step, in the order a run executes them.
STEPS: dict[str, Step] = {module.STEP.name: module.STEP for module in (
    decompose, length_sweep, probe, bos, convergence, sink_heads, sink_rate, sink_origin, massive, rollout,
    sink_reading, window_sinks, rotary_bands, leakage, fingerprint, prompt_sets,
)}

#: Every table a reproduction can write, by name, in run order (:class:`~lens_position.core.results.Table`).
TABLES: dict[str, Table] = {table.name: table for step in STEPS.values() for table in step.tables}

#: The report's figures: its own and those the steps declare beside their tables (``Step.figures``).
FIGURES: tuple[Figure, ...] = (*report_html.FIGURES, *(figure for step in STEPS.values() for figure in step.figures))

__all__ = ["ANALYSIS_OPTIONS", "FIGURES", "STEPS", "TABLES", "Sizes", "Step", "StepContext", "StepOutput",
           "command_options", "commands", "early_sizes", "get_step", "quick_sizes", "model_T", "step_names",
           "tables_of"]


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


def command_options(command: str) -> set[str]:
    """The analysis options a sub-command shows: those its steps read, opt-in steps included
    (``reproduce``: every step's)."""
    return {option for step in STEPS.values() if command in ("reproduce", step.command) for option in step.options}


def quick_sizes(command: str) -> str:
    """What ``--quick`` runs ``command``'s steps at, from the quick and full settings themselves, on
    a model without sliding-window layers: ``"decompose T=40 N=4, length_sweep T=16,40,80 N=4"``."""
    from lens_position.models.spec import ModelSpec
    from lens_position.pipeline.config import QUICK

    plain = ModelSpec(name="a model", family="custom", source="custom", n_layers=2, n_heads=1, n_kv_heads=1,
                      d_model=64, d_head=64, n_ctx=1 << 20, rope_kind="standard", rotary_base=10_000.0,
                      attn_types=("global", "global"))
    parts = []
    for name in commands()[command]:
        sizes = STEPS[name].sizes(QUICK, plain)
        lengths = ",".join(map(str, sizes.lengths)) if sizes.lengths else str(sizes.T)
        first = f" (the first {sizes.T} of {sizes.first_of})" if sizes.first_of else ""
        parts.append(f"{name} T={lengths}{first} N={sizes.N}")
    return ", ".join(parts)


def get_step(name: str) -> Step:
    """The registry's step called ``name`` (BadInputError naming the known steps otherwise)."""
    try:
        return STEPS[name]
    except KeyError:
        raise BadInputError(f"unknown step {name!r}; choose from {', '.join(STEPS)}") from None


def tables_of(steps: tuple[str, ...]) -> tuple[str, ...]:
    """The tables the given steps write, in order."""
    return tuple(table.name for name in steps for table in get_step(name).tables)
