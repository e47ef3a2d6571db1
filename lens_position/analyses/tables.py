"""The tables a reproduction writes: one registry, read by the steps that write them, the
report that renders them and the takeaways that build them from result objects.

Each table is one DataFrame attribute of one result object (``BosReplacement.frame`` is the
table ``bos_layers``), written by one step of the pipeline. Tables are stacked over models
and conditions by the pipeline, which adds the columns ``model``, ``architecture`` and
``role``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd


@dataclass(frozen=True)
class Table:
    """One table: its file name (``name``), the step that writes it, where it comes from
    (``result``: the keyword of :func:`lens_position.report.takeaways.result_tables` naming
    the result object, ``attribute``: the result's DataFrame), what it holds (``meaning``),
    and other ``(result keyword, attribute)`` pairs that give the same table."""

    name: str
    step: str
    result: str
    attribute: str
    meaning: str
    also_from: tuple[tuple[str, str], ...] = ()


_ALL = (
    Table("decompose_layers", "decompose", "decomposition", "layers", "Decomposition.layers (all queries, all keys)"),
    Table("decompose_heads", "decompose", "decomposition", "heads", "Decomposition.heads (all queries, all keys)"),
    Table("decompose_replicates", "decompose", "decomposition", "replicates",
          "Decomposition.replicates (all queries, all keys): per-layer means per bootstrap replicate"),
    Table("decompose_early_layers", "bos", "bos", "base_layers", "Decomposition.layers (early queries, all keys)",
          also_from=(("early", "layers"),)),
    Table("decompose_early_replicates", "bos", "bos", "base_replicates",
          "Decomposition.replicates (early queries, all keys)", also_from=(("early", "replicates"),)),
    Table("probe_layers", "probe", "probe", "layers", "ProbeResult.layers"),
    Table("bos_layers", "bos", "bos", "frame", "BosReplacement.frame"),
    Table("bos_overall", "bos", "bos", "overall", "BosReplacement.overall"),
    Table("bos_replicates", "bos", "bos", "replicates",
          "BosReplacement.replicates: overall fraction of R removed per bootstrap replicate"),
    Table("fingerprint", "fingerprint", "fingerprint", "frame", "Fingerprint.frame"),
    Table("sink_heads", "sink_heads", "sinks", "frame", "SinkHeads.frame"),
    Table("sink_rate", "sink_rate", "sink_rate", "frame", "SinkRate.frame"),
    Table("sink_reading", "sink_reading", "reading", "frame", "SinkReading.frame"),
    Table("sink_ablation", "sink_reading", "reading", "ablation", "SinkReading.ablation"),
    Table("convergence_layers", "convergence", "convergence", "layers",
          "Position0Convergence.layers: cosine and norm of the replaced position-0 state per layer"),
    Table("convergence_restoration", "convergence", "convergence", "restoration",
          "Position0Convergence.restoration: the gap each attention / MLP output at position 0 closes"),
    Table("window_sinks_heads", "window_sinks", "window_sinks", "heads",
          "WindowSinks.heads: Gu et al.'s and the window-aware sink score per head"),
    Table("window_sinks_types", "window_sinks", "window_sinks", "layer_types",
          "WindowSinks.layer_types: sink heads and sink rate per layer type under each metric"),
    Table("bands_heads", "rotary_bands", "rotary_bands", "heads",
          "RotaryBands.heads: R's exact split by RoPE band (with its error) and R' attribution (with its error)"),
    Table("bands_layers", "rotary_bands", "rotary_bands", "layers",
          "RotaryBands.layers: per layer and band, R_band and the R' attribution (mean over heads)"),
    Table("prompt_sets", "prompt_sets", "prompt_sets", "sets",
          "PromptSetSpread.sets (opt-in, --prompt-sets K): C1's and C2's numbers on each prompt set"),
    Table("prompt_sets_summary", "prompt_sets", "prompt_sets", "spread",
          "PromptSetSpread.spread (opt-in): the spread between prompt sets beside the bootstrap's"),
)

#: The registry: table name -> :class:`Table`.
TABLES: dict[str, Table] = {table.name: table for table in _ALL}


def tables_of_step(step: str) -> tuple[str, ...]:
    """The names of the tables the step ``step`` writes, in registry order."""
    return tuple(table.name for table in _ALL if table.step == step)


def step_frames(step: str, result: Any) -> dict[str, pd.DataFrame]:
    """The tables of step ``step`` from its result object, by name; one whose attribute is
    None (bootstrap replicates with intervals off) is left out."""
    frames = {}
    for name in tables_of_step(step):
        frame = getattr(result, TABLES[name].attribute)
        if frame is not None:
            frames[name] = frame.reset_index(drop=True)
    return frames


def result_sources() -> dict[str, dict[str, str]]:
    """Per result keyword, its DataFrame attributes and the table each one is."""
    sources: dict[str, dict[str, str]] = {}
    for table in _ALL:
        for keyword, attribute in ((table.result, table.attribute), *table.also_from):
            sources.setdefault(keyword, {})[attribute] = table.name
    return sources
