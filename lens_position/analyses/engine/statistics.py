"""The decomposition's streamed statistics: each batch of scores reduced to float64 sums, per
group of sequences, and the check that the scores show exactly the key set the design expects.

For one layer and one head the scores ``s[i, j]`` become ``t = s - s[i, i]``, ``z = logsumexp_K(i) t``
and ``log A = t - z``; least squares over every (sequence, query, key) triple then needs only
``X'y`` per group (``X`` the :class:`~lens_position.analyses.engine.design.PairDesign`, the same for every
sequence), the row sums of ``t`` and the sums of ``log A`` and its square. Memory is
``O(layers x heads x features)`` whatever the number of sequences.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from jaxtyping import Float, Int

from lens_position.analyses.engine.design import PairDesign
from lens_position.analyses.engine.kernels import fast_exp
from lens_position.ground.errors import NonFiniteError, UnsupportedArchitectureError


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

    def to(self, device: torch.device | str) -> HeadStatistics:
        """These statistics on ``device`` (the group sizes stay on the CPU)."""
        return HeadStatistics(self.xty_t.to(device), self.xty_z.to(device), self.row_t.to(device),
                              self.sum_y.to(device), self.sum_y2.to(device), self.n_sequences)

    @classmethod
    def zeros(cls, n_heads: int, n_features: int, n_queries: int, n_groups: int = 2, *,
              t_only: bool = False) -> HeadStatistics:
        """Zero statistics; ``t_only``: for a :class:`Target` that sums ``t`` alone, ``xty_z`` and
        ``row_t`` empty (no feature, no query: a third of the memory, which grows with T)."""
        z = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
        return cls(z(n_groups, n_heads, n_features), z(n_groups, n_heads, 0 if t_only else n_features),
                   z(n_groups, n_heads, 0 if t_only else n_queries), z(n_groups, n_heads), z(n_groups, n_heads),
                   z(n_groups))

    @property
    def n_groups(self) -> int:
        return int(self.n_sequences.shape[0])

    @classmethod
    def side_by_side(cls, layers: Sequence[HeadStatistics]) -> HeadStatistics:
        """Several layers' statistics (same sequences, same features) as one layer whose heads are
        theirs one after the other, so that one refit serves them all."""
        xty_t, xty_z, row_t, sum_y, sum_y2 = (torch.cat([getattr(stats, name) for stats in layers], dim=1)
                                              for name in ("xty_t", "xty_z", "row_t", "sum_y", "sum_y2"))
        return cls(xty_t, xty_z, row_t, sum_y, sum_y2, layers[0].n_sequences)

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
BLOCK_ROWS = 32


def _runs(flags: torch.Tensor) -> list[tuple[int, int]]:
    """``(start, stop)`` of every run of consecutive True values in the boolean vector ``flags``
    (found by comparing neighbours in one pass, not one Python step per value: a block's keys reach
    the sequence's length)."""
    padded = torch.nn.functional.pad(flags.to(torch.int8).cpu(), (1, 1))
    edges = torch.nonzero(padded[1:] != padded[:-1]).flatten().tolist()
    return list(zip(edges[::2], edges[1::2]))


class Workspace:
    """Float64 buffers reused by every batch's reduction. Allocating them anew for each block of scores
    cost more than the arithmetic on them (fresh pages from the system, each time)."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}
        self._blocks: dict[tuple[int, int, int, int, str], tuple[PairDesign, _RowBlock]] = {}

    def row_block(self, design: PairDesign, first_row: int, stop_row: int, n_batch: int,
                  device: torch.device) -> _RowBlock:
        """:meth:`_RowBlock.of`, made once per design, rows, batch size and device: every layer that
        shares a design, and every batch, reduces the same blocks (the design is held with it, so
        its id is not reused)."""
        key = (id(design), first_row, stop_row, n_batch, str(device))
        kept = self._blocks.get(key)
        if kept is None or kept[0] is not design:
            kept = self._blocks[key] = (design, _RowBlock.of(design, first_row, stop_row, n_batch, device))
        return kept[1]

    def buffer(self, name: str, shape: Sequence[int], device: torch.device) -> torch.Tensor:
        """An uninitialised float64 tensor of ``shape`` on ``device``, the same memory on every call."""
        size = int(np.prod(shape))
        kept = self._buffers.get(name)
        if kept is None or kept.numel() < size or kept.device != device:
            kept = self._buffers[name] = torch.empty(size, dtype=torch.float64, device=device)
        return kept[:size].view(*shape)


@dataclass(frozen=True)
class Target:
    """Where one of a :class:`ScoreSets`' score tensors is reduced: its statistics, and whether only
    ``X't`` is wanted (``t_only``: ``xty_t`` alone, no softmax normaliser, about half the work;
    ``xty_z``, ``row_t``, ``sum_y`` and ``sum_y2`` are left as they are, and may be empty
    (``HeadStatistics.zeros(..., t_only=True)``), so such statistics serve a fit of ``t`` alone,
    never :func:`~lens_position.analyses.engine.fit.components`)."""

    stats: HeadStatistics
    t_only: bool = False


class ScoreSets(Protocol):
    """Several score tensors of one shape that :func:`reduce_score_sets` reads together, one block at a
    time, computed on demand instead of held whole (a ``[batch, head, query, key]`` float64 tensor per
    derived score is T² per head: 19 GB for SmolLM2's nine heads in four bands at T = 8192)."""

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``[batch, head, query, key]``."""
        ...

    @property
    def device(self) -> torch.device:
        ...

    def blocks(self, heads: slice, queries: slice, keys: slice
               ) -> Iterator[tuple[int, Float[torch.Tensor, "batch head query key"]]]:
        """For ``heads``, the absolute query positions ``queries`` and keys ``keys``: every target's
        scores, as ``(index into the targets, scores)``, one at a time (each may be freed once read)."""
        ...


@dataclass
class _Whole:
    """One score tensor, held whole, as :class:`ScoreSets` of one target."""

    scores: torch.Tensor

    @property
    def shape(self) -> tuple[int, int, int, int]:
        batch, heads, queries, keys = self.scores.shape
        return batch, heads, queries, keys

    @property
    def device(self) -> torch.device:
        return self.scores.device

    def blocks(self, heads: slice, queries: slice, keys: slice) -> Iterator[tuple[int, torch.Tensor]]:
        yield 0, self.scores[:, heads, queries, keys]


def reduce_scores(scores: Float[torch.Tensor, "batch head query key"], design: PairDesign,
                  group_of_row: Int[torch.Tensor, "batch"], stats: HeadStatistics,
                  workspace: Workspace | None = None) -> None:
    """Add one batch's statistics to ``stats``; batch row ``b`` belongs to group
    ``group_of_row[b]``.

    Each block of scores is copied once into a float64 buffer as ``t = s - s[i, i]``; ``z`` is
    ``log sum exp t`` over the key set (about the diagonal, where ``t = 0``, so the sum is at least
    1 and no row maximum is needed), ``log A = t - z``. Rows of the same group are summed first
    (every statistic is linear in ``t`` and ``z``), so the cost per batch grows with the number of
    distinct groups in it, not with the number of groups kept. Queries are processed in blocks of
    rows, each over the keys its rows can see (the others are masked and add nothing, whatever
    value they hold: the design's key set decides, not the scores), and heads a few at a time so
    that each float64 buffer stays in cache; the per-offset sums are read along the block's
    diagonals (a strided view) instead of scattered cell by cell.
    """
    reduce_score_sets(_Whole(scores), design, group_of_row, [Target(stats)], workspace)


def reduce_score_sets(sets: ScoreSets, design: PairDesign, group_of_row: Int[torch.Tensor, "batch"],
                      targets: Sequence[Target], workspace: Workspace | None = None) -> None:
    """:func:`reduce_scores` of several score tensors read together block by block (``sets`` yields,
    for each block, the scores of every target in turn): whatever one block of one tensor needs
    computing (bands of a rotary split, the scores less one of them) is computed once and reduced into
    each statistics that reads it. Cells outside the design's key set are never read for their value."""
    workspace = workspace if workspace is not None else Workspace()
    n_batch, n_heads = sets.shape[:2]
    n_rows, device = design.query_stop - design.query_start, sets.device
    rows_per_block = BLOCK_ROWS if device.type == "cpu" else n_rows
    groups = _Groups.of(group_of_row, device)
    for first_row in range(0, n_rows, rows_per_block):
        block = workspace.row_block(design, first_row, min(first_row + rows_per_block, n_rows), n_batch, device)
        queries = slice(design.query_start + block.rows.start, design.query_start + block.rows.stop)
        for first in range(0, n_heads, block.chunk):
            heads = slice(first, min(first + block.chunk, n_heads))
            for index, cells in sets.blocks(heads, queries, block.keys):
                _reduce_block(cells, design, block, groups, targets[index], heads, workspace)
    counts = torch.bincount(groups.inverse.cpu(), minlength=len(groups.groups)).to(torch.float64)
    for stats in {id(target.stats): target.stats for target in targets}.values():
        stats.n_sequences.index_add_(0, groups.groups, counts)


@dataclass
class _Groups:
    """The groups of a batch's rows: the distinct ``groups``, each row's index among them (``inverse``),
    and the statistics' rows they update (``to``: a slice when they are consecutive, an in-place add
    with no gather and scatter)."""

    groups: torch.Tensor
    inverse: torch.Tensor
    one_per_row: bool
    in_order: bool
    to: slice | torch.Tensor

    @classmethod
    def of(cls, group_of_row: torch.Tensor, device: torch.device) -> _Groups:
        groups, inverse = torch.unique(group_of_row.cpu(), return_inverse=True)
        one_per_row = len(groups) == len(group_of_row)
        in_order = one_per_row and torch.equal(inverse, torch.arange(len(group_of_row)))  # consecutive: no copy
        consecutive = int(groups[-1] - groups[0]) + 1 == len(groups)
        to = slice(int(groups[0]), int(groups[-1]) + 1) if consecutive else groups
        return cls(groups, inverse.to(device), one_per_row, in_order, to)

    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the rows of ``x`` that share a group: ``[distinct groups, ...]``."""
        if self.in_order:
            return x
        if self.one_per_row:
            return x[torch.argsort(self.inverse)]
        return torch.zeros((len(self.groups), *x.shape[1:]), dtype=x.dtype, device=x.device).index_add_(
            0, self.inverse, x)


@dataclass
class _RowBlock:
    """A block of query rows and the keys they can see, with what its reduction needs of the design:
    the key columns with a hidden cell (and there 1.0 where a key is shown: multiplying is 4x faster
    than masked_fill_, and exp(t) is finite there), the shown keys left out of the analysis (key 0
    with keys="no-bos"), and where the per-offset sums lie. An offset up to the block's first query's
    (``top_offset``) is seen by every row of the block, one cell per row along a diagonal; larger
    offsets lie in the strict lower triangle of the first columns."""

    rows: slice
    keys: slice
    chunk: int  # heads reduced together
    count: torch.Tensor
    hidden: torch.Tensor
    hidden_runs: list[tuple[int, int, torch.Tensor, torch.Tensor]]
    unanalysed_runs: list[tuple[int, int, torch.Tensor]]
    top_offset: int
    tri_cells: torch.Tensor
    tri_offsets: torch.Tensor
    query_bins: torch.Tensor  # the position bin of each row's query
    key_bins: torch.Tensor  # the position bin of each key column
    reach: torch.Tensor  # each row's largest analysed offset (0 for a row with none, whose sums are 0)
    reach_top: int  # the largest of them (-1: no row has an analysed key)

    @classmethod
    def of(cls, design: PairDesign, first_row: int, stop_row: int, n_batch: int, device: torch.device) -> _RowBlock:
        rows = slice(first_row, stop_row)
        first_query = design.query_start + first_row
        window = design.window if design.window is not None else design.length
        keys = slice(max(0, first_query - window + 1), design.query_start + stop_row)  # K(i) of its queries
        hidden = ~design.key_set[rows, keys]  # the mask's cells
        unanalysed = ~design.analysed[rows, keys] & ~hidden
        n_block, n_keys = stop_row - first_row, keys.stop - keys.start
        top_offset = first_query - keys.start
        tri_row, tri_key = torch.tril_indices(n_block, n_block, offset=-1, device=device)
        count = design.analysed_per_query[rows]
        return cls(rows=rows, keys=keys, chunk=max(1, _CHUNK_BYTES // (n_batch * n_block * n_keys * 8)),
                   count=count, hidden=hidden,
                   hidden_runs=[(a, b, hidden[:, a:b], (~hidden[:, a:b]).to(torch.float64))
                                for a, b in _runs(hidden.any(0))],
                   unanalysed_runs=[(a, b, unanalysed[:, a:b]) for a, b in _runs(unanalysed.any(0))],
                   top_offset=top_offset, tri_cells=tri_row * n_keys + tri_key,
                   tri_offsets=top_offset + tri_row - tri_key, query_bins=design.query_bin[rows],
                   key_bins=design.key_bin[keys], reach=design.max_offset[rows].clamp(min=0),
                   reach_top=int(count.max()) - 1 if n_block else -1)


def _reduce_block(block: torch.Tensor, design: PairDesign, rb: _RowBlock, groups: _Groups, target: Target,
                  heads: slice, workspace: Workspace) -> None:
    """Add the statistics of one block of scores (some heads, a block of rows and its keys)."""
    device, stats = block.device, target.stats
    diagonal = block.diagonal(offset=rb.top_offset, dim1=-2, dim2=-1).to(torch.float64)
    # float64, in a buffer of the workspace (the scores untouched)
    t = torch.sub(block, diagonal[..., None], out=workspace.buffer("t", block.shape, device))
    # the mask's cells to 0 before exp: exp of -inf or of finfo.min (a mask) takes its slow path, 2.5-6x
    # the time of exp on finite values; exp(t) is then zeroed there, exactly the 0 exp(-inf) gives
    for a, b, cells, _ in rb.hidden_runs:
        t[..., a:b].masked_fill_(cells, 0.0)
    to, target_device = groups.to, stats.xty_t.device
    if not target.t_only:
        z = _normaliser(t, rb, workspace)
        row_t2 = _unanalysed_to_zero(t, rb)
        stats.xty_z[to, heads] += _xty_z(groups.sum(z), design, rb).to(target_device)
    else:
        _unanalysed_to_zero(t, rb, squares=False)
    row_t = t.sum(-1)
    if not target.t_only:
        sum_y = (row_t - rb.count * z).sum(-1)  # log A = t - z; [batch, head]
        sum_y2 = (row_t2 - 2 * z * row_t + rb.count * z * z).sum(-1)
        stats.sum_y[to, heads] += groups.sum(sum_y).to(target_device)
        stats.sum_y2[to, heads] += groups.sum(sum_y2).to(target_device)
    t_sum = groups.sum(t).contiguous()  # [group, head, rows, keys]
    row_sum = groups.sum(row_t)
    n_off, n_bins = design.length, design.n_pos_bins
    xty_t = torch.zeros(*row_sum.shape[:2], design.n_features, dtype=torch.float64, device=device)
    xty_t[..., n_off:n_off + n_bins].index_add_(2, rb.query_bins, row_sum)  # each row's query bin
    xty_t[..., n_off + n_bins:-1].index_add_(2, rb.key_bins, t_sum.sum(-2))  # each key's bin
    xty_t[..., -1] = row_sum.sum(-1)
    size, stride = t_sum.shape, t_sum.stride()
    along = t_sum.as_strided((*size[:2], size[2], rb.top_offset + 1), (*stride[:2], size[3] + 1, 1))
    xty_t[..., :rb.top_offset + 1] += along.sum(-2).flip(-1)
    xty_t[..., :design.length].index_add_(2, rb.tri_offsets, t_sum.flatten(2)[..., rb.tri_cells])
    # the sums stay where the statistics are (the scores' device; back on the CPU in result())
    stats.xty_t[to, heads] += xty_t.to(target_device)
    if not target.t_only:
        stats.row_t[to, heads, rb.rows] += row_sum.to(target_device)


def _normaliser(t: torch.Tensor, rb: _RowBlock, workspace: Workspace) -> Float[torch.Tensor, "batch head row"]:
    """``z = log sum exp t`` over each row's key set (``t`` with the mask's cells at 0)."""
    exp = fast_exp(t, out=workspace.buffer("exp", t.shape, t.device))
    for a, b, _, shown in rb.hidden_runs:
        exp[..., a:b].mul_(shown)
    z = exp.sum(-1).log_()  # about the diagonal
    if not torch.isfinite(z).all():  # exp overflowed (a score more than ~700 above its diagonal)
        z = torch.logsumexp(t.masked_fill(rb.hidden, -torch.inf), dim=-1)
    return z


def _unanalysed_to_zero(t: torch.Tensor, rb: _RowBlock, squares: bool = True
                        ) -> Float[torch.Tensor, "batch head row"] | None:
    """Set the shown keys left out of the analysis to 0 in ``t``; with ``squares``, return each row's
    sum of ``t**2``."""
    for a, b, cells in rb.unanalysed_runs:
        t[..., a:b].masked_fill_(cells, 0.0)
    return torch.einsum("bhqk,bhqk->bhq", t, t) if squares else None  # a batched matmul: 10x faster than (t*t).sum


def _xty_z(z: Float[torch.Tensor, "group head row"], design: PairDesign, rb: _RowBlock
           ) -> Float[torch.Tensor, "group head feature"]:
    """``X'z`` of a block's rows, ``z`` constant along each row: a row's pairs are its offsets
    ``0 .. m_i`` (so ``z_i`` on every offset up to its largest, a reverse cumulative sum), ``n_i``
    times its query bin and the intercept, and its keys' bins (``key_bins_per_query``)."""
    n_off, n_bins = design.length, design.n_pos_bins
    out = torch.zeros(*z.shape[:2], design.n_features, dtype=torch.float64, device=z.device)
    if rb.reach_top < 0:
        return out
    weighted = z * rb.count
    at_top = torch.zeros(*z.shape[:2], rb.reach_top + 1, dtype=torch.float64, device=z.device)
    at_top.index_add_(2, rb.reach, torch.where(rb.count > 0, z, 0.0))
    out[..., :rb.reach_top + 1] = at_top.flip(-1).cumsum(-1).flip(-1)
    out[..., n_off:n_off + n_bins].index_add_(2, rb.query_bins, weighted)
    out[..., n_off + n_bins:-1] = z @ design.key_bins_per_query[rb.rows]
    out[..., -1] = weighted.sum(-1)
    return out


def visible_keys(scores: torch.Tensor) -> torch.Tensor:
    """Which cells of ``scores`` the mask leaves visible: masked cells are ``-inf`` (HookedTransformer,
    a bridge in compatibility mode) or the dtype's most negative value (``finfo.min``, a bridge
    outside it); anything at or below half of it is masked."""
    return torch.isfinite(scores) & (scores > torch.finfo(scores.dtype).min / 2)


def shows_key_set(scores: Float[torch.Tensor, "batch head query key"], design: PairDesign) -> bool:
    """Whether :func:`visible_keys` of ``scores`` (the design's query rows) is exactly ``design.key_set``
    for every prompt and head, decided by reductions over rectangles instead of boolean tensors.

    Rows are taken in blocks; for a block, the columns every row sees (its first query's and earlier,
    inside the last query's window) must have all scores finite and above ``finfo.min / 2``
    (``aminmax``), the columns no row sees (after its last query, or before its first query's window)
    all scores at or below it, ``-inf`` included (``amax``); the few columns in between, the block's
    diagonal band (and a window's edge), are compared cell by cell, where a hidden key's score must also
    not be NaN or ``+inf`` (stricter than :func:`visible_keys`, which calls those masked). One read of each score
    instead of
    five passes that each write a ``batch x head x T x T`` boolean: 0.9 s of a 22 s decomposition of
    SmolLM2 at T=256, N=16 before. NaN anywhere fails a reduction's comparison, so it is never taken
    for a key set."""
    threshold = torch.finfo(scores.dtype).min / 2
    s = scores[:, :, design.query_start:design.query_stop]
    n_rows, length = s.shape[2], s.shape[3]
    window = design.window if design.window is not None else length + design.query_stop
    key_set = design.key_set.to(s.device)
    for first_row in range(0, n_rows, BLOCK_ROWS):
        last_row = min(first_row + BLOCK_ROWS, n_rows)
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


def check_key_set(scores: torch.Tensor, design: PairDesign, layer: int, rows: torch.Tensor | None = None) -> None:
    """Every head of every prompt must see exactly the key set ``design`` expects. A departure
    shared by all heads and prompts is the model's mask (masked cells: :func:`visible_keys`); one
    confined to some of them is an infinite score (non-finite weights, or overflow), named with its head and prompt."""
    if shows_key_set(scores, design):
        return
    visible = visible_keys(scores[:, :, design.query_start:design.query_stop])
    key_set = design.key_set.to(visible.device)
    if bool((visible == key_set).all()):  # then a hidden key's score is NaN or +inf: the softmax row is NaN
        s = scores[:, :, design.query_start:design.query_stop]
        batch, head, query, key = (int(i) for i in ((s.isnan() | (s == torch.inf)) & ~key_set).nonzero()[0].tolist())
        prompt = int(rows[batch]) if rows is not None else batch
        raise NonFiniteError(
            f"layer {layer}, head {head}, prompt {prompt}: the score of query {design.query_start + query} on key "
            f"{key} "
            f"is {float(s[batch, head, query, key])} where the mask hides that key (a masked score must be -inf or "
            "very negative); its attention row is not a softmax over the visible keys. Likely cause: a hook that "
            "writes scores after the mask, non-finite weights, or overflow in float16/bfloat16 (run in float32)"
        )
    same_everywhere = bool((visible == visible[:1, :1]).all())
    if same_everywhere:
        raise UnsupportedArchitectureError(
            f"layer {layer}: the attention mask in hook_attn_scores is not the causal/sliding-window "
            f"key set lens_position expects (window={design.window}); decompose only supports "
            "unpadded causal or sliding-window attention"
        )
    batch, head, query, key = (int(i) for i in (visible != key_set).nonzero()[0].tolist())
    prompt = int(rows[batch]) if rows is not None else batch
    raise NonFiniteError(
        f"layer {layer}, head {head}, prompt {prompt}: the score of query {design.query_start + query} on key {key} "
        "is infinite where the mask shows that key (the other heads see the expected key set); likely cause: "
        "non-finite weights in that head's W_Q/W_K, or overflow in float16/bfloat16 (run in float32)"
    )
