"""How much of each attention head's pattern depends on absolute position, and where from.

The measurement (see the docs' concepts page), for one layer and one head:

1. Read the scores ``s[i, j]`` at ``blocks.{l}.attn.hook_attn_scores`` (after RoPE, the
   1/sqrt(d_head) scale and any soft-cap; ``-inf`` outside the key set ``K(i)``, which is
   ``{0..i}`` for a causal layer and ``{i-W+1..i}`` for a sliding window of ``W`` keys).
2. Self-reference them: ``t[i, j] = s[i, j] - s[i, i]``. A per-query constant never
   changes a softmax and the reference sits at offset 0, so offset-only scores give
   offset-only ``t``.
3. The log-normaliser ``z[i] = logsumexp_{j in K(i)} t[i, j]``, and the exact identity
   ``log A[i, j] = t[i, j] - z[i]``.
4. Fit ``y`` by least squares on relative features (one-hot offset ``d = i - j``, every
   offset its own bin, plus an intercept) and on relative plus absolute features (one-hot
   bins of the query position ``i`` and key position ``j``: exact below ``exact_until``,
   log-spaced beyond). The *absolute part* ``abs(y)`` is the full fit minus the relative
   fit. Least squares is linear in its target, so ``abs(log A) = abs(t) - abs(z)``.
5. With ``V = Var(log A)`` over the analysed (sequence, query, key) triples:
   total ``T = Var(abs log A)/V``, residual ``R = Var(abs t)/V``, mask
   ``M = Var(abs z)/V``, interaction ``C = -2 Cov(abs t, abs z)/V``; ``T = R + M + C``.

Why offsets get one bin each: the relative model must be able to express *any* function
of the offset, otherwise within-bin offset variation would be credited to absolute
position (and offset-only scores would not give ``R = 0``).

Streaming. Every sequence has the same positions, so the design matrix ``X`` (analysed
pairs x features) is the same for every sequence. Least squares over all (n, i, j)
triples then needs only ``X'X`` (counted once from positions) and ``X'y`` (per-feature
sums of ``y`` over the batch), and ``V`` needs ``sum y`` and ``sum y^2``. A hook on
``hook_attn_scores`` reduces each batch to these float64 statistics and drops the
``T x T`` tensors, so memory is ``O(layers x heads x features)`` whatever the number of
sequences; the forward pass stops after the last analysed layer (``stop_at_layer``).

Held-out values (split-half cross-fit). Sequences are split by parity of their index
(halves A and B). The absolute parts ``abs_A``, ``abs_B`` are fitted on each half. Because
``abs_A`` lies in the span of the absolute features orthogonal to the relative ones, the
share of half B's ``log A`` variance that the A-fitted absolute part explains is
``Cov(abs_A(log A), log A_B) / V_B = Cov(abs_A(log A), abs_B(log A)) / V_B``. Expanding
``abs = abs(t) - abs(z)`` gives held-out ``R, M, C`` with ``T = R + M + C`` exactly; we
average the two directions (A -> B and B -> A). In-sample values include the part of
sequence-specific noise that happens to align with the absolute bins (it shrinks as
``features / (N x pairs)``); the held-out values do not, and they can be slightly negative
when there is no absolute signal at all. With ``N = 1`` they are NaN.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Sequence

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from lens_position.models.backends import ModelLike

from lens_position.ground import provenance
from lens_position.core.checks import check_count, check_layers, check_query_range, tokens_sha256
from lens_position.ground.errors import BadInputError, NonFiniteError, UnsupportedArchitectureError
from lens_position.core.inputs import Prompts, checked_prompts
from lens_position.core.intervals import (BIAS_CORRECTED_QUANTITIES, MIN_INTERVAL_UNITS, Bootstrap,
                                         bootstrap_interval, interval_method, resample_counts, small_sample_widening)
from lens_position.models.spec import LoadedModel, as_loaded
from lens_position.core.summaries import Headline, layer_mean
from lens_position.core.results import SavedResult
from lens_position.core.stream import BATCH_SIZE, check_finite_activation, stream
from lens_position.analyses.cached_scores import CachedScores

if TYPE_CHECKING:
    from lens_position.analyses.patching import Patch

KeySet = Literal["all", "no-bos"]
REFERENCE_FREE_DEFINITION = (
    "mask-only counterfactual: g(d) fitted to t with one constant per query (t ~ g(i - j) + c(i)), "
    "lam = g - logsumexp_K(i) g; M' = Var(abs lam)/V, R' = Var(abs log A - abs lam)/V, "
    "C' = 2 Cov(abs lam, abs log A - abs lam)/V"
)
HELDOUT_DEFINITION = (
    "split-half cross-fit: absolute part fitted on even-indexed sequences, evaluated as "
    "Cov(abs_even, abs_odd)/V_odd, averaged with the reverse direction"
)


# ---------------------------------------------------------------------------------------
# Bins and the design matrix
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PositionBins:
    """Bins of query and key positions: one per position below ``exact_until``, then
    ``per_octave`` log-spaced bins per doubling. Offsets always get one bin each."""

    exact_until: int = 16
    per_octave: int = 4

    def __post_init__(self) -> None:
        # a zero or negative value would make edges() loop forever or divide by zero
        object.__setattr__(self, "exact_until", check_count("PositionBins exact_until", self.exact_until))
        object.__setattr__(self, "per_octave", check_count("PositionBins per_octave", self.per_octave))

    def edges(self, length: int) -> np.ndarray:
        """Left edges of the position bins covering ``0..length-1``, shape ``[n_bins]``."""
        exact = list(range(min(self.exact_until, length)))
        edges = set(exact)
        if length > self.exact_until:
            k = 0
            while True:
                edge = int(round(self.exact_until * 2 ** (k / self.per_octave)))
                if edge >= length:
                    break
                edges.add(edge)
                k += 1
        return np.array(sorted(edges), dtype=np.int64)

    def assign(self, positions: np.ndarray, length: int) -> np.ndarray:
        """Bin index of each position."""
        return np.searchsorted(self.edges(length), positions, side="right") - 1

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PairDesign:
    """The analysed (query, key) pairs of one sequence and their one-hot features.

    Feature columns: ``[offset 0..T-1 | query bins | key bins | intercept]``. The relative
    model uses the offset block and the intercept; the full model uses everything.
    """

    length: int
    window: int | None
    query_start: int
    query_stop: int
    keys: KeySet
    query: Int[torch.Tensor, "pair"]
    key: Int[torch.Tensor, "pair"]
    columns: Int[torch.Tensor, "pair 4"]  # feature index of each pair in each one-hot group
    n_features: int
    relative: Int[torch.Tensor, "rel_feature"]
    gram: Float[torch.Tensor, "feature feature"]  # X'X for one sequence, float64
    key_set: torch.Tensor  # bool [query_stop-query_start, length]: j in K(i)
    analysed: torch.Tensor  # bool [query_stop-query_start, length]: (i, j) analysed
    row_features: Float[torch.Tensor, "query feature"]  # per query row: sum of X over its pairs
    flat: Int[torch.Tensor, "pair"]  # (i - query_start) * length + j
    query_indicator: Float[torch.Tensor, "query feature"]  # row -> its query bin and the intercept
    key_indicator: Float[torch.Tensor, "key feature"]  # key -> its key bin
    analysed_per_query: Float[torch.Tensor, "query"]

    @property
    def n_pairs(self) -> int:
        return int(self.query.numel())

    @classmethod
    def build(cls, length: int, window: int | None, query_start: int, query_stop: int,
              keys: KeySet, bins: PositionBins) -> "PairDesign":
        i = torch.arange(query_start, query_stop)[:, None]
        j = torch.arange(length)[None, :]
        key_set = j <= i
        if window is not None:
            key_set = key_set & (j > i - window)
        analysed = key_set & (j > 0) if keys == "no-bos" else key_set
        query, key = (x.reshape(-1) for x in torch.broadcast_tensors(i, j))
        keep = analysed.reshape(-1)
        query, key = query[keep], key[keep]
        n_pos_bins = len(bins.edges(length))
        query_bin = torch.from_numpy(bins.assign(query.numpy(), length))
        key_bin = torch.from_numpy(bins.assign(key.numpy(), length))
        n_features = length + 2 * n_pos_bins + 1
        columns = torch.stack([
            query - key,
            length + query_bin,
            length + n_pos_bins + key_bin,
            torch.full_like(query, n_features - 1),
        ], dim=1)
        gram = torch.zeros(n_features * n_features, dtype=torch.float64)
        for a in range(4):
            for b in range(4):
                gram.index_add_(0, columns[:, a] * n_features + columns[:, b],
                                torch.ones(len(query), dtype=torch.float64))
        gram = gram.reshape(n_features, n_features)
        rows = query - query_start
        row_features = torch.zeros(query_stop - query_start, n_features, dtype=torch.float64)
        for a in range(4):
            row_features.index_put_((rows, columns[:, a]), torch.ones(len(query), dtype=torch.float64),
                                    accumulate=True)
        relative = torch.cat([torch.arange(length), torch.tensor([n_features - 1])])
        all_rows = torch.arange(query_stop - query_start)
        query_indicator = torch.zeros(len(all_rows), n_features, dtype=torch.float64)
        query_indicator[all_rows, length + torch.from_numpy(bins.assign(all_rows.numpy() + query_start, length))] = 1
        query_indicator[:, -1] = 1
        key_indicator = torch.zeros(length, n_features, dtype=torch.float64)
        key_indicator[torch.arange(length),
                      length + n_pos_bins + torch.from_numpy(bins.assign(np.arange(length), length))] = 1
        return cls(length=length, window=window, query_start=query_start, query_stop=query_stop,
                   keys=keys, query=query, key=key, columns=columns, n_features=n_features,
                   relative=relative, gram=gram, key_set=key_set, analysed=analysed,
                   row_features=row_features, flat=rows * length + key,
                   query_indicator=query_indicator, key_indicator=key_indicator,
                   analysed_per_query=analysed.sum(-1).to(torch.float64))

    def to(self, device: torch.device | str) -> "PairDesign":
        """This design with its tensors on ``device`` (the scores' device)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})

    def dense(self) -> Float[torch.Tensor, "pair feature"]:
        """The explicit design matrix ``X`` of one sequence (float64; for reference code)."""
        x = torch.zeros(self.n_pairs, self.n_features, dtype=torch.float64)
        for a in range(4):
            x[torch.arange(self.n_pairs), self.columns[:, a]] = 1.0
        return x


# ---------------------------------------------------------------------------------------
# Streaming statistics
# ---------------------------------------------------------------------------------------


@dataclass
class HeadStatistics:
    """Sufficient statistics of one layer, per group of sequences (sequence ``n`` belongs to
    group ``n % n_groups``; ``n_groups`` is even, so group ``g`` lies in half ``g % 2``):
    ``xty_t``/``xty_z`` are ``X'y`` summed over the group's sequences, ``row_t`` the sums of
    ``t`` over each query's analysed keys (the query features of the reference-free fit),
    ``sum_y``/``sum_y2`` the sums of ``log A`` and its square over the analysed triples,
    ``n_sequences`` the group sizes. float64.

    Keeping groups instead of halves costs nothing in forward passes: a bootstrap replicate
    re-weights the groups and refits (:mod:`lens_position.core.intervals`)."""

    xty_t: Float[torch.Tensor, "group head feature"]
    xty_z: Float[torch.Tensor, "group head feature"]
    row_t: Float[torch.Tensor, "group head query"]
    sum_y: Float[torch.Tensor, "group head"]
    sum_y2: Float[torch.Tensor, "group head"]
    n_sequences: Float[torch.Tensor, "group"]

    def to(self, device: torch.device | str) -> "HeadStatistics":
        """These statistics on ``device`` (the group sizes stay on the CPU)."""
        return HeadStatistics(self.xty_t.to(device), self.xty_z.to(device), self.row_t.to(device),
                              self.sum_y.to(device), self.sum_y2.to(device), self.n_sequences)

    @classmethod
    def zeros(cls, n_heads: int, n_features: int, n_queries: int, n_groups: int = 2) -> "HeadStatistics":
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(z(n_groups, n_heads, n_features), z(n_groups, n_heads, n_features),
                   z(n_groups, n_heads, n_queries), z(n_groups, n_heads), z(n_groups, n_heads), z(n_groups))

    @property
    def n_groups(self) -> int:
        return int(self.n_sequences.shape[0])

    @classmethod
    def side_by_side(cls, layers: Sequence["HeadStatistics"]) -> "HeadStatistics":
        """Several layers' statistics (same sequences, same features) as one layer whose heads are
        theirs one after the other, so that one refit serves them all."""
        return cls(*(torch.cat([getattr(stats, name) for stats in layers], dim=1)
                     for name in ("xty_t", "xty_z", "row_t", "sum_y", "sum_y2")), layers[0].n_sequences)

    @property
    def halves(self) -> Float[torch.Tensor, "group"]:
        """Half of every group (0: even-indexed sequences, 1: odd)."""
        return torch.arange(self.n_groups) % 2


def self_referenced_scores(
    scores: Float[torch.Tensor, "batch head query key"], query_start: int = 0
) -> tuple[Float[torch.Tensor, "batch head query key"], Float[torch.Tensor, "batch head query"]]:
    """``t = s - s[i, i]`` and ``z = logsumexp_j t`` in float64, for score rows
    ``query_start..`` (``scores`` already sliced to those rows, keys unsliced)."""
    s = scores.to(torch.float64)
    diagonal = s.diagonal(offset=query_start, dim1=-2, dim2=-1)
    t = s - diagonal[..., None]
    return t, torch.logsumexp(t, dim=-1)


_CHUNK_BYTES = 8 * 2**20  # heads are reduced in chunks of about this many float64 bytes (cache-sized)
# Query rows reduced together on the CPU. A block needs only the keys its queries see (up to its last
# query, from its first query's window start), so blocks skip most of the masked scores (at T=256, 8
# blocks of 32 rows touch 56% of a causal layer's T x T scores) and stay small enough for the cache:
# SmolLM2's 9 heads at T=256, batch 8, 45 -> 22 ms per layer. On an accelerator, one block.
_BLOCK_ROWS = 32


def _runs(flags: Sequence[bool]) -> list[tuple[int, int]]:
    """``(start, stop)`` of every run of consecutive True values in ``flags``."""
    runs: list[tuple[int, int]] = []
    for k, flag in enumerate(flags):
        if flag and runs and runs[-1][1] == k:
            runs[-1] = (runs[-1][0], k + 1)
        elif flag:
            runs.append((k, k + 1))
    return runs


class _Workspace:
    """Float64 buffers reused by every batch's reduction. Allocating them anew for each block of scores
    cost more than the arithmetic on them (fresh pages from the system, each time)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def buffer(self, name: str, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        """An uninitialised float64 tensor of ``shape`` on ``device``, the same memory on every call."""
        size = int(np.prod(shape))
        kept = self._buffers.get(name)
        if kept is None or kept.numel() < size or kept.device != device:
            kept = self._buffers[name] = torch.empty(size, dtype=torch.float64, device=device)
        return kept[:size].view(*shape)


def _reduce(scores: Float[torch.Tensor, "batch head query key"], design: PairDesign,
            group_of_row: Int[torch.Tensor, "batch"], stats: HeadStatistics,
            workspace: _Workspace | None = None) -> None:
    """Add one batch's statistics to ``stats``; batch row ``b`` belongs to group
    ``group_of_row[b]``.

    Each block of scores is copied once into a float64 buffer as ``t = s - s[i, i]``; ``z`` is
    ``log sum exp t`` over the key set (about the diagonal, where ``t = 0``, so the sum is at least
    1 and no row maximum is needed), ``log A = t - z``. Rows of the same group are summed first
    (every statistic is linear in ``t`` and ``z``), so the cost per batch grows with the number of
    distinct groups in it, not with the number of groups kept. Queries are processed in blocks of
    rows, each over the keys its rows can see (the others are masked and add nothing), and heads a
    few at a time so that each float64 buffer stays in cache; the per-offset sums are read along
    the block's diagonals (a strided view) instead of scattered cell by cell.
    """
    s = scores[:, :, design.query_start:design.query_stop]
    workspace = workspace if workspace is not None else _Workspace()
    n_batch, n_heads, n_rows, length = s.shape
    rows_per_block = _BLOCK_ROWS if s.device.type == "cpu" else n_rows
    window = design.window if design.window is not None else length
    groups, inverse = torch.unique(group_of_row.cpu(), return_inverse=True)
    one_per_row = len(groups) == n_batch
    in_order = one_per_row and torch.equal(inverse, torch.arange(n_batch))  # consecutive rows: no copy needed
    inverse = inverse.to(s.device)
    # the groups' rows of the statistics: a slice when they are consecutive (an in-place add, no gather and scatter)
    to = slice(int(groups[0]), int(groups[-1]) + 1) if int(groups[-1] - groups[0]) + 1 == len(groups) else groups

    def by_group(x: torch.Tensor) -> torch.Tensor:
        """Sum the rows of ``x`` that share a group: ``[distinct groups, ...]``."""
        if in_order:
            return x
        if one_per_row:
            return x[torch.argsort(inverse)]
        return torch.zeros((len(groups), *x.shape[1:]), dtype=x.dtype, device=x.device).index_add_(0, inverse, x)

    for first_row in range(0, n_rows, rows_per_block):
        rows = slice(first_row, min(first_row + rows_per_block, n_rows))
        first_query = design.query_start + first_row
        keys = slice(max(0, first_query - window + 1), design.query_start + rows.stop)  # K(i) of its queries
        count = design.analysed_per_query[rows]
        hidden = ~design.key_set[rows, keys]  # the mask's cells
        unanalysed = ~design.analysed[rows, keys] & ~hidden  # shown but left out (key 0 with keys="no-bos")
        row_features = design.row_features[rows]
        chunk = max(1, _CHUNK_BYTES // (n_batch * (rows.stop - rows.start) * (keys.stop - keys.start) * 8))
        # the key columns with a hidden cell, and there 1.0 where a key is shown (multiplying is 4x faster than
        # masked_fill_, and exp(t) is finite there)
        hidden_runs = [(a, b, hidden[:, a:b], (~hidden[:, a:b]).to(torch.float64))
                       for a, b in _runs(hidden.any(0).tolist())]
        unanalysed_runs = [(a, b, unanalysed[:, a:b]) for a, b in _runs(unanalysed.any(0).tolist())]
        # per-offset sums: an offset up to the block's first query's (top_offset) is seen by every row of the
        # block, one cell per row along a diagonal; larger offsets lie in the strict lower triangle of the
        # first columns
        n_block, n_keys = rows.stop - rows.start, keys.stop - keys.start
        top_offset = first_query - keys.start
        tri_row, tri_key = torch.tril_indices(n_block, n_block, offset=-1, device=s.device)
        tri_cells, tri_offsets = tri_row * n_keys + tri_key, top_offset + tri_row - tri_key
        for first in range(0, n_heads, chunk):
            heads = slice(first, min(first + chunk, n_heads))
            block = s[:, heads, rows, keys]
            diagonal = block.diagonal(offset=top_offset, dim1=-2, dim2=-1).to(torch.float64)
            # float64, in a buffer of the workspace (the scores untouched)
            t = torch.sub(block, diagonal[..., None], out=workspace.buffer("t", block.shape, s.device))
            # the mask's cells to 0 before exp: exp of -inf or of finfo.min (a mask) takes its slow path, 2.5-6x
            # the time of exp on finite values; exp(t) is then zeroed there, exactly the 0 exp(-inf) gives
            for a, b, cells, _ in hidden_runs:
                t[..., a:b].masked_fill_(cells, 0.0)
            exp = _exp(t, out=workspace.buffer("exp", block.shape, s.device))
            for a, b, _, shown in hidden_runs:
                exp[..., a:b].mul_(shown)
            z = exp.sum(-1).log_()  # about the diagonal
            if not torch.isfinite(z).all():  # exp overflowed (a score more than ~700 above its diagonal)
                z = torch.logsumexp(t.masked_fill(hidden, -torch.inf), dim=-1)
            for a, b, cells in unanalysed_runs:
                t[..., a:b].masked_fill_(cells, 0.0)
            row_t = t.sum(-1)
            row_t2 = torch.einsum("bhqk,bhqk->bhq", t, t)  # a batched matmul: 10x faster than (t*t).sum
            sum_y = (row_t - count * z).sum(-1)  # log A = t - z; [batch, head]
            sum_y2 = (row_t2 - 2 * z * row_t + count * z * z).sum(-1)
            t_sum = by_group(t).contiguous()  # [group, head, rows, keys]
            row_sum = by_group(row_t)
            xty_t = row_sum @ design.query_indicator[rows] + t_sum.sum(-2) @ design.key_indicator[keys]
            size, stride = t_sum.shape, t_sum.stride()
            along = t_sum.as_strided((*size[:2], n_block, top_offset + 1), (*stride[:2], n_keys + 1, 1))
            xty_t[..., :top_offset + 1] += along.sum(-2).flip(-1)
            xty_t[..., :length].index_add_(2, tri_offsets, t_sum.flatten(2)[..., tri_cells])
            # the sums stay where the statistics are (the scores' device; back on the CPU in result())
            stats.xty_t[to, heads] += xty_t.to(stats.xty_t.device)
            stats.xty_z[to, heads] += (by_group(z) @ row_features).to(stats.xty_t.device)
            stats.row_t[to, heads, rows] += row_sum.to(stats.xty_t.device)
            stats.sum_y[to, heads] += by_group(sum_y).to(stats.xty_t.device)
            stats.sum_y2[to, heads] += by_group(sum_y2).to(stats.xty_t.device)
    stats.n_sequences.index_add_(0, groups, torch.bincount(inverse.cpu(), minlength=len(groups)).to(torch.float64))


# ---------------------------------------------------------------------------------------
# From statistics to T, R, M, C
# ---------------------------------------------------------------------------------------


_RANK_TOLERANCE = 1e-10  # singular values below this fraction of the largest are numerical zeros


@dataclass
class _Fitter:
    """Everything that depends on the key set only (one per design), computed once.

    Absolute parts in coordinates. With ``b = X'y`` (per sequence), the absolute part's
    coefficients are ``delta = D b`` with ``D = pinv(X'X) - [pinv(X_rel'X_rel)]`` (the relative
    block subtracted), and every variance or covariance over the analysed pairs is
    ``delta_a' G delta_b / n - mean_a mean_b`` (``G = X'X``). Writing ``G = R'R`` and taking
    the SVD of ``R D`` gives a matrix ``coords`` (``[k, feature]``, ``k`` = rank of the
    absolute subspace, about twice the number of position bins) with
    ``delta_a' G delta_b = (coords b_a) . (coords b_b)``: every component is a dot product of
    ``k``-vectors, which is what makes thousands of bootstrap refits cheap.

    The reference-free split needs, in addition, the *offset-only fit up to a per-query
    constant*: ``t ~ g(d) + c(i)`` (one-hot offsets and one-hot queries). Its coefficients
    are ``[X_off'y, row sums of t] @ pinv_fe``; ``lam = g(i - j) - logsumexp_{K(i)} g`` is
    the log-pattern the mask alone makes of it, and ``X'lam = g @ G[offsets] - lse @
    row_features``, so its coordinates (and mean) are ``g @ linear_lam + lse @ lse_lam``. The
    first term is linear in the statistics, so it is computed once per group of sequences and
    re-weighted like them; only ``lse`` (a cumulative logsumexp of ``g`` over the offsets) is
    computed per replicate. Queries whose key sets span the same offsets (every query past a
    sliding window's width) share one row of ``lse_lam``.
    """

    design: PairDesign

    def __post_init__(self) -> None:
        design = self.design
        gram = design.gram
        rel = design.relative
        pinv_full = torch.linalg.pinv(gram, hermitian=True)
        pinv_rel = torch.linalg.pinv(gram[rel][:, rel], hermitian=True)
        delta = pinv_full.clone()
        delta[rel[:, None], rel] -= pinv_rel
        evals, evecs = torch.linalg.eigh(gram)
        keep = evals > _RANK_TOLERANCE * evals.max()
        root = evals[keep].sqrt()[:, None] * evecs[:, keep].T  # G = root' root
        _, singular, right = torch.linalg.svd(root @ delta, full_matrices=False)
        rank = singular > _RANK_TOLERANCE * singular.max() if singular.numel() and singular.max() > 0 else singular > 0
        self.coords = singular[rank, None] * right[rank]  # [k, feature]
        self.mean = delta @ gram[-1] / design.n_pairs  # mean over pairs of X delta = mean . b
        # reference-free: offset-only fit up to a per-query constant
        n_off, n_query = design.length, design.query_stop - design.query_start
        rows = design.query - design.query_start
        offsets = design.query - design.key
        gram_fe = torch.zeros(n_off + n_query, n_off + n_query, dtype=torch.float64)
        ones = torch.ones(len(rows), dtype=torch.float64)
        for a, b in ((offsets, offsets), (offsets, n_off + rows), (n_off + rows, offsets), (n_off + rows, n_off + rows)):
            gram_fe.view(-1).index_add_(0, a * (n_off + n_query) + b, ones)
        self.offsets_fit = torch.linalg.pinv(gram_fe, hermitian=True)[:, :n_off]  # [off + query, off] -> g
        coords_and_mean = torch.cat([self.coords.T, self.mean[:, None]], dim=1)  # [feature, k + 1]
        self.linear_lam = gram[:n_off] @ coords_and_mean  # [off, k + 1]
        window = design.window if design.window is not None else design.length
        # logsumexp over K(i) of g(i - j): the offsets 0..min(i, W - 1)
        lse_index = torch.arange(design.query_start, design.query_stop).clamp(max=window - 1)
        self.lse_first, self.lse_stop = int(lse_index.min()), int(lse_index.max()) + 1
        self.lse_lam = torch.zeros(self.lse_stop - self.lse_first, coords_and_mean.shape[1], dtype=torch.float64)
        self.lse_lam.index_add_(0, lse_index - self.lse_first, -design.row_features @ coords_and_mean)
        # a constant lse (the same on every query) moves lam by a constant, which has no absolute part: lse_lam's
        # columns sum to zero, exactly so once their round-off (about 1e-11 of the entries) is taken out
        self.lse_lam -= self.lse_lam.mean(0)
        # with key 0 left out, g at the offset of key 0 is not fitted for the last query
        self.reference_free = design.keys == "all"


_T, _Z, _LAM, _RES = range(4)  # the absolute parts, in this order, in a _Variant and its Gram matrices


@dataclass
class _Variant:
    """Weightings of the groups (a half, or all; one row each), as k-coordinates of the four
    absolute parts: ``t``, ``z``, (reference-free) the mask-only counterfactual ``lam`` and the
    residual ``log A - lam`` (indices ``_T, _Z, _LAM, _RES``)."""

    parts: Float[torch.Tensor, "replicate head 4 k"]
    means: Float[torch.Tensor, "replicate head 4"]
    var_log_a: Float[torch.Tensor, "replicate head"]

    def take(self, rows: Int[torch.Tensor, "row"] | slice) -> "_Variant":
        """The weightings ``rows``, in that order (a slice: a view; ``index_select`` copies the strided
        fields about twice as fast as indexing with a tensor)."""
        pick = (lambda x: x[rows]) if isinstance(rows, slice) else (lambda x: x.index_select(0, rows))
        return _Variant(*(pick(getattr(self, f.name)) for f in dataclasses.fields(self)))


_UNDERFLOW = 1e-300  # exp(x - max) below this leaves a float64 sum without its full precision
# Heads refitted together: as many as keep the refits' working tensors (every distinct weighting x heads x
# the values per head) near this many float64 values, small enough for the cache.
_REFIT_BLOCK_VALUES = 2**19


def _numpy_vector_math() -> bool:
    """Whether numpy runs its float64 ``exp`` and ``log`` on AVX-512, its only vectorised float64 path
    (elsewhere torch's are used: numpy's scalar loops have not been measured against them)."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:  # numpy 1.x
        try:
            from numpy.core._multiarray_umath import __cpu_features__
        except ImportError:
            return False
    return bool(__cpu_features__.get("AVX512F"))


_NUMPY_VECTOR_MATH = _numpy_vector_math()


def _through_numpy(x: torch.Tensor) -> bool:
    return _NUMPY_VECTOR_MATH and x.device.type == "cpu" and x.dtype == torch.float64 and not x.requires_grad


def _exp(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``torch.exp(x, out=out)``; on the CPU through numpy where its float64 ``exp`` is vectorised
    (AVX-512), 1.7-2.9x faster there than torch's, the same values to one unit in the last place."""
    if not _through_numpy(x):
        return torch.exp(x, out=out)
    out = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    with np.errstate(all="ignore"):  # torch's silence: overflow to inf, underflow to 0, NaN stays NaN
        np.exp(x.numpy(), out=out.numpy())
    return out


def _log_(x: torch.Tensor) -> torch.Tensor:
    """``x.log_()``, through numpy like :func:`_exp`."""
    if not _through_numpy(x):
        return x.log_()
    with np.errstate(all="ignore"):  # log 0 = -inf, log of a negative number NaN, as torch's
        np.log(x.numpy(), out=x.numpy())
    return x


def _logcumsumexp(x: Float[torch.Tensor, "... n"], shifted: bool = False) -> Float[torch.Tensor, "... n"]:
    """``torch.logcumsumexp(x, dim=-1)``, about five times faster: ``max + log(cumsum(exp(x -
    max)))`` with vectorised ``exp`` and ``log`` instead of a log-add-exp per element. The two
    agree to float64 round-off (about 1e-14 for the bootstrap's offset fits; a test checks
    it). ``shifted``: the caller has already subtracted an upper bound of every row (``x <= 0``
    up to round-off), so no maximum is taken and nothing is added back. A row whose shifted
    prefix underflows (its first value more than about 690 below the shift) or that is not
    finite falls back to ``torch.logcumsumexp``."""
    shift = None if shifted else x.amax(-1, keepdim=True)
    out = _exp(x if shifted else x - shift).cumsum_(-1)
    # NaN compares False; a prefix sum never decreases, so the first is the smallest and the last the largest
    exact = ~(out[..., 0] >= _UNDERFLOW) | ~(out[..., -1] < torch.inf)
    if shift is not None:
        exact |= ~torch.isfinite(shift[..., 0])
    out = _log_(out) if shift is None else _log_(out).add_(shift)
    if exact.any():
        out[exact] = torch.logcumsumexp(x[exact], dim=-1)
    return out


def _variant(fit: _Fitter, stats: HeadStatistics, per_group: torch.Tensor,
             weights: Float[torch.Tensor, "replicate group"]) -> _Variant:
    """Weighted sums of the groups, divided by the weighted number of sequences (mean per
    sequence), turned into coordinates; NaN where a weighting holds no sequence.
    ``per_group``: ``[group, head, 4 k | 4 | offset | 1 | 1]`` (the coordinates of ``t``, ``z``,
    the linear parts of ``lam`` and of the residual, their means, the offset fit ``g`` less a
    per-head upper bound (:func:`_components`) up to the largest offset a key set spans, and the
    sums of ``log A`` and its square), so every replicate's mean is one matrix product (the
    division folded into the weights), laid out as the parts of a :class:`_Variant`: ``lam``
    and the residual are completed in place, no copies."""
    n = weights @ stats.n_sequences  # [R]
    scale = torch.where(n > 0, 1.0 / n, torch.nan)
    n_groups, n_heads, width = per_group.shape
    means = ((weights * scale[:, None]) @ per_group.reshape(n_groups, -1)).reshape(len(weights), n_heads, width)
    k, n_off = fit.coords.shape[0], fit.lse_stop
    parts = means[..., :4 * k].unflatten(-1, (4, k))  # [R, head, part, k], a view
    part_means = means[..., 4 * k:4 * k + 4]
    g = means[..., 4 * k + 4:4 * k + 4 + n_off]  # [R, head, offset]
    sum_y, sum_y2 = means[..., -2] / fit.design.n_pairs, means[..., -1] / fit.design.n_pairs
    if fit.reference_free:
        lse = _logcumsumexp(g, shifted=True)[..., fit.lse_first:]  # g is shifted (_components)
        nonlinear = (lse.reshape(-1, lse.shape[-1]) @ fit.lse_lam).view(*lse.shape[:-1], k + 1)
        parts[..., _LAM, :] += nonlinear[..., :k]
        part_means[..., _LAM] += nonlinear[..., k]
        parts[..., _RES, :] -= nonlinear[..., :k]  # log A - lam
        part_means[..., _RES] -= nonlinear[..., k]
    else:
        parts[..., _LAM:, :] = torch.nan
        part_means[..., _LAM:] = torch.nan
    return _Variant(parts=parts, means=part_means, var_log_a=sum_y2 - sum_y * sum_y)


def _components(fit: _Fitter, stats: HeadStatistics,
                weights: Float[torch.Tensor, "replicate group"] | None = None) -> dict[str, torch.Tensor]:
    """Every component, ``[replicate, head]``, for each row of ``weights`` (the multiplicity of
    every group; None: each group once, i.e. the estimate on all the data, one row).

    In-sample (all weighted groups): ``R = Var(abs t)/V``, ``M = Var(abs z)/V``,
    ``C = -2 Cov(abs t, abs z)/V``; reference-free ``R' = Var(abs log A - abs lam)/V``,
    ``M' = Var(abs lam)/V``, ``C' = 2 Cov(abs lam, abs log A - abs lam)/V``. Held-out: the
    same with one factor fitted on each half (module docstring), averaged over both directions.
    """
    if weights is None:
        weights = torch.ones(1, stats.n_groups, dtype=torch.float64)
    n_off = fit.design.length
    offset_fit = torch.cat([stats.xty_t[..., :n_off], stats.row_t], dim=-1) @ fit.offsets_fit  # g per group
    linear_lam = offset_fit @ fit.linear_lam  # [group, head, k + 1]
    k = fit.coords.shape[0]
    g = offset_fit[..., :fit.lse_stop]
    if fit.reference_free:
        # g less one shift per head, the largest of its groups' mean g: a weighting's mean g is a convex combination
        # of the groups' means, so it stays <= 0 and exp cannot overflow. The shift is subtracted from the statistics
        # (times a group's size, so that every weighting's mean has it once) and never added back: it moves lse, so
        # lam, by the same constant on every pair, and a constant has no absolute part (the relative model's
        # intercept takes it; lse_lam's columns sum to zero, _Fitter).
        sizes = stats.n_sequences.to(torch.float64)
        present = sizes > 0
        shift = (g[present] / sizes[present, None, None]).amax(dim=(0, 2))  # [head]
        g = g - sizes[:, None, None] * shift[:, None]
    coords_t, coords_z = stats.xty_t @ fit.coords.T, stats.xty_z @ fit.coords.T
    mean_t, mean_z = (stats.xty_t @ fit.mean)[..., None], (stats.xty_z @ fit.mean)[..., None]
    per_group = torch.cat([  # the residual's linear part, t - z - (linear part of lam), like the others
        coords_t, coords_z, linear_lam[..., :k], coords_t - coords_z - linear_lam[..., :k],
        mean_t, mean_z, linear_lam[..., k:], mean_t - mean_z - linear_lam[..., k:],
        g, stats.sum_y[..., None], stats.sum_y2[..., None],
    ], dim=-1)
    # Identical weightings refit identically, and there are few distinct ones when the halves hold few groups: a
    # half of 4 groups resampled within itself can only be one of 35 multiplicities (of 200 replicates' 400
    # half weightings on 8 sequences, 61 are distinct; of their 200 weightings of all groups, 178). Each
    # distinct weighting is refitted once and the replicates take their rows back (``unique`` sorts the rows).
    halves = stats.halves.to(torch.float64)
    weights, replicate_row = torch.unique(weights, dim=0, return_inverse=True)
    half_weights, half_row = torch.unique(torch.cat([weights * (1 - halves), weights * halves]), dim=0,
                                          return_inverse=True)
    # heads are independent: a few at a time, every weighting, keeps the working tensors small enough for the
    # cache (and reads each head's statistics once)
    everything = torch.cat([weights, half_weights])
    per_block = max(1, _REFIT_BLOCK_VALUES // (len(everything) * per_group.shape[2]))
    half_row = half_row.view(2, len(weights))
    blocks = [_weighted_components(fit, stats, per_group[:, heads], everything, len(weights), half_row)
              for heads in torch.arange(per_group.shape[1]).split(per_block)]
    return {name: torch.cat([block[name] for block in blocks], dim=1)[replicate_row] for name in blocks[0]}


def _weighted_components(fit: _Fitter, stats: HeadStatistics, per_group: torch.Tensor,
                         weights: Float[torch.Tensor, "weighting group"], n_whole: int,
                         half_row: Int[torch.Tensor, "2 replicate"]) -> dict[str, torch.Tensor]:
    """:func:`_components` for the heads of ``per_group`` and the first ``n_whole`` rows of
    ``weights``, from the statistics per group; the weightings of each half alone are rows
    ``n_whole + half_row[0]`` and ``n_whole + half_row[1]``.

    Every component is a variance or covariance of two absolute parts (t, z, the mask-only
    ``lam`` and the residual ``log A - lam``), each a dot product of k-coordinates: the four
    parts' coordinates (side by side in a :class:`_Variant`) are multiplied once, all weightings and heads batched, into
    the 4 x 4 products of all the data with itself (in-sample) and of one half with the other
    (held out)."""
    n_pairs = fit.design.n_pairs
    variant = _variant(fit, stats, per_group, weights)
    both = variant.take(slice(0, n_whole))
    parts = [variant.take(n_whole + rows) for rows in half_row]

    def cov(a: _Variant, b: _Variant) -> torch.Tensor:
        """``[R, head, 4, 4]``: covariance over the analysed pairs of every part of ``a`` with every part of ``b``."""
        return (a.parts @ b.parts.transpose(-1, -2)).div_(n_pairs).sub_(a.means[..., :, None] * b.means[..., None, :])

    inside = cov(both, both)
    var_log_a = both.var_log_a
    var_t, var_z, cov_tz = inside[..., _T, _T], inside[..., _Z, _Z], inside[..., _T, _Z]
    out = {"R": var_t / var_log_a, "M": var_z / var_log_a, "C": -2 * cov_tz / var_log_a,
           "var_logA": var_log_a, "var_abs_t": var_t, "var_abs_z": var_z, "cov_abs_tz": cov_tz}
    out["total"] = out["R"] + out["M"] + out["C"]
    out["R_rf"] = inside[..., _RES, _RES] / var_log_a
    out["M_rf"] = inside[..., _LAM, _LAM] / var_log_a
    out["C_rf"] = 2 * inside[..., _LAM, _RES] / var_log_a
    weight = 0.5 * (1 / parts[0].var_log_a + 1 / parts[1].var_log_a)  # NaN when a half is empty
    cross = cov(parts[0], parts[1]).mul_(weight[..., None, None])  # [half 0 part, half 1 part]
    out["R_heldout"] = cross[..., _T, _T]
    out["M_heldout"] = cross[..., _Z, _Z]
    out["C_heldout"] = -(cross[..., _T, _Z] + cross[..., _Z, _T])
    out["total_heldout"] = out["R_heldout"] + out["M_heldout"] + out["C_heldout"]
    out["R_rf_heldout"] = cross[..., _RES, _RES]
    out["M_rf_heldout"] = cross[..., _LAM, _LAM]
    out["C_rf_heldout"] = cross[..., _LAM, _RES] + cross[..., _RES, _LAM]
    return out


# ---------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------

COMPONENTS = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout",
              "R_rf", "M_rf", "C_rf", "R_rf_heldout", "M_rf_heldout", "C_rf_heldout"]
INTERVAL_COLUMNS = [f"{c}_{side}" for c in COMPONENTS for side in ("lo", "hi")]
# The components kept per head and replicate (Decomposition.head_replicates): the residual components an
# intervention changes, so a per-head change gets a paired interval (lens_position.analyses.compare).
HEAD_REPLICATE_COMPONENTS = ["R", "R_heldout", "R_rf", "R_rf_heldout"]
HEAD_COLUMNS = [
    "layer", "head", "layer_type", "window", "query_start", "query_stop", "key_set", *COMPONENTS,
    "var_logA", "var_abs_t", "var_abs_z", "cov_abs_tz", "n_pairs", "n_sequences", *INTERVAL_COLUMNS,
]


@dataclass(repr=False)
class Decomposition(SavedResult):
    """Result of :func:`decompose`.

    ``heads``: one row per (layer, head). ``T, R, M, C`` (and ``*_heldout``) are fractions of
    ``var_logA`` = Var(log A) over the analysed triples (in-sample ``T`` lies in [0, 1];
    ``T = R + M + C``). ``var_abs_t``, ``var_abs_z``, ``cov_abs_tz`` are in squared nats.
    ``n_pairs`` counts analysed (sequence, query, key) triples. ``layer_type`` is
    ``"global"`` or ``"local"`` with its ``window``. ``*_heldout`` are split-half cross-fits
    (module docstring): free of the in-sample fit's noise, slightly negative when there is
    no signal, NaN with a single sequence. ``R_rf, M_rf, C_rf`` (and ``*_heldout``) are
    the reference-free split of the same ``T`` (module docstring), ``T = R_rf + M_rf + C_rf``;
    NaN with ``keys="no-bos"``. Every component ``X`` has its bootstrap interval
    ``X_lo``/``X_hi`` (NaN when intervals are off): the percentile interval for the held-out
    components, the bias-corrected percentile one for the in-sample components, whose replicates
    carry the in-sample fit's optimism once more (:mod:`lens_position.core.intervals`).
    ``layers``: one row per layer, the mean over heads of each component, its interval (from
    that mean over the replicates, the same method), ``relative_depth`` = layer / (n_layers − 1),
    ``query_stop`` and ``n_sequences``.
    ``provenance``: model spec, data spec, seed, options (bins, query range, keys), the
    interval method, level and number of resamples, versions.
    ``replicates``: one row per (bootstrap replicate, layer) with the layer's mean over heads
    of every component in that replicate (None when intervals are off). Derived quantities
    (a ratio, a depth slope, a difference between two runs on the same prompts) get their
    intervals by computing them replicate by replicate.
    ``head_replicates``: one row per (bootstrap replicate, layer, head) with the head's residual
    components (``HEAD_REPLICATE_COMPONENTS``) in that replicate, for the per-head paired
    intervals of an intervention's change (None when intervals are off).
    """

    heads: pd.DataFrame
    layers: pd.DataFrame
    provenance: dict[str, Any]
    replicates: pd.DataFrame | None = None
    head_replicates: pd.DataFrame | None = None

    WHAT = "absolute position in attention split into residual (R') and mask (M') components"
    HEADS = ("heads", "R_rf_heldout")

    def headline(self) -> list[Headline]:
        """Mean over layers and heads of R', M' (held out, reference-free: what the claims use) and
        the total, with their intervals; the query range in the label when it is not all queries."""
        stop = int(self.layers["query_stop"].iloc[0]) if "query_stop" in self.layers.columns and len(self.layers) else None
        where = f", queries < {stop}" if stop is not None and stop < int((self.provenance.get("data") or {}).get("T") or 0) else ""
        out = []
        for column, label, meaning in (
                ("R_rf_heldout", "R' residual", "the residual stream's share of Var(log A)"),
                ("M_rf_heldout", "M' mask", "the causal mask's share of Var(log A)"),
                ("total_heldout", "total", "absolute-position share of Var(log A)")):
            if column in self.layers.columns:
                out.append(Headline(column, f"{label} (held out{where})",
                                    layer_mean(self.layers, self.replicates, column), meaning))
        return out

    def to_tensor(self, component: str = "R") -> Float[torch.Tensor, "layer head"]:
        """One per-head column of ``heads`` (``"R"``, ``"M_heldout"``, ...) as a float64
        ``[layer, head]`` tensor indexed like the model: ``to_tensor("R")[l, h]`` is layer ``l``,
        head ``h``. Layers that were not analysed are rows of NaN, so a subset keeps its real
        layer indices."""
        if component not in self.heads.columns or component in ("layer", "head") \
                or not pd.api.types.is_numeric_dtype(self.heads[component]):
            numeric = [c for c in self.heads.columns
                       if c not in ("layer", "head") and pd.api.types.is_numeric_dtype(self.heads[c])]
            raise BadInputError(f"no per-head quantity {component!r}; choose one of {numeric}")
        model = self.provenance.get("model") or {}
        n_layers = int(model.get("n_layers") or self.heads["layer"].max() + 1)
        n_heads = int(model.get("n_heads") or self.heads["head"].max() + 1)
        out = torch.full((n_layers, n_heads), float("nan"), dtype=torch.float64)
        layer = torch.from_numpy(self.heads["layer"].to_numpy(dtype=np.int64, copy=True))
        head = torch.from_numpy(self.heads["head"].to_numpy(dtype=np.int64, copy=True))
        out[layer, head] = torch.from_numpy(self.heads[component].to_numpy(dtype=np.float64, na_value=np.nan, copy=True))
        return out


def layer_key_windows(model: ModelLike) -> list[int | None]:
    """Window of each layer's attention mask (``None`` for a causal layer over all earlier
    keys): ``ModelSpec.layer_windows``, which the spec builder reads off the model's own
    attention modules."""
    return list(as_loaded(model).spec.layer_windows)


def _prompt_tokens(loaded: LoadedModel, prompts: Any) -> tuple[torch.Tensor, Any]:
    """Tokens and spec of the checked prompt set (T >= 2: a single position has no pairs to fit)."""
    checked = checked_prompts(loaded, prompts, min_length=2)
    return checked.tokens, checked.spec


def _check_options(loaded: LoadedModel, tokens: torch.Tensor, layers: Sequence[int] | None,
                   query_range: tuple[int, int] | None, keys: str) -> tuple[list[int], int, int]:
    cfg = loaded.model.cfg
    if cfg.attention_dir != "causal" or getattr(cfg, "use_attention_sinks", False):
        raise UnsupportedArchitectureError(
            "decompose needs plain causal softmax attention (log A = s - logsumexp s); this model has "
            f"attention_dir={cfg.attention_dir!r}, use_attention_sinks={getattr(cfg, 'use_attention_sinks', False)}")
    length = tokens.shape[1]
    layers = check_layers(layers, cfg.n_layers)
    query_start, query_stop = check_query_range(query_range, length)
    if keys not in ("all", "no-bos"):
        raise BadInputError(f"keys must be 'all' or 'no-bos', got {keys!r}")
    return layers, query_start, query_stop


def visible_keys(scores: torch.Tensor) -> torch.Tensor:
    """Which cells of ``scores`` the mask leaves visible: masked cells are ``-inf`` (HookedTransformer,
    a bridge in compatibility mode) or the dtype's most negative value (``finfo.min``, a bridge
    outside it); anything at or below half of it is masked."""
    return torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)


def _shows_key_set(scores: Float[torch.Tensor, "batch head query key"], design: PairDesign) -> bool:
    """Whether :func:`visible_keys` of ``scores`` (the design's query rows) is exactly ``design.key_set``
    for every prompt and head, decided by reductions over rectangles instead of boolean tensors.

    Rows are taken in blocks; for a block, the columns every row sees (its first query's and earlier,
    inside the last query's window) must have all scores finite and above ``finfo.min / 2``
    (``aminmax``), the columns no row sees (after its last query, or before its first query's window)
    all scores at or below it, ``-inf`` included (``amax``); the few columns in between, the block's
    diagonal band (and a window's edge), are compared cell by cell, where a hidden key's score must also
    not be NaN or ``+inf`` (stricter than :func:`visible_keys`, which calls those masked). One read of each score instead of
    five passes that each write a ``batch x head x T x T`` boolean: 0.9 s of a 22 s decomposition of
    SmolLM2 at T=256, N=16 before. NaN anywhere fails a reduction's comparison, so it is never taken
    for a key set."""
    threshold = torch.finfo(scores.dtype).min / 2
    s = scores[:, :, design.query_start:design.query_stop]
    n_rows, length = s.shape[2], s.shape[3]
    window = design.window if design.window is not None else length + design.query_stop
    key_set = design.key_set.to(s.device)
    for first_row in range(0, n_rows, _BLOCK_ROWS):
        last_row = min(first_row + _BLOCK_ROWS, n_rows)
        first_query, last_query = design.query_start + first_row, design.query_start + last_row - 1
        # every row sees [all_from, all_to]; none sees [0, none_before) or (none_after, length)
        all_from, all_to = max(0, last_query - window + 1), first_query
        none_before, none_after = max(0, first_query - window + 1), last_query
        block = s[:, :, first_row:last_row]
        if all_from <= all_to:
            low, high = torch.aminmax(block[..., all_from:all_to + 1])
            if not (bool(low > threshold) and bool(high < torch.inf)):
                return False
        for a, b in ((0, none_before), (none_after + 1, length)):
            if a < b and not bool(block[..., a:b].amax() <= threshold):
                return False
        mixed = [(none_before, min(all_from, all_to + 1)), (max(all_to + 1, none_before), none_after + 1)]
        for a, b in mixed:
            if a < b:  # a small band: copied (masked_fill on a strided view is slower than the copy)
                cells, shown = block[..., a:b].contiguous(), key_set[first_row:last_row, a:b]
                low, high = torch.aminmax(cells.masked_fill(~shown, 0.0))
                if not (bool(low > threshold) and bool(high < torch.inf)
                        and bool(cells.masked_fill_(shown, -torch.inf).amax() <= threshold)):
                    return False
    return True


def _check_mask(scores: torch.Tensor, design: PairDesign, layer: int, rows: torch.Tensor | None = None) -> None:
    """Every head of every prompt must see exactly the key set ``design`` expects. A departure
    shared by all heads and prompts is the model's mask (masked cells: :func:`visible_keys`); one
    confined to some of them is an infinite score (non-finite weights, or overflow), named with its head and prompt."""
    if _shows_key_set(scores, design):
        return
    visible = visible_keys(scores[:, :, design.query_start:design.query_stop])
    key_set = design.key_set.to(visible.device)
    if bool((visible == key_set).all()):  # then a hidden key's score is NaN or +inf: the softmax row is NaN
        s = scores[:, :, design.query_start:design.query_stop]
        batch, head, query, key = (int(i) for i in ((s.isnan() | (s == torch.inf)) & ~key_set).nonzero()[0].tolist())
        prompt = int(rows[batch]) if rows is not None else batch
        raise NonFiniteError(
            f"layer {layer}, head {head}, prompt {prompt}: the score of query {design.query_start + query} on key {key} "
            f"is {float(s[batch, head, query, key])} where the mask hides that key (a masked score must be -inf or "
            "very negative); its attention row is not a softmax over the visible keys. Likely cause: a hook that "
            "writes scores after the mask, non-finite weights, or overflow in float16/bfloat16 (run in float32)")
    same_everywhere = bool((visible == visible[:1, :1]).all())
    if same_everywhere:
        raise UnsupportedArchitectureError(
            f"layer {layer}: the attention mask in hook_attn_scores is not the causal/sliding-window "
            f"key set lens_position expects (window={design.window}); decompose only supports "
            "unpadded causal or sliding-window attention")
    batch, head, query, key = (int(i) for i in (visible != key_set).nonzero()[0].tolist())
    prompt = int(rows[batch]) if rows is not None else batch
    raise NonFiniteError(
        f"layer {layer}, head {head}, prompt {prompt}: the score of query {design.query_start + query} on key {key} "
        "is infinite where the mask shows that key (the other heads see the expected key set); likely cause: "
        "non-finite weights in that head's W_Q/W_K, or overflow in float16/bfloat16 (run in float32)")


MAX_GROUPS = 32  # sequences are kept in at most this many groups (each its own while N <= MAX_GROUPS)


class DecompositionReducer:
    """The decomposition's statistics as a reducer for :func:`lens_position.core.stream.stream`:
    it reads ``hook_attn_scores`` of the analysed layers and keeps, per layer, the
    :class:`HeadStatistics` of every group of sequences: each sequence its own group while
    ``N <= MAX_GROUPS`` and intervals are on, else sequence ``n`` in group ``n % n_groups``
    (two groups, the halves, when intervals are off).

    Build it with the same options as :func:`decompose`, stream the prompts through the
    model (together with any other reducers), then call :meth:`result`.
    """

    def __init__(self, model: ModelLike, prompts: Any, *,
                 layers: Sequence[int] | None = None, query_range: tuple[int, int] | None = None,
                 keys: KeySet = "all", bins: PositionBins = PositionBins(),
                 bootstrap: Bootstrap = Bootstrap()) -> None:
        self.loaded = as_loaded(model)
        tokens, self.data = _prompt_tokens(self.loaded, prompts)
        self.tokens_sha256 = tokens_sha256(tokens)
        self.seed = getattr(getattr(prompts, "spec", None), "seed", None)
        self.layers, self.query_start, self.query_stop = _check_options(self.loaded, tokens, layers,
                                                                         query_range, keys)
        self.length = tokens.shape[1]
        self.keys, self.bins, self.bootstrap = keys, bins, bootstrap
        n_seq = tokens.shape[0]
        self.n_groups = 2 if not bootstrap.enabled else max(2, min(n_seq + n_seq % 2, MAX_GROUPS))
        self.windows = layer_key_windows(self.loaded)
        self.designs: dict[int | None, PairDesign] = {}
        for layer in self.layers:
            window = self.windows[layer]
            if window not in self.designs:
                self.designs[window] = PairDesign.build(self.length, window, self.query_start, self.query_stop,
                                                        keys, bins)
        n_heads = self.loaded.model.cfg.n_heads
        self.stats = {layer: HeadStatistics.zeros(n_heads, self.designs[self.windows[layer]].n_features,
                                                  self.query_stop - self.query_start, self.n_groups)
                      for layer in self.layers}
        self.hook_names = tuple(f"blocks.{layer}.attn.hook_attn_scores" for layer in self.layers)
        self._layer_of = dict(zip(self.hook_names, self.layers))
        self._checked: set[int] = set()
        self._on_device: dict[int | None, PairDesign] = {}
        self._workspace = _Workspace()

    def update(self, hook_name: str, scores: Float[torch.Tensor, "batch head query key"],
               rows: Int[torch.Tensor, "batch"]) -> None:
        layer = self._layer_of[hook_name]
        if scores.device.type != "cpu":  # reduce where the scores are; sums come back in result()
            if self.windows[layer] not in self._on_device:
                self._on_device[self.windows[layer]] = self.designs[self.windows[layer]].to(scores.device)
            self.stats[layer] = self.stats[layer].to(scores.device)
            design = self._on_device[self.windows[layer]]
        else:
            design = self.designs[self.windows[layer]]
        _check_mask(scores, design, layer, rows)
        _reduce(scores, design, rows % self.n_groups, self.stats[layer], self._workspace)

    def resample_weights(self) -> Float[torch.Tensor, "replicate group"] | None:
        """Multiplicities of the groups in every bootstrap replicate, drawn within halves
        (None when intervals are off). Deterministic in the number of groups and the
        bootstrap seed, so two decompositions of the same prompts draw the same replicates."""
        if not self.bootstrap.enabled:
            return None
        stats = self.stats[self.layers[0]]
        present = (stats.n_sequences > 0).numpy()
        counts = torch.zeros(self.bootstrap.n_resamples, stats.n_groups, dtype=torch.float64)
        counts[:, present] = resample_counts(int(present.sum()), self.bootstrap.n_resamples, self.bootstrap.seed,
                                             strata=stats.halves.numpy()[present]).to(torch.float64)
        return counts

    def result(self, **options: Any) -> Decomposition:
        """The :class:`Decomposition` of everything streamed so far; ``options`` (batch
        size, interventions) are recorded in its provenance."""
        n_heads = self.loaded.model.cfg.n_heads
        n_layers = self.loaded.model.cfg.n_layers
        n_seq = int(self.stats[self.layers[0]].n_sequences.sum())
        if n_seq == 0:
            raise BadInputError("no prompts were streamed through this decomposition")
        self.stats = {layer: stats.to("cpu") for layer, stats in self.stats.items()}
        # too few sequences for an interval to exist (MIN_INTERVAL_UNITS): none is computed
        weights = self.resample_weights() if n_seq >= MIN_INTERVAL_UNITS else None
        level = self.bootstrap.level
        stats0 = self.stats[self.layers[0]]
        per_half = min(int(((stats0.n_sequences > 0) & (stats0.halves == h)).sum()) for h in (0, 1))

        def widen(estimate: torch.Tensor, replicates: torch.Tensor) -> torch.Tensor:
            return small_sample_widening(estimate, replicates, per_half)

        # the layers of one key set are refitted together (their heads side by side): one design, one
        # refit, and each component's per-head intervals in one call
        estimates, refits, intervals = {}, {}, {}
        for window, design in self.designs.items():
            fit = _Fitter(design)
            group = [layer for layer in self.layers if self.windows[layer] == window]
            stats = HeadStatistics.side_by_side([self.stats[layer] for layer in group])
            # the estimate (every group once) refitted with the replicates: one pass over the statistics
            everything = torch.ones(1, stats.n_groups, dtype=torch.float64)
            if weights is not None:
                everything = torch.cat([everything, weights])
            fitted = _components(fit, stats, everything)
            together = {name: v[0].numpy() for name, v in fitted.items()}
            if weights is not None:
                refitted = {name: v[1:] for name, v in fitted.items()}
                # only the components get intervals (and kept replicates)
                replicates = {name: widen(torch.as_tensor(together[name]), refitted[name]) for name in COMPONENTS}
                all_bounds = {name: bootstrap_interval(together[name], replicates[name].numpy(), level,
                                                   interval_method(name)) for name in COMPONENTS}
            for k, layer in enumerate(group):
                heads = slice(k * n_heads, (k + 1) * n_heads)
                estimates[layer] = {name: v[heads] for name, v in together.items()}
                if weights is not None:
                    refits[layer] = {name: v[:, heads] for name, v in replicates.items()}
                    intervals[layer] = {name: (lo[heads], hi[heads]) for name, (lo, hi) in all_bounds.items()}
        # the tables, column by column: a row per layer and head, layers in the order analysed
        layers, n_rows = self.layers, len(self.layers) * n_heads
        spec = self.loaded.spec
        columns: dict[str, Any] = {
            "layer": np.repeat(layers, n_heads), "head": np.tile(np.arange(n_heads), len(layers)),
            "layer_type": np.repeat([spec.layer_types[layer] for layer in layers], n_heads),
            "window": pd.array(np.repeat([self.windows[layer] for layer in layers], n_heads).tolist(), dtype="Int64"),
            "query_start": np.full(n_rows, self.query_start), "query_stop": np.full(n_rows, self.query_stop),
            "key_set": np.full(n_rows, self.keys),
            "n_pairs": np.array([self.designs[self.windows[layer]].n_pairs * n_seq for layer in layers]).repeat(n_heads),
            "n_sequences": np.full(n_rows, n_seq),
        }
        for name in estimates[layers[0]]:
            columns[name] = np.concatenate([estimates[layer][name] for layer in layers]).astype(float)
        for name in COMPONENTS:
            for side in (0, 1):
                columns[f"{name}_{('lo', 'hi')[side]}"] = (
                    np.concatenate([intervals[layer][name][side] for layer in layers]).astype(float)
                    if weights is not None else np.full(n_rows, np.nan))
        heads = pd.DataFrame(columns, columns=HEAD_COLUMNS)
        per_layer = heads.groupby(["layer", "layer_type"], dropna=False, sort=True)[COMPONENTS].mean().reset_index()
        per_layer["relative_depth"] = per_layer["layer"] / max(n_layers - 1, 1)
        per_layer["query_stop"], per_layer["n_sequences"] = self.query_stop, n_seq
        replicates = head_replicates = None
        if weights is not None:
            n_rep = len(weights)
            # a layer's replicate: the mean over its heads of their refits
            layer_means = {name: torch.stack([refits[layer][name].mean(-1) for layer in layers], dim=1).numpy()
                           for name in COMPONENTS}  # [replicate, layer]
            replicates = pd.DataFrame({"replicate": np.tile(np.arange(n_rep), len(layers)),
                                       "layer": np.repeat(layers, n_rep),
                                       **{name: layer_means[name].T.reshape(-1) for name in COMPONENTS}})
            head_replicates = pd.DataFrame({
                "replicate": np.tile(np.repeat(np.arange(n_rep), n_heads), len(layers)),
                "layer": np.repeat(layers, n_rep * n_heads),
                "head": np.tile(np.arange(n_heads), n_rep * len(layers)),
                **{name: torch.stack([refits[layer][name] for layer in layers]).reshape(-1).numpy()
                   for name in HEAD_REPLICATE_COMPONENTS}})
        order = [layers.index(layer) for layer in per_layer["layer"]]  # per_layer is sorted by layer
        for name in COMPONENTS:  # a layer's interval: the percentiles of its head mean over replicates
            if weights is None:
                per_layer[f"{name}_lo"] = per_layer[f"{name}_hi"] = np.nan
                continue
            lo, hi = bootstrap_interval(per_layer[name].to_numpy(dtype=float), layer_means[name][:, order], level,
                                        interval_method(name))
            per_layer[f"{name}_lo"], per_layer[f"{name}_hi"] = lo, hi
        prov = provenance.collect(
            model=self.loaded.spec, data=self.data, seed=self.seed, tokens_sha256=self.tokens_sha256,
            layers=self.layers,
            query_range=[self.query_start, self.query_stop], keys=self.keys, **options,
            bins={**self.bins.to_dict(), "position_edges": self.bins.edges(self.length).tolist(), "offsets": "exact"},
            heldout=HELDOUT_DEFINITION, reference_free=REFERENCE_FREE_DEFINITION,
            intervals={**self.bootstrap.to_dict("sequence", [c for c in COMPONENTS
                                                               if c in BIAS_CORRECTED_QUANTITIES]),
                       "groups": self.n_groups,
                       "strata": "halves (even / odd sequences), resampled separately"},
            mask_windows={str(layer): self.windows[layer] for layer in self.layers},
        )
        return Decomposition(heads=heads, layers=per_layer, provenance=prov, replicates=replicates,
                             head_replicates=head_replicates)


def decompose(
    model: ModelLike,
    prompts: Prompts,
    *,
    layers: Sequence[int] | None = None,
    query_range: tuple[int, int] | None = None,
    keys: KeySet = "all",
    patches: Sequence[Patch] = (),
    fwd_hooks: Sequence[tuple[str | Callable, Callable]] = (),
    batch_size: int = BATCH_SIZE,
    bins: PositionBins = PositionBins(),
    bootstrap: Bootstrap = Bootstrap(),
    progress: bool = True,
    scores: Any = None,
) -> Decomposition:
    """Measure, per layer and head, the absolute-position share of the attention pattern
    and split it into residual and mask components (module docstring: method), with
    bootstrap intervals over whole sequences.

    Args:
        model: a ``LoadedModel`` or a bare ``HookedTransformer``.
        prompts: a ``PromptSet`` or integer tokens ``Int[Tensor, "N T"]``; every sequence
            has the same length ``T`` and is analysed as is (no BOS is added).
        layers: layers to analyse (default all); the forward pass stops after the last.
        query_range: ``(start, stop)``, queries ``start <= i < stop`` (default all ``T``).
        keys: ``"all"`` keys of ``K(i)``, or ``"no-bos"`` to leave position 0 out of the
            analysed pairs (the normaliser ``z`` still sums over all of ``K(i)``).
        patches: interventions (:class:`lens_position.analyses.patching.Patch`) applied during the
            pass; the analysis reads the scores the patched model actually uses.
        fwd_hooks: extra ``(hook name, function)`` pairs active during the forward pass,
            run after the patches and before the analysis.
        batch_size: sequences per forward pass.
        bins: query/key position bins (offsets always get one bin each).
        bootstrap: the intervals (:class:`lens_position.core.intervals.Bootstrap`; its default is
            a 95% percentile interval from 200 replicates; ``NO_INTERVALS`` switches them off).
            Replicates refit re-weighted statistics: they cost no forward pass.
        progress: show a progress bar.
        scores: the scores already computed for ``prompts``, instead of a forward pass: the
            ``ActivationCache`` of ``model.run_with_cache(prompts.tokens)`` (``hook_attn_scores``,
            or ``hook_rot_q`` and ``hook_rot_k``, of every analysed layer) or a mapping
            ``{layer: Float[Tensor, "batch head query key"]}``; checked against the model's key
            sets, the prompts' shape and a fresh run of two prompts
            (:mod:`lens_position.analyses.cached_scores`). The numbers are those of the forward pass.

    Returns:
        a :class:`Decomposition`. To compute it in the same pass as other statistics, stream
        a :class:`DecompositionReducer` with them (:func:`lens_position.core.stream.stream`).
    """
    prompts = checked_prompts(model, prompts, min_length=2)
    batch_size = check_count("batch_size", batch_size)
    reducer = DecompositionReducer(model, prompts, layers=layers, query_range=query_range, keys=keys, bins=bins,
                                   bootstrap=bootstrap)
    if scores is not None:
        if patches or fwd_hooks:
            raise BadInputError("decompose: scores= are read as cached; patches= and fwd_hooks= need a forward pass "
                                "(pass one or the other)")
        cached = CachedScores(reducer.loaded, prompts.tokens, reducer.layers, scores)
        for layer, batch, rows in cached.batches(batch_size):
            reducer.update(f"blocks.{layer}.attn.hook_attn_scores", batch, rows)
        return reducer.result(batch_size=batch_size, scores_from=f"cached {cached.kind}")
    stream(model, prompts, [reducer], patches=patches, fwd_hooks=fwd_hooks, batch_size=batch_size,
           progress=progress, desc="decompose")
    return reducer.result(
        batch_size=batch_size,
        patches=[patch.label or patch.hook_name for patch in patches],
        fwd_hooks=[name if isinstance(name, str) else repr(name) for name, _ in fwd_hooks],
    )


# ---------------------------------------------------------------------------------------
# Dense reference
# ---------------------------------------------------------------------------------------


def decompose_dense(
    model: ModelLike,
    prompts: Prompts,
    *,
    layers: Sequence[int] | None = None,
    query_range: tuple[int, int] | None = None,
    keys: KeySet = "all",
    bins: PositionBins = PositionBins(),
) -> Decomposition:
    """The same measurement done the plain way, as a reference for :func:`decompose`.

    Caches every analysed layer's scores for all sequences at once, builds the explicit
    design matrix stacked over sequences (``[N * pairs, features]``) and solves each fit with
    ``torch.linalg.lstsq``; the absolute parts, variances and held-out cross-fits are then
    computed pair by pair. Memory grows as ``N x layers x heads x T^2``: use it on small
    cases (tests, the benchmark), never for analysis.
    """
    loaded = as_loaded(model)
    tokens, data = _prompt_tokens(loaded, prompts)
    layers, query_start, query_stop = _check_options(loaded, tokens, layers, query_range, keys)
    n_seq, length = tokens.shape
    windows = layer_key_windows(loaded)
    names = {f"blocks.{layer}.attn.hook_attn_scores" for layer in layers}
    with torch.no_grad():
        cache = loaded.backend.run_with_cache(tokens, sorted(names), stop_at_layer=layers[-1] + 1)
    for name in sorted(names):
        check_finite_activation(name, cache[name], torch.arange(len(tokens)), loaded.backend.model)
    n_heads = loaded.backend.n_heads
    rows = []
    for window in dict.fromkeys(windows[layer] for layer in layers):
        group = [layer for layer in layers if windows[layer] == window]
        design = PairDesign.build(length, window, query_start, query_stop, keys, bins)
        x_full = design.dense().repeat(n_seq, 1)
        x_rel = x_full[:, design.relative]
        # targets: per layer and head, t then z, as columns [N * pairs, layers * 2 * heads]
        y = torch.empty(n_seq * design.n_pairs, len(group) * 2 * n_heads, dtype=torch.float64)
        for k, layer in enumerate(group):
            scores = cache[f"blocks.{layer}.attn.hook_attn_scores"][:, :, query_start:query_stop]
            t, z = self_referenced_scores(scores, query_start)
            y_t = t.reshape(n_seq, n_heads, -1)[:, :, design.flat]
            y_z = z[:, :, design.query - query_start]
            y[:, 2 * k * n_heads:(2 * k + 1) * n_heads] = y_t.permute(0, 2, 1).reshape(-1, n_heads)
            y[:, (2 * k + 1) * n_heads:(2 * k + 2) * n_heads] = y_z.permute(0, 2, 1).reshape(-1, n_heads)
            del t, z, y_t, y_z
        sequence = torch.arange(n_seq).repeat_interleave(design.n_pairs)

        def absolute_part(rows: torch.Tensor | None) -> torch.Tensor:
            """abs(y) on one sequence's pairs ``[pairs, columns]``, fitted on ``rows`` (None: all)."""
            pick = (lambda m: m) if rows is None else (lambda m: m[rows])
            full = torch.linalg.lstsq(pick(x_full), pick(y), driver="gelsd").solution
            rel = torch.linalg.lstsq(pick(x_rel), pick(y), driver="gelsd").solution
            return x_full[: design.n_pairs] @ full - x_rel[: design.n_pairs] @ rel

        def centred_cov(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return ((a - a.mean(0)) * (b - b.mean(0))).mean(0)

        halves = [sequence % 2 == 0, sequence % 2 == 1]
        fits = [absolute_part(None)] + ([absolute_part(h) for h in halves] if n_seq > 1 else [])
        for k, layer in enumerate(group):
            cols_t = slice(2 * k * n_heads, (2 * k + 1) * n_heads)
            cols_z = slice((2 * k + 1) * n_heads, (2 * k + 2) * n_heads)
            log_a = y[:, cols_t] - y[:, cols_z]
            var_log_a = log_a.var(0, unbiased=False)
            a_t, a_z = fits[0][:, cols_t], fits[0][:, cols_z]
            var_t, var_z, cov_tz = centred_cov(a_t, a_t), centred_cov(a_z, a_z), centred_cov(a_t, a_z)
            values = {"R": var_t / var_log_a, "M": var_z / var_log_a, "C": -2 * cov_tz / var_log_a,
                      "total": (a_t - a_z).var(0, unbiased=False) / var_log_a,
                      "var_logA": var_log_a, "var_abs_t": var_t, "var_abs_z": var_z, "cov_abs_tz": cov_tz}
            if n_seq > 1:
                (at0, az0), (at1, az1) = [(f[:, cols_t], f[:, cols_z]) for f in fits[1:]]
                v0, v1 = (log_a[h].var(0, unbiased=False) for h in halves)
                # fit on half 0, evaluate on half 1: Cov(abs_0, log A of half 1) / V_1, and back
                cross = []
                for fitted, other, v_other in (((at0, az0), 1, v1), ((at1, az1), 0, v0)):
                    la = log_a[halves[other]].reshape(-1, design.n_pairs, n_heads)
                    cross.append(torch.stack([
                        centred_cov(fitted[0].repeat(la.shape[0], 1), la.reshape(-1, n_heads)),
                        centred_cov(fitted[1].repeat(la.shape[0], 1), la.reshape(-1, n_heads)),
                    ]) / v_other)
                values["total_heldout"] = 0.5 * sum(c[0] - c[1] for c in cross)
                values["R_heldout"] = 0.5 * (centred_cov(at0, at1) / v1 + centred_cov(at1, at0) / v0)
                values["M_heldout"] = 0.5 * (centred_cov(az0, az1) / v1 + centred_cov(az1, az0) / v0)
                values["C_heldout"] = -0.5 * ((centred_cov(at0, az1) + centred_cov(az0, at1)) / v1
                                              + (centred_cov(at1, az0) + centred_cov(az1, at0)) / v0)
            for head in range(n_heads):
                row = {"layer": layer, "head": head, "layer_type": loaded.spec.layer_types[layer],
                       "window": window, "query_start": query_start, "query_stop": query_stop, "key_set": keys,
                       "n_pairs": design.n_pairs * n_seq, "n_sequences": n_seq}
                row.update({name: float(v[head]) for name, v in values.items()})
                rows.append(row)
    heads = (pd.DataFrame(rows, columns=HEAD_COLUMNS).astype({"window": "Int64"})
             .sort_values(["layer", "head"], ignore_index=True))
    per_layer = heads.groupby(["layer", "layer_type"], dropna=False, sort=True)[COMPONENTS].mean().reset_index()
    prov = provenance.collect(model=loaded.spec, data=data, tokens_sha256=tokens_sha256(tokens), layers=layers,
                              query_range=[query_start, query_stop],
                              keys=keys, bins={**bins.to_dict(), "position_edges": bins.edges(length).tolist()},
                              method="dense reference (cached scores, torch.linalg.lstsq)")
    return Decomposition(heads=heads, layers=per_layer, provenance=prov)


def check_identity(
    model: ModelLike,
    prompts: Prompts,
    *,
    layers: Sequence[int] | None = None,
    min_pattern: float = 1e-6,
) -> pd.DataFrame:
    """Check the exact identity ``log A = t - z`` against the model's own ``hook_pattern``.

    Returns one row per layer: ``max_abs_error_pattern`` = max |exp(t - z) - A| over all
    entries (probability units), ``max_abs_error_log`` = max |(t - z) - log A| over entries
    with ``A > min_pattern`` (nats; smaller patterns are float32 round-off territory), and
    ``max_row_sum_error`` = max |sum_j exp(t - z) - 1|. Expected: float32 round-off.
    """
    loaded = as_loaded(model)
    tokens, _ = _prompt_tokens(loaded, prompts)
    layers, _, _ = _check_options(loaded, tokens, layers, None, "all")
    names = {f"blocks.{layer}.attn.{kind}" for layer in layers for kind in ("hook_attn_scores", "hook_pattern")}
    with torch.no_grad():
        cache = loaded.backend.run_with_cache(tokens, sorted(names), stop_at_layer=layers[-1] + 1)
    for name in sorted(names):
        check_finite_activation(name, cache[name], torch.arange(len(tokens)), loaded.backend.model)
    rows = []
    for layer in layers:
        t, z = self_referenced_scores(cache[f"blocks.{layer}.attn.hook_attn_scores"])
        log_a = t - z[..., None]
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].to(torch.float64)
        visible = pattern > min_pattern
        rows.append({
            "layer": layer,
            "max_abs_error_pattern": float((log_a.exp() - pattern).abs().max()),
            "max_abs_error_log": float((log_a - pattern.log())[visible].abs().max()),
            "max_row_sum_error": float((log_a.exp().sum(-1) - 1).abs().max()),
        })
    return pd.DataFrame(rows)
