"""From the streamed statistics to the components: the absolute parts of ``t``, ``z``, the mask-only
counterfactual ``lam`` and the residual, as k-coordinates, and every component (in-sample,
held out, reference-free) for many weightings of the groups of sequences at once (the estimate and
its bootstrap replicates refit re-weighted statistics, no forward pass).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int

from lens_position.analyses.engine.design import PairDesign
from lens_position.analyses.engine.kernels import fast_logcumsumexp
from lens_position.analyses.engine.statistics import HeadStatistics

_RANK_TOLERANCE = 1e-10  # singular values below this fraction of the largest are numerical zeros


@dataclass
class Fitter:
    """Everything that depends on the key set only (one per design), computed once from the design's
    structure, in ``O(T x bins)`` time and memory (no ``T x T`` matrix).

    Absolute parts in coordinates. The relative model is one one-hot column per offset (its Gram
    block ``D`` diagonal: the pairs per offset; the intercept lies in its span); the full model adds
    the query and key bins ``X_a``. The absolute part of a fit is the projection on
    ``Z = (I - P_off) X_a``, and with ``b = X'y`` (per sequence) ``Z'y = b_a - F b_off``,
    ``F = X_a'X_off D^-1``, ``Z'Z = G_aa - F G_off,a`` (the Schur complement, ``2 bins x 2 bins``).
    With ``Z'Z = V L V'``, ``coords = L^-1/2 V' [-F | I | 0]`` (``[k, feature]``, ``k`` its rank,
    about twice the number of position bins) gives ``<abs_a, abs_b> = (coords b_a) . (coords b_b)``
    over the analysed pairs: every component is a dot product of ``k``-vectors, which is what
    makes thousands of bootstrap refits cheap. The absolute part has mean 0 (``mean``).

    The reference-free split needs, in addition, the *offset-only fit up to a per-query constant*:
    ``t ~ g(d) + c(i)`` (one-hot offsets and one-hot queries), :meth:`offset_fit`. Every query's
    offsets are a prefix ``0 .. m_i``, so eliminating ``c`` leaves ``A g = r`` with
    ``A = diag(pairs per offset) - U diag(w) U'`` (``U`` upper-triangular ones, ``w_m`` the sum of
    ``1 / (m_i + 1)`` over the queries with ``m_i = m``): in prefix sums ``y = U'g`` a tridiagonal
    system, solved in ``O(T)`` per row (``g`` is fixed up to a constant, which moves neither the
    fitted values nor ``lam``; ``g(0) = 0``). ``lam = g(i - j) - logsumexp_{K(i)} g`` is the
    log-pattern the mask alone makes of it; its absolute part comes from the per-query
    ``logsumexp`` only (an offset function has none): ``lse @ lse_lam``, with ``lse`` (a cumulative
    logsumexp of ``g`` over the offsets) computed per replicate. Queries whose key sets span the same
    offsets (every query past a sliding window's width) share one row of ``lse_lam``.
    ``linear_lam`` (the part of ``lam``'s coordinates linear in ``g``) is zero for that reason and
    kept for the layout of the refits.
    """

    design: PairDesign

    def __post_init__(self) -> None:
        design = self.design
        self.coords = self._absolute_coordinates()
        n_off, k = design.length, self.coords.shape[0]
        self.mean = torch.zeros(design.n_features, dtype=torch.float64)  # the absolute part has mean 0
        self.linear_lam = torch.zeros(n_off, k + 1, dtype=torch.float64)
        window = design.window if design.window is not None else design.length
        # logsumexp over K(i) of g(i - j): the offsets 0..min(i, W - 1)
        lse_index = torch.arange(design.query_start, design.query_stop).clamp(max=window - 1)
        self.lse_first, self.lse_stop = int(lse_index.min()), int(lse_index.max()) + 1
        self.lse_lam = torch.zeros(self.lse_stop - self.lse_first, k + 1, dtype=torch.float64)
        self.lse_lam[:, :k].index_add_(0, lse_index - self.lse_first, -self._row_coordinates())
        # a constant lse (the same on every query) moves lam by a constant, which has no absolute part: lse_lam's
        # columns sum to zero, exactly so once their round-off is taken out
        self.lse_lam -= self.lse_lam.mean(0)
        # with key 0 left out, g at the offset of key 0 is not fitted for the last query
        self.reference_free = design.keys == "all"
        self._prepare_offset_fit()

    def _absolute_coordinates(self) -> Float[torch.Tensor, "k feature"]:
        """``coords`` (class docstring) from the Gram blocks of the design, built from its structure."""
        design = self.design
        n_off, n_bins = design.length, design.n_pos_bins
        counts = design.offset_counts()
        g_oa, g_aa = _absolute_gram(design)
        inverse = torch.where(counts > 0, 1.0 / counts.clamp(min=1.0), 0.0)
        f = g_oa.T * inverse[None, :]  # [2 bins, offset]: X_a'X_off D^-1
        schur = g_aa - f @ g_oa  # Z'Z
        evals, evecs = torch.linalg.eigh(0.5 * (schur + schur.T))
        top = float(evals.max()) if evals.numel() else 0.0
        keep = evals > _RANK_TOLERANCE * top if top > 0 else torch.zeros_like(evals, dtype=torch.bool)
        half = evecs[:, keep].T / evals[keep].sqrt()[:, None]  # [k, 2 bins]: (Z'Z)^+1/2
        coords = torch.zeros(int(keep.sum()), design.n_features, dtype=torch.float64)
        coords[:, :n_off] = -half @ f
        coords[:, n_off:n_off + 2 * n_bins] = half
        return coords

    def _row_coordinates(self) -> Float[torch.Tensor, "query k"]:
        """Per query, ``coords`` applied to the sum of its pairs' features (its offsets ``0 .. m_i``, its
        query bin and the intercept ``n_i`` times, its keys' bins), by prefix sums over offsets and keys."""
        design, coords = self.design, self.coords
        n_off, n_bins = design.length, design.n_pos_bins
        has = design.max_offset >= 0
        top = design.max_offset.clamp(min=0)
        zero = torch.zeros(1, coords.shape[0], dtype=torch.float64)
        offsets = torch.cat([zero, coords[:, :n_off].T.cumsum(0)])  # [1 + offset, k]: sums over offsets < d
        keys = torch.cat([zero, coords[:, n_off + n_bins + design.key_bin].T.cumsum(0)])  # over keys < j
        queries = torch.arange(design.query_start, design.query_stop)
        n = design.analysed_per_query[:, None]
        rows = (offsets[top + 1] + n * coords[:, n_off + design.query_bin].T
                + keys[queries + 1] - keys[queries - top])
        return torch.where(has[:, None], rows, 0.0)

    def _prepare_offset_fit(self) -> None:
        """The tridiagonal system of :meth:`offset_fit` in prefix sums ``y = U'g`` (class docstring), its
        forward elimination done once: offsets ``0 .. top``, ``y_0 = g_0 = 0`` (the free constant)."""
        design = self.design
        has = design.max_offset >= 0
        self._top = int(design.max_offset.max()) if bool(has.any()) else -1
        top = max(self._top, 0)
        self._reach, self._size = design.max_offset[has], design.analysed_per_query[has]
        self._has = has
        counts = design.offset_counts()[:top + 1]
        w = torch.zeros(top + 1, dtype=torch.float64).index_add_(0, self._reach, 1.0 / self._size)
        after = torch.cat([counts[1:], counts.new_zeros(1)])
        diagonal, upper = counts + after - w, -after[:-1]  # upper[d]: rows d and d + 1
        denominator, factor = torch.zeros(top + 1, dtype=torch.float64), torch.zeros(top + 1, dtype=torch.float64)
        for d in range(1, top + 1):  # Thomas' forward elimination (the matrix is positive definite)
            denominator[d] = diagonal[d] - (upper[d - 1] * factor[d - 1] if d > 1 else 0.0)
            factor[d] = upper[d] / denominator[d] if d < top else 0.0
        self._upper, self._denominator, self._factor = upper, denominator, factor

    def offset_fit(self, xty_offsets: Float[torch.Tensor, "... offset"], row_sums: Float[torch.Tensor, "... query"]
                   ) -> Float[torch.Tensor, "... offset"]:
        """``g`` of the offset-only fit up to a per-query constant (class docstring) for each row of the
        statistics: ``xty_offsets`` the sums of ``t`` per offset, ``row_sums`` per query. ``g(0) = 0``;
        offsets no query reaches get 0."""
        top, device = self._top, xty_offsets.device
        out = torch.zeros_like(xty_offsets)
        if top < 1:
            return out
        per_top = torch.zeros(*row_sums.shape[:-1], top + 1, dtype=torch.float64, device=device)
        per_top.index_add_(-1, self._reach.to(device), row_sums[..., self._has.to(device)] / self._size.to(device))
        b = xty_offsets[..., :top + 2] if xty_offsets.shape[-1] > top + 1 else torch.nn.functional.pad(
            xty_offsets[..., :top + 1], (0, 1))
        z = b[..., :top + 1] - b[..., 1:top + 2] - per_top  # U^-1 r
        upper, denominator, factor = (x.to(device) for x in (self._upper, self._denominator, self._factor))
        y = torch.zeros_like(z)
        for d in range(1, top + 1):  # forward substitution
            y[..., d] = (z[..., d] - (upper[d - 1] * y[..., d - 1] if d > 1 else 0.0)) / denominator[d]
        for d in range(top - 1, 0, -1):  # back substitution
            y[..., d] -= factor[d] * y[..., d + 1]
        out[..., :top + 1] = torch.diff(y, dim=-1, prepend=torch.zeros_like(y[..., :1]))
        return out


def _absolute_gram(design: PairDesign) -> tuple[Float[torch.Tensor, "offset bins"], Float[torch.Tensor, "bins bins"]]:
    """The Gram blocks ``X_off'X_a`` and ``X_a'X_a`` of the query and key bins ``X_a``, counted from the
    design's structure: query ``i``'s analysed keys are ``i - m_i .. i`` (``m_i`` nondecreasing in ``i``)."""
    n_off, n_bins = design.length, design.n_pos_bins
    has = design.max_offset >= 0
    per_query = design.key_bins_per_query.cpu()  # [query, key bin]
    # offsets d <= m_i of query i: in its query bin (reverse cumulative sums over the largest offset)
    top_in_bin = torch.zeros(n_off, n_bins, dtype=torch.float64)
    top_in_bin.index_put_((design.max_offset[has], design.query_bin[has]),
                          torch.ones(int(has.sum()), dtype=torch.float64), accumulate=True)
    off_query = top_in_bin.flip(0).cumsum(0).flip(0)
    # offset d: the queries from the first reaching d to the last, their keys i - d, counted per key bin
    offsets = torch.arange(n_off)
    first = design.query_start + torch.searchsorted(design.max_offset.contiguous(), offsets, right=False)
    lo, hi = (first - offsets)[:, None], (design.query_stop - offsets)[:, None]  # keys lo .. hi - 1
    edges = design.bin_edges[None, :]
    ends = torch.cat([design.bin_edges[1:], torch.tensor([design.length])])[None, :]
    off_key = (torch.minimum(hi, ends) - torch.maximum(lo, edges)).clamp(min=0).to(torch.float64)
    g_oa = torch.cat([off_query, off_key], dim=1)
    query_bins = torch.zeros(len(design.max_offset), n_bins, dtype=torch.float64)
    query_bins[has.nonzero().flatten(), design.query_bin[has]] = 1.0
    g_aa = torch.zeros(2 * n_bins, 2 * n_bins, dtype=torch.float64)
    g_aa[:n_bins, :n_bins] = torch.diag(query_bins.T @ per_query.sum(1))
    g_aa[:n_bins, n_bins:] = query_bins.T @ per_query
    g_aa[n_bins:, :n_bins] = g_aa[:n_bins, n_bins:].T
    g_aa[n_bins:, n_bins:] = torch.diag(per_query.sum(0))
    return g_oa, g_aa


PART_T, PART_Z, PART_LAM, PART_RES = range(4)  # the absolute parts, in this order, in a Variant and its Gram matrices


@dataclass
class Variant:
    """Weightings of the groups (a half, or all; one row each), as k-coordinates of the four
    absolute parts: ``t``, ``z``, (reference-free) the mask-only counterfactual ``lam`` and the
    residual ``log A - lam`` (indices ``PART_T, PART_Z, PART_LAM, PART_RES``)."""

    parts: Float[torch.Tensor, "replicate head 4 k"]
    means: Float[torch.Tensor, "replicate head 4"]
    var_log_a: Float[torch.Tensor, "replicate head"]

    def take(self, rows: Int[torch.Tensor, "row"] | slice) -> Variant:
        """The weightings ``rows``, in that order (a slice: a view; ``index_select`` copies the strided
        fields about twice as fast as indexing with a tensor)."""
        pick = (lambda x: x[rows]) if isinstance(rows, slice) else (lambda x: x.index_select(0, rows))
        return Variant(*(pick(getattr(self, f.name)) for f in dataclasses.fields(self)))


# Heads refitted together: as many as keep the refits' working tensors (every distinct weighting x heads x
# the values per head) near this many float64 values, small enough for the cache.
REFIT_BLOCK_VALUES = 2**19


def fit_variant(
    fit: Fitter, stats: HeadStatistics, per_group: torch.Tensor, weights: Float[torch.Tensor, "replicate group"]
) -> Variant:
    """Weighted sums of the groups, divided by the weighted number of sequences (mean per
    sequence), turned into coordinates; NaN where a weighting holds no sequence.
    ``per_group``: ``[group, head, 4 k | 4 | offset | 1 | 1]`` (the coordinates of ``t``, ``z``,
    the linear parts of ``lam`` and of the residual, their means, the offset fit ``g`` less a
    per-head upper bound (:func:`components`) up to the largest offset a key set spans, and the
    sums of ``log A`` and its square), so every replicate's mean is one matrix product (the
    division folded into the weights), laid out as the parts of a :class:`Variant`: ``lam``
    and the residual are completed in place, no copies."""
    n = weights @ stats.n_sequences  # [R]
    scale = torch.where(n > 0, 1.0 / n, torch.nan)
    n_groups, n_heads, width = per_group.shape
    means = ((weights * scale[:, None]) @ per_group.reshape(n_groups, -1)).reshape(len(weights), n_heads, width)
    k, n_off = fit.coords.shape[0], fit.lse_stop
    parts = means[..., : 4 * k].unflatten(-1, (4, k))  # [R, head, part, k], a view
    part_means = means[..., 4 * k : 4 * k + 4]
    g = means[..., 4 * k + 4 : 4 * k + 4 + n_off]  # [R, head, offset]
    sum_y, sum_y2 = means[..., -2] / fit.design.n_pairs, means[..., -1] / fit.design.n_pairs
    if fit.reference_free:
        lse = fast_logcumsumexp(g, shifted=True)[..., fit.lse_first :]  # g is shifted (components)
        nonlinear = (lse.reshape(-1, lse.shape[-1]) @ fit.lse_lam).view(*lse.shape[:-1], k + 1)
        parts[..., PART_LAM, :] += nonlinear[..., :k]
        part_means[..., PART_LAM] += nonlinear[..., k]
        parts[..., PART_RES, :] -= nonlinear[..., :k]  # log A - lam
        part_means[..., PART_RES] -= nonlinear[..., k]
    else:
        parts[..., PART_LAM:, :] = torch.nan
        part_means[..., PART_LAM:] = torch.nan
    return Variant(parts=parts, means=part_means, var_log_a=sum_y2 - sum_y * sum_y)


def components(
    fit: Fitter, stats: HeadStatistics, weights: Float[torch.Tensor, "replicate group"] | None = None
) -> dict[str, torch.Tensor]:
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
    offset_fit = fit.offset_fit(stats.xty_t[..., :n_off], stats.row_t)  # g per group
    linear_lam = offset_fit @ fit.linear_lam  # [group, head, k + 1]
    k = fit.coords.shape[0]
    g = offset_fit[..., : fit.lse_stop]
    if fit.reference_free:
        # g less one shift per head, the largest of its groups' mean g: a weighting's mean g is a convex combination
        # of the groups' means, so it stays <= 0 and exp cannot overflow. The shift is subtracted from the statistics
        # (times a group's size, so that every weighting's mean has it once) and never added back: it moves lse, so
        # lam, by the same constant on every pair, and a constant has no absolute part (the relative model's
        # intercept takes it; lse_lam's columns sum to zero, Fitter).
        sizes = stats.n_sequences.to(torch.float64)
        present = sizes > 0
        shift = (g[present] / sizes[present, None, None]).amax(dim=(0, 2))  # [head]
        g = g - sizes[:, None, None] * shift[:, None]
    coords_t, coords_z = stats.xty_t @ fit.coords.T, stats.xty_z @ fit.coords.T
    mean_t, mean_z = (stats.xty_t @ fit.mean)[..., None], (stats.xty_z @ fit.mean)[..., None]
    per_group = torch.cat(
        [  # the residual's linear part, t - z - (linear part of lam), like the others
            coords_t,
            coords_z,
            linear_lam[..., :k],
            coords_t - coords_z - linear_lam[..., :k],
            mean_t,
            mean_z,
            linear_lam[..., k:],
            mean_t - mean_z - linear_lam[..., k:],
            g,
            stats.sum_y[..., None],
            stats.sum_y2[..., None],
        ],
        dim=-1,
    )
    # Identical weightings refit identically, and there are few distinct ones when the halves hold few groups: a
    # half of 4 groups resampled within itself can only be one of 35 multiplicities (of 200 replicates' 400
    # half weightings on 8 sequences, 61 are distinct; of their 200 weightings of all groups, 178). Each
    # distinct weighting is refitted once and the replicates take their rows back (``unique`` sorts the rows).
    halves = stats.halves.to(torch.float64)
    weights, replicate_row = torch.unique(weights, dim=0, return_inverse=True)
    half_weights, half_row = torch.unique(
        torch.cat([weights * (1 - halves), weights * halves]), dim=0, return_inverse=True
    )
    # heads are independent: a few at a time, every weighting, keeps the working tensors small enough for the
    # cache (and reads each head's statistics once)
    everything = torch.cat([weights, half_weights])
    per_block = max(1, REFIT_BLOCK_VALUES // (len(everything) * per_group.shape[2]))
    half_row = half_row.view(2, len(weights))
    blocks = [
        weighted_components(fit, stats, per_group[:, heads], everything, len(weights), half_row)
        for heads in torch.arange(per_group.shape[1]).split(per_block)
    ]
    return {name: torch.cat([block[name] for block in blocks], dim=1)[replicate_row] for name in blocks[0]}


def weighted_components(
    fit: Fitter,
    stats: HeadStatistics,
    per_group: torch.Tensor,
    weights: Float[torch.Tensor, "weighting group"],
    n_whole: int,
    half_row: Int[torch.Tensor, "2 replicate"],
) -> dict[str, torch.Tensor]:
    """:func:`components` for the heads of ``per_group`` and the first ``n_whole`` rows of
    ``weights``, from the statistics per group; the weightings of each half alone are rows
    ``n_whole + half_row[0]`` and ``n_whole + half_row[1]``.

    Every component is a variance or covariance of two absolute parts (t, z, the mask-only
    ``lam`` and the residual ``log A - lam``), each a dot product of k-coordinates: the four
    parts' coordinates (side by side in a :class:`Variant`) are multiplied once, all weightings and heads batched, into
    the 4 x 4 products of all the data with itself (in-sample) and of one half with the other
    (held out)."""
    n_pairs = fit.design.n_pairs
    variant = fit_variant(fit, stats, per_group, weights)
    both = variant.take(slice(0, n_whole))
    parts = [variant.take(n_whole + rows) for rows in half_row]

    def cov(a: Variant, b: Variant) -> torch.Tensor:
        """``[R, head, 4, 4]``: covariance over the analysed pairs of every part of ``a`` with every part of ``b``."""
        return (a.parts @ b.parts.transpose(-1, -2)).div_(n_pairs).sub_(a.means[..., :, None] * b.means[..., None, :])

    inside = cov(both, both)
    var_log_a = both.var_log_a
    var_t, var_z, cov_tz = inside[..., PART_T, PART_T], inside[..., PART_Z, PART_Z], inside[..., PART_T, PART_Z]
    out = {
        "R": var_t / var_log_a,
        "M": var_z / var_log_a,
        "C": -2 * cov_tz / var_log_a,
        "var_logA": var_log_a,
        "var_abs_t": var_t,
        "var_abs_z": var_z,
        "cov_abs_tz": cov_tz,
    }
    out["total"] = out["R"] + out["M"] + out["C"]
    out["R_rf"] = inside[..., PART_RES, PART_RES] / var_log_a
    out["M_rf"] = inside[..., PART_LAM, PART_LAM] / var_log_a
    out["C_rf"] = 2 * inside[..., PART_LAM, PART_RES] / var_log_a
    weight = 0.5 * (1 / parts[0].var_log_a + 1 / parts[1].var_log_a)  # NaN when a half is empty
    cross = cov(parts[0], parts[1]).mul_(weight[..., None, None])  # [half 0 part, half 1 part]
    out["R_heldout"] = cross[..., PART_T, PART_T]
    out["M_heldout"] = cross[..., PART_Z, PART_Z]
    out["C_heldout"] = -(cross[..., PART_T, PART_Z] + cross[..., PART_Z, PART_T])
    out["total_heldout"] = out["R_heldout"] + out["M_heldout"] + out["C_heldout"]
    out["R_rf_heldout"] = cross[..., PART_RES, PART_RES]
    out["M_rf_heldout"] = cross[..., PART_LAM, PART_LAM]
    out["C_rf_heldout"] = cross[..., PART_LAM, PART_RES] + cross[..., PART_RES, PART_LAM]
    return out
