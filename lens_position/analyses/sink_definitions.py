"""Attention sinks under each published definition, one function with the definition as a parameter.

Papers on attention sinks each compute one number, without intervals. :func:`sink_metric` computes
any of them on any model, on the inputs its authors used by default, with a bootstrap interval over
prompts:

- ``"gu"`` (Gu et al. 2025, sail-sg/Attention-Sink ``eval_sink_open_source.py``): per prompt, the
  share of (layer, head) whose attention on position 0, averaged over every query ``0 .. T-1``,
  exceeds ``eps = 0.3``; the mean over prompts. Inputs: the first ``T = 64`` tokens of each document
  with the tokenizer's own BOS (:func:`lens_position.core.data.build_document_prompts`), or Gu et al.'s
  other two conditions (``condition="random"``: random tokens after the BOS; ``"repeated"``: one token
  repeated, without BOS). The same number as :func:`lens_position.analyses.sinks.sink_rate` with
  ``protocol="documents"`` on each condition (a test checks it).
- ``"barbero"`` (Barbero et al. 2025, "Why do LLMs attend to the first token?"): the same metric at
  ``eps = 0.8``, as their paper states it; we found no public code to check it against.
- ``"first_token_mass"`` (the attention on the first token read in the nnsight and TransformerLens
  tutorials): per prompt, the mean over layers, heads and queries ``1 .. T-1`` of ``A[i, 0]`` (query 0,
  which can only attend to itself, left out), a fraction in [0, 1].
- ``"eviction"`` (Xiao et al. 2024, StreamingLLM, mit-han-lab/streaming-llm ``eval_long_ppl.py``):
  the perplexity of next-token prediction when every query attends only to the last ``window`` keys
  (window attention: older keys evicted from the cache), and when the first ``sinks`` keys are kept as
  well (StreamingLLM), beside dense attention; on positions ``window .. T-2`` predicting the next token.
  One forward pass per variant with every layer's scores masked to the keys the cache would still
  hold: each key was computed when its token was processed, with the keys its own cache held then,
  which is exactly what token-by-token decoding with an evicting cache computes (checked against such
  a decoding loop on a Hugging Face model). Keys keep their original positions: StreamingLLM also
  re-numbers positions inside the cache, which this pass does not (within the model's context the
  offsets inside the window are the same; only the offsets to the kept first keys differ).

Units: ``sink_rate`` a fraction of (layer, head) pairs; ``first_token_mass`` a fraction of
attention; ``ppl_*`` perplexities (exp of mean nats per token); ``ppl_ratio`` = window over
window-with-sinks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float

from lens_position.analyses.massive import LossReducer
from lens_position.analyses.patching import as_tokens
from lens_position.analyses.sinks import GU_CONDITIONS, prompt_sink_scores, sink_rate_prompts
from lens_position.core.checks import check_count, check_fraction
from lens_position.core.data import build_document_prompts
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import PROBABILITY, Bootstrap, bootstrap_mean
from lens_position.core.results import SavedResult
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.core.summaries import Headline, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.models.spec import LoadedModel, public

__all__ = ["DEFINITIONS", "SinkMetric", "eviction_mask", "sink_metric"]

#: definition -> (threshold, what it is, where it comes from)
DEFINITIONS: dict[str, tuple[float | None, str, str]] = {
    "gu": (0.3, "share of (layer, head) with mean_i A[i, 0] > eps, per prompt",
           "Gu et al. 2025 (sail-sg/Attention-Sink)"),
    "barbero": (0.8, "share of (layer, head) with mean_i A[i, 0] > eps, per prompt",
                "Barbero et al. 2025 (the paper's definition; no public code found)"),
    "first_token_mass": (None, "mean over layers, heads and queries 1..T-1 of A[i, 0]", "nnsight / TransformerLens"),
    "eviction": (None, "perplexity with window attention, with and without the first keys kept",
                 "Xiao et al. 2024, StreamingLLM (mit-han-lab/streaming-llm)"),
}
#: the default sizes: Gu et al.'s T = 64; StreamingLLM's evaluation needs texts longer than the window
DOCUMENT_T, EVICTION_T, EVICTION_WINDOW, EVICTION_SINKS = 64, 256, 64, 4


@dataclass(repr=False)
class SinkMetric(SavedResult):
    """Result of :func:`sink_metric`. ``frame``: one row per quantity (``sink_rate``,
    ``first_token_mass``, or ``ppl_dense``, ``ppl_window``, ``ppl_window_sinks`` and ``ppl_ratio``) with
    ``value`` and its 95% bootstrap interval over prompts (``value_lo``, ``value_hi``), ``definition``,
    ``eps``, ``seq_len``, ``N``. ``per_prompt``: the per-prompt values the intervals resample."""

    frame: pd.DataFrame
    per_prompt: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "an attention-sink metric under a published definition"
    INTERVALS = "95% bootstrap over prompts"

    def headline(self) -> list[Headline]:
        """Each quantity with its interval."""
        return [Headline("value", str(row["quantity"]), row_estimate(row, "value"), str(row["definition"]))
                for _, row in self.frame.iterrows()]


def eviction_mask(T: int, window: int, sinks: int) -> Float[torch.Tensor, "query key"]:
    """The keys a cache of the last ``window`` tokens (plus the first ``sinks``) holds for each query:
    ``j <= i`` and (``i - j < window`` or ``j < sinks``), as a boolean ``[T, T]``."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    return (j <= i) & ((i - j < window) | (j < sinks))


def _score_mask_hooks(loaded: LoadedModel, keep: torch.Tensor) -> list[tuple[str, Callable]]:
    def hook(scores: torch.Tensor, hook: Any = None) -> torch.Tensor:
        return scores.masked_fill(~keep.to(scores.device), float("-inf"))

    return [(f"blocks.{layer}.attn.hook_attn_scores", hook) for layer in range(loaded.spec.n_layers)]


def _eviction(loaded: LoadedModel, tokens: torch.Tensor, window: int, sinks: int, batch_size: int,
              progress: bool) -> dict[str, np.ndarray]:
    """Mean next-token loss per prompt under dense, window and window-with-sinks attention."""
    T = tokens.shape[1]
    out = {}
    for name, keep in (("dense", None), ("window", eviction_mask(T, window, 0)),
                       ("window_sinks", eviction_mask(T, window, sinks))):
        reducer = LossReducer(tokens.cpu(), first=window)
        stream.body(loaded, tokens, [reducer], batch_size=batch_size, progress=progress, desc=f"eviction ({name})",
               fwd_hooks=() if keep is None else _score_mask_hooks(loaded, keep))
        out[name] = reducer.loss.numpy()
    return out


def _default_prompts(loaded: LoadedModel, definition: str, condition: str, T: int | None, N: int, seed: int
                     ) -> Any:
    """The first ``T`` tokens of ``N`` documents with the tokenizer's own BOS (``"natural"``), or Gu
    et al.'s other inputs of the same size (``"random"`` tokens after the BOS, one token
    ``"repeated"`` without BOS; :func:`lens_position.analyses.sinks.sink_rate_prompts`)."""
    length = T if T is not None else (EVICTION_T if definition == "eviction" else DOCUMENT_T)
    if condition == "natural":
        return build_document_prompts(loaded, T=length, N=N, seed=seed)
    return sink_rate_prompts(loaded, conditions=[condition], T=length, N=N, seed=seed, protocol="documents")[condition]


@public
def sink_metric(
    loaded: LoadedModel,
    prompts: Prompts | None = None,
    *,
    definition: str = "gu",
    condition: str = "natural",
    eps: float | None = None,
    T: int | None = None,
    N: int = 16,
    seed: int = 0,
    window: int = EVICTION_WINDOW,
    sinks: int = EVICTION_SINKS,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> SinkMetric:
    """The attention-sink metric of ``definition`` (module docstring: ``"gu"``, ``"barbero"``,
    ``"first_token_mass"``, ``"eviction"``) on ``prompts`` (default: the first ``T`` tokens of ``N``
    documents of the default corpus with the tokenizer's own BOS, ``T`` = 64, or 256 for eviction),
    with 95% bootstrap intervals over prompts. ``condition`` picks Gu et al.'s default inputs:
    ``"natural"`` documents, ``"random"`` tokens after the BOS, or one token ``"repeated"`` without
    BOS (prompts given: ``"given"``). ``eps`` overrides the definition's threshold; ``window`` and
    ``sinks``: the eviction's cache of recent keys and the first keys kept."""
    if definition not in DEFINITIONS:
        raise BadInputError(f"unknown sink definition {definition!r}; use one of {', '.join(DEFINITIONS)}")
    if condition not in GU_CONDITIONS:
        raise BadInputError(f"unknown condition {condition!r}; use one of {', '.join(GU_CONDITIONS)} (Gu et al.'s "
                            "inputs), or pass prompts")
    if prompts is not None and condition != "natural":
        raise BadInputError(f"condition={condition!r} chooses the default prompts; pass either prompts or a condition")
    threshold = DEFINITIONS[definition][0] if eps is None else check_fraction("eps", eps)
    label = condition if prompts is None else "given"
    if prompts is None:
        prompts = _default_prompts(loaded, definition, condition, T, check_count("N", N), seed)
    prompts = checked_prompts(loaded, prompts, min_length=2)
    tokens = as_tokens(loaded, prompts)
    length = tokens.shape[1]
    if definition == "eviction":
        window, sinks = check_count("window", window), check_count("sinks", sinks, minimum=0)
        if not sinks < window < length - 1:
            raise BadInputError(f"eviction needs sinks < window < T - 1 (got sinks={sinks}, window={window}, "
                                f"T={length}): pass longer prompts or a smaller window")
        losses = _eviction(loaded, tokens, window, sinks, check_count("batch_size", batch_size), progress)
        per_prompt = pd.DataFrame({f"loss_{k}": v for k, v in losses.items()})
        rows = []
        for name in ("dense", "window", "window_sinks"):
            mean, lo, hi = bootstrap_mean(losses[name], bootstrap)
            rows.append({"quantity": f"ppl_{name}", "value": math.exp(mean), "value_lo": math.exp(lo),
                         "value_hi": math.exp(hi)})
        mean, lo, hi = bootstrap_mean(losses["window"] - losses["window_sinks"], bootstrap)
        rows.append({"quantity": "ppl_ratio", "value": math.exp(mean), "value_lo": math.exp(lo),
                     "value_hi": math.exp(hi)})
    else:
        query_range = (1, length) if definition == "first_token_mass" else None
        scores = prompt_sink_scores(loaded, prompts, query_range=query_range, batch_size=batch_size, progress=progress)
        if definition == "first_token_mass":
            values, quantity = scores.mean((1, 2)).numpy(), "first_token_mass"
        else:
            values, quantity = (scores > threshold).to(torch.float64).mean((1, 2)).numpy(), "sink_rate"
        per_prompt = pd.DataFrame({quantity: values})
        mean, lo, hi = bootstrap_mean(values, bootstrap, PROBABILITY)
        rows = [{"quantity": quantity, "value": float(mean), "value_lo": float(lo), "value_hi": float(hi)}]
    frame = pd.DataFrame(rows).assign(definition=definition, condition=label, eps=threshold, seq_len=length,
                                      N=len(tokens))
    return SinkMetric(frame=frame, per_prompt=per_prompt, provenance=provenance.collect(
        model=loaded.spec, data=getattr(prompts, "spec", None), definition=definition, condition=label, eps=threshold,
        what=DEFINITIONS[definition][1], source=DEFINITIONS[definition][2], window=window, sinks=sinks,
        intervals=bootstrap.to_dict("prompt")))
