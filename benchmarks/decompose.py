"""Streamed decomposition vs the dense reference, and its overhead over a bare forward pass.

    python benchmarks/decompose.py                      # smollm2-135m, N=16, T=256
    python benchmarks/decompose.py --model tiny-llama --N 8 --T 64 --json /tmp/bench.json

Same tokens for every measurement (natural text, the tokenizer's own BOS policy). Each of
the three runs happens in its own subprocess, one after the other:

- ``bare``: the forward passes alone (``stop_at_layer`` = number of layers, no hooks);
- ``streamed``: :func:`lens_position.analyses.decompose.decompose` (all layers, all queries and keys);
- ``dense``: :func:`lens_position.analyses.decompose.decompose_dense` (every pattern cached, explicit
  design matrix stacked over sequences, ``torch.linalg.lstsq``).

Time is the wall time of the measured phase only (model loading excluded), and its CPU time
(``time.process_time``; with one torch thread, the less noisy of the two on a shared machine).
Memory is the peak resident set size sampled every 5 ms during the phase, minus the resident size just
before it: the memory the analysis itself needs (the model's weights are not counted). The
process's lifetime peak (``ru_maxrss``) is printed too. Ratios are printed, never asserted:
they depend on the machine and on what else runs on it (the load average is printed).

``--repeats k`` runs the bare and streamed phases ``k`` times each (in their processes) and
keeps the fastest: on a busy machine the minimum is the least disturbed measurement.
``--suite`` runs the issue's three measurements one after the other: the overhead over a bare
forward pass for SmolLM2-135M at T=256 (target <= 1.2x) and Gemma-3-270M at T=640, the
sliding-window case where the analysed pairs grow as T² (target <= 1.3x), both N=16; and the
analysis memory of the streamed decomposition of SmolLM2 at T=256 for N=16 and N=64, with
bootstrap intervals and without (``streamed-no-intervals``), and the bytes of statistics it keeps:
with intervals one group of sequences per sequence up to ``MAX_GROUPS`` (the bootstrap resamples
them), without only the two halves. ``--fast`` halves N in the overhead runs.

``--threads`` sets ``torch.set_num_threads`` in every run (default 1: on a small shared
machine, multi-threaded kernels spin-wait for busy cores and every timing becomes noise;
``--threads 0`` keeps torch's default).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODES = ("bare", "streamed", "dense", "streamed-no-intervals")
COMPONENT_COLUMNS = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout"]


class PeakSampler:
    """Peak RSS of this process, sampled in a background thread."""

    def __init__(self, interval: float = 0.005) -> None:
        import psutil

        self.process = psutil.Process()
        self.interval = interval
        self.peak = self.process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self) -> PeakSampler:
        self.start = self.process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)


def worker(mode: str, model_name: str, tokens_path: str, batch_size: int, threads: int, repeats: int,
           out: str) -> None:
    import gc

    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    from lens_position.analyses.decompose import DecompositionReducer, decompose_dense
    from lens_position.core.inputs import check_prompts
    from lens_position.core.intervals import NO_INTERVALS, Bootstrap
    from lens_position.core.stream import stream
    from lens_position.models import load_model

    loaded = load_model(model_name)
    tokens = torch.load(tokens_path)
    gc.collect()
    times, cpu_times, kept = [], [], None
    with PeakSampler() as memory:
        for _ in range(1 if mode == "dense" else repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            if mode == "bare":
                with torch.no_grad():
                    for first in range(0, len(tokens), batch_size):
                        loaded.model(tokens[first:first + batch_size], stop_at_layer=loaded.model.cfg.n_layers)
                heads = None
            elif mode in ("streamed", "streamed-no-intervals"):
                # what decompose() does, keeping the reducer to weigh the statistics it keeps
                reducer = DecompositionReducer(loaded, check_prompts(loaded, tokens),
                                               bootstrap=Bootstrap() if mode == "streamed" else NO_INTERVALS)
                stream(loaded, tokens, [reducer], batch_size=batch_size, progress=False)
                heads = reducer.result(batch_size=batch_size).heads
                kept = {"groups": reducer.n_groups, "bytes": sum(
                    t.nbytes for s in reducer.stats.values()
                    for t in (s.xty_t, s.xty_z, s.row_t, s.sum_y, s.sum_y2, s.n_sequences))}
            else:
                heads = decompose_dense(loaded, tokens).heads
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    seconds = min(times)
    if heads is not None:
        heads.to_csv(out + ".csv", index=False)
    result = {"mode": mode, "seconds": seconds, "all_seconds": times, "cpu_seconds": min(cpu_times),
              "all_cpu_seconds": cpu_times, "analysis_peak_bytes": memory.peak - memory.start,
              "rss_before_bytes": memory.start,
              "process_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "threads": torch.get_num_threads(), "kept_statistics": kept}
    Path(out).write_text(json.dumps(result))


OVERHEAD_TARGETS = {"smollm2-135m": 1.2, "gemma3-270m": 1.3}


def suite(args: argparse.Namespace) -> None:
    """The overhead and memory measurements of the module docstring, each printed as it ends."""
    import copy

    from lens_position.analyses.decompose import MAX_GROUPS

    n = 8 if args.fast else 16
    summaries = []
    for model, T in () if args.memory_only else (("smollm2-135m", 256), ("gemma3-270m", 640)):
        case = copy.copy(args)
        case.model, case.T, case.N, case.skip_dense = model, T, n, True
        summary = run_all(case)
        print(report(summary), flush=True)
        ratio = summary["overhead_streamed_over_bare"]
        print(f"==> {model} T={T} N={n}: streamed / bare = {ratio:.2f}x wall (target <= {OVERHEAD_TARGETS[model]}x: "
              f"{'met' if ratio <= OVERHEAD_TARGETS[model] else 'NOT met'}), "
              f"{summary['cpu_overhead_streamed_over_bare']:.2f}x CPU", flush=True)
        summaries.append(summary)
    memory, kept = {}, {}
    modes = ("streamed", "streamed-no-intervals")
    for n_seq in (16, 64):
        case = copy.copy(args)
        case.model, case.T, case.N, case.skip_dense, case.modes = "smollm2-135m", 256, n_seq, True, modes
        summary = run_all(case)
        for mode in modes:
            memory[mode, n_seq] = summary["runs"][mode]["analysis_peak_bytes"] / 2**20
            kept[mode, n_seq] = summary["runs"][mode]["kept_statistics"]
        summaries.append(summary)
    for mode, label in zip(modes, ("with intervals", "without intervals (n_resamples=0)")):
        groups = {n: kept[mode, n]["groups"] for n in (16, 64)}
        print(f"==> analysis peak memory, streamed decomposition, smollm2-135m T=256, {label}: "
              f"N=16 {memory[mode, 16]:.0f} MiB, N=64 {memory[mode, 64]:.0f} MiB "
              f"(ratio {memory[mode, 64] / max(memory[mode, 16], 1e-9):.2f}); statistics kept: "
              f"{kept[mode, 16]['bytes'] / 2**20:.1f} MiB in {groups[16]} groups at N=16, "
              f"{kept[mode, 64]['bytes'] / 2**20:.1f} MiB in {groups[64]} groups at N=64 "
              f"({kept[mode, 64]['bytes'] / groups[64] / 2**20:.2f} MiB per group of sequences)", flush=True)
    print(f"==> with intervals every sequence is its own resampling group up to {MAX_GROUPS} groups "
          f"(lens_position.analyses.decompose.MAX_GROUPS), so the kept statistics grow with N up to N={MAX_GROUPS} and "
          "not beyond; without intervals only the two halves are kept", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(summaries, indent=1, default=str))


def run_all(args: argparse.Namespace) -> dict:
    import pandas as pd
    import torch

    from lens_position.core.data import build_prompts
    from lens_position.models import load_model

    loaded = load_model(args.model)
    prompts = build_prompts(loaded, T=args.T, N=args.N, bos=args.bos, seed=args.seed)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as folder:
        tokens_path = os.path.join(folder, "tokens.pt")
        torch.save(prompts.tokens, tokens_path)
        for mode in getattr(args, "modes", ("bare", "streamed", "dense")):
            if mode == "dense" and args.skip_dense:
                continue
            out = os.path.join(folder, f"{mode}.json")
            print(f"running {mode} ...", flush=True)
            subprocess.run([sys.executable, __file__, "--worker", mode, "--model", args.model,
                            "--tokens", tokens_path, "--batch-size", str(args.batch_size),
                            "--threads", str(args.threads), "--repeats", str(args.repeats), "--out", out],
                           check=True)
            results[mode] = json.loads(Path(out).read_text())
            if mode != "bare":
                results[mode]["heads"] = pd.read_csv(out + ".csv")
    summary = {
        "model": args.model, "N": args.N, "T": args.T, "bos": args.bos, "batch_size": args.batch_size,
        "threads": args.threads, "repeats": args.repeats,
        "position0": prompts.spec.position0, "load_average": os.getloadavg(),
        "cpu_count": os.cpu_count(),
        "runs": {mode: {k: v for k, v in r.items() if k != "heads"} for mode, r in results.items()},
    }
    if "bare" in results:
        summary["overhead_streamed_over_bare"] = results["streamed"]["seconds"] / results["bare"]["seconds"]
        summary["cpu_overhead_streamed_over_bare"] = (results["streamed"]["cpu_seconds"]
                                                      / results["bare"]["cpu_seconds"])
    if "dense" in results:
        streamed, dense = results["streamed"]["heads"], results["dense"]["heads"]
        summary["time_ratio_dense_over_streamed"] = results["dense"]["seconds"] / results["streamed"]["seconds"]
        summary["memory_ratio_dense_over_streamed"] = (
            results["dense"]["analysis_peak_bytes"] / max(results["streamed"]["analysis_peak_bytes"], 1))
        summary["process_peak_ratio_dense_over_streamed"] = (
            results["dense"]["process_peak_bytes"] / results["streamed"]["process_peak_bytes"])
        summary["max_abs_difference_streamed_vs_dense"] = float(
            (streamed[COMPONENT_COLUMNS] - dense[COMPONENT_COLUMNS]).abs().max().max())
    return summary


def report(summary: dict) -> str:
    mib = 2**20
    lines = [f"model {summary['model']}, N={summary['N']}, T={summary['T']}, bos={summary['bos']} "
             f"(position 0: {summary['position0']}), batch size {summary['batch_size']}, "
             f"torch threads {summary['threads'] or 'default'}, fastest of {summary['repeats']} "
             "(bare, streamed), "
             f"{summary['cpu_count']} CPUs, load average {tuple(round(x, 1) for x in summary['load_average'])}",
             f"{'run':<10}{'seconds':>10}{'CPU s':>8}{'analysis peak MiB':>20}{'process peak MiB':>18}"]
    for mode, run in summary["runs"].items():
        lines.append(f"{mode:<10}{run['seconds']:>10.1f}{run['cpu_seconds']:>8.1f}"
                     f"{run['analysis_peak_bytes'] / mib:>20.0f}{run['process_peak_bytes'] / mib:>18.0f}   all: "
                     + ", ".join(f"{t:.1f}" for t in run["all_seconds"]))
    if "overhead_streamed_over_bare" in summary:
        lines.append(f"analysis overhead (streamed / bare forward): {summary['overhead_streamed_over_bare']:.2f}x "
                     f"wall, {summary['cpu_overhead_streamed_over_bare']:.2f}x CPU")
    if "time_ratio_dense_over_streamed" in summary:
        lines += [
            f"time ratio (dense / streamed): {summary['time_ratio_dense_over_streamed']:.1f}x (target >= 5x)",
            f"peak-memory ratio (dense / streamed, analysis only): "
            f"{summary['memory_ratio_dense_over_streamed']:.1f}x (target >= 10x)",
            f"process peak ratio (dense / streamed, weights included): "
            f"{summary['process_peak_ratio_dense_over_streamed']:.1f}x",
            f"max |streamed - dense| over T, R, M, C (+ held-out): "
            f"{summary['max_abs_difference_streamed_vs_dense']:.2e}",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--N", type=int, default=16)
    parser.add_argument("--T", type=int, default=256)
    parser.add_argument("--bos", default="tokenizer")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=1, help="bare and streamed runs per process (min kept)")
    parser.add_argument("--skip-dense", action="store_true", help="only the overhead over a bare forward pass")
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--suite", action="store_true", help="the overhead and memory measurements (docstring)")
    parser.add_argument("--fast", action="store_true", help="with --suite: N=8 in the overhead runs")
    parser.add_argument("--memory-only", action="store_true", help="with --suite: only the memory measurements")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--tokens", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.tokens, args.batch_size, args.threads, args.repeats, args.out)
        return
    if args.suite:
        suite(args)
        return
    summary = run_all(args)
    print(report(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
