"""The decomposition's components against sequence length ``T``, on one model.

Why it exists: the mask component shrinks as ``T`` grows on every model (the normaliser of query
``i`` sums over ``i + 1`` keys, and the further ``i`` is from 0 the less one more key changes it),
and the residual component moves with ``T`` too. A comparison of two models measured at different
``T`` therefore measures ``T`` as much as the models. This sweep decomposes one model at each ``T``
of a grid, with prompts drawn the same way at every ``T`` (:func:`lens_position.core.data.build_prompts`,
same source, BOS policy and seed), so that:

- the report shows how much ``T`` alone moves each component (the ``length_sweep`` figure);
- the claims compare architectures only at a ``T`` both were measured at
  (:mod:`lens_position.analyses.claims`: a comparison whose decompositions differ in ``T`` is made
  on this sweep's rows at a common ``T``, or is inconclusive with that reason).

Tables: ``layers`` is :class:`~lens_position.analyses.decompose.Decomposition`'s per-layer table
at every ``T`` (its ``seq_len`` column says which); ``replicates`` its per-layer bootstrap
replicates with the same ``seq_len`` column; ``by_length`` one row per (``seq_len`` = ``T``,
component): the mean over layers and heads of the held-out total and of the reference-free
split's ``R'``, ``M'`` and interaction ``C'`` (fractions of Var(log A)), its 95% percentile
interval over the bootstrap replicates of whole sequences, ``n_sequences`` and the model's
sliding ``window`` (NaN without one) with ``beyond_window`` (``T`` larger than it: the local
layers slide).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from lens_position.analyses.decompose import decompose
from lens_position.core.checks import check_count, check_seed
from lens_position.core.data import DEFAULT_BOS, build_prompts
from lens_position.core.intervals import Bootstrap, from_replicates
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.pass_memory import check_pass_fits
from lens_position.models.spec import LoadedModel, public

__all__ = ["DEFAULT_LENGTHS", "QUANTITIES", "SUMMARY_COLUMNS", "LengthSweep", "length_sweep", "lengths_within"]

#: The default grid: powers of two from 32 to 1024 (1024 is twice Gemma-3's window of 512).
DEFAULT_LENGTHS: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
#: The components the summary carries: column -> what it is.
QUANTITIES = {"total_heldout": "total", "R_rf_heldout": "R' residual", "M_rf_heldout": "M' mask",
              "C_rf_heldout": "C' interaction"}
SUMMARY_COLUMNS = ["seq_len", "quantity", "label", "value", "lo", "hi", "level", "n_sequences", "window",
                   "beyond_window"]


@dataclass(repr=False)
class LengthSweep(SavedResult):
    """Result of :func:`length_sweep` (module docstring: the tables and their units)."""

    KEYWORD = "length_sweep"
    TABLES = (
        Table("length_sweep", "by_length",
              "LengthSweep.by_length: total, R', M' and C' (held out, means over layers and heads) at each T"),
        Table("length_sweep_layers", "layers",
              "LengthSweep.layers: the decomposition's per-layer table at each T (column seq_len)"),
        Table("length_sweep_replicates", "replicates",
              "LengthSweep.replicates: per-layer means per bootstrap replicate at each T (column seq_len)"),
    )

    by_length: pd.DataFrame
    layers: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)
    replicates: pd.DataFrame | None = None

    WHAT = "the decomposition's components against sequence length T"

    def headline(self) -> list[Headline]:
        """R' and M' at the shortest and the longest T, with their intervals."""
        if not len(self.by_length):
            return []
        out = []
        for T in sorted({int(self.by_length["seq_len"].min()), int(self.by_length["seq_len"].max())}):
            for column in ("R_rf_heldout", "M_rf_heldout"):
                row = self.by_length[(self.by_length["seq_len"] == T) & (self.by_length["quantity"] == column)].iloc[0]
                out.append(Headline("value", f"{QUANTITIES[column]} at T = {T}", row_estimate(row, "value"),
                                    "share of Var(log A), held out, mean over layers and heads"))
        return out

    def at(self, T: int, quantity: str = "M_rf_heldout") -> float:
        """``by_length``'s value of ``quantity`` at ``T`` (KeyError when that T was not measured)."""
        part = self.by_length[(self.by_length["seq_len"] == T) & (self.by_length["quantity"] == quantity)]
        if not len(part):
            raise KeyError(f"T = {T} was not measured; measured: {sorted(set(self.by_length['seq_len'].tolist()))}")
        return float(part["value"].iloc[0])


def lengths_within(lengths: Sequence[int], n_ctx: int | None) -> tuple[int, ...]:
    """The lengths of a grid that fit a context of ``n_ctx`` positions (all of them when None)."""
    return tuple(T for T in lengths if n_ctx is None or T <= n_ctx)


def _summary_rows(T: int, layers: pd.DataFrame, replicates: pd.DataFrame | None, window: int | None) -> list[dict]:
    """The mean over layers of each quantity at one ``T``, with its interval over replicates."""
    layers = layers.sort_values("layer")
    n = int(layers["n_sequences"].iloc[0])
    rows = []
    for column, label in QUANTITIES.items():
        reps = None
        if replicates is not None and column in replicates.columns:
            grid = replicates.pivot(index="replicate", columns="layer", values=column)
            reps = grid.reindex(columns=layers["layer"].tolist()).to_numpy(dtype=float).mean(1)
        e = from_replicates(float(layers[column].mean()), reps, n=n)
        rows.append({"seq_len": T, "quantity": column, "label": label, "value": e.value, "lo": e.lo, "hi": e.hi,
                     "level": e.level, "n_sequences": n, "window": math.nan if window is None else float(window),
                     "beyond_window": window is not None and T > window})
    return rows


@public
def length_sweep(
    loaded: LoadedModel,
    lengths: Sequence[int] = DEFAULT_LENGTHS,
    *,
    N: int = 8,
    source: str = "natural",
    bos: str = DEFAULT_BOS,
    seed: int = 0,
    text: str | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
    leave_out_short_text: bool = False,
) -> LengthSweep:
    """Decompose ``model`` on ``N`` prompts at each length of ``lengths`` (module docstring).

    Every length must fit the model's context (ContextLengthError otherwise: leave it out, or
    use :func:`lengths_within`), and one pass of it the memory of the model's device
    (ResourceError otherwise, before the first pass: :mod:`lens_position.models.pass_memory`).
    Costs one decomposition per length; the longest dominates (a decomposition's cost grows
    faster than ``T``). ``progress``: one bar counting sequences.

    ``leave_out_short_text``: a length at which the text gives fewer than ``N`` distinct sequences
    (a short corpus, long ``T``) is left out and named in the provenance's ``left_out``, instead of
    raising BadInputError (the reproduction's step does this, so a short corpus still gets the
    lengths it can fill); at least one length must remain."""
    N, seed = check_count("N", N, minimum=2), check_seed(seed)
    grid = sorted({check_count("T", T, minimum=2) for T in lengths})
    if not grid:
        raise BadInputError("give at least one length T to sweep")
    for T in grid:
        loaded.spec.check_context(T)
        check_pass_fits(loaded.backend, min(batch_size, N), T)  # before hours of shorter lengths
    window = loaded.spec.window if loaded.spec.has_sliding_window else None
    layer_frames, replicate_frames, rows, prompt_specs, left_out = [], [], [], [], []
    with progress_bar("length sweep", total=N * len(grid), enabled=progress):
        for T in grid:
            prompts = build_prompts(loaded, source=source, T=T, N=N, bos=bos, seed=seed, text=text)
            if leave_out_short_text and len(torch.unique(prompts.tokens, dim=0)) < len(prompts.tokens):
                left_out.append(T)
                continue
            result = decompose.body(loaded, prompts, batch_size=batch_size, bootstrap=bootstrap, progress=progress)
            layers = result.layers.assign(seq_len=T)
            replicates = None if result.replicates is None else result.replicates.assign(seq_len=T)
            layer_frames.append(layers)
            if replicates is not None:
                replicate_frames.append(replicates)
            rows.extend(_summary_rows(T, layers, replicates, window))
            prompt_specs.append(prompts.spec.to_dict())
    if not layer_frames:
        raise BadInputError(f"the text gives fewer than N = {N} distinct sequences at every length of {grid}: "
                            "use a longer text, a smaller N or shorter lengths")
    intervals = (result.provenance.get("options") or {}).get("intervals")
    prov = provenance.collect(model=loaded.spec, data=prompt_specs, seed=seed, lengths=grid, N=N, source=source,
                              bos=bos, intervals=intervals, left_out=left_out)
    return LengthSweep(by_length=pd.DataFrame(rows, columns=SUMMARY_COLUMNS),
                       layers=pd.concat(layer_frames, ignore_index=True), provenance=prov,
                       replicates=pd.concat(replicate_frames, ignore_index=True) if replicate_frames else None)
