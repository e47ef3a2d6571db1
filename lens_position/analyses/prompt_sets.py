"""The claims' numbers on independent prompt sets: the between-set spread beside the bootstrap.

A bootstrap interval (:mod:`lens_position.core.intervals`) resamples the sequences of *one* prompt
set. Where the data allow, the same uncertainty can be seen directly: draw ``K`` disjoint
prompt sets, measure the claim's number on each, and compare how much the ``K`` estimates
differ with what each set's bootstrap interval predicts.

- **Disjoint sets** (:func:`disjoint_prompt_sets`). Natural text: one draw of ``K x N``
  distinct windows of the corpus (the corpus is cut into non-overlapping windows, so no two
  sets share a token of it), dealt into ``K`` sets of ``N`` by a seeded permutation. Random
  or repeated tokens: ``K`` draws with the seeds ``seed, seed + 1, ...``.
- **The numbers** (:func:`between_sets`): per set, the held-out ``T`` (claim C1) and the
  held-out reference-free ``R'`` and ``M'`` (claim C2), each the mean over layers and heads
  over all queries, with its bootstrap interval, exactly as :mod:`lens_position.analyses.claims`
  computes them, and the claim's verdict on that set.
- **The comparison** (``spread``): per quantity, the mean over sets, the between-set
  standard deviation ``between_sd``, the standard deviation the bootstrap predicts
  ``bootstrap_sd`` (the mean over sets of the interval's width / (2 z), z = 1.96 at 95%),
  and their ratio ``sd_ratio`` with a 95% interval from the chi-square distribution of a
  sample variance of ``K`` values (exact quantiles). A ratio whose interval
  contains 1 says the bootstrap interval is as wide as the spread between independent sets;
  a ratio above 1 that the bootstrap is too narrow. With few sets the check is loose: for
  ``K = 4`` the ratio's 95% interval runs from 0.57 to 3.7 times the measured ratio.

Cost: one decomposition pass per set (``K`` times the decomposition of one set; on
SmolLM2-135M at T = 128, N = 16: 96 s for 4 sets on 2 shared cores), so this is an opt-in
analysis, not part of the default reproduction: :func:`across_prompt_sets` in Python,
``lens-position reproduce --prompt-sets K`` or ``lens-position decompose MODEL --prompt-sets K``
(the step ``prompt_sets``: its tables in the run's output and a table in the report).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import numpy as np
import pandas as pd
import torch

from lens_position.analyses import claims
from lens_position.analyses.decompose import Decomposition, decompose
from lens_position.core.checks import check_count, check_seed
from lens_position.core.data import DEFAULT_BOS, PromptSet, build_prompts
from lens_position.core.intervals import Bootstrap, from_replicates
from lens_position.core.results import SavedResult, Table
from lens_position.core.stream import BATCH_SIZE
from lens_position.core.summaries import Headline, headlines_from_rows
from lens_position.ground import provenance
from lens_position.ground.errors import BadInputError
from lens_position.ground.progress import progress as progress_bar
from lens_position.models.spec import LoadedModel, public

# quantity -> the claim decided on it (module docstring)
QUANTITIES = {"total_heldout": "C1", "R_rf_heldout": "C2", "M_rf_heldout": "C2"}
SET_COLUMNS = ["set", "claim", "quantity", "value", "lo", "hi", "level", "n_sequences", "verdict"]
SUMMARY_COLUMNS = ["claim", "quantity", "n_sets", "mean_over_sets", "between_sd", "bootstrap_sd", "sd_ratio",
                   "sd_ratio_lo", "sd_ratio_hi", "min_over_sets", "max_over_sets", "verdicts"]


def disjoint_prompt_sets(
    loaded: LoadedModel,
    K: int,
    *,
    T: int = 128,
    N: int = 16,
    source: str = "natural",
    bos: str = DEFAULT_BOS,
    seed: int = 0,
    text: str | None = None,
    corpus: str | None = None,
) -> list[PromptSet]:
    """``K`` prompt sets of ``N`` sequences that share no corpus window (natural text) or no
    draw (random, repeated tokens); module docstring. Each set's spec records its own
    ``window_starts`` and, in ``extra``, which set of how many it is."""
    K, N, seed = check_count("K", K, minimum=2), check_count("N", N), check_seed(seed)
    if source == "natural":
        pool = build_prompts(loaded, source=source, T=T, N=K * N, bos=bos, seed=seed, text=text, corpus=corpus)
        order = np.random.default_rng([seed, K, N]).permutation(K * N)
        out = []
        for k in range(K):
            rows = np.sort(order[k * N:(k + 1) * N])
            window_starts = pool.spec.window_starts or ()  # natural text: one start per window
            starts = tuple(window_starts[r] for r in rows)
            spec = dataclasses.replace(pool.spec, N=N, window_starts=starts,
                                       extra={**pool.spec.extra, "prompt_set": f"{k + 1} of {K}, disjoint windows"})
            out.append(PromptSet(tokens=pool.tokens[torch.from_numpy(rows)].contiguous(), spec=spec,
                                 bos_token_id=pool.bos_token_id))
        return out
    sets = [
        build_prompts(loaded, source=source, T=T, N=N, bos=bos, seed=seed + k, text=text, corpus=corpus)
        for k in range(K)
    ]
    return [
        dataclasses.replace(
            p,
            spec=dataclasses.replace(p.spec, extra={**p.spec.extra, "prompt_set": f"{k + 1} of {K}, seed {seed + k}"}),
        )
        for k, p in enumerate(sets)
    ]


def _set_estimates(result: Decomposition) -> dict[str, Any]:
    """The mean over layers of each quantity with its interval (as the claims compute it)."""
    layers = result.layers.sort_values("layer")
    n = int(layers["n_sequences"].iloc[0])
    out = {}
    for quantity in QUANTITIES:
        replicates = None
        if result.replicates is not None:
            grid = result.replicates.pivot(index="replicate", columns="layer", values=quantity)
            replicates = grid.reindex(columns=layers["layer"].tolist()).to_numpy(dtype=float).mean(1)
        out[quantity] = from_replicates(float(layers[quantity].mean()), replicates, n=n)
    return out


def _verdicts(result: Decomposition, name: str) -> dict[str, str]:
    """The verdict of each claim of ``QUANTITIES`` on one set (``claims.evaluate``)."""
    tag = {"architecture": name, "role": "standard"}
    tables = {"decompose_layers": result.layers.assign(**tag)}
    if result.replicates is not None:
        tables["decompose_replicates"] = result.replicates.assign(**tag)
    wanted = set(QUANTITIES.values())
    return {e.claim: e.verdict for e in claims.evaluate(tables) if e.claim in wanted and e.architecture == name}


def _chi_square_quantile(p: float, k: int) -> float:
    """The ``p`` quantile of chi-square with ``k`` degrees of freedom: bisection on its CDF
    (the regularised lower incomplete gamma function), exact to 1e-12 relative for any ``k >= 1``."""
    if not 0 < p < 1 or k < 1:
        raise ValueError(f"chi-square quantile needs 0 < p < 1 and k >= 1, got p={p}, k={k}")
    def cdf(x: float) -> float:
        return float(torch.special.gammainc(torch.tensor(k / 2, dtype=torch.float64),
                                            torch.tensor(x / 2, dtype=torch.float64)))

    lo, hi = 0.0, float(k) + 10.0 * math.sqrt(2.0 * k) + 50.0
    while cdf(hi) < p:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return (lo + hi) / 2


@dataclass(repr=False)
class PromptSetSpread(SavedResult):
    """Result of :func:`between_sets` / :func:`across_prompt_sets` (module docstring).

    ``sets``: one row per (set, quantity): ``set`` (1..K), ``claim``, ``quantity``, ``value``
    with its bootstrap interval ``lo``/``hi`` at ``level``, ``n_sequences``, and the claim's
    ``verdict`` on that set. ``spread``: one row per quantity with ``n_sets``, ``mean_over_sets``,
    ``between_sd``, ``bootstrap_sd``, ``sd_ratio`` (``between_sd / bootstrap_sd``) and its 95%
    interval ``sd_ratio_lo``/``_hi``, ``min_over_sets``, ``max_over_sets`` and ``verdicts`` (e.g. ``"holds 4/4"``).
    ``provenance``: how the sets were drawn and how each interval was computed."""

    KEYWORD = "prompt_sets"
    TABLES = (
        Table(
            "prompt_sets",
            "sets",
            "PromptSetSpread.sets (opt-in, --prompt-sets K): C1's and C2's numbers on each prompt set",
        ),
        Table(
            "prompt_sets_summary",
            "spread",
            "PromptSetSpread.spread (opt-in): the spread between prompt sets beside the bootstrap's",
        ),
    )

    sets: pd.DataFrame
    spread: pd.DataFrame
    provenance: dict[str, Any] = field(default_factory=dict)

    WHAT = "the spread between disjoint prompt sets beside the bootstrap's"
    INTERVALS = "95% chi-square interval, K - 1 degrees of freedom"

    def headline(self) -> list[Headline]:
        """Per quantity, between-set SD / bootstrap SD with its interval (1 = they agree)."""
        return headlines_from_rows(self.spread, "quantity", [
            ("sd_ratio", "SD ratio", "between-set SD / bootstrap SD")])


def between_sets(decompositions: Sequence[Decomposition], *, name: str = "model") -> PromptSetSpread:
    """The claims' numbers on each of the decompositions of disjoint prompt sets, and the
    spread between them beside the bootstrap's (module docstring). ``name`` labels the
    architecture in the claims' evaluation."""
    if len(decompositions) < 2:
        raise BadInputError(f"the spread between prompt sets needs at least 2 sets, got {len(decompositions)}")
    rows = []
    for k, result in enumerate(decompositions, start=1):
        estimates, verdicts = _set_estimates(result), _verdicts(result, name)
        for quantity, claim in QUANTITIES.items():
            e = estimates[quantity]
            rows.append({"set": k, "claim": claim, "quantity": quantity, "value": e.value, "lo": e.lo, "hi": e.hi,
                         "level": e.level, "n_sequences": e.n, "verdict": verdicts.get(claim, claims.NOT_MEASURED)})
    sets = pd.DataFrame(rows, columns=SET_COLUMNS)
    summary = []
    for quantity, claim in QUANTITIES.items():
        part = sets[sets["quantity"] == quantity]
        K = len(part)
        level = float(part["level"].iloc[0])
        z = NormalDist().inv_cdf((1 + level) / 2)
        between = float(part["value"].std(ddof=1))
        bootstrap_sd = float(((part["hi"] - part["lo"]) / (2 * z)).mean())
        ratio = between / bootstrap_sd if bootstrap_sd > 0 else math.nan
        # (K - 1) s² / σ² ~ chi-square(K - 1): the 95% interval of s / σ, scaled by the ratio's σ
        ratio_lo = ratio * math.sqrt((K - 1) / _chi_square_quantile(0.975, K - 1))
        ratio_hi = ratio * math.sqrt((K - 1) / _chi_square_quantile(0.025, K - 1))
        counts = part["verdict"].value_counts()
        summary.append({"claim": claim, "quantity": quantity, "n_sets": K,
                        "mean_over_sets": float(part["value"].mean()),
                        "between_sd": between, "bootstrap_sd": bootstrap_sd, "sd_ratio": ratio,
                        "sd_ratio_lo": ratio_lo, "sd_ratio_hi": ratio_hi, "min_over_sets": float(part["value"].min()),
                        "max_over_sets": float(part["value"].max()),
                        "verdicts": ", ".join(f"{v} {c}/{K}" for v, c in counts.items())})
    intervals = (decompositions[0].provenance.get("options") or {}).get("intervals") or {}
    prov = {"sets": [d.provenance.get("data") for d in decompositions],
            "intervals": {**{k: v for k, v in intervals.items() if k in ("method", "level", "n_resamples", "seed")},
                          "per_set": "each set's own bootstrap over its sequences (claims' numbers, mean over "
                                     "layers and heads, all queries)",
                          "between_sets": "sample standard deviation of the K estimates; sd_ratio interval: "
                                          "chi-square(K - 1) quantiles (exact)"}}
    return PromptSetSpread(sets=sets, spread=pd.DataFrame(summary, columns=SUMMARY_COLUMNS), provenance=prov)


@public
def across_prompt_sets(
    loaded: LoadedModel,
    K: int = 4,
    *,
    T: int = 128,
    N: int = 16,
    source: str = "natural",
    bos: str = DEFAULT_BOS,
    seed: int = 0,
    text: str | None = None,
    corpus: str | None = None,
    batch_size: int = BATCH_SIZE,
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
) -> PromptSetSpread:
    """Decompose ``K`` disjoint prompt sets of ``N`` sequences (:func:`disjoint_prompt_sets`)
    and compare the claims' numbers between them (:func:`between_sets`). Costs ``K``
    decomposition passes (``progress``: one bar, "prompt sets", counting their sequences)."""
    prompt_sets = disjoint_prompt_sets(loaded, K, T=T, N=N, source=source, bos=bos, seed=seed, text=text,
                                       corpus=corpus)
    with progress_bar("prompt sets", total=sum(len(p.tokens) for p in prompt_sets), enabled=progress):
        decompositions = [decompose.body(loaded, prompts, batch_size=batch_size, bootstrap=bootstrap)
                          for prompts in prompt_sets]
    result = between_sets(decompositions, name=loaded.spec.name)
    result.provenance = provenance.collect(model=loaded.spec, data=[p.spec.to_dict() for p in prompt_sets],
                                           seed=seed, K=K, T=T, N=N, source=source, bos=bos,
                                           intervals=result.provenance["intervals"])
    return result
