"""Attention rollout to position 0: how much of each query's input has flowed from the first token,
layer by layer.

Rollout (Abnar and Zuidema, 2020) follows attention through the layers: with ``Ā_l`` the
pattern of layer ``l`` averaged over its heads (row-stochastic, causal, ``[query, key]``), the flow
after layer ``l`` is the product ``P_l = Â_l Â_{l-1} ... Â_0``, and ``P_l[i, 0]`` is the share of
query ``i``'s state that comes from position 0. Two versions:

- **without the residual path**, ``Â = Ā``: Wu, Wang, Jegelka and Jadbabaie (ICML 2025) prove that
  under causal masking this product converges to attention on the first token alone (``P[i, 0] → 1``)
  as depth grows, for any patterns whose weights stay bounded below;
- **with the residual path**, ``Â = (Ā + I) / 2`` (Abnar and Zuidema's account of the skip
  connection): each layer keeps half of what the query had.

The empirical curve is the mean over prompts and queries ``1 <= i < T`` (query 0 sees only itself:
its flow is 1 by construction) of ``P_l[i, 0]``, per layer, a fraction in [0, 1], with a bootstrap
interval over prompts (inside [0, 1]). Only position 0's column of the product is needed, and it
follows layer by layer, ``P_l[:, 0] = Â_l P_{l-1}[:, 0]``: one ``[batch, T]`` float64 vector per
variant while a batch streams, ``O(T²)`` per layer; nothing per layer is kept but the curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from lens_position.analyses.patching import as_tokens
from lens_position.core.checks import check_count
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts, require_checked
from lens_position.core.intervals import PROBABILITY, Bootstrap, bootstrap_mean
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

__all__ = ["AttentionRollout", "RolloutReducer", "attention_rollout", "flow_step", "rollout_step"]

VARIANTS = ("with_residual", "without_residual")
RESIDUAL = (True, False)  # whether each variant keeps the residual path


def rollout_step(product: Float[torch.Tensor, "batch query key"], pattern: Float[torch.Tensor, "batch query key"],
                 residual: bool) -> Float[torch.Tensor, "batch query key"]:
    """One layer of rollout: ``Â @ product`` with ``Â`` the head-averaged ``pattern``, mixed half
    and half with the identity when ``residual``."""
    if residual:
        pattern = 0.5 * (pattern + torch.eye(pattern.shape[-1], dtype=pattern.dtype))
    return pattern @ product


#: query rows of a pattern read together by :func:`flow_step` (their head sum: float64 ``[batch, rows, T]``)
FLOW_ROWS = 256


def flow_step(flow: Float[torch.Tensor, "batch query *variant"], pattern: Float[torch.Tensor, "batch head query key"],
              residual: bool | Sequence[bool]) -> Float[torch.Tensor, "batch query *variant"]:
    """One layer of rollout on position 0's column alone, ``P_l[:, 0] = Â_l P_{l-1}[:, 0]``
    (``flow`` is ``P_{l-1}[:, 0]``, ``Â`` the head mean of ``pattern``, mixed half and half with the
    identity when ``residual``): the column :func:`rollout_step` would give, in ``O(T²)`` per layer
    instead of ``O(T³)``, reading the pattern in blocks of :data:`FLOW_ROWS` query rows, its heads
    summed in float64.
    Several columns at once: ``flow`` ``[batch, query, variant]`` and one ``residual`` per variant (the
    pattern is then read once for all of them)."""
    columns = flow if flow.ndim == 3 else flow[..., None]
    mixes = torch.tensor([residual] if isinstance(residual, bool) else list(residual))
    out = torch.empty_like(columns)
    n_heads, n_queries = pattern.shape[1], pattern.shape[2]
    for first in range(0, n_queries, FLOW_ROWS):
        rows = slice(first, min(first + FLOW_ROWS, n_queries))
        # the heads summed as they are read (float64 sums, one read of the pattern, no float64 copy of it)
        head_sum = pattern[:, :, rows].sum(1, dtype=torch.float64).to(columns.device)
        out[:, rows] = torch.bmm(head_sum, columns) / n_heads
    out[..., mixes] = 0.5 * (out[..., mixes] + columns[..., mixes])
    return out if flow.ndim == 3 else out[..., 0]


class RolloutReducer:
    """The rollout flow to position 0 as a reducer for :func:`lens_position.core.stream.stream`: per
    prompt, layer and variant (:data:`VARIANTS`), the mean over queries ``1 .. T-1`` of ``P_l[i, 0]``."""

    def __init__(self, loaded: LoadedModel, prompts: CheckedPrompts) -> None:
        tokens = require_checked(loaded, prompts, "RolloutReducer").tokens
        if tokens.shape[1] < 2:
            raise BadInputError("rollout needs at least 2 positions: query 0 sees only itself")
        n_layers = loaded.spec.n_layers
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers))
        self._layer_of = {name: layer for layer, name in enumerate(self.hook_names)}
        self.flow = torch.full((tokens.shape[0], n_layers, len(VARIANTS)), float("nan"), dtype=torch.float64)
        self._columns = torch.zeros(0)

    def update(self, hook_name: str, pattern: Float[torch.Tensor, "batch head query key"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        if layer == 0:  # a new batch: every product starts at the identity, whose column 0 is e_0
            self._columns = torch.zeros(pattern.shape[0], pattern.shape[-1], len(VARIANTS), dtype=torch.float64)
            self._columns[:, 0] = 1.0
        self._columns = flow_step(self._columns, pattern, RESIDUAL)
        self.flow[rows, layer] = self._columns[:, 1:].mean(1)

    def result(self) -> Float[torch.Tensor, "prompt layer variant"]:
        """The flow to position 0 per prompt, layer and variant, in [0, 1]."""
        seen = ~torch.isnan(self.flow).any(2).any(1)
        if not bool(seen.any()):
            raise BadInputError("no prompts were streamed through this rollout")
        return self.flow[seen]


@dataclass(repr=False)
class AttentionRollout(SavedResult):
    """Result of :func:`attention_rollout`. ``layers``: one row per layer with ``flow_with_residual``
    and ``flow_without_residual`` (the mean over prompts and queries ``1 <= i < T`` of the rollout
    ``P_l[i, 0]``, fractions in [0, 1]) and their 95% bootstrap intervals over prompts (``_lo``,
    ``_hi``, inside [0, 1]), and ``n_sequences``. ``per_prompt``: ``[prompt, layer, variant]``."""

    layers: pd.DataFrame
    per_prompt: torch.Tensor
    provenance: dict[str, Any]

    WHAT = "attention rollout to position 0, layer by layer"
    KEYWORD = "rollout"
    TABLES = (Table("rollout_layers", "layers", "AttentionRollout.layers", columns={
        "flow_with_residual": "rollout to position 0 with the residual path ((A + I) / 2 per layer): share of a "
                              "query's input from position 0, mean over prompts and queries 1 <= i < T, in [0, 1]",
        "flow_without_residual": "rollout to position 0 through attention alone (the head-averaged patterns' "
                                 "product): share of a query's input from position 0, in [0, 1]"}),)

    def sentence(self, architecture: str | None = None) -> str:
        """The flow to position 0 in words (:func:`rollout_sentence`)."""
        return rollout_sentence(self.layers, architecture)

    def headline(self) -> list[Headline]:
        """The flow to position 0 after the last layer, with and without the residual path."""
        last = self.layers.iloc[-1]
        return [Headline(f"flow_{v}", f"flow to position 0 after layer {int(last['layer'])} ({v.replace('_', ' ')})",
                         row_estimate(last, f"flow_{v}"), "share of a query's input from position 0")
                for v in VARIANTS]


@public
def attention_rollout(loaded: LoadedModel, prompts: Prompts, *, batch_size: int = BATCH_SIZE,
                      bootstrap: Bootstrap = Bootstrap(), progress: bool = True) -> AttentionRollout:
    """The attention rollout to position 0 of ``model`` on ``prompts``, per layer, with and without
    the residual path, with bootstrap intervals over prompts (module docstring)."""
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    reducer = RolloutReducer(loaded, prompts)
    with progress_bar("attention rollout", enabled=progress):
        stream.body(loaded, as_tokens(loaded, prompts), [reducer], batch_size=check_count("batch_size", batch_size),
               progress=progress, desc="attention rollout")
    flow = reducer.result()
    n_prompts, n_layers, _ = flow.shape
    frame = pd.DataFrame({"layer": np.arange(n_layers)})
    for v, name in enumerate(VARIANTS):
        values = flow[:, :, v].numpy()
        frame[f"flow_{name}"] = values.mean(0)
        _, lo, hi = bootstrap_mean(values, bootstrap, PROBABILITY)
        frame[f"flow_{name}_lo"], frame[f"flow_{name}_hi"] = lo, hi
    frame["n_sequences"] = n_prompts
    return AttentionRollout(layers=frame, per_prompt=flow, provenance=provenance.collect(
        model=loaded.spec, data=prompts.spec.to_dict(), seed=prompts.spec.seed,
        metric="mean over prompts and queries 1 <= i < T of the rollout P_l[i, 0]; with residual: (A + I) / 2",
        intervals=bootstrap.to_dict("prompt")))


def rollout_sentence(layers: pd.DataFrame, architecture: str | None = None, level: float = 0.9) -> str:
    """The attention rollout to position 0 (``AttentionRollout.layers``): after which layer the flow
    from position 0 first reaches ``level`` (through attention alone, and with the residual path),
    and where it ends, with intervals."""
    who = architecture or "The model"
    layers = layers.sort_values("layer")
    last = layers.iloc[-1]
    parts = []
    for column, how in (("flow_without_residual", "through attention alone"),
                        ("flow_with_residual", "with the residual path")):
        reached = layers[layers[column] >= level]
        when = (f"reaches {level:.0%} after layer {int(reached['layer'].iloc[0])}" if len(reached)
                else f"stays below {level:.0%}")
        parts.append(f"{how} it {when} and ends at {last[column]:.0%} [{last[column + '_lo']:.0%}, "
                     f"{last[column + '_hi']:.0%}] after layer {int(last['layer'])}")
    return f"{who}: the share of a query's input that has flowed from position 0: " + "; ".join(parts) + "."
