"""The run-time estimate a run prints before a model's steps start (``lens_position.core.estimate``).

Each step's work is written in the terms of the cost model: its forward passes (how many, of how
many sequences and positions, through how many blocks), the layers whose scores it reduces, and its
interval refits, from the step's sizes (``Step.sizes``) and the model's spec.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from lens_position.core.estimate import (MODEL_OPS, Machine, ModelCost, Work, calibrate, decomposition_work, describe,
                                         forward_work, probe_work, seconds)
from lens_position.analyses.bos import REPLACEMENTS
from lens_position.analyses.convergence import REPLACEMENTS as CONVERGENCE_REPLACEMENTS


def _layers(sizes: Mapping[str, Any], cost: ModelCost) -> tuple[int, int]:
    """Analysed layers and the blocks a pass runs (it stops after the last analysed one)."""
    layers = sizes.get("layers")
    if not layers:
        return cost.n_layers, cost.n_layers
    return len(layers), max(layers) + 1


def _queries(sizes: Mapping[str, Any]) -> int | None:
    query_range = sizes.get("query_range")
    return None if not query_range else int(query_range[1]) - int(query_range[0])


def _common(sizes: Mapping[str, Any]) -> dict[str, int]:
    return {"sequences": int(sizes["N"]), "positions": int(sizes["T"]), "batch_size": int(sizes["batch_size"])}


def _decompose(sizes: Mapping[str, Any], cost: ModelCost, passes: int = 1) -> Work:
    layers, blocks = _layers(sizes, cost)
    return decomposition_work(cost, **_common(sizes), replicates=int(sizes.get("n_resamples", 0)), layers=layers,
                              blocks=blocks, passes=passes, queries=_queries(sizes))


def _forward(sizes: Mapping[str, Any], cost: ModelCost, passes: int = 1, reads_scores: bool = True) -> Work:
    common = {**_common(sizes), "batch_size": int(sizes.get("batch_size", sizes["N"]))}
    return forward_work(cost, **common, passes=passes, score_layers=cost.n_layers if reads_scores else 0)


# step name -> its work. BOS replacement: the unreplaced decomposition and one per replacement;
# sink reading: the base run, the counterfactual's, the patched run and the zero and mean ablations;
# rotary bands: the full decomposition and one per band; convergence: the unreplaced run and one per
# replacement (no scores reduced); fingerprint: with and without BOS.
STEP_WORK: dict[str, Callable[[Mapping[str, Any], ModelCost], Work]] = {
    "decompose": _decompose,
    "probe": lambda s, c: probe_work(c, **_common(s), replicates=int(s.get("n_resamples", 0)),
                                     layers=_layers(s, c)[0]),
    "bos": lambda s, c: _decompose(s, c, passes=1 + len(REPLACEMENTS)),
    "convergence": lambda s, c: _forward({**s, "batch_size": s.get("batch_size", s["N"])}, c,
                                         passes=1 + len(CONVERGENCE_REPLACEMENTS), reads_scores=False),
    "sink_heads": lambda s, c: _forward(s, c),
    "sink_rate": lambda s, c: _forward(s, c, passes=3),
    "sink_reading": lambda s, c: _decompose(s, c, passes=5),
    "window_sinks": lambda s, c: _forward(s, c),
    "rotary_bands": lambda s, c: _decompose(s, c, passes=1 + int(s.get("n_bands", 4))),
    "fingerprint": lambda s, c: _forward({**s, "batch_size": s["N"]}, c, passes=2, reads_scores=False),
    "prompt_sets": lambda s, c: _decompose(s, c, passes=int(s.get("K", 2))),
}


def step_work(step: str, sizes: Mapping[str, Any], cost: ModelCost) -> Work:
    """The work of one step at ``sizes`` on a model of ``cost``."""
    return STEP_WORK[step](sizes, cost)


def cells_estimate(cells: Sequence[Any], spec: Any, machine: Machine) -> float:
    """Modelled seconds of ``cells`` (a model's cells still to compute) on ``machine``."""
    cost = ModelCost.of(spec)
    conditions = len({cell.condition for cell in cells})
    return conditions * MODEL_OPS / machine.float64_ops + sum(
        seconds(step_work(cell.step, cell.sizes, cost), cost, machine) for cell in cells)


def announce(model: str, cells: Sequence[Any], spec: Any, compute: Any, block_overhead_s: float | None) -> str:
    """The line a run prints before a model's steps: how many to compute and how long they should take."""
    machine = calibrate(compute.device, compute.dtype, block_overhead_s=block_overhead_s)
    total = cells_estimate(cells, spec, machine)
    steps = f"{len(cells)} step{'s' * (len(cells) != 1)}"
    return f"{model}: {steps} to compute, {describe(total, machine)}"
