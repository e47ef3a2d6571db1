"""Positional leakage (ΔR²) per head, the measure of Ruscio, Nanni and Silvestri's "Once upon a
token", on any model lens_position loads, in two modes.

**What is measured.** Per head and sequence, ``ΔR² = R²(rel + src + tgt) - R²(rel)``: the share of
the variance of the unscaled post-RoPE scores ``q_rot[i] . k_rot[j]`` over the causal pairs
``j <= i`` (no BOS: texts tokenised without special tokens) that a linear model in the absolute
positions explains beyond one in the offset ``i - j``, both R² held out over pairs
(:mod:`lens_position.analyses.leakage_stats`). Per head, the **gap** is the mean ΔR² over the
texts minus the mean over their nulls (each text's tokens circularly shifted), with an interval, a
one-sided p-value ("real > null") and a multiple-comparison step over all heads. A unitless
difference of two fractions of variance, in [-1, 1].

**Two modes.**

- ``mode="authors"`` reproduces the authors' notebook (``ValeRuscio/Once_upon_a_token``): texts
  drawn with replacement from the pool by one ``numpy`` generator seeded with ``seed`` (their 123),
  the same generator for the pair splits, the shifts, the 2000 bootstrap draws and the 5000 sign
  vectors, in their order; their multiple-comparison step (:func:`~lens_position.analyses.
  leakage_stats.authors_qvalues`, not Benjamini-Hochberg); their band shares (pairs taken as
  dimensions ``2p, 2p+1``, all pairs of one other input: the first five texts joined). Seeded
  alike on the same texts, it gives their numbers (tests/unit/analyses/test_leakage_reference.py).
- ``mode="corrected"`` keeps the statistic and the null, and changes what the tests showed wrong
  or fragile: texts drawn without replacement; the interval of the gap a calibrated bootstrap of
  the mean over sequences (:func:`lens_position.core.intervals.bootstrap_mean`); the sign-flip test
  exact for up to 16 sequences (all 65,536 sign vectors: with 5000 random ones no p-value falls below
  1/5001, too coarse for Benjamini-Hochberg over hundreds of heads); textbook Benjamini-Hochberg;
  band shares with the model's own pair layout
  (:func:`lens_position.analyses.rotary_bands.frequency_bands`) on the causal pairs of the tested
  texts; and the whole run repeated for ``n_seeds`` seeds, with how often each head is
  significant and how much the significant sets of two seeds overlap (Jaccard).

What ΔR² can and cannot see beside the decomposition's ``R'`` and ``M'`` is on the concepts page
("Positional leakage beside R' and M'").
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int

from lens_position.analyses import leakage_stats as stats
from lens_position.analyses.rotary_bands import frequency_bands
from lens_position.core.checks import check_count, check_layers, check_seed
from lens_position.core.inputs import CheckedPrompts, checked_prompts, checked_rows
from lens_position.core.intervals import Bootstrap, Estimate, benjamini_hochberg, bootstrap_mean
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import stream
from lens_position.core.summaries import Headline
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.backends import rotate
from lens_position.models.corpus import read_corpus
from lens_position.models.spec import LoadedModel, public

__all__ = ["PUBLISHED", "PositionalLeakage", "leakage_texts", "positional_leakage", "published_table"]

Mode = Literal["authors", "corrected"]
MODES = ("authors", "corrected")
#: the authors' settings: sequences sampled (their published run), seed, cut, FDR level, draws
AUTHORS_SAMPLES = 16
AUTHORS_SEED = 123
MAX_LENGTH = 256
ALPHA = 0.05
N_BOOT = 2000
N_PERM = 5000
#: the authors' band shares come from one input, their first five texts joined by spaces
BAND_TEXTS = 5
#: sentences shorter than this many tokens are refused (a held-out fit needs pairs on both sides)
MIN_TOKENS = 8
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_PROSE = re.compile(r"^[A-Z][A-Za-z ,;'\-]+[.!?]$")


def leakage_texts(corpus: str | None = None, min_words: int = 15, max_words: int = 45, *,
                  text: str | None = None) -> list[str]:
    """Single sentences of plain prose from ``text`` or a corpus (default: lens_position's default
    corpus), in order: the sentences of ``min_words`` to ``max_words`` words that start with a capital,
    end with ``.``, ``!`` or ``?`` and hold only letters, spaces and ``,;'-`` (no code, no markup).
    They stand in for the authors' Wikipedia sentences, whose repository states no licence."""
    if text is not None and corpus is not None:
        raise BadInputError("pass either text= or corpus=, not both")
    source = text if text is not None else read_corpus(corpus).text
    sentences = (" ".join(s.split()) for paragraph in source.split("\n\n") for s in _SENTENCE.split(paragraph))
    return [s for s in sentences if _PROSE.match(s) and min_words <= len(s.split()) <= max_words]


def _are_texts(texts: Any) -> bool:
    return isinstance(texts, (list, tuple)) and bool(texts) and all(isinstance(t, str) for t in texts)


def _token_pool(loaded: LoadedModel, texts: Sequence[str] | CheckedPrompts | None,
                max_length: int) -> tuple[list[torch.Tensor], list[str] | None]:
    """The pool the samples are drawn from: each text tokenised without special tokens and cut to
    ``max_length`` (the authors' ``add_special_tokens=False, truncation=True``), or the rows of token
    ids the door checked (``positional_leakage``). Also the texts, when texts were given."""
    if isinstance(texts, CheckedPrompts):
        return list(texts.tokens[:, :max_length]), None
    texts = leakage_texts() if texts is None else texts
    if loaded.tokenizer is None:
        raise BadInputError("texts need a tokenizer; this model has none: pass token ids [N, T] instead")
    rows = [torch.tensor(loaded.tokenizer(t, add_special_tokens=False)["input_ids"][:max_length],
                         dtype=torch.int64) for t in texts]
    if not rows:
        raise BadInputError("positional leakage needs at least one text")
    for k, row in enumerate(rows):
        if len(row) < MIN_TOKENS:
            raise BadInputError(f"text {k} is {len(row)} tokens, fewer than {MIN_TOKENS}: the held-out fits need "
                                "causal pairs on both sides of the split; drop it or pass longer texts")
    return checked_rows(loaded, rows, min_length=MIN_TOKENS), list(texts)


class _RotatedCapture:
    """A reducer that keeps one sequence's rotated queries and keys per layer, ``[head, pos, d_head]``,
    grouped keys repeated per query head (as Hugging Face's ``repeat_kv`` and TransformerLens do)."""

    def __init__(self, loaded: LoadedModel, layers: Sequence[int]) -> None:
        self.layouts = {layer: loaded.backend.rotary_layout(layer) for layer in layers}
        names = []
        for layer, layout in self.layouts.items():
            tables = ("hook_cos", "hook_sin") if layout.rotated_here else ()
            names += [f"blocks.{layer}.attn.{name}" for name in (*layout.query_hooks, *tables)]
        self.hook_names = tuple(names)
        self.seen: dict[tuple[int, str], torch.Tensor] = {}

    def update(self, hook_name: str, activation: torch.Tensor, rows: Int[torch.Tensor, "batch"]) -> None:
        _, layer, _, kind = hook_name.split(".")
        self.seen[(int(layer), kind)] = activation.detach().cpu()

    def layer(self, layer: int) -> tuple[Float[torch.Tensor, "head pos d"], Float[torch.Tensor, "head pos d"]]:
        layout = self.layouts[layer]
        q, k = (self.seen[(layer, name)] for name in layout.query_hooks)
        if layout.rotated_here:
            cos, sin = self.seen[(layer, "hook_cos")], self.seen[(layer, "hook_sin")]
            q, k = (rotate(x.to(torch.float64), cos.to(torch.float64), sin.to(torch.float64), layout).to(x.dtype)
                    for x in (q, k))
        q, k = q[0].transpose(0, 1), k[0].transpose(0, 1)
        if k.shape[0] != q.shape[0]:
            k = torch.repeat_interleave(k, q.shape[0] // k.shape[0], dim=0)
        return q, k


def _capture(loaded: LoadedModel, tokens: torch.Tensor, layers: Sequence[int], progress: bool) -> _RotatedCapture:
    reducer = _RotatedCapture(loaded, layers)
    stream.body(loaded, tokens[None].to(loaded.backend.device), [reducer], batch_size=1, progress=progress,
           desc="positional leakage")
    return reducer


@dataclass
class _Run:
    """One seed's run: per sample, layer and head ``(R²_rel, R²_full, ΔR²)`` on the texts (``real``) and
    on their nulls (``null``), the pool indices drawn, and the corrected mode's band shares per sample."""

    real: np.ndarray
    null: np.ndarray
    picks: list[int]
    shares: np.ndarray | None


def _sample(loaded: LoadedModel, pool: list[torch.Tensor], *, n_samples: int, rng: np.random.Generator,
            layers: Sequence[int], mode: str, bands: dict[int, list[tuple[int, ...]]] | None, progress: bool) -> _Run:
    """Draw and analyse ``n_samples`` texts and their nulls in the authors' order of random draws
    (text, the real pass's splits layer by layer, the shift, the null pass's splits)."""
    if mode == "corrected" and n_samples > len(pool):
        raise BadInputError(f"n_samples={n_samples} distinct texts asked for, the pool has {len(pool)}: "
                            "lower n_samples or pass more texts")
    distinct = rng.permutation(len(pool))[:n_samples] if mode == "corrected" else None
    real, null, picks, shares = [], [], [], []
    for s in range(n_samples):
        pick = int(distinct[s]) if distinct is not None else int(rng.integers(0, len(pool)))
        picks.append(pick)
        capture = _capture(loaded, pool[pick], layers, progress)
        real.append([stats.layer_leakage(*capture.layer(layer), rng) for layer in layers])
        if bands is not None:
            shares.append([[stats.band_energy_shares(q, k, bands[layer], causal=True)
                            for q, k in zip(*capture.layer(layer))] for layer in layers])
        shifted = stats.circular_shift(pool[pick], rng)
        capture = _capture(loaded, shifted, layers, progress)
        null.append([stats.layer_leakage(*capture.layer(layer), rng) for layer in layers])
    return _Run(np.array(real), np.array(null), picks, np.array(shares) if shares else None)


def _model_bands(loaded: LoadedModel, layers: Sequence[int]) -> dict[int, list[tuple[str, tuple[int, ...]]]]:
    """The corrected mode's bands per layer: the model's own pair layout, ten bands of contiguous
    frequency (fewer when the layer rotates fewer pairs), plus the unrotated dimensions if any."""
    out = {}
    for layer in layers:
        n_pairs = loaded.backend.rotary_layout(layer).rotary_dim // 2
        out[layer] = [(b.name, b.dims) for b in frequency_bands(loaded, layer, min(stats.AUTHORS_BANDS, n_pairs))]
    return out


def _authors_bands(loaded: LoadedModel, pool: list[torch.Tensor], strings: list[str] | None, layers: Sequence[int],
                   max_length: int, progress: bool) -> np.ndarray:
    """The authors' band shares ``[layer, head, band]``: one input (the first five texts joined by spaces,
    tokenised and cut like the others; for token ids, the first five rows concatenated), all pairs,
    the pairs taken as dimensions ``(2p, 2p + 1)``."""
    if strings is not None:
        ids = loaded.tokenizer(" ".join(strings[:BAND_TEXTS]), add_special_tokens=False)["input_ids"][:max_length]
        tokens = torch.tensor(ids, dtype=torch.int64)
    else:
        tokens = torch.cat(pool[:BAND_TEXTS])[:max_length]
    capture = _capture(loaded, tokens, layers, progress)
    out = []
    for layer in layers:
        bands = stats.authors_band_dims(loaded.backend.rotary_layout(layer).rotary_dim // 2)
        out.append([stats.band_energy_shares(q, k, bands, causal=False) for q, k in zip(*capture.layer(layer))])
    return np.array(out)


@dataclass(frozen=True)
class _Tested:
    """One seed's per-head test, flattened over (layer, head): gap, interval, p, q, significance."""

    gap: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p: np.ndarray
    q: np.ndarray
    significant: np.ndarray


def _test(run: _Run, mode: str, rng: np.random.Generator, *, n_boot: int, n_perm: int, alpha: float,
          seed: int) -> _Tested:
    real, null = (x[..., 2].reshape(len(x), -1) for x in (run.real, run.null))
    if mode == "authors":
        test = stats.authors_gap_test(real, null, rng, n_boot, n_perm)
        gap, lo, hi, p, q = test.gap, test.lo, test.hi, test.p, stats.authors_qvalues(test.p)
    else:
        diffs = real - null
        gap, lo, hi = bootstrap_mean(diffs, Bootstrap(n_resamples=min(n_boot, 10_000), seed=seed))
        p = stats.one_sided_sign_flip(diffs, n_perm, seed)
        q = benjamini_hochberg(p)
    return _Tested(gap, lo, hi, p, q, q <= alpha)


@dataclass(repr=False)
class PositionalLeakage(SavedResult):
    """Result of :func:`positional_leakage`.

    ``heads``: one row per (layer, head): ``delta_r2`` and ``delta_r2_null`` (mean ΔR² over the texts
    and over their shifted nulls), ``r2_relative`` and ``r2_full`` (mean held-out R² of the two fits
    on the texts), ``leakage_gap`` = ``delta_r2 - delta_r2_null`` with its interval (``_lo``, ``_hi``),
    ``p_value`` (one-sided sign flip), ``q_value`` (the mode's multiple-comparison step) and
    ``significant`` (``q_value <= alpha``); in the corrected mode also ``significant_share``, the share
    of the seeds in which the head was significant. All from the first seed.
    ``layers``: per layer, ``n_heads``, ``n_significant``, and the means over heads of ``delta_r2``,
    ``delta_r2_null`` and ``leakage_gap``. ``bands``: per (layer, head, band), ``energy_share`` (the band's share of the
    Frobenius norm of the score matrix; mean over the tested texts with its interval in the corrected
    mode, the one band input in the authors'). ``seeds``: per pair of seeds, the sizes of their
    significant sets and their ``jaccard`` overlap. ``real`` and ``null``: the per-sequence
    ``[sample, layer, head, (R²_rel, R²_full, ΔR²)]`` of the first seed."""

    heads: pd.DataFrame
    layers: pd.DataFrame
    bands: pd.DataFrame
    seeds: pd.DataFrame
    real: torch.Tensor
    null: torch.Tensor
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "positional leakage (ΔR²) per head, against a circular-shift null"
    KEYWORD = "leakage"
    HEADS = ("heads", "leakage_gap")
    INTERVALS = "95% bootstrap over sequences"
    TABLES = (Table("leakage_heads", "heads", "PositionalLeakage.heads: ΔR² per head, its gap over the shifted "
                    "null, p and q values"),
              Table("leakage_layers", "layers", "PositionalLeakage.layers: significant heads per layer"),
              Table("leakage_seeds", "seeds", "PositionalLeakage.seeds: overlap of the significant sets of two seeds"))

    @property
    def mode(self) -> str:
        return str(self.provenance.get("options", {}).get("mode", ""))

    def headline(self) -> list[Headline]:
        """Significant heads out of all, the largest gap, and (over several seeds) the overlap of
        the significant sets."""
        top = self.heads.sort_values("leakage_gap", ascending=False).iloc[0]
        out = [Headline("n_significant", f"significant heads ({self.mode} step)",
                        Estimate(float(self.heads["significant"].sum())), f"of {len(self.heads)} heads"),
               Headline("leakage_gap", f"largest gap: L{int(top['layer'])}H{int(top['head'])}",
                        Estimate(float(top["leakage_gap"]), float(top["leakage_gap_lo"]),
                                 float(top["leakage_gap_hi"])), "mean ΔR² on texts minus on shifted nulls")]
        if len(self.seeds):
            out.append(Headline("jaccard", "overlap of the significant sets of two seeds",
                                Estimate(float(self.seeds["jaccard"].mean())), "mean Jaccard over pairs of seeds"))
        return out


def _head_frame(layers: Sequence[int], n_heads: int, run: _Run, tested: _Tested,
                shares: np.ndarray | None) -> pd.DataFrame:
    means = run.real.mean(0).reshape(-1, 3)
    frame = pd.DataFrame({
        "layer": np.repeat(list(layers), n_heads), "head": np.tile(np.arange(n_heads), len(layers)),
        "delta_r2": means[:, 2], "delta_r2_null": run.null[..., 2].mean(0).reshape(-1),
        "r2_relative": means[:, 0], "r2_full": means[:, 1],
        "leakage_gap": tested.gap, "leakage_gap_lo": tested.lo, "leakage_gap_hi": tested.hi,
        "p_value": tested.p, "q_value": tested.q, "significant": tested.significant})
    if shares is not None:
        frame["significant_share"] = shares
    return frame


def _band_frame(layers: Sequence[int], shares: np.ndarray, names: dict[int, list[str]],
                bootstrap: Bootstrap | None) -> pd.DataFrame:
    """Rows per (layer, head, band) from shares ``[layer, head, band]`` (authors) or
    ``[sample, layer, head, band]`` (corrected: the mean over the tested texts and its interval)."""
    rows = []
    for li, layer in enumerate(layers):
        per_layer = shares[li] if bootstrap is None else shares[:, li]
        mean, lo, hi = ((per_layer, np.full(per_layer.shape, np.nan), np.full(per_layer.shape, np.nan))
                        if bootstrap is None else bootstrap_mean(per_layer, bootstrap, (0.0, 1.0)))
        for h in range(mean.shape[0]):
            for b, name in enumerate(names[layer]):
                rows.append({"layer": layer, "head": h, "band": name, "band_index": b,
                             "energy_share": mean[h, b], "energy_share_lo": lo[h, b], "energy_share_hi": hi[h, b]})
    return pd.DataFrame(rows)


def _seed_frame(seeds: Sequence[int], significant: list[set[tuple[int, int]]]) -> pd.DataFrame:
    rows = [{"seed_a": seeds[a], "seed_b": seeds[b], "n_significant_a": len(significant[a]),
             "n_significant_b": len(significant[b]), "jaccard": stats.jaccard(significant[a], significant[b])}
            for a, b in itertools.combinations(range(len(seeds)), 2)]
    return pd.DataFrame(rows, columns=["seed_a", "seed_b", "n_significant_a", "n_significant_b", "jaccard"])


def _checked_options(mode: Any, alpha: Any, n_samples: Any, n_seeds: Any,
                     max_length: Any) -> tuple[Mode, int, int, int]:
    if mode not in MODES:
        raise BadInputError(f"mode={mode!r}: use 'authors' (their notebook's computation) or 'corrected'")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise BadInputError(f"alpha must be a false discovery rate in (0, 1) such as 0.05, got {alpha!r}")
    n_samples = check_count("n_samples", n_samples, minimum=2)
    n_seeds = check_count("n_seeds", (1 if mode == "authors" else 3) if n_seeds is None else n_seeds)
    return mode, n_samples, n_seeds, check_count("max_length", max_length, minimum=MIN_TOKENS)


@public
def positional_leakage(
    loaded: LoadedModel,
    texts: Sequence[str] | Any = None,
    *,
    mode: Mode = "corrected",
    n_samples: int = AUTHORS_SAMPLES,
    seed: int = AUTHORS_SEED,
    n_seeds: int | None = None,
    layers: Sequence[int] | int | str | None = None,
    max_length: int = MAX_LENGTH,
    alpha: float = ALPHA,
    n_boot: int = N_BOOT,
    n_perm: int = N_PERM,
    progress: bool = True,
) -> PositionalLeakage:
    """Positional leakage ΔR² of every head (module docstring) on ``n_samples`` texts and their
    circularly shifted nulls, with the per-head test in ``mode`` ``"authors"`` or ``"corrected"``.

    ``texts``: a list of strings (each tokenised without special tokens, cut to ``max_length``
    tokens), token ids ``[N, T]`` or a PromptSet; default :func:`leakage_texts`. ``seed`` seeds the
    one generator of the run (the authors' 123); ``n_seeds`` runs (default 1 in the authors' mode,
    3 in the corrected one) use ``seed, seed + 1, ...``. ``alpha``: the false discovery rate of the
    multiple-comparison step. ``n_boot``, ``n_perm``: bootstrap draws and sign vectors per head.
    Costs ``2 n_samples n_seeds`` forward passes (one sequence each), plus one in the authors' mode.
    """
    source = "leakage_texts() (default corpus)" if texts is None else "given"
    mode, n_samples, n_seeds, max_length = _checked_options(mode, alpha, n_samples, n_seeds, max_length)
    n_boot, n_perm = check_count("n_boot", n_boot, minimum=20), check_count("n_perm", n_perm, minimum=20)
    seed = check_seed(seed)
    layers = check_layers(layers, loaded.spec.n_layers)
    if not (texts is None or _are_texts(texts)):
        texts = checked_prompts(loaded, texts, min_length=MIN_TOKENS, hygiene=False)
    pool, strings = _token_pool(loaded, texts, max_length)
    seeds = [seed + k for k in range(n_seeds)]
    bands = _model_bands(loaded, layers) if mode == "corrected" else None
    runs, tests = [], []
    with progress_bar("positional leakage", total=2 * n_samples * n_seeds + (mode == "authors"), enabled=progress):
        for run_seed in seeds:
            rng = np.random.default_rng(run_seed)
            run = _sample(loaded, pool, n_samples=n_samples, rng=rng, layers=layers, mode=mode,
                          bands=None if bands is None else {layer: [d for _, d in bands[layer]] for layer in layers},
                          progress=progress)
            runs.append(run)
            tests.append(_test(run, mode, rng, n_boot=n_boot, n_perm=n_perm, alpha=alpha, seed=run_seed))
        authors_shares = (_authors_bands(loaded, pool, strings, layers, max_length, progress)
                          if mode == "authors" else None)
    return _result(loaded, layers, runs, tests, seeds, bands, authors_shares, source=source, n_texts=len(pool),
                   mode=mode, alpha=alpha, n_boot=n_boot, n_perm=n_perm, max_length=max_length)


def _result(loaded: LoadedModel, layers: Sequence[int], runs: list[_Run], tests: list[_Tested], seeds: list[int],
            bands: dict[int, list[tuple[str, tuple[int, ...]]]] | None, authors_shares: np.ndarray | None, *,
            source: str, n_texts: int, mode: str, alpha: float, n_boot: int, n_perm: int,
            max_length: int) -> PositionalLeakage:
    n_heads = loaded.spec.n_heads
    keys = [(layer, h) for layer in layers for h in range(n_heads)]
    significant = [{keys[i] for i in np.flatnonzero(t.significant)} for t in tests]
    share = np.mean([t.significant for t in tests], axis=0) if mode == "corrected" else None
    heads = _head_frame(layers, n_heads, runs[0], tests[0], share)
    per_layer = heads.groupby("layer", sort=True).agg(
        n_heads=("head", "size"), n_significant=("significant", "sum"), delta_r2=("delta_r2", "mean"),
        delta_r2_null=("delta_r2_null", "mean"), leakage_gap=("leakage_gap", "mean")).reset_index()
    if bands is not None and runs[0].shares is not None:
        band_frame = _band_frame(layers, runs[0].shares, {layer: [n for n, _ in bands[layer]] for layer in layers},
                                 Bootstrap())
        band_layout = "the model's own pairs, causal pairs of the tested texts"
    else:
        assert authors_shares is not None
        names = {layer: [f"b{k}" for k in range(authors_shares.shape[-1])] for layer in layers}
        band_frame = _band_frame(layers, authors_shares, names, None)
        band_layout = "pairs as dimensions (2p, 2p+1), all pairs of the first five texts joined"
    return PositionalLeakage(
        heads=heads, layers=per_layer, bands=band_frame, seeds=_seed_frame(seeds, significant),
        real=torch.from_numpy(runs[0].real), null=torch.from_numpy(runs[0].null),
        provenance=provenance.collect(
            model=loaded.spec, seed=seeds[0], seeds=seeds, mode=mode, alpha=alpha, n_boot=n_boot, n_perm=n_perm,
            layers=list(layers), n_samples=len(runs[0].picks), max_length=max_length, picks=runs[0].picks,
            data={"texts": source, "n_texts": n_texts},
            statistic="ΔR² = R²(rel + src + tgt) - R²(rel), held out over 30% of the causal pairs, unscaled "
                      "q_rot . k_rot, no BOS",
            null="the text's tokens circularly shifted by k ~ U{1..T-1}",
            multiple_comparisons="the authors' step as written" if mode == "authors" else "Benjamini-Hochberg",
            bands=band_layout))


@dataclass(frozen=True)
class PublishedRun:
    """A published positional-leakage run: significant heads per layer (their step), heads per layer,
    and the head with the largest gap with its gap and interval."""

    model: str
    significant_per_layer: tuple[int, ...]
    heads_per_layer: int
    top_head: tuple[int, int]
    top_gap: tuple[float, float, float]


#: The authors' published run (their notebook's output): Llama-3.2-1B, n = 16 texts, seed 123, their step.
PUBLISHED = PublishedRun(model="Llama-3.2-1B (published)",
                         significant_per_layer=(4, 0, 9, 2, 3, 12, 6, 9, 8, 4, 1, 10, 0, 11, 3, 3),
                         heads_per_layer=32, top_head=(5, 24), top_gap=(0.1024, 0.0610, 0.1428))


def published_table(results: dict[str, PositionalLeakage]) -> pd.DataFrame:
    """The authors' published numbers beside runs of ours, one row each: ``model``, ``mode``,
    ``n_significant`` of ``n_heads`` (and ``share_significant``), the head with the largest gap and that
    gap with its interval, and ``jaccard`` (the mean overlap of the seeds' significant sets, NaN for
    one seed). ``results``: model name -> result (either mode)."""
    per_layer, gap = PUBLISHED.significant_per_layer, PUBLISHED.top_gap
    n_heads = len(per_layer) * PUBLISHED.heads_per_layer
    rows: list[dict[str, Any]] = [{"model": PUBLISHED.model, "mode": "authors", "n_samples": AUTHORS_SAMPLES,
             "n_significant": sum(per_layer), "n_heads": n_heads, "share_significant": sum(per_layer) / n_heads,
             "top_head": "L{}H{}".format(*PUBLISHED.top_head), "leakage_gap": gap[0], "leakage_gap_lo": gap[1],
             "leakage_gap_hi": gap[2], "jaccard": np.nan}]
    for name, result in results.items():
        heads = result.heads
        top = heads.sort_values("leakage_gap", ascending=False).iloc[0]
        rows.append({"model": name, "mode": result.mode, "n_samples": result.provenance["options"]["n_samples"],
                     "n_significant": int(heads["significant"].sum()), "n_heads": len(heads),
                     "share_significant": float(heads["significant"].mean()),
                     "top_head": f"L{int(top['layer'])}H{int(top['head'])}", "leakage_gap": float(top["leakage_gap"]),
                     "leakage_gap_lo": float(top["leakage_gap_lo"]), "leakage_gap_hi": float(top["leakage_gap_hi"]),
                     "jaccard": float(result.seeds["jaccard"].mean()) if len(result.seeds) else np.nan})
    return pd.DataFrame(rows)
