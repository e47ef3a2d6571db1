"""The fitter computed from the design's structure (``O(T x bins)``) against the dense pseudo-inverses it
replaced (``tests/helpers/dense_fitter.py``, ``O(T^3)``): the same components for every key set a
decomposition builds (causal or a window, key 0 analysed or not, any range of queries), on statistics
of random targets, and the same offset-only fit."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.engine.design import PairDesign, PositionBins
from lens_position.analyses.engine.fit import Fitter, components
from lens_position.analyses.engine.statistics import HeadStatistics
from tests.helpers.dense_fitter import DenseFitter
from tests.helpers.design_strategies import key_set_shapes

pytestmark = pytest.mark.tl4


def _statistics(design: PairDesign, seed: int, n_groups: int = 4, n_heads: int = 2) -> HeadStatistics:
    """Statistics of random targets with a key trend (so that the absolute parts are not zero)."""
    generator = torch.Generator().manual_seed(seed)
    x, rows = design.dense(), design.query - design.query_start
    stats = HeadStatistics.zeros(n_heads, design.n_features, design.query_stop - design.query_start, n_groups)
    for group in range(n_groups):
        for head in range(n_heads):
            t = torch.randn(design.n_pairs, generator=generator, dtype=torch.float64) + design.key.double().sqrt()
            z = torch.randn(design.n_pairs, generator=generator, dtype=torch.float64)
            stats.xty_t[group, head], stats.xty_z[group, head] = x.T @ t, x.T @ z
            stats.row_t[group, head] = torch.zeros(len(stats.row_t[group, head]), dtype=torch.float64).index_add_(
                0, rows, t)
            stats.sum_y[group, head], stats.sum_y2[group, head] = t.sum(), (t * t).sum() + 100.0
        stats.n_sequences[group] = 1.0
    return stats


@st.composite
def _designs(draw):
    shape = draw(key_set_shapes(min_length=3, max_length=48, min_window=2, min_queries=2))
    exact = draw(st.sampled_from([4, 16]))
    return PairDesign.build(*shape, PositionBins(exact_until=exact, per_octave=2))


@settings(max_examples=40, deadline=None)
@given(_designs(), st.integers(0, 2**16))
def test_the_structured_fit_gives_the_dense_fits_components(design, seed):
    stats = _statistics(design, seed)
    weights = torch.randint(0, 3, (3, stats.n_groups), generator=torch.Generator().manual_seed(seed)).double()
    weights[0] = 1.0
    ours, dense = components(Fitter(design), stats, weights), components(DenseFitter(design), stats, weights)
    for name, value in dense.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-7, atol=1e-9, equal_nan=True, msg=name)


@pytest.mark.parametrize("window, query_start, keys", [(None, 0, "all"), (32, 0, "all"), (None, 1, "no-bos")])
def test_at_the_reproductions_length_the_components_are_the_dense_fits(window, query_start, keys):
    """T = 128 with the default bins: the decomposition's numbers as the dense fitter gave them."""
    design = PairDesign.build(128, window, query_start, 128, keys, PositionBins())
    stats = _statistics(design, 7, n_groups=6, n_heads=3)
    weights = torch.randint(0, 3, (20, 6), generator=torch.Generator().manual_seed(1)).double()
    ours, dense = components(Fitter(design), stats, weights), components(DenseFitter(design), stats, weights)
    for name, value in dense.items():
        torch.testing.assert_close(ours[name], value, rtol=1e-8, atol=1e-10, equal_nan=True, msg=name)


@settings(max_examples=40, deadline=None)
@given(_designs(), st.integers(0, 2**16))
def test_the_offset_fit_has_the_dense_fits_values_on_every_pair(design, seed):
    """``g`` is fixed up to a constant (the per-query constants take it): the fitted values
    ``g(i - j) + c(i)`` are the same, and so is ``lam``."""
    stats = _statistics(design, seed, n_groups=1, n_heads=1)
    b, row_t = stats.xty_t[0, 0, :design.length], stats.row_t[0, 0]
    offsets, rows = design.query - design.key, design.query - design.query_start
    sizes = design.analysed_per_query.clamp(min=1)

    def fitted(g):  # c(i) = (sum of t over the row - sum of g over the row's offsets) / n_i
        c = (row_t - torch.zeros_like(row_t).index_add_(0, rows, g[offsets])) / sizes
        return g[offsets] + c[rows]

    torch.testing.assert_close(fitted(Fitter(design).offset_fit(b, row_t)),
                               fitted(DenseFitter(design).offset_fit(b, row_t)), rtol=1e-8, atol=1e-8)


def test_a_long_design_holds_no_matrix_of_its_length_squared():
    """At T = 4096 the design and its fit keep only ``O(T x bins)`` numbers (and the key set's two boolean
    masks); the dense pairs, design and Gram matrix are built only if a reference asks."""
    design = PairDesign.build(4096, None, 0, 4096, "all", PositionBins())
    fit = Fitter(design)
    numbers = [v for v in (*vars(design).values(), *vars(fit).values()) if isinstance(v, torch.Tensor)
               and v.dtype != torch.bool]
    assert max(v.numel() for v in numbers) < 4096 * 200
    assert design._built == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.booleans(), max_size=40))
def test_the_runs_of_masked_columns_are_found_in_one_pass(flags):
    from lens_position.analyses.engine.statistics import _runs

    expected: list[tuple[int, int]] = []
    for k, flag in enumerate(flags):
        if flag and expected and expected[-1][1] == k:
            expected[-1] = (expected[-1][0], k + 1)
        elif flag:
            expected.append((k, k + 1))
    assert _runs(torch.tensor(flags, dtype=torch.bool)) == expected
