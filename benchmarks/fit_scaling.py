"""The decomposition's fit against sequence length T: the fitter built from the design's structure
against the dense pseudo-inverses it replaced (``tests/helpers/dense_fitter.py``), in the same run.

For each T it builds the design of a causal layer (every query, every key), its fitter both ways, and
refits the components of 9 heads (SmolLM2's) over 16 groups of sequences and 200 bootstrap
weightings on random statistics; prints the seconds of each part, the ratio dense / structured and
the largest difference of each component relative to its largest value. The dense fitter is run up to ``--dense-up-to``
(its time grows as T^3 and its memory as T^2: about 15 s and 1 GiB at T = 2048).

    python benchmarks/fit_scaling.py                          # T = 128 512 2048 8192
    python benchmarks/fit_scaling.py --T 128 1024 --dense-up-to 1024
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lens_position.analyses.engine.design import PairDesign, PositionBins  # noqa: E402
from lens_position.analyses.engine.fit import Fitter, components  # noqa: E402
from lens_position.analyses.engine.statistics import HeadStatistics  # noqa: E402
from tests.helpers.dense_fitter import DenseFitter  # noqa: E402

GROUPS, HEADS, REPLICATES = 16, 9, 200


def _statistics(design: PairDesign, from_pairs: bool) -> HeadStatistics:
    """Statistics of random targets on the pairs (``from_pairs``: the dense comparison needs sums that
    targets can have, ``X'y`` in the range of ``X'``), or, for timing alone, random sums that agree
    where the offset-only fit needs them to (per offset, per query and in all)."""
    generator = torch.Generator().manual_seed(0)
    shape, n_off = (GROUPS, HEADS), design.length
    n_rows = design.query_stop - design.query_start
    if from_pairs:
        xty = [torch.zeros(*shape, design.n_features, dtype=torch.float64) for _ in range(2)]
        row_t = torch.zeros(*shape, n_rows, dtype=torch.float64)
        rows = design.query - design.query_start
        for group in range(GROUPS):
            for head in range(HEADS):
                t, z = torch.randn(2, design.n_pairs, generator=generator, dtype=torch.float64)
                t += design.key.double().sqrt()
                for part, y in zip(xty, (t, z)):
                    for a in range(4):
                        part[group, head].index_add_(0, design.columns[:, a], y)
                row_t[group, head].index_add_(0, rows, t)
    else:
        row_t = torch.randn(*shape, n_rows, generator=generator, dtype=torch.float64) * design.analysed_per_query
        xty = [torch.randn(*shape, design.n_features, generator=generator, dtype=torch.float64) for _ in range(2)]
        for part in xty:
            part[..., -1] = row_t.sum(-1)
            part[..., 0] += part[..., -1] - part[..., :n_off].sum(-1)  # the offsets' sums add up to the total
    return HeadStatistics(xty[0], xty[1], row_t, row_t.sum(-1), row_t.pow(2).sum(-1) + 1e6,
                          torch.ones(GROUPS, dtype=torch.float64))


def _timed(make, stats: HeadStatistics, weights: torch.Tensor) -> tuple[float, float, dict[str, torch.Tensor]]:
    started = time.perf_counter()
    fit = make()
    built = time.perf_counter()
    result = components(fit, stats, weights)
    return built - started, time.perf_counter() - built, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, nargs="+", default=[128, 512, 2048, 8192])
    parser.add_argument("--dense-up-to", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    weights = torch.randint(0, 3, (REPLICATES, GROUPS), generator=torch.Generator().manual_seed(1)).double()
    print(f"one causal layer, {HEADS} heads, {GROUPS} groups, {REPLICATES} replicates, {args.threads} thread(s)")
    print(f"{'T':>6} {'design s':>9} {'fitter s':>9} {'refit s':>8} {'dense fitter s':>15} {'dense refit s':>14} "
          f"{'dense/ours':>11} {'max diff':>13}")
    for length in args.T:
        started = time.perf_counter()
        design = PairDesign.build(length, None, 0, length, "all", PositionBins())
        design_s = time.perf_counter() - started
        stats = _statistics(design, from_pairs=length <= args.dense_up_to)
        build, refit, ours = _timed(lambda: Fitter(design), stats, weights)  # noqa: B023
        row = f"{length:>6} {design_s:>9.2f} {build:>9.2f} {refit:>8.2f}"
        if length <= args.dense_up_to:
            dense_build, dense_refit, dense = _timed(lambda: DenseFitter(design), stats, weights)  # noqa: B023
            worst = max(float((ours[k] - dense[k]).abs().nan_to_num().max() / dense[k].abs().nan_to_num().max())
                        for k in dense)
            ratio = (dense_build + dense_refit) / (build + refit)
            row += f" {dense_build:>15.2f} {dense_refit:>14.2f} {ratio:>10.0f}x {worst:>13.1e}"
        print(row)


if __name__ == "__main__":
    main()
