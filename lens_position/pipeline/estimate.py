"""The run-time estimate a run prints before a model's steps start (``lens_position.core.estimate``).

Each step states its own work in the terms of the cost model (``Step.work``: its forward passes,
the layers whose scores it reduces, its interval refits), from its sizes and the model's spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lens_position.core.estimate import MODEL_OPS, Machine, ModelCost, Work, calibrate, describe, seconds
from lens_position.models.spec import ModelSpec
from lens_position.pipeline.plan import Cell
from lens_position.pipeline.steps import Sizes, get_step


def step_work(step: str, sizes: Sizes, cost: ModelCost) -> Work:
    """The work of one step at ``sizes`` on a model of ``cost``."""
    return get_step(step).work(sizes, cost)


def cells_estimate(cells: Sequence[Cell], spec: ModelSpec, machine: Machine) -> float:
    """Modelled seconds of ``cells`` (a model's cells still to compute) on ``machine``."""
    cost = ModelCost.of(spec)
    conditions = len({cell.condition for cell in cells})
    return conditions * MODEL_OPS / machine.float64_ops + sum(
        seconds(step_work(cell.step, cell.sizes, cost), cost, machine) for cell in cells)


def announce(model: str, cells: Sequence[Cell], spec: ModelSpec, compute: Any, block_overhead_s: float | None) -> str:
    """The line a run prints before a model's steps: how many to compute and how long they should take."""
    machine = calibrate(compute.device, compute.dtype, block_overhead_s=block_overhead_s)
    total = cells_estimate(cells, spec, machine)
    steps = f"{len(cells)} step{'s' * (len(cells) != 1)}"
    return f"{model}: {steps} to compute, {describe(total, machine)}"
