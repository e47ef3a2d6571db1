"""The analysed (query, key) pairs of one sequence and their one-hot features: the design
matrix of the decomposition's fits, the same for every sequence of a prompt set.

Features: one bin per offset ``d = i - j`` (the relative model; every offset its own bin, so the
relative model can express any function of the offset), bins of the query position and of the key
position (exact below ``exact_until``, log-spaced beyond: the absolute model), and an intercept.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from jaxtyping import Float, Int

from lens_position.core.checks import check_count

KeySet = Literal["all", "no-bos"]


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
        return np.asarray(np.searchsorted(self.edges(length), positions, side="right") - 1)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class PairDesign:
    """The analysed (query, key) pairs of one sequence and their one-hot features.

    Feature columns: ``[offset 0..T-1 | query bins | key bins | intercept]``. The relative
    model uses the offset block and the intercept; the full model uses everything.

    Every query's analysed keys are a run ending at the query: the offsets ``0 .. max_offset``
    (causal attention, a sliding window, key 0 left out or not), so the design is held by its
    structure, ``O(T x bins)``: the reduction and the fits use only that. The explicit pairs, the
    dense design, its Gram matrix and the per-row feature sums (``O(T^2)``, for reference code and
    tests) are built on first use.
    """

    length: int
    window: int | None
    query_start: int
    query_stop: int
    keys: KeySet
    n_features: int
    key_set: torch.Tensor  # bool [query_stop-query_start, length]: j in K(i)
    analysed: torch.Tensor  # bool [query_stop-query_start, length]: (i, j) analysed
    analysed_per_query: Float[torch.Tensor, "query"]
    max_offset: Int[torch.Tensor, "query"]  # -1 for a query with no analysed key
    query_bin: Int[torch.Tensor, "query"]
    key_bin: Int[torch.Tensor, "key"]
    bin_edges: Int[torch.Tensor, "bin"]  # the left edge of every position bin
    key_bins_per_query: Float[torch.Tensor, "query bin"]  # how many of a query's analysed keys lie in each bin
    _built: dict[str, Any] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def n_pairs(self) -> int:
        return int(self.analysed_per_query.sum())

    @property
    def n_pos_bins(self) -> int:
        return int(self.bin_edges.numel())

    @classmethod
    def build(cls, length: int, window: int | None, query_start: int, query_stop: int,
              keys: KeySet, bins: PositionBins) -> PairDesign:
        i = torch.arange(query_start, query_stop)[:, None]
        j = torch.arange(length)[None, :]
        key_set = j <= i
        if window is not None:
            key_set = key_set & (j > i - window)
        analysed = key_set & (j > 0) if keys == "no-bos" else key_set
        per_query = analysed.sum(-1)
        edges = torch.from_numpy(bins.edges(length))
        queries = torch.arange(query_start, query_stop)
        first = (queries - per_query + 1).unsqueeze(1)  # the query's first analysed key
        ends = torch.cat([edges[1:], torch.tensor([length])]).unsqueeze(0)
        key_bins = (torch.minimum(queries.unsqueeze(1) + 1, ends) - torch.maximum(first, edges.unsqueeze(0)))
        return cls(length=length, window=window, query_start=query_start, query_stop=query_stop, keys=keys,
                   n_features=length + 2 * len(edges) + 1, key_set=key_set, analysed=analysed,
                   analysed_per_query=per_query.to(torch.float64), max_offset=per_query - 1,
                   query_bin=torch.from_numpy(bins.assign(queries.numpy(), length)),
                   key_bin=torch.from_numpy(bins.assign(np.arange(length), length)), bin_edges=edges,
                   key_bins_per_query=torch.where(per_query[:, None] > 0, key_bins.clamp(min=0), 0).to(torch.float64))

    def offset_counts(self) -> Float[torch.Tensor, "offset"]:
        """How many analysed pairs have each offset ``d`` (float64, ``[length]``): the queries whose
        offsets reach ``d``."""
        reach = self.max_offset[self.max_offset >= 0].cpu()
        per_top = torch.bincount(reach, minlength=self.length).to(torch.float64)
        return per_top.flip(0).cumsum(0).flip(0)

    def to(self, device: torch.device | str) -> PairDesign:
        """This design with its tensors on ``device`` (the scores' device)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if f.init and isinstance(getattr(self, f.name), torch.Tensor)})

    # ------------------------------------------------------------------ explicit pairs, built on first use

    def _pairs(self) -> dict[str, Any]:
        if not self._built:
            query, key = (x.reshape(-1) for x in torch.broadcast_tensors(
                torch.arange(self.query_start, self.query_stop)[:, None], torch.arange(self.length)[None, :]))
            keep = self.analysed.cpu().reshape(-1)
            query, key = query[keep], key[keep]
            n_bins = self.n_pos_bins
            columns = torch.stack([query - key, self.length + self.query_bin.cpu()[query - self.query_start],
                                   self.length + n_bins + self.key_bin.cpu()[key],
                                   torch.full_like(query, self.n_features - 1)], dim=1)
            self._built.update(query=query, key=key, columns=columns)
        return self._built

    @property
    def query(self) -> Int[torch.Tensor, "pair"]:
        return self._pairs()["query"]

    @property
    def key(self) -> Int[torch.Tensor, "pair"]:
        return self._pairs()["key"]

    @property
    def flat(self) -> Int[torch.Tensor, "pair"]:
        """Each pair's index in a row-major ``[query rows, length]`` block: ``(i - query_start) * length + j``."""
        return (self.query - self.query_start) * self.length + self.key

    @property
    def columns(self) -> Int[torch.Tensor, "pair 4"]:
        """The feature index of each pair in each one-hot group."""
        return self._pairs()["columns"]

    @property
    def relative(self) -> Int[torch.Tensor, "rel_feature"]:
        """The relative model's features: the offsets and the intercept."""
        return torch.cat([torch.arange(self.length), torch.tensor([self.n_features - 1])])

    @property
    def gram(self) -> Float[torch.Tensor, "feature feature"]:
        """``X'X`` of one sequence, float64 (``n_features^2``: reference code only)."""
        n, columns = self.n_features, self.columns
        gram = torch.zeros(n * n, dtype=torch.float64)
        ones = torch.ones(len(columns), dtype=torch.float64)
        for a in range(4):
            for b in range(4):
                gram.index_add_(0, columns[:, a] * n + columns[:, b], ones)
        return gram.view(n, n)

    @property
    def row_features(self) -> Float[torch.Tensor, "query feature"]:
        """Per query row, the sum of ``X`` over its pairs (reference code only)."""
        rows = torch.zeros(self.query_stop - self.query_start, self.n_features, dtype=torch.float64)
        for a in range(4):
            rows.index_put_((self.query - self.query_start, self.columns[:, a]),
                            torch.ones(self.n_pairs, dtype=torch.float64), accumulate=True)
        return rows

    def dense(self) -> Float[torch.Tensor, "pair feature"]:
        """The explicit design matrix ``X`` of one sequence (float64; for reference code)."""
        x = torch.zeros(self.n_pairs, self.n_features, dtype=torch.float64)
        for a in range(4):
            x[torch.arange(self.n_pairs), self.columns[:, a]] = 1.0
        return x
