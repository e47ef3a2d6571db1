"""resid_pre patching sweep: lens_position against TransformerLens and against the counted floor.

Every path sweeps every (layer, position) of SmolLM2-135M: patch ``resid_pre[layer][:, position]``
from the source run into the target run and evaluate the metric on the logits.

- TransformerLens: ``transformer_lens.patching.get_act_patch_resid_pre``, one full forward pass
  per (layer, position): ``layers x T`` passes of ``T`` positions through every block.
- lens_position without prefix reuse (``resid_pre_sweep(..., reuse_prefix=False)``): each layer
  resumes from the cached target residual (``start_at_layer``), positions batched.
- lens_position (``resid_pre_sweep``, the default): also computes only the positions a patch can
  change (those from the patched position on), the target run's keys, values and logits for the
  earlier ones.

Token-layers are counted for each path (rows x computed positions x blocks run). The floor is
what a patch at (l, p) can change, ``(T - p) x (layers - l)`` per cell; its time is the floor's
token-layers at the throughput of a bare forward pass of the same model (batches of
``--batch-size`` rows of ``T`` positions) measured in the same run.

Prompt: ``T`` tokens of the default natural text (BOS forced); the source run is the same text
with token ``T // 2`` replaced. Metric: log-probability of the target's last token at position
``T - 2`` (mean over the batch). Prints, per ``T``: the largest absolute difference of each path
from TransformerLens (must be <= 1e-4), the wall times (lens_position's: the fastest of
``--repeats``; TransformerLens's: one run, it is the slow one), the ratios, the token-layers, and
the machine's load average before and after (the machine may be shared: read the ratios with it).

``--tl-sample K`` times TransformerLens on ``K`` cells only, spread evenly over layers and
positions (a grid of layers x positions, both ends included), with its own code path
(``transformer_lens.patching.generic_activation_patch`` with an ``index_df`` of those cells and
the ``resid_pre`` setter ``get_act_patch_resid_pre`` uses). Each of its cells costs one full
forward pass of the same ``N x T`` tokens whatever the cell, so its sweep time is extrapolated
as the source-cache pass plus the measured time per cell x ``layers x T`` cells; the output says
so. Equality with TransformerLens is then checked on those ``K`` cells only.

    python benchmarks/patching.py                      # SmolLM2, T = 64 and 128
    python benchmarks/patching.py --model tiny-llama --T 24
    python benchmarks/patching.py --tl-sample 32 --repeats 1   # TransformerLens extrapolated

``--layers`` sweeps only the given layers (every position): a partial sweep, every path, token
count and floor of those layers alone, printed as such. ``--skip-no-reuse`` leaves the path
without prefix reuse untimed (its token-layers are still counted, by the planner).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TransformerLens shows a progress bar per patch; it would drown the result lines.
os.environ.setdefault("TQDM_DISABLE", "1")

import pandas as pd  # noqa: E402
import torch  # noqa: E402
from transformer_lens.patching import (  # noqa: E402
    generic_activation_patch,
    get_act_patch_resid_pre,
    layer_pos_patch_setter,
)

from lens_position.analyses.patching import (  # noqa: E402
    min_token_layers,
    plan_passes,
    resid_pre_sweep,
    token_layers,
)
from lens_position.core.data import build_prompts  # noqa: E402
from lens_position.models import load_model  # noqa: E402

TOLERANCE = 1e-4
TARGET_SPEEDUP = 30.0  # over TransformerLens, at T = 128 on a CPU
TARGET_FLOOR = 1.3  # at most this multiple of the floor's time


def _bare_forward_seconds_per_token_layer(model, tokens: torch.Tensor, batch_size: int, repeats: int) -> float:
    batch = tokens.repeat(max(1, batch_size // len(tokens)), 1)
    best = float("inf")
    with torch.no_grad():
        model(batch)
        for _ in range(repeats):
            started = time.perf_counter()
            model(batch)
            best = min(best, time.perf_counter() - started)
    return best / (batch.numel() * model.cfg.n_layers)


def sample_cells(n_layers: int, n_pos: int, k: int) -> list[tuple[int, int]]:
    """``k`` (layer, position) cells spread evenly over both axes: the ``i``-th cell's layer is
    the ``i``-th of ``k`` evenly spaced layers (first and last included), its position the
    ``(i x g mod k)``-th of ``k`` evenly spaced positions, ``g`` coprime to ``k`` near ``0.618 k``
    (so both ends of both axes, and every band of either, are sampled). All cells when ``k`` is
    at least ``n_layers x n_pos``."""
    if k >= n_layers * n_pos:
        return [(layer, pos) for layer in range(n_layers) for pos in range(n_pos)]
    if k == 1:
        return [(0, 0)]
    g = next(g for g in range(max(1, round(0.618 * k)), 2 * k) if math.gcd(g, k) == 1)
    def spaced(n: int, j: int) -> int:
        return round(j * (n - 1) / (k - 1))

    return sorted({(spaced(n_layers, i), spaced(n_pos, i * g % k)) for i in range(k)})


def _no_reuse_token_layers(layers: list[int], n_layers: int, n_pos: int, n_rows: int, batch_size: int) -> int:
    """Token-layers the sweep computes with ``reuse_prefix=False``, counted by the planner without
    running it: every condition from position 0, block ``l`` (block -1, the tokens, for ``l = 0``),
    and the unpatched run read off the target run."""
    starts = [(layer if layer > 0 else -1, 0) for layer in layers for _ in range(n_pos)] + [(-1, n_pos)]
    return token_layers(plan_passes(starts, n_rows, n_pos, batch_size), n_rows, n_pos, n_layers)


def measure(loaded, name: str, T: int, args) -> dict:
    model = loaded.model
    prompts = build_prompts(loaded, source="natural", T=T, N=args.N, bos="force", seed=args.seed)
    target = prompts.tokens
    source = target.clone()
    source[:, T // 2] = (source[:, T // 2] + 1) % model.cfg.d_vocab
    answer = target[:, -1]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        log_probs = logits[:, -2].log_softmax(-1)
        return log_probs.gather(-1, answer[: len(log_probs), None].to(log_probs.device)).mean()

    n_layers = model.cfg.n_layers
    layers = list(range(n_layers)) if args.layers is None else sorted(set(args.layers))
    if not all(0 <= layer < n_layers for layer in layers):
        raise SystemExit(f"--layers must be in 0..{n_layers - 1}, got {args.layers}")
    cells = len(layers) * T
    load_before = os.getloadavg()[0]
    per_token_layer = _bare_forward_seconds_per_token_layer(model, target, args.batch_size, args.repeats)

    def ours(reuse: bool):
        best, sweep = float("inf"), None
        for _ in range(args.repeats):
            started = time.perf_counter()
            sweep = resid_pre_sweep(loaded, prompts, source, metric, layers=layers, batch_size=args.batch_size,
                                    reuse_prefix=reuse, progress=False)
            best = min(best, time.perf_counter() - started)
        return sweep, best

    reused, reused_s = ours(True)
    full, full_s = ours(False) if not args.skip_no_reuse else (None, None)
    started = time.perf_counter()
    with torch.no_grad():
        _, source_cache = model.run_with_cache(source, names_filter=lambda n: n.endswith("hook_resid_pre"))
        cache_s = time.perf_counter() - started
        if args.tl_sample:
            sampled = [(layers[i], pos) for i, pos in sample_cells(len(layers), T, args.tl_sample)]
            index_df = pd.DataFrame(sampled, columns=["layer", "pos"])
            started = time.perf_counter()
            theirs_sampled = generic_activation_patch(model, target, source_cache, metric, layer_pos_patch_setter,
                                                      "resid_pre", index_df=index_df)
            per_cell_s = (time.perf_counter() - started) / len(sampled)
            theirs_s = cache_s + per_cell_s * cells
            rows, cols = zip(*((layers.index(layer), pos) for layer, pos in sampled))
            def ours_on(v: torch.Tensor, rows: tuple = rows, cols: tuple = cols) -> torch.Tensor:
                return v.cpu()[list(rows), list(cols)]

            theirs_cmp = theirs_sampled.cpu()
        else:
            sampled, per_cell_s = None, None
            theirs = get_act_patch_resid_pre(model, target, source_cache, metric)[layers]
            theirs_s = time.perf_counter() - started
            def ours_on(v: torch.Tensor) -> torch.Tensor:
                return v.cpu()

            theirs_cmp = theirs.cpu()
    load_after = os.getloadavg()[0]

    floor = min_token_layers(layers, range(T), args.N, T, n_layers)
    counts = {"transformer_lens": cells * args.N * T * n_layers,
              "no_prefix_reuse": (full.provenance["options"]["token_layers"] if full is not None
                                  else _no_reuse_token_layers(layers, n_layers, T, args.N, args.batch_size)),
              "lens_position": reused.provenance["options"]["token_layers"], "floor": floor}
    floor_s = floor * per_token_layer
    return {
        "model": name, "T": T, "N": args.N, "layers": n_layers, "swept_layers": layers, "cells": cells,
        "max_abs_diff": float((ours_on(reused.values) - theirs_cmp).abs().max()),
        "max_abs_diff_no_reuse": (float((ours_on(full.values) - theirs_cmp).abs().max()) if full is not None
                                  else None),
        "transformer_lens_sampled_cells": sampled, "transformer_lens_s_per_cell": per_cell_s,
        "transformer_lens_cache_s": cache_s, "transformer_lens_s": theirs_s, "no_prefix_reuse_s": full_s,
        "lens_position_s": reused_s,
        "floor_s": floor_s, "bare_forward_ns_per_token_layer": per_token_layer * 1e9,
        "speedup_vs_transformer_lens": theirs_s / reused_s,
        "speedup_vs_no_prefix_reuse": full_s / reused_s if full_s else None,
        "over_floor": reused_s / floor_s, "token_layers": counts,
        "load_average_1min": [load_before, load_after],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--T", type=int, nargs="+", default=[64, 128], help="prompt lengths, position 0 included")
    parser.add_argument("--N", type=int, default=1, help="prompts in the batch")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per lens_position forward pass")
    parser.add_argument("--repeats", type=int, default=3, help="lens_position runs per path (the fastest counts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--tl-sample", type=int, default=0, metavar="K",
                        help="time TransformerLens on K cells spread over layers and positions and extrapolate "
                             "(default 0: the whole sweep)")
    parser.add_argument("--layers", type=int, nargs="+", default=None,
                        help="sweep these layers only (all positions); every path, count and floor is of them")
    parser.add_argument("--skip-no-reuse", action="store_true",
                        help="do not time the path without prefix reuse (its token-layers are still counted)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    name, note = args.model, ""
    try:
        loaded = load_model(name)
    except Exception as error:  # the fallback is the point: say why and go on
        note = f"could not load {name} ({type(error).__name__}: {error}); fell back to tiny-llama"
        name, loaded = "tiny-llama", load_model("tiny-llama")
    if note:
        print(note)
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, model {name}, N = {args.N}, "
        f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, batch size {args.batch_size}"
    )
    results, failed = [], False
    for T in args.T:
        r = measure(loaded, name, T, args)
        results.append(r)
        c = r["token_layers"]
        sampled_run = bool(r["transformer_lens_sampled_cells"])
        ok = max(r["max_abs_diff"], r["max_abs_diff_no_reuse"] or 0.0) <= TOLERANCE
        no_reuse = "not run" if r["max_abs_diff_no_reuse"] is None else f"{r['max_abs_diff_no_reuse']:.2e}"
        failed |= not ok
        swept = (f"{r['layers']} layers" if len(r["swept_layers"]) == r["layers"] else
                 f"{len(r['swept_layers'])} of {r['layers']} layers ({', '.join(map(str, r['swept_layers']))}; "
                 "a partial sweep)")
        print(f"\nT = {T}: {swept} x {T} positions = {r['cells']} cells; load average "
              f"{r['load_average_1min'][0]:.1f} before, {r['load_average_1min'][1]:.1f} after")
        on = (f"on the {len(r['transformer_lens_sampled_cells'])} sampled cells" if r["transformer_lens_sampled_cells"]
              else "on every cell")
        print(f"  max |ours - transformer_lens| {on} = {r['max_abs_diff']:.2e} (prefix reuse), "
              f"{no_reuse} (without); must be <= {TOLERANCE:g}: {'OK' if ok else 'FAIL'}")
        if r["transformer_lens_sampled_cells"]:
            k = len(r["transformer_lens_sampled_cells"])
            print(
                f"  transformer_lens EXTRAPOLATED from {k} measured cells: {r['transformer_lens_s_per_cell']:.3f} s "
                f"per cell x {r['cells']} cells + {r['transformer_lens_cache_s']:.2f} s source cache = "
                f"{r['transformer_lens_s']:.1f} s (each cell is one full forward pass of {args.N} x {T} tokens)"
            )
        print(
            f"  token-layers: transformer_lens {c['transformer_lens']:,}, without prefix reuse "
            f"{c['no_prefix_reuse']:,}{' (counted, not run)' if r['no_prefix_reuse_s'] is None else ''}, "
            f"lens_position {c['lens_position']:,}, floor {c['floor']:,} "
            f"({c['lens_position'] / c['floor']:.2f}x the floor)"
        )
        no_reuse_s = "not run" if r["no_prefix_reuse_s"] is None else f"{r['no_prefix_reuse_s']:.2f} s"
        print(
            f"  time: transformer_lens {r['transformer_lens_s']:.2f} s{' (extrapolated)' if sampled_run else ''}, "
            "without prefix reuse "
            f"{no_reuse_s}, lens_position {r['lens_position_s']:.2f} s, floor {r['floor_s']:.2f} s "
            f"(bare forward: {r['bare_forward_ns_per_token_layer']:.0f} ns per token-layer)"
        )
        reuse = r["speedup_vs_no_prefix_reuse"]
        print(
            f"  lens_position: {r['speedup_vs_transformer_lens']:.1f}x transformer_lens (target >= "
            f"{TARGET_SPEEDUP:g}x at T = 128), "
            f"{'(not run)' if reuse is None else format(reuse, '.2f') + 'x'} without prefix reuse, "
            f"{r['over_floor']:.2f}x the floor's time (target <= {TARGET_FLOOR:g}x)"
        )
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"note": note, "results": results}, handle, indent=2)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
