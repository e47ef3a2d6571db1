"""Where a model's attention sink comes from: the position, the BOS token, both, or neither.

The same ``N`` windows of text (no BOS of their own, ``T`` tokens) are run under seven
conditions, each ``T`` tokens long (:data:`CONDITIONS`):

- ``bos``: the model's BOS token, then the text;
- ``no_bos``: the text alone (an ordinary token at position 0);
- ``bos_moved``: the text with BOS inserted at position ``k`` (``moved_to``), nothing special at 0;
- ``bos_doubled``: two BOS tokens, then the text;
- ``replaced_token`` / ``replaced_mean`` / ``replaced_random``: the ``bos`` prompts with the BOS
  embedding replaced (another token's embedding, the mean embedding, a random vector of the BOS
  embedding's norm; :func:`lens_position.analyses.patching.replacement_embedding`).

**Where the sink sits** (:data:`LOCATIONS`): ``position0`` (key 0), ``bos`` (the BOS token(s),
wherever they are: key 0, key ``k`` when moved, keys 0 and 1 when doubled; absent without a BOS or
with its embedding replaced) and ``first_delimiter`` (the first punctuation or newline token after
position 0 of each prompt; absent where a prompt has none, or the model has no tokenizer and no
``delimiters`` are given). A head's *sink score* at a location is its attention on the location's
keys (summed over them), averaged over the queries that see all of them (``i >= max(keys)``; at
position 0 every query, as in Gu et al. 2025). The *sink rate* at a location is Gu et al.'s metric
there: per prompt, the fraction of (layer, head) pairs whose score exceeds ``eps`` (0.3), averaged
over the prompts where the location exists, a fraction in [0, 1] with a bootstrap interval over
prompts.

**The verdict** comes from the share of the sink that stays at position 0 when BOS is removed,
``kept = rate(no_bos, position0) / rate(bos, position0)``, with a paired bootstrap interval (the
two conditions share their text, so each replicate resamples the same prompts in both):

- ``none``: no condition has a sink rate resolved above :data:`NONE_FLOOR` at any location;
- ``position-driven``: the interval of ``kept`` lies at or above :data:`KEPT_HIGH` (2/3): the sink
  re-forms on whatever token sits first;
- ``BOS-driven``: it lies at or below :data:`KEPT_LOW` (1/3): without BOS the sink is gone;
- ``mixed``: it lies between the two: part of the sink needs BOS, part does not;
- ``inconclusive``: the interval crosses 1/3 or 2/3, the with-BOS rate is not resolved from 0
  (a share of nothing is not defined), or there are too few prompts for an interval.

``followed`` (the share of the with-BOS rate found at the moved BOS) and the replaced and doubled
conditions are reported beside it as readings, not used by the verdict: a BOS-driven sink may or
may not follow a BOS placed mid-text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses.patching import embedding_patch
from lens_position.core.checks import check_count, check_fraction, check_int, check_seed
from lens_position.core.data import build_prompts
from lens_position.core.inputs import CheckedPrompts, Prompts, checked_prompts
from lens_position.core.intervals import (
    MIN_INTERVAL_UNITS,
    PROBABILITY,
    Bootstrap,
    Estimate,
    bootstrap_mean,
    percentile_interval,
    resample_counts,
    small_sample_widening,
)
from lens_position.core.patch import Patch
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE, stream
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

__all__ = ["CONDITIONS", "LOCATIONS", "SinkOrigin", "origin_verdict", "sink_origin", "sink_origin_tokens"]

SINK_EPS = 0.3
CONDITIONS = ("bos", "no_bos", "bos_moved", "bos_doubled", "replaced_token", "replaced_mean", "replaced_random")
REPLACED = {"replaced_token": "token", "replaced_mean": "mean", "replaced_random": "random"}
LOCATIONS = ("position0", "bos", "first_delimiter")
VERDICTS = ("position-driven", "BOS-driven", "mixed", "none", "inconclusive")
KEPT_HIGH = 2 / 3  # at or above: the sink stays at position 0 without BOS
KEPT_LOW = 1 / 3  # at or below: the sink goes with BOS
NONE_FLOOR = 0.02  # a sink rate whose interval stays below this is no sink (2% of head-prompt pairs)
DELIMITER_CHARACTERS = frozenset(".,;:!?")

Keys = tuple[int, ...] | None  # the key positions of a location in one prompt (None: absent)


# --------------------------------------------------------------------------- inputs


def sink_origin_tokens(body: Int[torch.Tensor, "N T"], bos_id: int, moved_to: int
                       ) -> dict[str, Int[torch.Tensor, "N T"]]:
    """The token ids of the four token conditions, each as long as ``body`` (text without BOS):
    ``bos`` (BOS then the text), ``no_bos`` (the text), ``bos_moved`` (BOS at ``moved_to``),
    ``bos_doubled`` (two BOS then the text). The replaced conditions run the ``bos`` ids."""
    n, length = body.shape
    if not 1 <= moved_to < length - 1:
        raise BadInputError(f"moved_to = {moved_to}: BOS must move to a position in 1 .. {length - 2} of a "
                            f"{length}-token prompt (it needs text before and after it)")
    bos = torch.full((n, 1), bos_id, dtype=body.dtype)
    return {"bos": torch.cat([bos, body[:, :-1]], 1), "no_bos": body.clone(),
            "bos_moved": torch.cat([body[:, :moved_to], bos, body[:, moved_to:-1]], 1),
            "bos_doubled": torch.cat([bos, bos, body[:, :-2]], 1)}


def delimiter_ids(loaded: LoadedModel, tokens: torch.Tensor) -> set[int]:
    """The ids among ``tokens`` that are delimiters: a newline, or only punctuation out of
    ``.,;:!?`` once whitespace is stripped. Empty without a tokenizer."""
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        return set()
    out = set()
    for token in torch.unique(tokens).tolist():
        text = tokenizer.decode([token])
        stripped = text.strip()
        if "\n" in text or (stripped and set(stripped) <= DELIMITER_CHARACTERS):
            out.add(token)
    return out


def locations_of(tokens: Int[torch.Tensor, "N T"], condition: str, bos_id: int, moved_to: int,
                 delimiters: set[int]) -> dict[str, list[Keys]]:
    """Per location (:data:`LOCATIONS`), the key positions it covers in each prompt of a condition."""
    n = len(tokens)
    bos_keys: Keys = {"bos": (0,), "bos_moved": (moved_to,), "bos_doubled": (0, 1)}.get(condition)
    first_text = 2 if condition == "bos_doubled" else 1
    delimiter: list[Keys] = []
    for row in tokens.tolist():
        found = [j for j in range(first_text, len(row)) if row[j] in delimiters and row[j] != bos_id]
        delimiter.append((found[0],) if found else None)
    return {"position0": [(0,)] * n, "bos": [bos_keys] * n, "first_delimiter": delimiter}


class LocationSinkReducer:
    """Sink scores at named key locations as a reducer for :func:`lens_position.core.stream.stream`:
    per location, prompt, layer and head, the attention on the location's keys summed over them and
    averaged over queries ``i >= max(keys)`` (float64; NaN where the location is absent)."""

    def __init__(self, n_layers: int, n_heads: int, locations: Mapping[str, Sequence[Keys]]) -> None:
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers))
        self._layer_of = {name: layer for layer, name in enumerate(self.hook_names)}
        self.locations = {name: list(keys) for name, keys in locations.items()}
        n_prompts = len(next(iter(self.locations.values())))
        self.scores = {name: torch.full((n_prompts, n_layers, n_heads), float("nan"), dtype=torch.float64)
                       for name in self.locations}

    def update(self, hook_name: str, pattern: Float[torch.Tensor, "batch head query key"],
               rows: torch.Tensor) -> None:
        layer = self._layer_of[hook_name]
        pattern = pattern.detach().to(torch.float64).cpu()
        for name, where in self.locations.items():
            for b, row in enumerate(rows.tolist()):
                keys = where[row]
                if keys is not None:
                    self.scores[name][row, layer] = pattern[b, :, max(keys):, list(keys)].sum(-1).mean(-1)

    def result(self) -> dict[str, Float[torch.Tensor, "prompt layer head"]]:
        return self.scores


# --------------------------------------------------------------------------- the verdict


def paired_share(numerator: Float[np.ndarray, "prompt"], denominator: Float[np.ndarray, "prompt"],
                 bootstrap: Bootstrap) -> Estimate:
    """``mean(numerator) / mean(denominator)`` over the same prompts, with the percentile interval
    of the ratio taken replicate by replicate (each replicate resamples the prompts of both), its
    spread widened as :func:`lens_position.core.intervals.bootstrap_mean` widens a mean's. NaN
    (and no interval) where the denominator's interval is not resolved above :data:`NONE_FLOOR`."""
    num, den = np.asarray(numerator, dtype=float), np.asarray(denominator, dtype=float)
    n = len(den)
    value = float(num.mean() / den.mean()) if den.mean() > 0 else float("nan")
    if not bootstrap.enabled or n < MIN_INTERVAL_UNITS:
        return Estimate(value if den.mean() > NONE_FLOOR else float("nan"), level=bootstrap.level, n=n)
    counts = resample_counts(n, bootstrap.n_resamples, bootstrap.seed).numpy().astype(float)
    den_mean = den.mean()
    den_reps = small_sample_widening(den_mean, counts @ den / n, n)
    den_lo, _ = percentile_interval(den_reps, bootstrap.level)
    if not float(den_lo) > NONE_FLOOR:
        return Estimate(float("nan"), level=bootstrap.level, n=n)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = (counts @ num / n) / (counts @ den / n)
    ratios = small_sample_widening(value, ratios, n)
    lo, hi = percentile_interval(ratios, bootstrap.level)
    return Estimate(value, float(lo), float(hi), bootstrap.level, n)


def origin_verdict(rates: pd.DataFrame, with_bos: Float[np.ndarray, "prompt"],
                   without_bos: Float[np.ndarray, "prompt"], bootstrap: Bootstrap) -> tuple[str, Estimate, str]:
    """``(verdict, kept, reason)`` (module docstring). ``rates``: the sink rates of every
    condition and location (``sink_rate_lo`` / ``sink_rate_hi``); ``with_bos`` / ``without_bos``:
    the per-prompt sink rates at position 0 of the ``bos`` and ``no_bos`` prompts (same texts)."""
    n = len(with_bos)
    kept = paired_share(without_bos, with_bos, bootstrap)
    rates = rates[rates["n_prompts"] > 0]  # a location absent everywhere (no BOS, no delimiter) has no rate
    if not bootstrap.enabled or n < MIN_INTERVAL_UNITS:
        return "inconclusive", kept, (f"no interval at N = {n} (intervals need at least {MIN_INTERVAL_UNITS} "
                                      "prompts and a bootstrap): nothing is decided")
    if bool((rates["sink_rate_hi"] < NONE_FLOOR).all()):
        return "none", kept, (f"no condition has a sink rate reaching {NONE_FLOOR:.0%} at any location: the model "
                              "has no attention sink on these prompts")
    if not bool((rates["sink_rate_lo"] > NONE_FLOOR).any()):
        return "inconclusive", kept, "no sink rate is resolved above the floor, yet not every one is below it"
    if not np.isfinite(kept.value):
        return "inconclusive", kept, ("the sink rate with BOS is not resolved above the floor, so the share kept "
                                      "without BOS is not defined (a ratio of a near-zero denominator)")
    share = f"kept {kept.value:.0%} [{kept.lo:.0%}, {kept.hi:.0%}] of its with-BOS rate without BOS"
    if kept.lo >= KEPT_HIGH:
        return "position-driven", kept, f"the sink {share}: it forms on whatever token sits at position 0"
    if kept.hi <= KEPT_LOW:
        return "BOS-driven", kept, f"the sink {share}: it needs the BOS token"
    if kept.lo > KEPT_LOW and kept.hi < KEPT_HIGH:
        return "mixed", kept, f"the sink {share}: part of it needs BOS, part forms at position 0 anyway"
    return "inconclusive", kept, (f"the sink {share}: the interval crosses {KEPT_LOW:.0%} or {KEPT_HIGH:.0%}; "
                                  "more prompts (N) would decide")


# --------------------------------------------------------------------------- result


@dataclass(repr=False)
class SinkOrigin(SavedResult):
    """Result of :func:`sink_origin`. ``frame``: one row per (condition, location) with
    ``sink_rate`` (Gu et al.'s rate at that location, a fraction in [0, 1]) and its interval
    (``_lo``/``_hi``, over prompts), ``n_sink_heads`` (heads whose score averaged over prompts exceeds
    ``eps``), ``n_heads``, ``n_prompts`` (prompts where the location exists), ``key_positions`` (where it is),
    ``eps``, ``seq_len``. ``heads``: one row per (condition, location, layer, head) with the
    ``sink_score`` (attention on the location, in [0, 1]), its interval and ``is_sink``.
    ``verdict``: one row with ``verdict`` (:data:`VERDICTS`), ``kept`` (share of the with-BOS sink
    rate at position 0 kept without BOS) and ``followed`` (share found at the moved BOS), each with
    its paired interval, and ``reason`` in words."""

    KEYWORD = "sink_origin"
    TABLES = (
        Table("sink_origin", "frame", "SinkOrigin.frame"),
        Table("sink_origin_heads", "heads", "SinkOrigin.heads"),
        Table("sink_origin_verdict", "verdict", "SinkOrigin.verdict"),
    )

    frame: pd.DataFrame
    heads: pd.DataFrame
    verdict: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "where the attention sink comes from: position 0, the BOS token, both or neither"
    INTERVALS = "95% bootstrap over prompts (paired across conditions)"
    HEADS = None  # one row per (condition, location, layer, head): see .heads

    @property
    def origin(self) -> str:
        """The verdict: ``position-driven``, ``BOS-driven``, ``mixed``, ``none`` or ``inconclusive``."""
        return str(self.verdict["verdict"].iloc[0])

    def rate(self, condition: str, location: str = "position0") -> Estimate:
        """The sink rate of ``condition`` at ``location`` with its interval."""
        rows = self.frame[(self.frame["condition"] == condition) & (self.frame["location"] == location)]
        if rows.empty:
            raise BadInputError(f"no sink rate for condition {condition!r} at {location!r}; conditions: "
                                f"{sorted(set(self.frame['condition']))}, locations: {list(LOCATIONS)}")
        row = rows.iloc[0]
        return Estimate(float(row["sink_rate"]), float(row["sink_rate_lo"]), float(row["sink_rate_hi"]),
                        n=int(row["n_prompts"]))

    def headline(self) -> list[Headline]:
        """The verdict with the share kept without BOS, then the sink rates with and without BOS."""
        row = self.verdict.iloc[0]
        kept = Estimate(float(row["kept"]), float(row["kept_lo"]), float(row["kept_hi"]))
        return [Headline("kept", f"sink origin: {row['verdict']} (share kept without BOS)", kept,
                         "sink rate at position 0 without BOS over the rate with BOS"),
                Headline("sink_rate", "sink rate with BOS (position 0)", self.rate("bos"),
                         "fraction of (prompt, layer, head) triples above eps"),
                Headline("sink_rate", "sink rate without BOS (position 0)", self.rate("no_bos"),
                         "fraction of (prompt, layer, head) triples above eps")]


# --------------------------------------------------------------------------- the measurement


def _base_text(loaded: LoadedModel, prompts: CheckedPrompts | None, *, T: int, N: int, seed: int, text: str | None,
               corpus: str | None, bos_id: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The text every condition is made of: ``N`` windows of ``T`` tokens without BOS (built from
    the corpus, or the caller's ``prompts``, which must not start with BOS)."""
    if prompts is None:
        built = build_prompts(loaded, source="natural", T=T, N=N, bos="none", seed=seed, text=text, corpus=corpus)
        return built.tokens, built.spec.to_dict()
    if bool((prompts.tokens == bos_id).any()):
        raise BadInputError(f"these prompts hold the BOS token (id {bos_id}); sink_origin places BOS itself in each "
                            "condition: pass the text without BOS (build_prompts(model, bos='none'))")
    return prompts.tokens, prompts.spec.to_dict()


def _rate_rows(condition: str, location: str, scores: torch.Tensor, where: Sequence[Keys], eps: float,
               bootstrap: Bootstrap) -> tuple[dict[str, Any], pd.DataFrame, np.ndarray]:
    """One condition's sink rate at one location (a row), its per-head scores (a frame) and its
    per-prompt rates (NaN where the location is absent)."""
    n_prompts, n_layers, n_heads = scores.shape
    defined = ~torch.isnan(scores).any(2).any(1)
    per_prompt = np.full(n_prompts, np.nan)
    per_prompt[defined.numpy()] = (scores[defined] > eps).to(torch.float64).mean((1, 2)).numpy()
    values = scores[defined].reshape(int(defined.sum()), n_layers * n_heads).numpy()
    if len(values):
        rate, lo, hi = bootstrap_mean(per_prompt[defined.numpy()], bootstrap, PROBABILITY)
        head, head_lo, head_hi = bootstrap_mean(values, bootstrap, PROBABILITY)
    else:
        rate, lo, hi = (np.full((), np.nan) for _ in range(3))
        head = head_lo = head_hi = np.full(n_layers * n_heads, np.nan)
    present = sorted({keys for keys in where if keys is not None})
    keys = ("none" if not present else ", ".join(map(str, present[0])) if len(present) == 1
            else f"per prompt, {present[0][0]} to {present[-1][0]}")
    heads = pd.DataFrame({"condition": condition, "location": location,
                          "layer": np.repeat(np.arange(n_layers), n_heads),
                          "head": np.tile(np.arange(n_heads), n_layers),
                          "sink_score": head, "sink_score_lo": head_lo, "sink_score_hi": head_hi})
    heads["is_sink"] = heads["sink_score"] > eps
    row = {"condition": condition, "location": location, "key_positions": keys, "sink_rate": float(rate),
           "sink_rate_lo": float(lo), "sink_rate_hi": float(hi), "n_sink_heads": int(heads["is_sink"].sum()),
           "n_heads": n_layers * n_heads, "n_prompts": int(defined.sum()), "eps": eps}
    return row, heads, per_prompt


def _checked_conditions(conditions: Sequence[str]) -> list[str]:
    if isinstance(conditions, str) or not len(conditions):
        raise BadInputError(f"conditions must be a non-empty sequence out of {list(CONDITIONS)}, got {conditions!r}")
    unknown = [c for c in conditions if c not in CONDITIONS]
    if unknown or len(set(conditions)) != len(conditions):
        raise BadInputError(f"conditions {list(conditions)}: each must be one of {list(CONDITIONS)}, named once")
    if not {"bos", "no_bos"} <= set(conditions):
        raise BadInputError("conditions must include 'bos' and 'no_bos': the verdict compares the sink with and "
                            "without BOS")
    return [c for c in CONDITIONS if c in conditions]


def _measure(loaded: LoadedModel, body: torch.Tensor, conditions: Sequence[str], *, bos_id: int, moved_to: int,
             delimiters: set[int], token: int | None, seed: int, batch_size: int, progress: bool
             ) -> dict[str, tuple[dict[str, torch.Tensor], dict[str, list[Keys]]]]:
    """Every condition's sink scores at every location, one streamed pass per condition."""
    token_sets = sink_origin_tokens(body, bos_id, moved_to)
    out = {}
    with progress_bar("sink origin", total=len(conditions) * len(body), enabled=progress):
        for condition in conditions:
            tokens = token_sets.get(condition, token_sets["bos"])
            patches: list[Patch] = []
            if condition in REPLACED:
                patches = [embedding_patch.body(loaded, token_sets["bos"], REPLACED[condition], position=0, token=token,
                                           seed=seed)]
            where = locations_of(tokens, condition, bos_id, moved_to, delimiters)
            reducer = LocationSinkReducer(loaded.spec.n_layers, loaded.spec.n_heads, where)
            stream.body(loaded, tokens, [reducer], patches=patches, batch_size=batch_size, progress=progress,
                   desc=f"sink origin: {condition}")
            out[condition] = (reducer.result(), where)
    return out


@public
def sink_origin(
    loaded: LoadedModel,
    prompts: Prompts | None = None,
    *,
    T: int = 64,
    N: int = 16,
    seed: int = 0,
    text: str | None = None,
    corpus: str | None = None,
    conditions: Sequence[str] = CONDITIONS,
    moved_to: int | None = None,
    token: int | None = None,
    delimiters: Sequence[int] | None = None,
    eps: float = SINK_EPS,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> SinkOrigin:
    """Where ``model``'s attention sink comes from (module docstring): the sink rate and sink heads
    at position 0, at the BOS and at the first delimiter under each condition, and the verdict.

    Args:
        prompts: the text, without BOS (default: ``N`` windows of ``T`` tokens of the corpus,
            ``build_prompts(model, bos="none", ...)``); a model without a tokenizer needs token ids.
        moved_to: where ``bos_moved`` puts BOS (default ``min(8, T // 2)``).
        token: the token whose embedding ``replaced_token`` puts at position 0 (default: one drawn
            with ``seed``, never a special token).
        delimiters: the token ids that count as delimiters (default: the tokenizer's punctuation and
            newline tokens among the prompts'; none without a tokenizer).
        eps: the sink threshold on a head's attention (Gu et al.'s 0.3).
    """
    eps, seed, batch_size = check_fraction("eps", eps), check_seed(seed), check_count("batch_size", batch_size)
    conditions = _checked_conditions(conditions)
    bos_id = getattr(loaded.tokenizer, "bos_token_id", None) if loaded.tokenizer is not None else None
    bos_id = bos_id if bos_id is not None else loaded.spec.bos_token_id
    if bos_id is None:
        raise BadInputError(f"{loaded.spec.name} has no BOS token (neither its tokenizer nor its spec names one): "
                            "sink_origin compares the sink with and without BOS; use sink_rate for its sinks")
    checked = None if prompts is None else checked_prompts(loaded, prompts, min_length=4, distinct=bootstrap.enabled,
                                                           hygiene=False)
    body, data = _base_text(loaded, checked, T=check_count("T", T), N=check_count("N", N), seed=seed, text=text,
                            corpus=corpus, bos_id=int(bos_id))
    length = body.shape[1]
    if "bos_moved" in conditions and length < 3:
        raise BadInputError(f"T = {length}: the bos_moved condition moves BOS into the text, which needs at least 3 "
                            "positions; use T >= 3, or leave bos_moved out of conditions")
    moved_to = min(8, length // 2) if moved_to is None else check_int("moved_to", moved_to)
    chosen = set(delimiters) if delimiters is not None else delimiter_ids(loaded, body)
    measured = _measure(loaded, body, conditions, bos_id=int(bos_id), moved_to=moved_to, delimiters=chosen,
                        token=token, seed=seed, batch_size=batch_size, progress=progress)
    rows, heads, per_prompt = [], [], {}
    for condition, (scores, where) in measured.items():
        for location in LOCATIONS:
            row, frame, rates = _rate_rows(condition, location, scores[location], where[location], eps, bootstrap)
            rows.append(row)
            heads.append(frame)
            per_prompt[condition, location] = rates
    frame = pd.DataFrame(rows).assign(seq_len=length)
    verdict, kept, reason = origin_verdict(frame, per_prompt["bos", "position0"], per_prompt["no_bos", "position0"],
                                           bootstrap)
    followed = (paired_share(per_prompt["bos_moved", "bos"], per_prompt["bos", "position0"], bootstrap)
                if "bos_moved" in measured else Estimate(float("nan")))
    table = pd.DataFrame([{"verdict": verdict, "kept": kept.value, "kept_lo": kept.lo, "kept_hi": kept.hi,
                           "followed": followed.value, "followed_lo": followed.lo, "followed_hi": followed.hi,
                           "reason": reason, "seq_len": length, "N": len(body)}])
    return SinkOrigin(frame=frame, heads=pd.concat(heads, ignore_index=True), verdict=table,
                      provenance=provenance.collect(
                          model=loaded.spec, data=data, seed=seed, eps=eps, conditions=list(conditions),
                          moved_to=moved_to, replacement_token=token, bos_token_id=int(bos_id),
                          delimiter_ids=sorted(chosen), thresholds={"kept_high": KEPT_HIGH, "kept_low": KEPT_LOW,
                                                                    "none_floor": NONE_FLOOR},
                          metric="sink rate at a location: mean over prompts of the fraction of (layer, head) whose "
                                 "attention on the location's keys, averaged over queries i >= max(keys), exceeds eps",
                          intervals=bootstrap.to_dict("prompt")))
