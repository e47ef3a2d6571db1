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
        for a, b in (
            (offsets, offsets),
            (offsets, n_off + rows),
            (n_off + rows, offsets),
            (n_off + rows, n_off + rows),
        ):
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
    offset_fit = torch.cat([stats.xty_t[..., :n_off], stats.row_t], dim=-1) @ fit.offsets_fit  # g per group
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
