"""The two model backends side by side: load time, bare forward passes, the decomposition.

    python benchmarks/backends.py                                  # tiny-llama and smollm2-135m
    python benchmarks/backends.py --models tiny-llama --N 2 --T 16 --repeats 1
    python benchmarks/backends.py --profile                        # also profile the bridge's decomposition

For each model and each backend this TransformerLens has (``hooked``: HookedTransformer,
TransformerLens 3.x; ``bridge``: TransformerBridge, 3.9 and 4.x; under TransformerLens 4.x only the
bridge), a fresh subprocess, one after the other, measures:

- ``load``: wall and CPU seconds of ``load_model(name, backend=...)``, the first call in the process
  (TransformerLens and transformers already imported) and a second call in the same process. The
  hooked backend reads converted weights from the weight cache (``$LENS_POSITION_CACHE``); the
  bridge reads the GGUF file and dequantises it on every load, and does not use that cache.
- ``bare``: the forward passes alone, the same batches as the decomposition (``batch_size``
  rows of ``T`` tokens, through the backend's own ``forward``), each ended after the last block
  by a plain torch forward hook that raises: no TransformerLens hooks, and on both backends the
  same work (``TransformerBridge``'s own ``stop_at_layer`` stops before block ``stop_at_layer``, so
  given ``stop_at_layer=n_layers`` it would run its final norm and unembedding too);
- ``decompose``: :func:`lens_position.analyses.decompose.decompose` on the same tokens (all layers,
  default bootstrap intervals), the whole call: forward passes, the reducer's hooks, the fit.

Times are wall and CPU seconds (``time.process_time``) of the fastest of ``--repeats`` runs
(model loading excluded, one warm-up pass before); the bare passes and the decomposition run in
turn, and the median of the ``--repeats`` pairs' CPU ratios is printed beside the ratio of the
fastest runs (on a shared machine the two have differed by 0.2x between runs an hour apart; the
median of pairs moved less). Each timed decomposition also counts the CPU seconds spent inside it in
its reducer's updates (the key-set check and the streamed statistics) and in its ``result()`` (the
fit); its total over its total less those two is its overhead over its own passes, measured in one
run and so free of the run-to-run noise (it leaves out the cost of calling the hooks, which the
pairs include). Printed ratios: the decomposition over its own
backend's bare passes (target at most 1.2x), the bridge over the hooked backend for the bare
passes and for the decomposition. Nothing is asserted: the ratios depend on the machine and on
what else runs on it (the load average is printed before and after). The tokens are the default
natural text (BOS forced) from the same seed on both backends, checked equal by their hash.

``--profile`` (and automatically when the bridge's decomposition is more than 1.5x the hooked
one) runs the bridge's decomposition once more under cProfile and prints the functions with the
most own time and the TransformerLens/transformers frames with the most cumulative time.
``--threads`` sets ``torch.set_num_threads`` (default 1: on a small shared machine multi-threaded
kernels spin-wait for busy cores).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

TARGET_OVER_BARE = 1.2  # the decomposition over its own backend's bare passes
EXPLAIN_BRIDGE_OVER = 1.5  # bridge over hooked above this: profile and say what dominates


def _tl_version() -> str:
    from importlib.metadata import version

    return version("transformer_lens")


def available_backends() -> list[str]:
    from lens_position.models.backends import bridge_class, hooked_available

    return [name for name, ok in (("hooked", hooked_available()), ("bridge", bridge_class() is not None)) if ok]


def worker(model_name: str, backend: str, N: int, T: int, batch_size: int, repeats: int, threads: int,
           seed: int, profile: bool, out: str) -> None:
    """One (model, backend) in this process; writes its numbers as JSON to ``out``."""
    import torch

    if threads > 0:
        torch.set_num_threads(threads)
    import transformer_lens  # noqa: F401  (imported before the load is timed)
    import transformers  # noqa: F401

    from lens_position.analyses.decompose import DecompositionReducer, decompose
    from lens_position.core.data import build_prompts
    from lens_position.models import load_model

    started, cpu_started = time.perf_counter(), time.process_time()
    loaded = load_model(model_name, backend=backend)
    load_s, load_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    started, cpu_started = time.perf_counter(), time.process_time()
    loaded = load_model(model_name, backend=backend)
    load_again_s, load_again_cpu_s = time.perf_counter() - started, time.process_time() - cpu_started
    if loaded.backend.kind != backend:
        raise SystemExit(f"asked for backend {backend!r}, load_model gave {loaded.backend.kind!r}")

    tokens = build_prompts(loaded, source="natural", T=T, N=N, bos="force", seed=seed).tokens
    n_layers = loaded.backend.n_layers

    # The bare pass ends after the last block on both backends. TransformerBridge's own stop_at_layer stops
    # *before* block stop_at_layer, and there is no block n_layers: given n_layers it would run the final norm
    # and the unembedding too (a 49,152 x 576 product per SmolLM2 position, about a quarter of its 30 blocks),
    # which lens_position's bridge backend ends before. A plain torch forward hook on the last block ends
    # both backends' passes at the same place, whatever either backend does after it.
    class AfterLastBlock(Exception):
        pass

    def stop(_module, _args, _output) -> None:
        stops.append(1)
        raise AfterLastBlock

    stops: list[int] = []
    last_block = loaded.backend.model.blocks[n_layers - 1]

    def bare() -> None:
        handle = last_block.register_forward_hook(stop)
        try:
            with torch.no_grad():
                for first in range(0, len(tokens), batch_size):
                    try:
                        loaded.backend.forward(tokens[first:first + batch_size], stop_at_layer=n_layers,
                                               return_type=None)
                    except AfterLastBlock:
                        pass
        finally:
            handle.remove()

    # CPU seconds inside the decomposition's own run: its reducer's updates (the key-set check and the streamed
    # statistics, called from the hooks) and its result() (the fit); the rest is the passes and their hooks
    spent = {"update": 0.0, "result": 0.0}
    for method in spent:
        original = getattr(DecompositionReducer, method)

        def counted(self, *args, _original=original, _method=method, **kwargs):
            started = time.process_time()
            try:
                return _original(self, *args, **kwargs)
            finally:
                spent[_method] += time.process_time() - started

        setattr(DecompositionReducer, method, counted)
    inside: list[tuple[float, float]] = []  # (statistics, fit) CPU seconds of each timed decomposition

    def decomposition() -> None:
        spent.update(update=0.0, result=0.0)
        decompose(loaded, tokens, batch_size=batch_size, progress=False)
        inside.append((spent["update"], spent["result"]))

    def timed(fn) -> tuple[float, float]:
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        return time.perf_counter() - w0, time.process_time() - c0

    bare()  # warm-up; the last block ended every batch's pass
    if len(stops) != -(-len(tokens) // batch_size):
        raise SystemExit(f"the bare pass on {backend} did not end after the last block ({len(stops)} stops)")
    # alternating, so that each decomposition has a bare run beside it under the same conditions
    decomposition()  # warm-up
    inside.clear()
    pairs = [(timed(bare), timed(decomposition)) for _ in range(repeats)]
    # each decomposition's CPU time over its own passes (its total less the statistics and the fit)
    inside_ratios = sorted(d[1] / (d[1] - statistics_s - fit_s) for (_, d), (statistics_s, fit_s) in zip(pairs, inside))
    bare_s, bare_cpu = min(b[0] for b, _ in pairs), min(b[1] for b, _ in pairs)
    dec_s, dec_cpu = min(d[0] for _, d in pairs), min(d[1] for _, d in pairs)
    pair_ratios_cpu = sorted(d[1] / b[1] for b, d in pairs)
    profile_text = None
    if profile:
        profile_text = _profile(decomposition)
    Path(out).write_text(json.dumps({
        "model": model_name, "backend": backend, "load_s": load_s, "load_cpu_s": load_cpu_s,
        "load_again_s": load_again_s,
        "load_again_cpu_s": load_again_cpu_s,
        "bare_s": bare_s, "bare_cpu_s": bare_cpu, "decompose_s": dec_s, "decompose_cpu_s": dec_cpu,
        "pair_ratios_cpu": pair_ratios_cpu, "inside_ratios_cpu": inside_ratios,
        "statistics_cpu_s": statistics.median(a for a, _ in inside),
        "fit_cpu_s": statistics.median(b for _, b in inside),
        "tokens_sha256": hashlib.sha256(tokens.numpy().tobytes()).hexdigest()[:16],
        "tokens_shape": list(tokens.shape), "n_layers": n_layers, "threads": torch.get_num_threads(),
        "profile": profile_text,
    }))


def _profile(fn, rows: int = 14) -> str:
    """``fn`` once under cProfile: the top functions by own time, then the TransformerLens and
    transformers frames by cumulative time (seconds, as cProfile counts them)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    fn()
    profiler.disable()
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    entries = [(key, value) for key, value in stats.stats.items()]  # type: ignore[attr-defined]

    def label(key) -> str:
        filename, line, name = key
        parts = Path(filename).parts
        short = (
            "/".join(parts[parts.index("site-packages") + 1 :]) if "site-packages" in parts else "/".join(parts[-3:])
        )
        return f"{short}:{line}({name})"

    out = io.StringIO()
    out.write(f"profile of one decomposition: {total:.2f} s under cProfile\n  by own time:\n")
    for key, (_cc, ncalls, tottime, cumtime, _callers) in sorted(entries, key=lambda e: -e[1][2])[:rows]:
        out.write(f"    {tottime:7.2f} s own {cumtime:7.2f} s cum {ncalls:8d} calls  {label(key)}\n")
    out.write("  TransformerLens / transformers frames by cumulative time:\n")
    library = [e for e in entries if "transformer_lens" in e[0][0] or "transformers/" in e[0][0]]
    for key, (_cc, ncalls, tottime, cumtime, _callers) in sorted(library, key=lambda e: -e[1][3])[:rows]:
        out.write(f"    {cumtime:7.2f} s cum {tottime:7.2f} s own {ncalls:8d} calls  {label(key)}\n")
    return out.getvalue()


def run_worker(model_name: str, backend: str, args: argparse.Namespace, profile: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "result.json")
        command = [sys.executable, __file__, "--worker", model_name, backend, "--N", str(args.N), "--T",
                   str(args.T), "--batch-size", str(args.batch_size), "--repeats", str(args.repeats),
                   "--threads", str(args.threads), "--seed", str(args.seed), "--out", out]
        if profile:
            command.append("--profile")
        completed = subprocess.run(command, capture_output=True, text=True)
        if completed.returncode != 0:
            raise SystemExit(f"{model_name} on {backend} failed:\n{completed.stderr[-4000:]}")
        return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["tiny-llama", "smollm2-135m"])
    parser.add_argument("--N", type=int, default=8, help="prompts")
    parser.add_argument("--T", type=int, default=128, help="tokens per prompt, BOS included")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per forward pass")
    parser.add_argument("--repeats", type=int, default=5,
                        help="alternating bare / decomposition runs (the fastest of each counts, and the "
                             "median of the pairs' ratios)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true", help="also profile the bridge's decomposition")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    parser.add_argument("--worker", nargs=2, metavar=("MODEL", "BACKEND"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.N, args.T, args.batch_size, args.repeats, args.threads, args.seed, args.profile,
               args.out)
        return

    backends = available_backends()
    load_before = os.getloadavg()
    print(
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, TransformerLens {_tl_version()}, "
        f"backends {', '.join(backends)}, N = {args.N}, T = {args.T}, batch size {args.batch_size}, "
        f"repeats {args.repeats}, {args.threads or 'default'} torch thread(s), {os.cpu_count()} CPUs; "
        f"load average {load_before[0]:.1f} {load_before[1]:.1f} {load_before[2]:.1f}"
    )
    if "hooked" not in backends:
        print("  (no HookedTransformer in this TransformerLens: bridge numbers only, no bridge/hooked ratio)")
    results: list[dict] = []
    for model_name in args.models:
        measured: dict[str, dict] = {}
        for backend in backends:
            measured[backend] = run_worker(model_name, backend, args, profile=False)
        hashes = {r["tokens_sha256"] for r in measured.values()}
        if len(hashes) != 1:
            raise SystemExit(f"{model_name}: the backends built different tokens ({hashes}); ratios would compare "
                             "different work")
        print(f"\n{model_name} ({next(iter(measured.values()))['n_layers']} layers), tokens "
              f"{next(iter(measured.values()))['tokens_shape']}:")
        for backend, r in measured.items():
            r["decompose_over_bare"] = r["decompose_s"] / r["bare_s"]
            r["decompose_over_bare_cpu"] = r["decompose_cpu_s"] / r["bare_cpu_s"]
            print(f"  {backend:6s} load {r['load_s']:6.2f} s wall / {r['load_cpu_s']:.2f} s CPU (again in the same "
                  "process "
                  f"{r['load_again_s']:.2f} s / {r['load_again_cpu_s']:.2f} s CPU); "
                  f"bare forward {r['bare_s']:.3f} s wall / {r['bare_cpu_s']:.3f} s CPU; decomposition "
                  f"{r['decompose_s']:.3f} s / {r['decompose_cpu_s']:.3f} s CPU")
        for backend, r in measured.items():
            pairs = r["pair_ratios_cpu"]
            r["decompose_over_bare_cpu_median"] = statistics.median(pairs)
            print(f"  ratio {backend} decomposition / {backend} bare forward: {r['decompose_over_bare']:.2f}x wall, "
                  f"{r['decompose_over_bare_cpu']:.2f}x CPU, fastest of each; median of {len(pairs)} alternating pairs "
                  f"{r['decompose_over_bare_cpu_median']:.2f}x CPU (from {pairs[0]:.2f}x to {pairs[-1]:.2f}x) "
                  f"(target <= {TARGET_OVER_BARE:g}x)")
            inside = r["inside_ratios_cpu"]
            r["inside_ratio_cpu_median"] = statistics.median(inside)
            print(f"    inside each {backend} decomposition: statistics {r['statistics_cpu_s']:.3f} s CPU, fit "
                  f"{r['fit_cpu_s']:.3f} s CPU (medians); over its own passes {r['inside_ratio_cpu_median']:.2f}x "
                  f"median (from {inside[0]:.2f}x to {inside[-1]:.2f}x)")
        row = {"model": model_name, "backends": measured}
        if "hooked" in measured and "bridge" in measured:
            h, b = measured["hooked"], measured["bridge"]
            row.update(bridge_over_hooked_bare=b["bare_s"] / h["bare_s"],
                       bridge_over_hooked_decompose=b["decompose_s"] / h["decompose_s"],
                       bridge_over_hooked_decompose_cpu=b["decompose_cpu_s"] / h["decompose_cpu_s"],
                       bridge_over_hooked_load=b["load_s"] / h["load_s"],
                       bridge_over_hooked_load_cpu=b["load_cpu_s"] / h["load_cpu_s"])
            print(f"  ratio bridge / hooked: bare forward {row['bridge_over_hooked_bare']:.2f}x, decomposition "
                  f"{row['bridge_over_hooked_decompose']:.2f}x wall ({row['bridge_over_hooked_decompose_cpu']:.2f}x "
                  f"CPU), load {row['bridge_over_hooked_load']:.2f}x wall "
                  f"({row['bridge_over_hooked_load_cpu']:.2f}x CPU)")
        over = row.get("bridge_over_hooked_decompose_cpu", 0.0) > EXPLAIN_BRIDGE_OVER
        if args.profile or over:
            why = f"above {EXPLAIN_BRIDGE_OVER:g}x" if over else "--profile"
            profiled = run_worker(model_name, "bridge", argparse.Namespace(**{**vars(args), "repeats": 1}),
                                  profile=True)
            row["bridge_profile"] = profiled["profile"]
            print(f"  bridge {why}: " + profiled["profile"].replace("\n", "\n  ").rstrip())
        results.append(row)
    load_after = os.getloadavg()
    print(f"\nload average after: {load_after[0]:.1f} {load_after[1]:.1f} {load_after[2]:.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"transformer_lens": _tl_version(), "backends": backends,
                                               "load_average": [load_before, load_after], "results": results},
                                              indent=2))


if __name__ == "__main__":
    main()
