"""How long a run will take, said before it starts: sizes x model x machine.

A run's time is modelled as the sum of what its forward passes and its statistics cost:

- **forward passes**: per token and block, ``2 P_block + 2 T H d_head`` floating-point operations
  (the block's matrix products, and causal attention over ``T/2`` keys on average), at the
  machine's measured matrix-product rate; plus a fixed cost per block and batch (the framework's
  hooks and Python dispatch, measured on a tiny TransformerLens model);
- **score reductions**: every analysed layer's ``[batch, head, T, T]`` scores are reduced to float64
  statistics (``REDUCE_OPS`` elementwise operations per score), at the measured float64 rate;
- **interval refits**: each bootstrap replicate refits every analysed layer on ``F`` position
  features (``REFIT_OPS H F^2`` operations; one ``F^3`` factorisation per analysis), no forward pass;
- **probe fits**: ``d_model x d_model`` solves per layer for the ridge penalties and replicates;
- a fixed cost per analysis (tables, provenance): ``STEP_OPS`` elementwise operations.

The machine enters through :func:`calibrate`, a fraction of a second of measurements on the
device and dtype of the run (a matrix product, a float64 reduction) and two forward passes of the
model itself on 4 tokens (:func:`block_overhead`): a loaded or slow machine measures slower, and
the estimate grows with it. The estimate is
a range (:data:`SPREAD` either side): a guide for planning, right to within a few times, never a
measured figure (the measured ones are in the docs' performance page).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Operations per score in the decomposition's float64 reduction (self-reference, logsumexp, the
# per-bin sums of t, z, their squares and cross products), per head and feature squared in a
# replicate-layer refit (the full and relative fits, both halves, three variants), and the fixed
# cost of one analysis (its tables and provenance) in float64 elementwise operations: set against
# timed runs of the tiny models (tests/unit/core/test_estimate.py checks the factor band).
REDUCE_OPS = 20.0
REFIT_OPS = 24.0
STEP_OPS = 6e7
# A run's fixed cost per model and data condition (its prompts built, its tables stacked and written).
MODEL_OPS = 1e8
# The fixed cost of one block of one batch when no model was timed (TransformerLens on a CPU; the
# Ray executor's workers, which do not time it).
DEFAULT_BLOCK_S = 0.005
# The range printed: the estimate divided and multiplied by this.
SPREAD = 2.0


@dataclass(frozen=True)
class ModelCost:
    """The sizes of a model that its forward pass costs depend on."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    d_mlp: int

    @classmethod
    def of(cls, model: Any) -> ModelCost:
        """From a ``LoadedModel``, a TransformerLens model (its ``cfg``) or a ``ModelSpec``
        (which has no ``d_mlp``: taken as ``4 d_model``, the common ratio, an upper bound for
        SmolLM2's 2.7 and Gemma-3's 3.2)."""
        cfg = getattr(getattr(model, "model", model), "cfg", None)
        if cfg is not None:
            return cls(int(cfg.n_layers), int(cfg.n_heads), int(getattr(cfg, "n_key_value_heads", None) or cfg.n_heads),
                       int(cfg.d_model), int(cfg.d_head), int(cfg.d_mlp or 4 * cfg.d_model))
        spec = getattr(model, "spec", model)
        return cls(int(spec.n_layers), int(spec.n_heads), int(spec.n_kv_heads or spec.n_heads), int(spec.d_model),
                   int(spec.d_head), int(spec.extra.get("d_mlp", 4 * spec.d_model)))

    def block_flops(self, positions: int) -> float:
        """Floating-point operations of one block for one token of a ``positions``-long sequence."""
        projections = self.d_model * (self.n_heads + 2 * self.n_kv_heads) * self.d_head \
            + self.n_heads * self.d_head * self.d_model + 3 * self.d_model * self.d_mlp
        return 2.0 * projections + 2.0 * positions * self.n_heads * self.d_head


@dataclass(frozen=True)
class Pass:
    """Forward passes of ``sequences`` prompts of ``positions`` tokens through ``blocks`` blocks,
    in batches of ``batch_size``; ``score_layers`` layers' scores are reduced to statistics."""

    sequences: int
    positions: int
    blocks: int
    batch_size: int
    score_layers: int = 0


@dataclass(frozen=True)
class Work:
    """What one analysis (or one step of a run) computes: its passes, its interval refits
    (``refits`` replicate-layers on ``features`` position features) and probe fits
    (``probe_solves`` solves of ``probe_size`` x ``probe_size``)."""

    passes: tuple[Pass, ...]
    refits: int = 0
    features: int = 0
    probe_solves: int = 0
    probe_size: int = 0
    analyses: int = 1

    def __add__(self, other: Work) -> Work:
        if self.refits and other.refits and self.features != other.features:
            # two refit sizes: keep the cost, expressed at the larger size
            big = max(self.features, other.features)
            scale = lambda w: w.refits * (w.features / big) ** 3  # noqa: E731
            refits, features = math.ceil(scale(self) + scale(other)), big
        else:
            refits, features = self.refits + other.refits, max(self.features, other.features)
        solves = self.probe_solves + other.probe_solves
        return Work(self.passes + other.passes, refits, features, solves, max(self.probe_size, other.probe_size),
                    self.analyses + other.analyses)


NOTHING = Work(passes=(), analyses=0)


def position_features(positions: int, exact_until: int = 16, per_octave: int = 4) -> int:
    """The decomposition's features for ``positions`` positions: one per offset, and query and key
    bins (exact below ``exact_until``, ``per_octave`` per doubling beyond), and an intercept."""
    bins = min(positions, exact_until)
    if positions > exact_until:
        bins += math.ceil(per_octave * math.log2(positions / exact_until))
    return positions + 2 * bins + 1


def decomposition_work(cost: ModelCost, *, sequences: int, positions: int, batch_size: int, replicates: int,
                       layers: int | None = None, blocks: int | None = None, passes: int = 1,
                       queries: int | None = None) -> Work:
    """``passes`` decomposition passes (one per condition: e.g. BOS replacement's base and three
    replacements) of ``layers`` analysed layers (default all), the pass running ``blocks`` blocks."""
    layers = cost.n_layers if layers is None else layers
    blocks = cost.n_layers if blocks is None else blocks
    one = Pass(sequences, positions, blocks, batch_size, score_layers=layers)
    return Work(passes=(one,) * passes, refits=replicates * layers * passes,
                features=position_features(queries or positions), analyses=passes)


def forward_work(cost: ModelCost, *, sequences: int, positions: int, batch_size: int, passes: int = 1,
                 score_layers: int = 0) -> Work:
    """``passes`` plain forward passes through every block (reading, at most, attention patterns)."""
    return Work(passes=(Pass(sequences, positions, cost.n_layers, batch_size, score_layers),) * passes)


def probe_work(cost: ModelCost, *, sequences: int, positions: int, batch_size: int, replicates: int,
               layers: int | None = None, penalties: int = 15) -> Work:
    """A probe pass and its ridge fits: per layer, two folds and the final fit over ``penalties``
    penalties (one eigendecomposition each, counted as four solves), and one solve per replicate."""
    layers = cost.n_layers if layers is None else layers
    return Work(passes=(Pass(sequences, positions, cost.n_layers, batch_size),),
                probe_solves=layers * (4 * 3 + replicates), probe_size=cost.d_model)


@dataclass(frozen=True)
class Machine:
    """What :func:`calibrate` measured: the matrix-product rate in the run's dtype and in float64
    (operations/s), the float64 elementwise rate (operations/s), and the fixed cost of one block of
    one batch (s: the framework's hooks and dispatch, from one short forward pass of the model)."""

    flops: float
    float64_flops: float
    float64_ops: float
    block_overhead_s: float
    threads: int
    device: str
    dtype: str = "float32"

    def describe(self) -> str:
        where = f"{self.threads} CPU thread{'s' * (self.threads != 1)}" if self.device == "cpu" else self.device
        return f"{where}, {self.flops / 1e9:.3g} GFLOP/s measured"


def _best_time(function: Callable[[], object], repeats: int = 3, minimum_s: float = 0.01) -> float:
    """Seconds per call of ``function``, the fastest of ``repeats`` rounds of at least ``minimum_s``."""
    best = math.inf
    for _ in range(repeats):
        calls, started = 0, time.perf_counter()
        while True:
            function()
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= minimum_s:
                break
        best = min(best, elapsed / calls)
    return best


def _synchronize(device: str) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.synchronize()


def _device(device: str) -> str:
    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


@functools.lru_cache(maxsize=8)
def _rates(device: str, dtype: str, threads: int) -> tuple[float, float, float]:
    sizes = (256, 512, 2048)
    rates = []
    with torch.no_grad():
        for kind in (getattr(torch, dtype), torch.float64):
            a = torch.randn(sizes[0], sizes[1], device=device, dtype=kind)
            b = torch.randn(sizes[1], sizes[2], device=device, dtype=kind)

            def product(a: torch.Tensor = a, b: torch.Tensor = b) -> None:
                a @ b
                _synchronize(device)

            rates.append(2.0 * sizes[0] * sizes[1] * sizes[2] / _best_time(product))
        values = torch.randn(1_000_000, dtype=torch.float64, device=device)

        def elementwise() -> None:
            ((values * 1.5 + 0.5).exp() * values).sum()
            _synchronize(device)

        rates.append(5 * values.numel() / _best_time(elementwise))
    return rates[0], rates[1], rates[2]


def block_overhead(model: Any, device: str | None = None) -> float:
    """Seconds of one block of one batch beyond its arithmetic: one forward pass of ``model`` (a
    ``LoadedModel``) on 4 tokens through every block, with a hook on each, over its blocks."""
    backend = model.backend
    device = str(backend.device) if device is None else device
    tokens = torch.zeros(1, 4, dtype=torch.long, device=backend.device)
    hooks = [(f"blocks.{layer}.attn.hook_attn_scores", lambda x, hook: None) for layer in range(backend.n_layers)]

    def forward() -> None:
        with torch.no_grad(), backend.hooks(hooks):
            backend.forward(tokens, stop_at_layer=backend.n_layers, return_type=None)
        _synchronize(device)

    forward()  # the first pass builds caches
    return _best_time(forward, repeats=3, minimum_s=0.02) / (backend.n_layers + 1)


def calibrate(device: str = "cpu", dtype: str = "float32", *, model: Any = None,
              block_overhead_s: float | None = None) -> Machine:
    """Measure this machine now (module docstring): ``[256, 512] x [512, 2048]`` matrix products
    in ``dtype`` and float64 and a float64 elementwise chain on ``device`` (cached per device,
    dtype and thread count: tens of milliseconds), and the fixed cost of a block: measured on
    ``model`` (a ``LoadedModel``: two short forward passes), or given as ``block_overhead_s``
    (e.g. measured when a model was loaded), else :data:`DEFAULT_BLOCK_S`."""
    device = _device(device)
    flops, flops64, ops64 = _rates(device, dtype, torch.get_num_threads())
    if block_overhead_s is None:
        block_overhead_s = block_overhead(model) if model is not None else DEFAULT_BLOCK_S
    return Machine(flops=flops, float64_flops=flops64, float64_ops=ops64, block_overhead_s=block_overhead_s,
                   threads=torch.get_num_threads(), device=device, dtype=dtype)


def seconds(work: Work, cost: ModelCost, machine: Machine) -> float:
    """The modelled time of ``work`` on a model of ``cost`` on ``machine`` (module docstring), s."""
    total = work.analyses * STEP_OPS / machine.float64_ops
    for one in work.passes:
        batches = math.ceil(one.sequences / one.batch_size)
        tokens = one.sequences * one.positions
        total += tokens * one.blocks * cost.block_flops(one.positions) / machine.flops
        total += batches * (one.blocks + 1) * machine.block_overhead_s
        total += one.score_layers * one.sequences * cost.n_heads * one.positions ** 2 * REDUCE_OPS / machine.float64_ops
    f = work.features
    # the design is the same for every sequence, so a replicate only re-weights sums: a product of
    # the F x F inverse with each head's sums, not a new factorisation
    total += (work.refits * REFIT_OPS * cost.n_heads * f ** 2 + work.analyses * f ** 3) / machine.float64_flops
    total += work.probe_solves * work.probe_size ** 3 / machine.float64_flops
    return total


def describe(estimate_s: float, machine: Machine) -> str:
    """``"estimated 2-4 min on this machine (2 CPU threads, ...)"``: the range :data:`SPREAD` either
    side of the estimate, both ends in the unit of the upper one."""
    low, high = estimate_s / SPREAD, estimate_s * SPREAD
    if high < 90:
        span = f"{max(1, round(low))}-{max(1, round(high))} s"
    elif high < 90 * 60:
        span = f"{max(1, round(low / 60))}-{max(1, round(high / 60))} min"
    else:
        span = f"{low / 3600:.1f}-{high / 3600:.1f} h"
    return f"estimated {span} on this machine ({machine.describe()})"


def estimate(works: Sequence[tuple[Work, ModelCost]], machine: Machine) -> tuple[float, str]:
    """The modelled seconds of every ``(work, model cost)`` on ``machine`` and the sentence saying it."""
    total = sum(seconds(work, cost, machine) for work, cost in works)
    return total, describe(total, machine)
