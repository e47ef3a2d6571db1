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

    python benchmarks/patching.py                      # SmolLM2, T = 64 and 128
    python benchmarks/patching.py --model tiny-llama --T 24
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TransformerLens shows a progress bar per patch; it would drown the result lines.
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from transformer_lens.patching import get_act_patch_resid_pre  # noqa: E402

from lens_position.analyses.patching import min_token_layers, resid_pre_sweep  # noqa: E402
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

    load_before = os.getloadavg()[0]
    per_token_layer = _bare_forward_seconds_per_token_layer(model, target, args.batch_size, args.repeats)

    def ours(reuse: bool):
        best, sweep = float("inf"), None
        for _ in range(args.repeats):
            started = time.perf_counter()
            sweep = resid_pre_sweep(loaded, prompts, source, metric, batch_size=args.batch_size,
                                    reuse_prefix=reuse, progress=False)
            best = min(best, time.perf_counter() - started)
        return sweep, best

    reused, reused_s = ours(True)
    full, full_s = ours(False)
    started = time.perf_counter()
    with torch.no_grad():
        _, source_cache = model.run_with_cache(source, names_filter=lambda n: n.endswith("hook_resid_pre"))
        theirs = get_act_patch_resid_pre(model, target, source_cache, metric)
    theirs_s = time.perf_counter() - started
    load_after = os.getloadavg()[0]

    n_layers, cells = model.cfg.n_layers, model.cfg.n_layers * T
    floor = min_token_layers(range(n_layers), range(T), args.N, T, n_layers)
    counts = {"transformer_lens": cells * args.N * T * n_layers,
              "no_prefix_reuse": full.provenance["options"]["token_layers"],
              "lens_position": reused.provenance["options"]["token_layers"], "floor": floor}
    floor_s = floor * per_token_layer
    return {
        "model": name, "T": T, "N": args.N, "layers": n_layers, "cells": cells,
        "max_abs_diff": float((reused.values.cpu() - theirs.cpu()).abs().max()),
        "max_abs_diff_no_reuse": float((full.values.cpu() - theirs.cpu()).abs().max()),
        "transformer_lens_s": theirs_s, "no_prefix_reuse_s": full_s, "lens_position_s": reused_s,
        "floor_s": floor_s, "bare_forward_ns_per_token_layer": per_token_layer * 1e9,
        "speedup_vs_transformer_lens": theirs_s / reused_s, "speedup_vs_no_prefix_reuse": full_s / reused_s,
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
    print(f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, model {name}, N = {args.N}, "
          f"{torch.get_num_threads()} torch threads, {os.cpu_count()} CPUs, batch size {args.batch_size}")
    results, failed = [], False
    for T in args.T:
        r = measure(loaded, name, T, args)
        results.append(r)
        c = r["token_layers"]
        ok = max(r["max_abs_diff"], r["max_abs_diff_no_reuse"]) <= TOLERANCE
        failed |= not ok
        print(f"\nT = {T}: {r['layers']} layers x {T} positions = {r['cells']} cells; load average "
              f"{r['load_average_1min'][0]:.1f} before, {r['load_average_1min'][1]:.1f} after")
        print(f"  max |ours - transformer_lens| = {r['max_abs_diff']:.2e} (prefix reuse), "
              f"{r['max_abs_diff_no_reuse']:.2e} (without); must be <= {TOLERANCE:g}: {'OK' if ok else 'FAIL'}")
        print(f"  token-layers: transformer_lens {c['transformer_lens']:,}, without prefix reuse "
              f"{c['no_prefix_reuse']:,}, lens_position {c['lens_position']:,}, floor {c['floor']:,} "
              f"({c['lens_position'] / c['floor']:.2f}x the floor)")
        print(f"  time: transformer_lens {r['transformer_lens_s']:.2f} s, without prefix reuse "
              f"{r['no_prefix_reuse_s']:.2f} s, lens_position {r['lens_position_s']:.2f} s, floor {r['floor_s']:.2f} s "
              f"(bare forward: {r['bare_forward_ns_per_token_layer']:.0f} ns per token-layer)")
        print(f"  lens_position: {r['speedup_vs_transformer_lens']:.1f}x transformer_lens (target >= "
              f"{TARGET_SPEEDUP:g}x at T = 128), {r['speedup_vs_no_prefix_reuse']:.2f}x without prefix reuse, "
              f"{r['over_floor']:.2f}x the floor's time (target <= {TARGET_FLOOR:g}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"note": note, "results": results}, handle, indent=2)
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
