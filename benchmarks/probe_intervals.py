"""The position probe's R² intervals on a real model: what the refit costs, and whether the
intervals are as wide as the spread between disjoint prompt sets.

    python benchmarks/probe_intervals.py                                  # SmolLM2-135M, 4 sets
    python benchmarks/probe_intervals.py --model gemma3-270m --sets 4 --layers 1 5 10 15

For each of ``--sets`` disjoint prompt sets of N natural-text windows (T positions;
``lens_position.analyses.prompt_sets.disjoint_prompt_sets``, the reproduction's probe sizes by default),
it streams two :class:`~lens_position.analyses.probes.ProbeReducer` in one pass, one with intervals
(the held-out bootstrap and the jackknife of the refitted probe over the training units) and one without, and times
their ``result()``. Per layer it then prints the held-out R² of every set, the spread between
sets (sample SD) and the SD the bootstrap predicts (mean interval width / 3.92), and their
ratio with the exact chi-square 95% interval (K - 1 degrees of freedom): a ratio near 1 says
the interval is as wide as the spread of a refit on other prompts.
"""

from __future__ import annotations

import argparse
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sets", type=int, default=4)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--N", type=int, default=16)
    parser.add_argument("--layers", type=int, nargs="*", default=None, help="default: every layer")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import numpy as np
    import torch

    from lens_position.analyses.probes import ProbeReducer
    from lens_position.analyses.prompt_sets import _chi_square_quantile, disjoint_prompt_sets
    from lens_position.core.inputs import check_prompts
    from lens_position.core.intervals import NO_INTERVALS, Bootstrap
    from lens_position.core.stream import stream
    from lens_position.models import load_model

    loaded = load_model(args.model)
    sets = disjoint_prompt_sets(loaded, args.sets, T=args.T, N=args.N, seed=args.seed)
    frames, timings = [], []
    for k, prompts in enumerate(sets, start=1):
        checked = check_prompts(loaded, prompts, distinct=True)
        reducers = [ProbeReducer(loaded, checked, layers=args.layers, seed=args.seed, bootstrap=bootstrap)
                    for bootstrap in (Bootstrap(), NO_INTERVALS)]
        stream(loaded, prompts, reducers, batch_size=8, progress=False)  # one pass feeds both
        start = time.perf_counter()
        with_intervals = reducers[0].result()
        seconds_with = time.perf_counter() - start
        start = time.perf_counter()
        without = reducers[1].result()
        seconds_without = time.perf_counter() - start
        # the same fit: only the order of float64 sums differs (groups kept for the bootstrap), ~1e-15
        assert np.allclose(with_intervals.layers["r2_heldout"], without.layers["r2_heldout"], atol=1e-12, rtol=1e-12)
        timings.append((seconds_with, seconds_without))
        frames.append(with_intervals.layers.assign(set=k))
        print(f"set {k}: result() {seconds_with:.1f} s with intervals (held-out bootstrap, refit jackknife), "
              f"{seconds_without:.1f} s without; torch threads {torch.get_num_threads()}", flush=True)
    import pandas as pd

    table = pd.concat(frames, ignore_index=True)
    K = args.sets
    print(f"\n{args.model}: {K} disjoint sets of N = {args.N}, T = {args.T}; held-out R² per set, "
          "between-set SD / bootstrap SD (width / 3.92) = ratio [95% interval]")
    ratios = []
    for layer, part in table.groupby("layer"):
        between = float(part["r2_heldout"].std(ddof=1))
        bootstrap_sd = float(((part["r2_heldout_hi"] - part["r2_heldout_lo"]) / 3.92).mean())
        ratio = between / bootstrap_sd if bootstrap_sd > 0 else math.nan
        lo = ratio * math.sqrt((K - 1) / _chi_square_quantile(0.975, K - 1))
        hi = ratio * math.sqrt((K - 1) / _chi_square_quantile(0.025, K - 1))
        ratios.append(ratio)
        values = ", ".join(f"{v:.3f}" for v in part["r2_heldout"])
        ridges = ", ".join(f"{v:g}" for v in part["ridge"])
        print(f"layer {layer:2d}: R² {values} (ridge {ridges}); {between:.4f} / {bootstrap_sd:.4f} = "
              f"{ratio:.2f} [{lo:.2f}, {hi:.2f}]")
    print(f"median ratio over layers {float(np.median(ratios)):.2f}; result() with / without intervals: "
          f"{sum(t[0] for t in timings):.1f} s / {sum(t[1] for t in timings):.1f} s over {K} sets")


if __name__ == "__main__":
    main()
