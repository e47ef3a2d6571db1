"""The decomposition's fitter as first written: dense pseudo-inverses of the whole Gram matrix of the
design and of the offset-only fit with one constant per query (``O(T^3)`` time, ``O(T^2)`` memory).
Kept as a test-only reference for :class:`lens_position.analyses.engine.fit.Fitter`, which computes
the same quantities from the design's structure."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lens_position.analyses.engine.design import PairDesign

_RANK_TOLERANCE = 1e-10


@dataclass
class DenseFitter:
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

    def offset_fit(self, xty_offsets: torch.Tensor, row_sums: torch.Tensor) -> torch.Tensor:
        """``g`` of the offset-only fit up to a per-query constant: the minimum-norm solution."""
        return torch.cat([xty_offsets, row_sums], dim=-1) @ self.offsets_fit
