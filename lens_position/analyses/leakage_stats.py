"""The statistics of positional leakage (ΔR²), on score matrices: no model, no hooks.

Positional leakage (Ruscio, Nanni and Silvestri, "Once upon a token") asks how much of a head's
unscaled post-RoPE score ``y[i, j] = q_rot[i] . k_rot[j]`` over the causal pairs ``j <= i`` a
linear model in the absolute positions explains beyond one in the relative position alone:

    ΔR² = R²(rel + src + tgt) - R²(rel),   rel = i - j, src = i, tgt = j,

each R² held out: fitted by least squares on a random 70% of the pairs, scored on the other 30%,
both with an intercept and with every feature centred on its own split. Because ``rel = src - tgt``
the full design spans only ``{1, rel, src}``: ΔR² is what a **linear trend in the query position**
adds to a linear trend in the offset. Within one query row such a trend is a constant, which the
softmax removes, so a head whose only absolute signal is ``c * i`` has ΔR² > 0 and exactly the
attention of a head without it.

The significance test compares each head's ΔR² on a text with its ΔR² on the same text's tokens
circularly shifted (same positions, other order): per head, the gap of the means over sequences,
a bootstrap interval of the mean of the paired differences and a one-sided sign-flip p-value
("real > null"), then one multiple-comparison step over all heads.

Everything here follows the authors' notebook (``once_upon_a_token.ipynb``) step by step, in the
same order of random draws, so that a run seeded like theirs gives their numbers
(:mod:`lens_position.analyses.leakage`; the test-only reference in ``tests/reference``). The
multiple-comparison step they call Benjamini-Hochberg is ported as written
(:func:`authors_qvalues`) beside the textbook one
(:func:`lens_position.core.intervals.benjamini_hochberg`): it divides the sorted p-values by the
heads' ranks taken in head order, not by their own ranks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from jaxtyping import Float

#: the share of the causal pairs held out to score the fits (the authors' ``test_frac``)
TEST_FRACTION = 0.3
#: added to the total sum of squares (the authors' guard against a constant target)
SS_EPSILON = 1e-12


def causal_pairs(T: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Query and key positions ``(I, J)`` of every causal pair ``j <= i < T``, in ``torch.tril_indices`` order."""
    pairs = torch.tril_indices(row=T, col=T, offset=0)
    return pairs[0], pairs[1]


def split_pairs(n_pairs: int, rng: np.random.Generator, test_fraction: float = TEST_FRACTION
                ) -> tuple[np.ndarray, np.ndarray]:
    """A random split of ``n_pairs`` pair indices into (train, test): one shuffle of the indices
    by ``rng``, the first ``round((1 - test_fraction) n_pairs)`` for training (the authors' draw)."""
    order = np.arange(n_pairs)
    rng.shuffle(order)
    cut = int(round((1.0 - test_fraction) * n_pairs))
    return order[:cut], order[cut:]


def _designs(queries: torch.Tensor, keys: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The relative-only design ``[rel, 1]`` and the full design ``[rel, src, tgt, 1]`` of some
    pairs, every feature centred on these pairs."""
    rel = (queries - keys).to(torch.float64).unsqueeze(1).numpy()
    src = queries.to(torch.float64).unsqueeze(1).numpy()
    tgt = keys.to(torch.float64).unsqueeze(1).numpy()
    ones = np.ones_like(rel)
    rel, src, tgt = rel - rel.mean(0, keepdims=True), src - src.mean(0, keepdims=True), tgt - tgt.mean(0,
                                                                                                     keepdims=True)
    return np.concatenate([rel, ones], axis=1), np.concatenate([rel, src, tgt, ones], axis=1)


def held_out_r2(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, y_test: np.ndarray) -> float:
    """R² on the test pairs of a least-squares fit on the training pairs (minimum-norm solution, so
    the collinear full design is fitted as well as any): ``1 - SS_res / (SS_tot + 1e-12)``."""
    beta, *_ = np.linalg.lstsq(x_train, y_train, rcond=None)
    prediction = (x_test @ beta).astype(np.float64, copy=False).ravel()
    y = np.asarray(y_test, dtype=np.float64).ravel()
    residual = float(np.sum((y - prediction) ** 2, dtype=np.float64))
    total = float(np.sum((y - float(np.mean(y, dtype=np.float64))) ** 2, dtype=np.float64)) + SS_EPSILON
    return float(1.0 - residual / total)


@dataclass(frozen=True)
class LayerSplit:
    """One layer's split of the causal pairs of a length-``T`` sequence and its two designs per side."""

    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]
    relative: tuple[np.ndarray, np.ndarray]  # (train, test) designs [rel, 1]
    full: tuple[np.ndarray, np.ndarray]  # (train, test) designs [rel, src, tgt, 1]

    @classmethod
    def draw(cls, T: int, rng: np.random.Generator, test_fraction: float = TEST_FRACTION) -> LayerSplit:
        queries, keys = causal_pairs(T)
        train, test = split_pairs(len(queries), rng, test_fraction)
        train_pairs, test_pairs = (queries[train], keys[train]), (queries[test], keys[test])
        rel_train, full_train = _designs(*train_pairs)
        rel_test, full_test = _designs(*test_pairs)
        return cls(train_pairs, test_pairs, (rel_train, rel_test), (full_train, full_test))


def head_scores(q_rot: Float[torch.Tensor, "pos d_head"], k_rot: Float[torch.Tensor, "pos d_head"]
                ) -> Float[torch.Tensor, "pos pos"]:
    """The unscaled score matrix ``q_rot k_rotᵀ`` of one head, in float32 (as the authors compute it)."""
    return q_rot.to(torch.float32) @ k_rot.to(torch.float32).T


def head_leakage(scores: Float[torch.Tensor, "pos pos"], split: LayerSplit) -> tuple[float, float, float]:
    """``(R²_rel, R²_full, ΔR²)`` of one head's score matrix on one split (held-out R²)."""
    y_train = np.nan_to_num(scores[split.train].to(torch.float64).numpy().reshape(-1, 1))
    y_test = np.nan_to_num(scores[split.test].to(torch.float64).numpy().reshape(-1, 1))
    r2_rel = held_out_r2(split.relative[0], y_train, split.relative[1], y_test)
    r2_full = held_out_r2(split.full[0], y_train, split.full[1], y_test)
    return r2_rel, r2_full, r2_full - r2_rel


def layer_leakage(q_rot: Float[torch.Tensor, "head pos d_head"], k_rot: Float[torch.Tensor, "head pos d_head"],
                  rng: np.random.Generator, test_fraction: float = TEST_FRACTION) -> Float[np.ndarray, "head 3"]:
    """Every head's ``(R²_rel, R²_full, ΔR²)`` in one layer of one sequence: one split drawn for the
    layer (one shuffle of ``rng``), shared by its heads; grouped keys already repeated per query head."""
    split = LayerSplit.draw(q_rot.shape[1], rng, test_fraction)
    return np.array([head_leakage(head_scores(q_rot[h], k_rot[h]), split) for h in range(q_rot.shape[0])])


def scores_leakage(scores: Float[torch.Tensor, "head pos pos"], rng: np.random.Generator,
                   test_fraction: float = TEST_FRACTION) -> Float[np.ndarray, "head 3"]:
    """:func:`layer_leakage` of score matrices given directly (a hand-set ground truth)."""
    split = LayerSplit.draw(scores.shape[-1], rng, test_fraction)
    return np.array([head_leakage(scores[h], split) for h in range(scores.shape[0])])


def circular_shift(tokens: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """The null input: ``tokens`` (one sequence ``[T]``) rotated left by ``k`` drawn uniformly in
    ``1 .. T-1`` (the positions stay, the order of the text changes)."""
    if tokens.shape[0] <= 1:
        return tokens
    k = int(rng.integers(1, tokens.shape[0]))
    return torch.cat([tokens[k:], tokens[:k]])


@dataclass(frozen=True)
class GapTest:
    """Per head: ``gap`` = mean ΔR² on the texts minus on their shifted nulls, the bootstrap
    interval of the paired mean (``lo``, ``hi``) and the one-sided sign-flip p-value ``p``."""

    gap: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    p: np.ndarray


def authors_gap_test(real: Float[np.ndarray, "sample head"], null: Float[np.ndarray, "sample head"],
                     rng: np.random.Generator, n_boot: int = 2000, n_perm: int = 5000) -> GapTest:
    """The authors' test, head by head in order, drawing from ``rng`` as they do: ``n_boot``
    resamples of the paired differences (2.5% and 97.5% quantiles of their means) and ``n_perm``
    random sign vectors, ``p = (1 + #{flipped mean >= gap}) / (1 + n_perm)``."""
    n_heads = real.shape[1]
    gap, lo, hi, p = (np.empty(n_heads) for _ in range(4))
    for h in range(n_heads):
        gap[h] = float(np.mean(real[:, h]) - np.mean(null[:, h]))
        n = min(len(real), len(null))
        diffs = real[:n, h] - null[:n, h]
        boots: np.ndarray = np.empty(n_boot, dtype=np.float64)
        for b in range(n_boot):
            boots[b] = float(np.mean(diffs[rng.integers(0, n, size=n)]))
        lo[h], hi[h] = float(np.quantile(boots, 0.025)), float(np.quantile(boots, 0.975))
        flips = rng.choice([-1.0, 1.0], size=(n_perm, n))
        p[h] = float((np.sum((flips * diffs).mean(axis=1) >= gap[h]) + 1) / (n_perm + 1))
    return GapTest(gap, lo, hi, p)


def authors_qvalues(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """The authors' multiple-comparison step, as written: the p-values sorted ascending are
    multiplied by ``m`` and divided by ``ranks``, where ``ranks[h]`` is the rank of head ``h``'s
    p-value but is indexed by head, not by sorted position, then made monotone from the right. It is
    not Benjamini-Hochberg (whose ``j``-th sorted p-value is divided by ``j``): with p-values in
    head order the ``j``-th smallest is divided by the rank of whichever head sits at index ``j``,
    so small q-values appear on pure noise (the concepts page, tests/unit/analyses/test_leakage.py)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    order = np.argsort(p)
    ranks = np.empty(m, dtype=int)
    ranks[order] = np.arange(1, m + 1)
    q_sorted = np.minimum.accumulate((p[order] * m / ranks)[::-1])[::-1]
    q = np.empty_like(p)
    q[order] = q_sorted
    return q


#: up to this many units the sign-flip test enumerates all 2^n sign vectors (65,536 at 16, the published n):
#: with 5000 random vectors the smallest p-value is 1/5001, above what Benjamini-Hochberg needs to keep one
#: head of 512 alone (0.05/512)
EXACT_UNITS = 16
_CHUNK = 4096


def one_sided_sign_flip(effects: Float[np.ndarray, "unit head"], n_perm: int, seed: int) -> np.ndarray:
    """One-sided sign-flip p-value of "the mean effect is above zero" per head: the share of sign
    vectors whose mean is at least the observed one, all ``2^n`` enumerated for ``n <= 16`` units
    (:data:`EXACT_UNITS`), else ``n_perm`` draws counted with the observed vector
    (``(1 + hits) / (1 + n_perm)``)."""
    values = np.asarray(effects, dtype=float)
    n = len(values)
    observed = values.mean(0)
    threshold = observed - 1e-12 * (1 + np.abs(observed))
    if n <= EXACT_UNITS:
        hits = np.zeros(values.shape[1:])
        for start in range(0, 2 ** n, _CHUNK):
            codes = np.arange(start, min(start + _CHUNK, 2 ** n))
            signs = 1.0 - 2.0 * (codes[:, None] >> np.arange(n)[None, :] & 1)
            hits += ((signs @ values / n) >= threshold).sum(0)
        return hits / 2 ** n
    signs = np.random.default_rng([seed, n]).choice((-1.0, 1.0), size=(n_perm, n))
    return (1 + ((signs @ values / n) >= threshold).sum(0)) / (1 + n_perm)


def jaccard(a: set, b: set) -> float:
    """``|a ∩ b| / |a ∪ b|``, 1 when both are empty (two runs agreeing that nothing is significant)."""
    union = a | b
    return 1.0 if not union else len(a & b) / len(union)


#: the authors' bands: ten equal fractions of the rotated pairs
AUTHORS_BANDS = 10


def authors_band_dims(n_pairs: int, n_bands: int = AUTHORS_BANDS) -> list[tuple[int, ...]]:
    """The dimensions of each of the authors' frequency bands: pairs in frequency order (fastest
    first) cut into ``n_bands`` runs of ``round(n_pairs / n_bands)`` pairs (the last takes what is
    left; runs past the end are empty), pair ``p`` taken as dimensions ``(2p, 2p + 1)``. Hugging Face
    Llama and TransformerLens rotate halves instead (pair ``p`` is ``(p, p + d/2)``): these bands then
    mix frequencies (:func:`lens_position.analyses.rotary_bands.frequency_bands` has the model's own)."""
    fractions = [1.0 / n_bands] * n_bands
    total = sum(fractions)
    start, runs = 0, []
    for fraction in fractions:
        end = min(start + int(round(fraction / total * n_pairs)), n_pairs)
        runs.append(list(range(start, max(start, end))))
        start = max(start, end)
    runs[-1] += list(range(start, n_pairs))
    return [tuple(d for p in run for d in (2 * p, 2 * p + 1)) for run in runs]


def band_energy_shares(q_rot: Float[torch.Tensor, "pos d_head"], k_rot: Float[torch.Tensor, "pos d_head"],
                       bands: Sequence[Sequence[int]], causal: bool) -> np.ndarray:
    """Each band's share of the score energy of one head: ``e_b = ||q_b k_bᵀ||_F`` over all pairs
    (``causal=False``, as the authors compute it) or over the causal pairs only, divided by ``sum_b e_b``
    (zeros when every band is zero). A band with no dimensions has energy 0."""
    energies = []
    mask = torch.ones(q_rot.shape[0], q_rot.shape[0], dtype=torch.bool)
    if causal:
        mask = torch.tril(mask)
    for dims in bands:
        if not dims:
            energies.append(0.0)
            continue
        index = list(dims)
        part = (q_rot[:, index].to(torch.float32) @ k_rot[:, index].to(torch.float32).T).masked_fill(~mask, 0.0)
        energies.append(float(torch.nan_to_num(torch.norm(part, p="fro"))))
    values = np.maximum(np.array(energies, dtype=np.float64), 0.0)
    total = values.sum()
    return values / total if total > 0 else np.zeros_like(values)
