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
              keys: KeySet, bins: PositionBins) -> PairDesign:
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

    def to(self, device: torch.device | str) -> PairDesign:
        """This design with its tensors on ``device`` (the scores' device)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})

    def dense(self) -> Float[torch.Tensor, "pair feature"]:
        """The explicit design matrix ``X`` of one sequence (float64; for reference code)."""
        x = torch.zeros(self.n_pairs, self.n_features, dtype=torch.float64)
        for a in range(4):
            x[torch.arange(self.n_pairs), self.columns[:, a]] = 1.0
        return x
