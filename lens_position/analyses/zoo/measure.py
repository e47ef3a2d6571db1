"""Measurements stored beside a zoo checkpoint: the sink rate of Gu et al. (2025).

The sink rate is the fraction of heads whose mean attention on position 0 exceeds
``ε = 0.3`` (``lens_position.analyses.sinks.sink_rate``), measured on CPython's pydoc topics (text the
zoo never trained on) at ``T = 64`` (Gu et al.'s setup), ``N = 32`` sequences, with the
model's own BOS policy (BOS for every variant but ``rope-nobos``). The largest per-head
score is stored too, so "no sink" can be read as "how far from one".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lens_position.analyses.sinks import SINK_EPS, sink_rate
from lens_position.models.spec import LoadedModel
from lens_position.models.zoo.store import SHIPPED, Checkpoint, load_zoo_model, update_meta

SINK_T, SINK_N = 64, 32


def measure_sinks(checkpoint: Checkpoint, *, root: Path = SHIPPED) -> Checkpoint:
    """Measure the sink rate of ``checkpoint`` and record it in its JSON (``sinks``)."""
    return update_meta(checkpoint, sinks=sink_measurement(load_zoo_model(checkpoint.name, root=root)))


def sink_measurement(loaded: LoadedModel) -> dict[str, Any]:
    """The zoo's sink measurement of one model (module docstring): the sink rate at ε, the
    largest per-head sink score (mean attention on position 0, a fraction in [0, 1]) overall
    and per layer, and the setup (T, N, text, BOS)."""
    result = sink_rate.body(loaded, conditions=("natural",), T=SINK_T, N=SINK_N, eps=SINK_EPS, bos="tokenizer",
                       progress=False)
    heads = result.heads
    return {
        "sink_rate": float(result.frame["sink_rate"].iloc[0]), "eps": SINK_EPS, "T": SINK_T, "N": SINK_N,
        "text": "pydoc topics (not in the training corpus)", "bos": "tokenizer",
        "max_sink_score": float(heads["sink_score"].max()),
        "sink_score_by_layer": heads.groupby("layer")["sink_score"].max().round(4).tolist(),
    }
