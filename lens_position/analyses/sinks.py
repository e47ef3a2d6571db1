"""Attention sinks and the heads that read them.

- **Sink heads** (:func:`sink_heads`). A head's *sink score* is its mean attention on
  position 0, ``alpha_0 = mean over prompts and queries i of A[i, 0]`` (queries ``0..T-1``
  by default, as in Gu et al. 2025, so query 0's ``A[0, 0] = 1`` is included), with a
  bootstrap interval over prompts. A head with ``alpha_0 > eps`` (``eps = 0.3``) is a sink
  head.
- **Sink rate** (:func:`sink_rate`), as Gu et al. compute it (``eval_sink_open_source.py``
  in sail-sg/Attention-Sink): for every prompt, layer and head, the attention on position 0
  averaged over queries is thresholded at ``eps``; the 0/1 outcomes are averaged over
  prompts, layers and heads (``sink_rate``, in [0, 1]; they report percent), with a
  bootstrap interval over prompts. Their inputs are the first ``T = 64`` tokens of each
  document, tokenised with the tokenizer's own special tokens (its own BOS):
  ``protocol="documents"`` here. The default, ``protocol="windows"``, draws windows of the
  corpus with the run's BOS policy instead, as every other analysis does. The rate lens_position reported before, the
  fraction of
  heads whose score *averaged over prompts first* exceeds ``eps``, is kept as
  ``sink_rate_pooled``; it is not the authors' metric and runs higher than it when a
  head's score varies across prompts around ``eps``.
- **Sink-reading heads** (:func:`sink_reading_heads`). A detector in the spirit of
  TransformerLens's ``head_detector``: for every head, patch *only its own* key and value at
  position 0 with a counterfactual fingerprint (the position-0 key/value that another token
  0, or the text without BOS, produces) and measure (a) the change of the head's output and
  (b) the change of its residual component ``R`` (``lens_position.analyses.decompose``). A head whose
  output or ``R`` moves reads the position-0 fingerprint. "Only its own" is exact: every
  block reads the *unpatched* residual stream (``resid_pre`` pinned to the base run), so all
  heads are measured in one pass without a patch in one layer leaking into the next. Then
  the top heads are ablated (zero and mean) and the per-layer ``R`` downstream is compared
  with the unablated model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.compare import compare, decompose_conditions
from lens_position.analyses.decompose import Decomposition, DecompositionReducer
from lens_position.analyses.fingerprint import counterfactual_token0, position0_activations
from lens_position.analyses.patching import Ablation, Patch, as_tokens, cache_activations, head_ablation
from lens_position.core.checks import check_count, check_fraction, check_heads, check_query_range
from lens_position.core.data import DEFAULT_BOS
from lens_position.core.inputs import CheckedPrompts, Prompts, check_prompts, checked_prompts, require_checked
from lens_position.core.intervals import PROBABILITY, Bootstrap, Estimate, bootstrap_mean
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, WholeActivations, stream
from lens_position.core.summaries import Headline, headlines_from_rows, row_estimate
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError, NonFiniteError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

SINK_EPS = 0.3
#: positions per prompt of the sink-head step (Gu et al.'s T = 64 set-up): ``analyze`` and the reproduction
#: measure sink heads on the first ``SINK_T`` positions of their prompts
SINK_T = 64
GU_CONDITIONS = ("natural", "random", "repeated")
SINK_CONDITIONS = (*GU_CONDITIONS, "repeated_bos")
# What each condition is made of: its token source, and the BOS policy of position 0 (None: the
# run's; "none": no BOS, as Gu et al. feed repeated tokens, one token repeated from position 0;
# "force": the tokenizer's BOS whatever the run's policy, so that repeated_bos always has one)
CONDITION_SOURCES: dict[str, tuple[str, str | None]] = {
    "natural": ("natural", None), "random": ("random", None), "repeated": ("repeated", "none"),
    "repeated_bos": ("repeated", "force")}


def _data_spec(prompts: Any) -> Any:
    return getattr(prompts, "spec", None) or {"source": "tensor", "shape": list(getattr(prompts, "shape", []))}


def _bos_policy(prompts: Any) -> Any:
    spec = getattr(prompts, "spec", None)
    return getattr(spec, "bos", None) if spec is not None else "as given (token tensor)"


# --------------------------------------------------------------------------- sink heads


@dataclass(repr=False)
class SinkHeads(SavedResult):
    """Result of :func:`sink_heads`. ``frame``: one row per (layer, head) with ``sink_score``
    (mean attention on position 0 over prompts and queries, in [0, 1]), its bootstrap
    interval over prompts ``sink_score_lo``/``sink_score_hi``, ``is_sink``
    (``sink_score > eps``), ``eps`` and ``seq_len`` (positions per prompt: the score depends on
    it). ``scores``: ``Float[Tensor, "layer head"]``;
    ``prompt_scores``: the same per prompt, ``Float[Tensor, "prompt layer head"]`` (None when
    only pooled scores were given).

    ``sink_rate``: Gu et al.'s metric, the fraction of (prompt, layer, head) triples whose
    per-prompt score exceeds ``eps``; ``sink_rate_pooled``: the fraction of heads whose
    score averaged over prompts exceeds it (not their metric)."""

    KEYWORD = "sinks"
    TABLES = (
        Table("sink_heads", "frame",
              "SinkHeads.frame"),
    )

    frame: pd.DataFrame
    scores: Float[torch.Tensor, "layer head"]
    eps: float
    prompt_scores: Float[torch.Tensor, "prompt layer head"] | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "sink heads: mean attention on position 0 per head"
    INTERVALS = "95% bootstrap over prompts"
    HEADS = ("frame", "sink_score")

    def headline(self) -> list[Headline]:
        """How many heads are sinks, and the largest sink score with its interval."""
        out = [Headline("is_sink", f"sink heads (score > {self.eps:g})", Estimate(float(self.frame["is_sink"].sum())),
                        f"of {len(self.frame)} heads")]
        if len(self.frame):
            top = self.frame.loc[self.frame["sink_score"].astype(float).idxmax()]
            out.append(Headline("sink_score", f"largest sink score (L{int(top['layer'])}.H{int(top['head'])})",
                                row_estimate(top, "sink_score"), "mean attention on position 0, in [0, 1]"))
        return out

    @property
    def sink_rate(self) -> float:
        if self.prompt_scores is None:
            raise BadInputError("Gu et al.'s sink rate needs the per-prompt scores; call sink_heads without "
                                "precomputed pooled scores (or use sink_rate_pooled)")
        return float((self.prompt_scores > self.eps).to(torch.float64).mean())

    @property
    def sink_rate_pooled(self) -> float:
        return float((self.scores > self.eps).to(torch.float64).mean())


class SinkScoreReducer:
    """Sink scores as a reducer for :func:`lens_position.core.stream.stream`: per prompt and
    (layer, head), the mean over queries ``query_range`` of ``A[i, 0]`` (float64), read at
    ``hook_pattern`` of every layer. :meth:`result` returns them per prompt
    (``[prompt, layer, head]``: Gu et al.'s sink rate thresholds each prompt);
    :func:`sink_scores` averages them over prompts."""

    def __init__(self, loaded: LoadedModel, prompts: CheckedPrompts, *,
                 query_range: tuple[int, int] | None = None) -> None:
        tokens = require_checked(loaded, prompts, "SinkScoreReducer").tokens
        self.start, self.stop = check_query_range(query_range, tokens.shape[1])
        n_layers = loaded.spec.n_layers
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers))
        self._layer_of = {name: layer for layer, name in enumerate(self.hook_names)}
        self.per_prompt = torch.zeros(tokens.shape[0], n_layers, loaded.spec.n_heads, dtype=torch.float64)
        self.seen = torch.zeros(tokens.shape[0], dtype=torch.bool)

    def update(self, hook_name: str, pattern: Float[torch.Tensor, "batch head query key"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        self.per_prompt[rows, layer] = pattern[:, :, self.start:self.stop, 0].to(torch.float64).mean(2).cpu()
        self.seen[rows] = True

    def result(self) -> Float[torch.Tensor, "prompt layer head"]:
        """Mean attention on position 0 over queries, per prompt and (layer, head), in [0, 1]."""
        if not bool(self.seen.any()):
            raise BadInputError("no prompts were streamed through these sink scores")
        return self.per_prompt[self.seen]


def sink_scores(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    *,
    query_range: tuple[int, int] | None = None,
    batch_size: int = BATCH_SIZE,
    progress: bool = True,
) -> Float[torch.Tensor, "layer head"]:
    """Mean attention on position 0 per head over prompts and queries ``query_range``
    (default all). Patterns are reduced as they stream by; nothing ``T x T`` is kept."""
    return prompt_sink_scores(loaded, prompts, query_range=query_range, batch_size=batch_size,
                              progress=progress).mean(0)


def prompt_sink_scores(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    *,
    query_range: tuple[int, int] | None = None,
    batch_size: int = BATCH_SIZE,
    progress: bool = True,
) -> Float[torch.Tensor, "prompt layer head"]:
    """Attention on position 0 averaged over queries ``query_range`` (default all), per
    prompt, layer and head (float64, in [0, 1])."""
    batch_size = check_count("batch_size", batch_size)
    reducer = SinkScoreReducer(loaded, prompts, query_range=query_range)
    stream.body(loaded, prompts, [reducer], batch_size=batch_size, progress=progress,
           desc="sink scores")
    return reducer.result()


SCORE_ROUNDING = 1e-3  # a float16 pattern's rounding; a logit or a percentage is far outside


def _checked_scores(scores: Any, loaded: LoadedModel, n_prompts: int) -> torch.Tensor:
    """Sink scores handed in (``sink_heads(scores=...)``): a float tensor ``[layer, head]`` or
    ``[prompt, layer, head]`` of this model's heads (and these prompts), every value a fraction of
    attention in [0, 1]; BadInputError otherwise (a NaN would be a head that is no sink)."""
    if not isinstance(scores, torch.Tensor) or not scores.is_floating_point():
        raise BadInputError(f"scores must be a float tensor [layer, head] or [prompt, layer, head] (from "
                            f"sink_scores or SinkScoreReducer.result), got {type(scores).__name__}")
    shape = (loaded.spec.n_layers, loaded.spec.n_heads)
    if tuple(scores.shape[-2:]) != shape or scores.dim() not in (2, 3) or (
            scores.dim() == 3 and len(scores) != n_prompts):
        raise BadInputError(f"scores has shape {tuple(scores.shape)}; this model and these prompts need {shape} or "
                            f"{(n_prompts, *shape)}")
    scores = scores.detach().cpu().to(torch.float64)
    if not bool(torch.isfinite(scores).all()):
        layer, head = (int(i) for i in (~torch.isfinite(scores)).nonzero()[0][-2:])
        raise NonFiniteError(f"scores hold a non-finite value (layer {layer}, head {head}); measure them again "
                             "with sink_scores on a model whose weights are finite")
    if bool((scores < -SCORE_ROUNDING).any()) or bool((scores > 1 + SCORE_ROUNDING).any()):
        raise BadInputError(f"scores must be fractions of attention in [0, 1], got values in "
                            f"[{float(scores.min()):.3g}, {float(scores.max()):.3g}]: pass attention on position 0 "
                            "(sink_scores), not logits or percentages")
    return scores


@public
def sink_heads(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    eps: float = SINK_EPS,
    query_range: tuple[int, int] | None = None,
    scores: Float[torch.Tensor, "layer head"] | Float[torch.Tensor, "prompt layer head"] | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> SinkHeads:
    """Sink score of every head (mean attention on position 0), its interval over prompts
    (``bootstrap``), and which heads exceed ``eps``.

    ``scores``: these prompts' scores when already streamed (e.g. by a
    :class:`SinkScoreReducer` sharing a pass): per prompt ``[prompt, layer, head]`` (its
    :meth:`~SinkScoreReducer.result`), or pooled ``[layer, head]`` (:func:`sink_scores`; no
    intervals and no Gu et al. rate then); no pass is made."""
    eps = check_fraction("eps", eps)
    prompts = checked_prompts(loaded, prompts, distinct=bootstrap.enabled)
    if scores is not None:
        scores = _checked_scores(scores, loaded, len(prompts.tokens))
    if scores is None:
        with progress_bar("sink heads", enabled=progress):
            scores = prompt_sink_scores(loaded, prompts, query_range=query_range, batch_size=batch_size)
    prompt_scores = scores if scores.dim() == 3 else None
    if prompt_scores is not None:
        scores = prompt_scores.mean(0)
        _, lo, hi = bootstrap_mean(prompt_scores.reshape(len(prompt_scores), -1).numpy(), bootstrap, PROBABILITY)
    else:
        lo = hi = np.full(scores.numel(), np.nan)
    n_layers, n_heads = scores.shape
    attn_types = loaded.spec.layer_types
    frame = pd.DataFrame({
        "layer": [layer for layer in range(n_layers) for _ in range(n_heads)],
        "head": [h for _ in range(n_layers) for h in range(n_heads)],
        "layer_type": [attn_types[layer] for layer in range(n_layers) for _ in range(n_heads)],
        "sink_score": scores.reshape(-1).numpy(),
        "sink_score_lo": lo, "sink_score_hi": hi,
    })
    frame["is_sink"] = frame["sink_score"] > eps
    frame["eps"] = eps
    frame["seq_len"] = int(prompts.tokens.shape[1])  # the score depends on it: the sentences say it
    return SinkHeads(frame=frame, scores=scores, eps=eps, prompt_scores=prompt_scores, provenance=provenance.collect(
        model=loaded.spec, data=_data_spec(prompts), seed=getattr(getattr(prompts, "spec", None), "seed", None),
        eps=eps, query_range=query_range, bos_policy=_bos_policy(prompts),
        metric="sink_score = mean over prompts and queries of A[i, 0]", intervals=bootstrap.to_dict("prompt")))


@dataclass(repr=False)
class SinkRate(SavedResult):
    """Result of :func:`sink_rate`. ``frame``: one row per condition with ``sink_rate`` (Gu
    et al.'s metric: the fraction of (prompt, layer, head) triples whose attention on
    position 0, averaged over queries, exceeds ``eps``; in [0, 1]), ``sink_rate_lo`` /
    ``sink_rate_hi`` (its bootstrap interval over prompts), ``sink_rate_pooled`` (the
    fraction of heads whose score averaged over prompts exceeds ``eps``: not their metric),
    ``eps``, ``seq_len`` (positions per prompt), ``N``, ``bos``, ``protocol``, ``n_heads``, ``n_sink_heads`` (heads
    whose score averaged
    over prompts exceeds ``eps``: the sink heads).
    ``heads``: the per-head sink scores of every condition (the :class:`SinkHeads` frames
    with a ``condition`` column)."""

    KEYWORD = "sink_rate"
    TABLES = (
        Table("sink_rate", "frame",
              "SinkRate.frame"),
    )

    frame: pd.DataFrame
    heads: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "Gu et al.'s sink rate per input condition"
    INTERVALS = "95% bootstrap over prompts"
    HEADS = ("heads", "sink_score")

    def headline(self) -> list[Headline]:
        """Per condition, the sink rate with its interval over prompts."""
        return headlines_from_rows(self.frame, "condition", [
            ("sink_rate", "sink rate", "fraction of (prompt, layer, head) triples above eps")])


SINK_PROTOCOLS = ("documents", "windows")


def sink_rate_prompts(
    loaded: LoadedModel,
    *,
    conditions: Sequence[str] = SINK_CONDITIONS,
    T: int = 64,
    N: int = 16,
    seed: int = 0,
    protocol: str = "windows",
    bos: str | None = DEFAULT_BOS,
    text: str | None = None,
    corpus: str | None = None,
) -> dict[str, Any]:
    """The prompt set of each condition of :func:`sink_rate` (its docstring: protocols), checked for
    ``loaded`` (``CheckedPrompts``), so a caller can stream their sink scores together with other
    statistics."""
    from lens_position.core.data import build_document_prompts, build_prompts

    if protocol not in SINK_PROTOCOLS:
        raise BadInputError(f"unknown sink-rate protocol {protocol!r}; use {' or '.join(SINK_PROTOCOLS)}")
    if isinstance(conditions, str) or not len(conditions):
        raise BadInputError(f"conditions must be a non-empty sequence of names out of {list(CONDITION_SOURCES)}, "
                            f"got {conditions!r}")
    unknown = [c for c in conditions if c not in CONDITION_SOURCES]
    if unknown:
        raise BadInputError(f"unknown sink-rate condition(s) {unknown}; use {', '.join(CONDITION_SOURCES)} "
                            "('repeated' is Gu et al.'s: one token repeated without BOS; 'repeated_bos' puts the "
                            "tokenizer's BOS first)")
    if len(set(conditions)) != len(conditions):
        raise BadInputError(f"conditions {list(conditions)} name a condition twice")
    # protocol='documents' always uses the tokenizer's own BOS, as Gu et al. do; bos applies to 'windows'
    bos = "tokenizer" if protocol == "documents" else (DEFAULT_BOS if bos is None else bos)
    out = {}
    for condition in conditions:
        source, own_bos = CONDITION_SOURCES[condition]
        if protocol == "documents" and condition == "natural":
            built = build_document_prompts(loaded, T=T, N=N, seed=seed, corpus=corpus, text=text)
        else:
            built = build_prompts(loaded, source=source, T=T, N=N, bos=own_bos or bos,
                                  seed=seed, text=text, corpus=corpus if condition == "natural" else None)
        out[condition] = check_prompts.body(loaded, built)  # built for this model: checked once, here
    return out


@public
def sink_rate(
    loaded: LoadedModel,
    *,
    conditions: Sequence[str] = SINK_CONDITIONS,
    T: int = 64,
    N: int = 16,
    eps: float = SINK_EPS,
    seed: int = 0,
    protocol: str = "windows",
    bos: str | None = DEFAULT_BOS,
    text: str | None = None,
    corpus: str | None = None,
    scores: Mapping[str, torch.Tensor] | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> SinkRate:
    """Gu et al. 2025's sink rate, as their code computes it (module docstring), per data
    condition, with its interval over prompts. Conditions (:data:`CONDITION_SOURCES`):
    ``"natural"`` text, ``"random"`` tokens, ``"repeated"``: one random token repeated from
    position 0 *without* BOS, as Gu et al. define it (their table gives 0.00 on the Llama and
    Mistral models); ``"repeated_bos"``: the same repeated token after the tokenizer's BOS
    (``bos="force"``; not one of their conditions: how much of a sink the BOS alone makes).
    ``bos`` (below) applies to natural text and random tokens.

    ``protocol="documents"`` (the authors' inputs, the reproduction's sink-rate step): natural
    text is the first ``T`` tokens of each of ``N`` documents
    (:func:`lens_position.core.data.build_document_prompts`), natural text and random tokens
    with the tokenizer's own BOS. ``protocol="windows"`` (default): windows of the corpus token stream
    (:func:`lens_position.core.data.build_prompts`) under the BOS policy ``bos`` (default
    ``lens_position.core.data.DEFAULT_BOS``). ``scores``: the per-prompt scores
    (:class:`SinkScoreReducer`) of some conditions' prompts when already streamed.
    """
    eps = check_fraction("eps", eps)
    prompt_sets = sink_rate_prompts(loaded, conditions=conditions, T=T, N=N, seed=seed, protocol=protocol,
                                    bos=bos, text=text, corpus=corpus)
    bos = "tokenizer" if protocol == "documents" else (DEFAULT_BOS if bos is None else bos)
    rows, frames, specs = [], [], {}
    streamed = [c for c in prompt_sets if scores is None or c not in scores]
    with progress_bar("sink rate", total=sum(len(prompt_sets[c].tokens) for c in streamed),
                      enabled=progress and bool(streamed)):
        results = {condition: sink_heads.body(loaded, prompts, eps=eps, batch_size=batch_size, bootstrap=bootstrap,
                                         scores=None if scores is None else scores.get(condition))
                   for condition, prompts in prompt_sets.items()}
    for condition, prompts in prompt_sets.items():
        result = results[condition]
        # per prompt: the fraction of (layer, head) above eps; the authors' rate is their mean over prompts
        if result.prompt_scores is None:
            raise BadInputError(f"sink_rate thresholds each prompt's scores: scores[{condition!r}] must be per prompt, "
                                "[prompt, layer, head] (SinkScoreReducer.result), not pooled [layer, head]")
        per_prompt = (result.prompt_scores > eps).to(torch.float64).mean((1, 2)).numpy()
        rate, lo, hi = bootstrap_mean(per_prompt, bootstrap, PROBABILITY)
        rows.append({"condition": condition, "sink_rate": float(rate), "sink_rate_lo": float(lo),
                     "sink_rate_hi": float(hi), "sink_rate_pooled": result.sink_rate_pooled, "eps": eps, "seq_len": T,
                     "N": N, "bos": prompts.spec.bos, "protocol": protocol, "position0": prompts.spec.position0,
                     "n_sink_heads": int(result.frame["is_sink"].sum()), "n_heads": len(result.frame)})
        frames.append(result.frame.assign(condition=condition))
        specs[condition] = prompts.spec.to_dict()
    return SinkRate(frame=pd.DataFrame(rows), heads=pd.concat(frames, ignore_index=True),
                    provenance=provenance.collect(
                        model=loaded.spec, data=specs, seed=seed, eps=eps, T=T, N=N, bos_policy=bos,
                        protocol=protocol, conditions=list(conditions), intervals=bootstrap.to_dict("prompt"),
                        sink_rate="Gu et al.: mean over prompts, layers and heads of 1[mean_i A[i, 0] > eps] "
                                  "(sail-sg/Attention-Sink, eval_sink_open_source.py)",
                        sink_rate_pooled="fraction of heads with mean over prompts and queries of A[i, 0] > eps"))


# --------------------------------------------------------------------------- sink-reading heads


@dataclass(repr=False)
class SinkReading(SavedResult):
    """Result of :func:`sink_reading_heads`.

    ``frame``: one row per (layer, head), ranked. ``output_change``: RMS over prompts and
    queries in ``query_range`` of ``||z_patched - z_base||`` divided by the RMS of
    ``||z_base||``, where ``z`` is the head's output before ``W_O`` (dimensionless, 0 = no
    change). ``R_base``, ``R_patched``: the head's residual component (fraction of
    Var(log A), ``decompose`` over ``query_range``) without and with its own position-0
    key/value patched; ``R_change = R_patched - R_base``, ``R_heldout_change`` the same for
    the held-out ``R``. ``reading_rank``: 1 = largest ``|R_change|`` (ties broken by
    ``output_change``).

    ``ablation``: one row per (ablation, layer): ``R_before`` / ``R_after`` = mean over the
    layer's heads of ``R`` without / with the top heads ablated (``"zero"``: ``z = 0``;
    ``"mean"``: ``z`` = its mean over prompts and positions), ``R_change = R_after -
    R_before``, and the same for the held-out ``R`` (``R_heldout_before``, ``R_heldout_after``,
    ``R_heldout_change``). ``ablation_heads``: ``R_before``, ``R_after``, ``R_change`` per head.
    ``ablated``: the heads ablated.

    Every change has a paired bootstrap interval over sequences (``*_lo``/``*_hi``), from
    :func:`lens_position.analyses.compare.compare` as for BOS replacement: the base and the patched or
    ablated runs resample the same sequences in each replicate. NaN when intervals are off or
    the base was decomposed with a different number of resamples.
    """

    KEYWORD = "reading"
    TABLES = (
        Table("sink_reading", "frame",
              "SinkReading.frame"),
        Table("sink_ablation", "ablation",
              "SinkReading.ablation"),
    )

    frame: pd.DataFrame
    ablation: pd.DataFrame
    ablation_heads: pd.DataFrame
    ablated: list[tuple[int, int]]
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "sink-reading heads: how each head's R changes when its own position-0 key/value is patched"
    INTERVALS = "95% paired bootstrap over sequences"
    HEADS = ("frame", "R_change")

    def headline(self) -> list[Headline]:
        """The three best-ranked sink-reading heads' R change, and what ablating the top heads did."""
        out = [Headline("R_change", f"R change, reader #{int(row['reading_rank'])} "
                                    f"(L{int(row['layer'])}.H{int(row['head'])})",
                        row_estimate(row, "R_change"), "own position-0 key/value patched, fraction of Var(log A)")
               for _, row in self.frame.sort_values("reading_rank").head(3).iterrows()]
        if len(self.ablation):
            for kind, part in self.ablation.groupby("ablation", sort=False):
                out.append(Headline("R_change", f"mean R change, {kind} ablation of {len(self.ablated)} heads",
                                    Estimate(float(part["R_change"].astype(float).mean())),
                                    "mean over layers of the layer's mean R change"))
        return out


def base_activation_names(loaded: LoadedModel) -> list[str]:
    """The unpatched run's activations the sink-reading detector reuses: every block's
    ``hook_z`` (the base of the output change, and the mean of the mean ablation) and
    ``resid_pre`` of blocks ``1..L-1`` (pinned by :func:`own_position0_patches`)."""
    n_layers = loaded.spec.n_layers
    return [f"blocks.{layer}.attn.hook_z" for layer in range(n_layers)] + [
        f"blocks.{layer}.hook_resid_pre" for layer in range(1, n_layers)
    ]


def own_position0_patches(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    counterfactual: str,
    *,
    base_activations: dict[str, torch.Tensor] | None = None,
) -> list[Patch]:
    """The detector's pattern: patches that give every head its own counterfactual
    position-0 key and value while every block still reads the base run's residual stream.

    Per block ``l``: ``hook_k`` and ``hook_v`` at position 0 from a one-token run on the
    counterfactual token 0 (:func:`lens_position.analyses.fingerprint.position0_activations`), and,
    for ``l > 0``, ``resid_pre[l]`` pinned to the base run, so the patches of earlier blocks
    do not reach block ``l``. All values are per prompt (first axis = prompts).
    ``base_activations``: the base run's ``resid_pre`` when already cached (else one pass).
    """
    token0 = counterfactual_token0(loaded, prompts, counterfactual)
    n_layers = loaded.spec.n_layers
    kv_names = [f"blocks.{layer}.attn.hook_{part}" for layer in range(n_layers) for part in ("k", "v")]
    counter = position0_activations(loaded, token0, kv_names)
    pinned = [f"blocks.{layer}.hook_resid_pre" for layer in range(1, n_layers)]
    if base_activations is None or any(name not in base_activations for name in pinned):
        base_activations = cache_activations.body(loaded, prompts, pinned)
    patches = []
    for layer in range(n_layers):
        if layer > 0:
            name = f"blocks.{layer}.hook_resid_pre"
            patches.append(Patch(name, base_activations[name], label=f"pin resid_pre[{layer}]"))
        for part in ("k", "v"):
            name = f"blocks.{layer}.attn.hook_{part}"
            patches.append(Patch(name, counter[name][:, 0], position=0, label=f"{part}[{layer}][0]"))
    return patches


def sink_reading_base(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    *,
    query_range: tuple[int, int] = (0, 32),
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> tuple[Decomposition, dict[str, torch.Tensor]]:
    """The unpatched run the detector compares with, in one pass: its decomposition over
    ``query_range`` (with ``bootstrap`` intervals) and the activations of
    :func:`base_activation_names`."""
    query_range = check_query_range(query_range, prompts.tokens.shape[1])
    decomposition = DecompositionReducer(loaded, prompts, query_range=query_range, bootstrap=bootstrap)
    activations = WholeActivations(base_activation_names(loaded))
    stream.body(
        loaded,
        prompts,
        [decomposition, activations],
        batch_size=batch_size,
        progress=progress,
        desc="sink reading: base",
    )
    return decomposition.result(batch_size=batch_size), activations.result()


def _output_change(base_z: Sequence[torch.Tensor], patched_z: Sequence[torch.Tensor]
                   ) -> Float[torch.Tensor, "layer head"]:
    """RMS over prompts and queries of ``||z_patched - z_base||`` over the RMS of ``||z_base||`` (each
    layer's ``hook_z`` at the measured queries only)."""

    def stack(acts: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.stack([act.to(torch.float64) for act in acts])

    base, patched = stack(base_z), stack(patched_z)
    # [layer, batch, query, head, d_head] -> per (layer, head)
    change = (patched - base).norm(dim=-1).pow(2).mean((1, 2)).sqrt()
    scale = base.norm(dim=-1).pow(2).mean((1, 2)).sqrt()
    return torch.where(change == 0, torch.zeros_like(change), change / scale).cpu()


def sink_reading_scores(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    patches: Sequence[Patch],
    *,
    base: Decomposition,
    base_activations: dict[str, torch.Tensor],
    query_range: tuple[int, int] = (0, 32),
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> pd.DataFrame:
    """The detector's scores for a pattern (``patches``, e.g. :func:`own_position0_patches`):
    one patched pass gives every head's output change and residual-component change against
    the base run (:func:`sink_reading_base`). Returns the ranked frame of
    :class:`SinkReading`."""
    query_range = check_query_range(query_range, prompts.tokens.shape[1])
    z_names = [f"blocks.{layer}.attn.hook_z" for layer in range(loaded.spec.n_layers)]
    patched = DecompositionReducer(loaded, prompts, query_range=query_range, bootstrap=bootstrap)
    start, stop = query_range
    patched_z = WholeActivations(z_names, select=lambda z: z[:, start:stop])  # only the measured queries are kept
    stream.body(
        loaded,
        prompts,
        [patched, patched_z],
        patches=patches,
        batch_size=batch_size,
        progress=progress,
        desc="sink reading: patched",
    )
    patched_at_queries = patched_z.result()
    output_change = _output_change([base_activations[n][:, start:stop] for n in z_names],
                                   [patched_at_queries[n] for n in z_names])
    comparison = compare(base, {"patched": patched.result(batch_size=batch_size)})
    frame = base.heads[["layer", "head", "layer_type"]].copy()
    frame["output_change"] = output_change.reshape(-1).numpy()
    frame["R_base"] = comparison.heads["R_base"].to_numpy()
    frame["R_patched"] = comparison.heads["R_condition"].to_numpy()
    frame["R_change"] = frame["R_patched"] - frame["R_base"]
    frame["R_heldout_change"] = comparison.heads["R_heldout_change"].to_numpy()
    for name in ("R_change", "R_heldout_change"):
        for side in ("lo", "hi"):
            frame[f"{name}_{side}"] = comparison.heads[f"{name}_{side}"].to_numpy()
    order = frame.assign(abs_change=frame["R_change"].abs()).sort_values(
        ["abs_change", "output_change"], ascending=False, kind="stable").index
    frame.loc[order, "reading_rank"] = range(1, len(frame) + 1)
    frame["reading_rank"] = frame["reading_rank"].astype(int)
    return frame.sort_values("reading_rank").reset_index(drop=True)


def head_ablation_effect(
    loaded: LoadedModel,
    prompts: CheckedPrompts,
    heads: Sequence[tuple[int, int]],
    *,
    base: Decomposition,
    reference: Any,
    kinds: Sequence[Ablation] = ("zero", "mean"),
    query_range: tuple[int, int] = (0, 32),
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Ablate ``heads`` (each kind one condition, :func:`lens_position.analyses.patching.head_ablation`)
    and compare every layer's ``R`` with the base decomposition. ``reference``: the prompts
    (or their cached ``hook_z``) the mean ablation averages over. Returns the ``ablation``
    and ``ablation_heads`` frames of :class:`SinkReading`."""
    query_range = check_query_range(query_range, prompts.tokens.shape[1])
    with progress_bar("head ablation", enabled=progress):
        conditions = {kind: head_ablation.body(loaded, heads, kind, reference=reference) for kind in kinds}
        decomposed = decompose_conditions.body(
            loaded, prompts, conditions, query_range=query_range, batch_size=batch_size, bootstrap=bootstrap
        )
    comparison = compare(base, decomposed)
    layers = comparison.layers.rename(columns={
        "condition": "ablation", "R_base": "R_before", "R_condition": "R_after",
        "R_heldout_base": "R_heldout_before", "R_heldout_condition": "R_heldout_after"})
    changes = [f"{name}{suffix}" for name in ("R_change", "R_heldout_change") for suffix in ("", "_lo", "_hi")]
    layers = layers[["ablation", "layer", "R_before", "R_after", "R_heldout_before", "R_heldout_after", *changes]]
    per_head = comparison.heads.rename(
        columns={"condition": "ablation", "R_base": "R_before", "R_condition": "R_after"}
    )
    per_head["ablated"] = [(layer, head) in heads for layer, head in per_head[["layer", "head"]].to_numpy()]
    per_head = per_head[
        ["layer", "head", "ablation", "ablated", "R_before", "R_after", "R_change", "R_change_lo", "R_change_hi"]
    ]
    return layers, per_head


@public
def sink_reading_heads(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    counterfactual: str = "no-bos",
    query_range: tuple[int, int] = (0, 32),
    n_ablate: int = 3,
    ablate_heads: Sequence[tuple[int, int]] | None = None,
    patches: Sequence[Patch] | None = None,
    base: tuple[Decomposition, dict[str, torch.Tensor]] | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> SinkReading:
    """Find the heads that read the position-0 fingerprint, rank them, ablate the top ones.

    Args:
        prompts: the base run (PromptSet or tokens). For ``counterfactual="no-bos"`` they
            must start with BOS (``bos="force"`` on SmolLM2).
        counterfactual: ``"no-bos"`` (position 0's key/value as the text without BOS would
            make them, i.e. from its first text token) or ``"token:<id>"``.
        query_range: queries over which output change and ``R`` are measured (clipped to T).
        n_ablate: ablate the ``n_ablate`` top-ranked heads (ignored if ``ablate_heads``).
        ablate_heads: explicit ``(layer, head)`` list to ablate instead.
        patches: the detector's pattern, when not :func:`own_position0_patches` of
            ``counterfactual`` (then ``counterfactual`` is only recorded).
        base: :func:`sink_reading_base` of the same prompts and ``query_range``, when
            already computed (it is then not recomputed).
        bootstrap: the intervals of every change (``NO_INTERVALS``: none, and no refits).

    The steps are separate functions: :func:`sink_reading_base` (the unpatched pass),
    :func:`own_position0_patches` (the pattern), :func:`sink_reading_scores` (the scores
    and ranking) and :func:`head_ablation_effect` (the ablations).
    """
    prompts = checked_prompts(loaded, prompts, min_length=2, distinct=bootstrap.enabled)
    tokens = as_tokens(loaded, prompts)
    query_range = check_query_range(query_range, tokens.shape[1])
    batch_size, n_ablate = check_count("batch_size", batch_size), check_count("n_ablate", n_ablate, minimum=0)
    pattern = "given patches" if patches is not None else f"own position-0 key/value ({counterfactual})"
    if patches is None:
        counterfactual_token0(loaded, prompts, counterfactual)  # refuse a bad counterfactual before any pass
    options: dict[str, Any] = dict(query_range=query_range, batch_size=batch_size, bootstrap=bootstrap)
    kinds: tuple[Ablation, ...] = ("zero", "mean")
    # the passes: the base run (unless given), the patched run, one per ablation kind
    passes = (base is None) + 1 + len(kinds)
    with progress_bar("sink-reading heads", total=passes * len(tokens), enabled=progress):
        base_decomposition, base_activations = (base if base is not None
                                                else sink_reading_base(loaded, prompts, **options))
        if patches is None:
            patches = own_position0_patches(loaded, prompts, counterfactual, base_activations=base_activations)
        frame = sink_reading_scores(loaded, prompts, patches, base=base_decomposition,
                                    base_activations=base_activations, **options)
        if ablate_heads is None:
            ablate_heads = [
                (int(layer), int(head)) for layer, head in frame[["layer", "head"]].head(n_ablate).to_numpy()
            ]
        ablate_heads = check_heads(ablate_heads, loaded.spec.n_layers, loaded.spec.n_heads)
        ablation, ablation_heads = head_ablation_effect(
            loaded, prompts, ablate_heads, base=base_decomposition, reference=base_activations, kinds=kinds, **options
        )
    return SinkReading(
        frame=frame, ablation=ablation, ablation_heads=ablation_heads, ablated=ablate_heads,
        provenance=provenance.collect(
            model=loaded.spec, data=_data_spec(prompts), seed=getattr(getattr(prompts, "spec", None), "seed", None),
            counterfactual=counterfactual, query_range=list(query_range), bos_policy=_bos_policy(prompts),
            ablated=ablate_heads, mean_ablation_reference="the base prompts, mean over prompts and positions",
            pattern=pattern,
            R="decompose(...).heads['R'] over query_range, keys='all'",
            intervals={**((base_decomposition.provenance.get("options") or {}).get("intervals") or {}),
                       "pairing": "paired bootstrap through lens_position.analyses.compare: the base and the "
                                  "patched or "
                                  "ablated runs resample the same sequences per replicate",
                       "columns": ["R_change", "R_heldout_change"]},
            output_change="RMS ||z_patched - z_base|| / RMS ||z_base|| over prompts and queries"))


# --------------------------------------------------------------------------- window-aware sinks


def first_visible_keys(length: int, window: int | None, query_start: int = 0,
                       query_stop: int | None = None) -> torch.Tensor:
    """The first key each query ``query_start <= i < query_stop`` can see: 0 in a causal layer
    (``window`` None) and while ``i < window``, else ``i - window + 1``. ``Int[Tensor, "query"]``."""
    stop = length if query_stop is None else query_stop
    queries = torch.arange(query_start, stop)
    if window is None:
        return torch.zeros_like(queries)
    return (queries - window + 1).clamp(min=0)


def uniform_window_score(length: int, window: int | None, query_range: tuple[int, int] | None = None) -> float:
    """The window-aware score of a uniform head (its chance level): the mean over queries of
    ``1 / |K(i)|``, with ``|K(i)| = min(i + 1, W)``. In a causal layer it is also Gu et al.'s."""
    start, stop = check_query_range(query_range, length)
    counts = torch.arange(start, stop, dtype=torch.float64) + 1
    if window is not None:
        counts = counts.clamp(max=window)
    return float((1 / counts).mean())


#: query rows per block of the window-aware sink scores
_WINDOW_ROWS = 256


class WindowSinkReducer:
    """Both sink metrics, per prompt, layer and head, as a reducer for
    :func:`lens_position.core.stream.stream` (read at ``hook_pattern`` of every layer):

    - ``gu``: Gu et al.'s score, the mean over queries of ``A[i, 0]`` (a query past a window
      that cannot see position 0 contributes its 0);
    - ``window_aware``: the mean over queries of ``A[i, f(i)] / sum_{j in K(i)} A[i, j]``, with
      ``f(i)`` the first key the query can see (:func:`first_visible_keys`: position 0 where it is
      visible, the window's first key ``i - W + 1`` otherwise) and ``K(i)`` its key set;
    - ``visible``: the mean of ``A[i, 0]`` over the queries that see position 0, and ``past``:
      the mean of ``A[i, i - W + 1]`` over the queries past the window (NaN where a layer has
      no such query), so ``window_aware`` is their mix weighted by query counts.

    All in [0, 1], float64. A pattern with mass outside ``K(i)`` means the model's mask is not
    the one its spec declares: refused, since every number here would be misassigned."""

    def __init__(self, loaded: LoadedModel, prompts: CheckedPrompts, *,
                 query_range: tuple[int, int] | None = None) -> None:
        tokens = require_checked(loaded, prompts, "WindowSinkReducer").tokens
        self.length = tokens.shape[1]
        self.start, self.stop = check_query_range(query_range, self.length)
        n_layers, n_heads = loaded.spec.n_layers, loaded.spec.n_heads
        self.windows = loaded.spec.layer_windows
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers))
        self._layer_of = {name: layer for layer, name in enumerate(self.hook_names)}
        self.scores = {name: torch.full((tokens.shape[0], n_layers, n_heads), float("nan"), dtype=torch.float64)
                       for name in ("gu", "window_aware", "visible", "past")}
        self.seen = torch.zeros(tokens.shape[0], dtype=torch.bool)

    def update(self, hook_name: str, pattern: Float[torch.Tensor, "batch head query key"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        window = self.windows[layer]
        first = first_visible_keys(self.length, window, self.start, self.stop)
        on_first, total, on_zero, outside = self._read(pattern, first)
        if outside > 1e-6:
            raise BadInputError(
                f"layer {layer}: attention of up to {outside:.3g} falls outside the keys the spec's "
                f"window ({window}) lets a query see; the model's mask is not the declared one, so the "
                "window-aware sink metric cannot assign it")
        sees_zero = first == 0
        self.scores["gu"][rows, layer] = on_zero.mean(-1)
        self.scores["window_aware"][rows, layer] = (on_first / total).mean(-1)
        if bool(sees_zero.any()):
            self.scores["visible"][rows, layer] = on_zero[:, :, sees_zero].mean(-1)
        if bool((~sees_zero).any()):
            self.scores["past"][rows, layer] = (on_first / total)[:, :, ~sees_zero].mean(-1)
        self.seen[rows] = True

    def _read(self, pattern: Float[torch.Tensor, "batch head query key"], first: Int[torch.Tensor, "query"]
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float]:
        """Per analysed query, float64 ``[batch, head, query]``: the attention on its first visible key, the
        total over its visible keys, the attention on position 0; and the largest attention outside the
        visible keys. In blocks of query rows, each over the keys its rows can see (a float64 copy of a
        whole ``[head, T, T]`` pattern is 4.8 GB for nine heads at T = 8192)."""
        batch, heads = pattern.shape[:2]
        shape = (batch, heads, self.stop - self.start)
        on_first, total, on_zero = (torch.empty(shape, dtype=torch.float64) for _ in range(3))
        outside = 0.0
        for r0 in range(0, shape[2], _WINDOW_ROWS):
            r1 = min(r0 + _WINDOW_ROWS, shape[2])
            q0, q1 = self.start + r0, self.start + r1
            block, firsts = pattern[:, :, q0:q1], first[r0:r1]
            lo = int(firsts.min())
            for hidden in (block[..., q1:], block[..., :lo]):  # keys no row of the block can see
                if hidden.numel():
                    outside = max(outside, *(abs(float(v)) for v in torch.aminmax(hidden)))  # one read, no copy
            a = block[..., lo:q1]  # in the pattern's dtype: sums are taken in float64
            # the keys some row of the block cannot see lie in a's first columns (before the last row's
            # first key) and its last (after the first row's query); every column between is seen by all
            left, right = int(firsts.max()) - lo, max(q0 - lo + 1, int(firsts.max()) - lo)
            cols = torch.cat([torch.arange(0, left), torch.arange(right, q1 - lo)]).to(a.device)
            keys, queries = cols + lo, torch.arange(q0, q1, device=a.device)
            visible = (keys[None, :] >= firsts[:, None].to(a.device)) & (keys[None, :] <= queries[:, None])
            masked = a[..., cols].masked_fill(visible, 0.0)  # the cells no row sees, 0 where it sees them
            if masked.numel():
                outside = max(outside, float(masked.abs().amax()))
            at_first = (firsts - lo).to(a.device).view(1, 1, -1, 1).expand(batch, heads, -1, 1)
            on_first[..., r0:r1] = a.gather(-1, at_first)[..., 0].to(torch.float64).cpu()
            total[..., r0:r1] = (a.sum(-1, dtype=torch.float64) - masked.sum(-1, dtype=torch.float64)).cpu()
            on_zero[..., r0:r1] = block[..., 0].to(torch.float64).cpu()
        return on_first, total, on_zero, outside

    def result(self) -> dict[str, Float[torch.Tensor, "prompt layer head"]]:
        """Per metric (``gu``, ``window_aware``, ``visible``, ``past``) the scores per prompt,
        layer and head."""
        if not bool(self.seen.any()):
            raise BadInputError("no prompts were streamed through these window-aware sink scores")
        return {name: scores[self.seen] for name, scores in self.scores.items()}


@dataclass(repr=False)
class WindowSinks(SavedResult):
    """Result of :func:`window_sinks`.

    ``heads``: one row per (layer, head) with ``layer_type`` (``"local"``/``"global"``),
    ``window``, the two sink scores ``gu_score`` (Gu et al.: mean over prompts and queries of
    ``A[i, 0]``) and ``window_score`` (mean of attention on the first visible key, normalised
    over the visible keys), each with its interval over prompts (``*_lo``/``*_hi``), ``visible_score``
    and ``past_score`` (:class:`WindowSinkReducer`), ``uniform_score`` (the window-aware score a
    uniform head gets, :func:`uniform_window_score`: ``1/W`` past the window, so with a small
    window a head can pass ``eps`` without sinking), ``is_sink_gu`` / ``is_sink_window``
    (score > ``eps``) and ``eps``. All scores in [0, 1].

    ``layer_types``: one row per (layer type, metric): ``n_layers``, ``n_heads``,
    ``n_sink_heads`` (heads whose score averaged over prompts exceeds ``eps``), ``sink_rate``
    (Gu et al.'s thresholding per prompt: the fraction of (prompt, layer, head) triples of
    that type above ``eps``) and ``mean_score``, each with its interval over prompts. Metrics:
    ``"gu"``, ``"window_aware"`` and ``"visible"`` (attention on position 0 over the queries
    that can see it only: in a window layer, the part of both metrics that past-window queries
    do not dilute)."""

    KEYWORD = "window_sinks"
    TABLES = (
        Table("window_sinks_heads", "heads", "WindowSinks.heads: Gu et al.'s and the window-aware sink score per head"),
        Table(
            "window_sinks_types",
            "layer_types",
            "WindowSinks.layer_types: sink heads and sink rate per layer type under each metric",
        ),
    )

    heads: pd.DataFrame
    layer_types: pd.DataFrame
    eps: float
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "sink heads under Gu et al.'s metric and the window-aware one, per layer type"
    INTERVALS = "95% bootstrap over prompts"
    HEADS = ("heads", "window_score")

    def headline(self) -> list[Headline]:
        """Per layer type, the sink heads under each metric and the largest window-aware score."""
        out = []
        for kind in sorted(set(self.heads["layer_type"])):
            rows = self.heads[self.heads["layer_type"] == kind]
            for metric, label in (("is_sink_gu", "Gu et al."), ("is_sink_window", "window-aware")):
                out.append(Headline(metric, f"{kind} layers: sink heads, {label}", Estimate(float(rows[metric].sum())),
                                    f"of {len(rows)} heads (score > {self.eps:g})"))
            top = rows.loc[rows["window_score"].astype(float).idxmax()]
            out.append(
                Headline(
                    "window_score",
                    f"{kind} layers: largest window-aware score (L{int(top['layer'])}.H{int(top['head'])})",
                    row_estimate(top, "window_score"),
                    "attention on the first visible key, in [0, 1]",
                )
            )
        return out


@public
def window_sinks(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    eps: float = SINK_EPS,
    query_range: tuple[int, int] | None = None,
    scores: Mapping[str, torch.Tensor] | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> WindowSinks:
    """Sink heads under Gu et al.'s metric and under the window-aware one, per layer type.

    In a sliding-window layer of ``W`` keys, a query ``i >= W`` cannot see position 0, so Gu
    et al.'s score counts a 0 for it whatever the head does; a head that puts its attention
    on the first key of every window is not seen. The window-aware score reads, per query,
    the first key it can see (position 0 while visible), normalised over the keys it can
    see; in a causal (global) layer the two scores are the same number. Prompts longer than
    ``W`` are needed for the metrics to differ (Gemma-3: ``T > 512``).

    ``scores``: :meth:`WindowSinkReducer.result` of these prompts when already streamed."""
    prompts = checked_prompts(loaded, prompts, distinct=bootstrap.enabled)
    batch_size = check_count("batch_size", batch_size)
    if scores is None:
        reducer = WindowSinkReducer(loaded, prompts, query_range=query_range)
        with progress_bar("window-aware sinks", enabled=progress):
            stream.body(loaded, prompts, [reducer], batch_size=batch_size, progress=progress,
                   desc="window-aware sinks")
        scores = reducer.result()
    gu, aware = scores["gu"], scores["window_aware"]
    n_prompts, n_layers, n_heads = gu.shape
    layer_types, windows = loaded.spec.layer_types, loaded.spec.layer_windows
    heads = pd.DataFrame(
        {
            "layer": np.repeat(np.arange(n_layers), n_heads),
            "head": np.tile(np.arange(n_heads), n_layers),
            "layer_type": [layer_types[layer] for layer in range(n_layers) for _ in range(n_heads)],
            "window": pd.array([windows[layer] for layer in range(n_layers) for _ in range(n_heads)], dtype="Int64"),
        }
    )
    for metric, values in (("gu", gu), ("window", aware)):
        mean, lo, hi = bootstrap_mean(values.reshape(n_prompts, -1).numpy(), bootstrap, PROBABILITY)
        heads[f"{metric}_score"], heads[f"{metric}_score_lo"], heads[f"{metric}_score_hi"] = mean, lo, hi
    heads["visible_score"] = scores["visible"].mean(0).reshape(-1).numpy()
    heads["past_score"] = scores["past"].mean(0).reshape(-1).numpy()
    length = prompts.tokens.shape[1]
    chance = [uniform_window_score(length, windows[layer], query_range) for layer in range(n_layers)]
    heads["uniform_score"] = np.repeat(chance, n_heads)
    heads["is_sink_gu"] = heads["gu_score"] > eps
    heads["is_sink_window"] = heads["window_score"] > eps
    heads["eps"] = eps
    rows = []
    for kind in dict.fromkeys(layer_types):
        layers = [layer for layer in range(n_layers) if layer_types[layer] == kind]
        for metric, values in (("gu", gu), ("window_aware", aware), ("visible", scores["visible"])):
            part = values[:, layers]
            rate, rate_lo, rate_hi = bootstrap_mean((part > eps).to(torch.float64).mean((1, 2)).numpy(), bootstrap,
                                                     PROBABILITY)
            score, score_lo, score_hi = bootstrap_mean(part.mean((1, 2)).numpy(), bootstrap, PROBABILITY)
            rows.append({"layer_type": kind, "metric": metric, "n_layers": len(layers),
                         "n_heads": len(layers) * n_heads, "n_sink_heads": int((part.mean(0) > eps).sum()),
                         "sink_rate": float(rate), "sink_rate_lo": float(rate_lo), "sink_rate_hi": float(rate_hi),
                         "mean_score": float(score), "mean_score_lo": float(score_lo),
                         "mean_score_hi": float(score_hi), "eps": eps})
    return WindowSinks(heads=heads, layer_types=pd.DataFrame(rows), eps=eps, provenance=provenance.collect(
        model=loaded.spec, data=_data_spec(prompts), seed=getattr(getattr(prompts, "spec", None), "seed", None),
        eps=eps, query_range=query_range, bos_policy=_bos_policy(prompts), intervals=bootstrap.to_dict("prompt"),
        gu_score="mean over prompts and queries of A[i, 0] (Gu et al. 2025)",
        window_score="mean over prompts and queries of A[i, f(i)] / sum_{j in K(i)} A[i, j], f(i) = max(0, i - W + 1) "
                     "in a window layer of W keys, 0 in a causal layer",
        windows=[None if w is None else int(w) for w in windows]))
