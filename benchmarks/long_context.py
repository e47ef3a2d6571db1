"""Every public analysis at a long context, against the bare forward passes it costs.

    python benchmarks/long_context.py                                  # smollm2-135m, T = 8192, N = 1
    python benchmarks/long_context.py --keep-layers 2                  # the same, in the first 2 blocks
    python benchmarks/long_context.py --model tiny-llama --T 256 --json /tmp/long.json
    python benchmarks/long_context.py --only decompose,probe

Each analysis runs in its own process, one after the other, on the same prompts (natural text, the
tokenizer's BOS policy, ``N`` sequences of ``T`` positions), with its smallest setting that still
does what it is for: one replacement, one ablated head, two patched layers, no bootstrap intervals
(intervals resample statistics, not passes). The probe takes two sequences (a held-out fit needs
them, one per pass) and the sink-origin conditions place BOS themselves on ``T - 1`` tokens of text. The baseline,
``bare``, is one forward pass of the same prompts with no hook, in its own process in the same run.

For each analysis the script prints its wall and CPU time, how many forward passes it made (counted
at the embedding), the ratio of its CPU time to the bare run's CPU time per position times the
positions it embedded (a pass that stops early, or a one-token pass, counts in full), and its peak memory over the
process's memory before the analysis (the model's weights are not counted) against the bare pass's,
as anonymous memory (memory-mapped weights read in are not the analysis's). Ratios are printed, never
asserted; the load average is printed with them. ``--json`` appends one record per analysis as it
finishes, so a long run keeps what it measured.

``--keep-layers K`` keeps the model's first ``K`` blocks: every layer costs and holds what it does
in the whole model (at long ``T`` the attention of each layer dominates), in ``K`` layers' time, so
that every analysis can be run at SmolLM2's full context on a CPU in minutes rather than hours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


#: analysis name -> code run with ``m`` (the model), ``p`` (the prompts), ``T``, ``N``, ``I`` (no intervals)
ANALYSES = {
    # the model's own forward pass (grouped keys and values as the model has them), no hook, one sequence
    # per pass as in the analyses below
    "bare": "run = m.model if m.spec.extra.get('backend') == 'hooked' else m.backend.forward\n"
            "for i in range(len(p.tokens)):\n"
            "    run(p.tokens[i:i + 1], stop_at_layer=m.spec.n_layers)",
    "decompose": "A.decompose.decompose(m, p, batch_size=1, bootstrap=I, progress=False)",
    # with its default bootstrap intervals (200 refits per layer), on two sequences one pass each
    "decompose_intervals": "A.decompose.decompose(m, build_prompts(m, T=T, N=max(N, 2), seed=0), batch_size=1, "
                           "progress=False)",
    # a held-out probe needs two sequences at least
    "probe": "A.probes.position_probe(m, build_prompts(m, T=T, N=max(N, 2), seed=0), ridge=1.0, batch_size=1, "
             "bootstrap=I, progress=False)",
    "rotary_bands": "A.rotary_bands.rotary_bands(m, p, bootstrap=I, progress=False)",
    "sink_heads": "A.sinks.sink_heads(m, p, bootstrap=I, progress=False)",
    "sink_rate": "A.sinks.sink_rate(m, conditions=('natural',), T=T, N=N, bootstrap=I, progress=False)",
    "window_sinks": "A.sinks.window_sinks(m, p, bootstrap=I, progress=False)",
    "sink_reading": "A.sinks.sink_reading_heads(m, p, n_ablate=1, bootstrap=I, progress=False)",
    "bos_replacement": "A.bos.bos_replacement(m, p, replacements=('mean',), bootstrap=I, progress=False)",
    "convergence": "A.convergence.position0_convergence(m, p, replacements=('mean',), bootstrap=I, progress=False)",
    "trajectory_patching": "A.trajectory.trajectory_patching(m, p, layers=[1, m.spec.n_layers // 2], progress=False)",
    "rollout": "A.rollout.attention_rollout(m, p, bootstrap=I, progress=False)",
    "massive": "A.massive.massive_activations(m, p, bootstrap=I, progress=False)",
    "fingerprint": "A.fingerprint.fingerprint(m, T=T, N=max(N, 2), batch_size=1, progress=False)",
    "sink_metric": "A.sink_definitions.sink_metric(m, p, definition='gu', bootstrap=I, progress=False)",
    "sink_origin": "A.sink_origin.sink_origin(m, build_prompts(m, T=T - 1, N=N, seed=0, bos='none'), "
                   "conditions=('bos', 'no_bos'), bootstrap=I, progress=False)",
}

CHILD = r"""
import json, sys, time, torch
sys.path.insert(0, {bench!r})
from host_memory import Peaks, anonymous_mib
import lens_position.analyses as _
from lens_position.analyses import bos, convergence, decompose, fingerprint, massive, probes, rollout, rotary_bands
from lens_position.analyses import sink_definitions, sink_origin, sinks, trajectory
from lens_position import load_model
from lens_position.core.data import build_prompts
from lens_position.core.intervals import NO_INTERVALS as I
import types
A = types.SimpleNamespace(bos=bos, convergence=convergence, decompose=decompose, fingerprint=fingerprint,
                          massive=massive, probes=probes, rollout=rollout, rotary_bands=rotary_bands,
                          sink_definitions=sink_definitions, sink_origin=sink_origin, sinks=sinks,
                          trajectory=trajectory)
if {threads}:
    torch.set_num_threads({threads})
m = load_model({model!r})
if {keep}:  # the first blocks only: each layer's cost and memory as in the whole model, fewer of them
    import dataclasses
    m.model.blocks = m.model.blocks[:{keep}]
    m.model.cfg.n_layers = {keep}
    m.model.setup()
    m.spec = dataclasses.replace(m.spec, n_layers={keep}, attn_types=m.spec.attn_types[:{keep}])
T, N = {T}, {N}
p = build_prompts(m, T=T, N=N, seed=0)
passes = []  # positions embedded per forward pass
m.model.embed.register_forward_pre_hook(lambda module, args: passes.append(args[0].numel()))
before = anonymous_mib()
wall, cpu = time.perf_counter(), time.process_time()
with Peaks() as peaks, torch.inference_mode():
    exec({code!r})
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
print("RESULT " + json.dumps(dict(wall_s=wall, cpu_s=cpu, passes=len(passes), positions=sum(passes),
                                  peak_mib=peaks.anonymous - before)))
"""


def measure(name: str, args: argparse.Namespace) -> dict:
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), threads=args.threads, keep=args.keep_layers,
                        model=args.model,
                        T=args.T, N=args.N, code=ANALYSES[name])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    line = next((line for line in done.stdout.splitlines() if line.startswith("RESULT ")), None)
    if done.returncode or line is None:
        return {"analysis": name, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return {"analysis": name, **json.loads(line.removeprefix("RESULT "))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--T", type=int, default=8192)
    parser.add_argument("--N", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process (0: torch's default)")
    parser.add_argument("--keep-layers", type=int, default=0,
                        help="keep the first K blocks of the model (0: all): the per-layer cost and memory are "
                             "the whole model's, in K layers' time (TransformerLens 3.x's HookedTransformer)")
    parser.add_argument("--only", default="", help="comma-separated analyses (default: all of them)")
    parser.add_argument("--json", type=Path, default=None, help="append one JSON record per analysis here")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or [n for n in ANALYSES if n != "bare"]
    unknown = sorted(set(names) - set(ANALYSES))
    if unknown:
        parser.error(f"unknown analyses {unknown}; choose among {sorted(ANALYSES)}")
    kept = f" (first {args.keep_layers} blocks)" if args.keep_layers else ""
    print(f"{args.model}{kept}, T = {args.T}, N = {args.N}, {args.threads or 'default'} thread(s), "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    bare = measure("bare", args)
    if "error" in bare:
        sys.exit(f"the bare pass failed: {bare['error']}")
    print(f"{'bare':22s} {bare['wall_s']:9.1f} s wall {bare['cpu_s']:9.1f} s CPU {bare['passes']:2d} passes  "
          f"peak +{bare['peak_mib']:.0f} MiB", flush=True)
    common = dict(model=args.model, keep_layers=args.keep_layers, T=args.T, N=args.N)
    records = [dict(bare, **common, loadavg=os.getloadavg()[0])]
    for name in names:
        start = time.time()
        record = dict(measure(name, args), **common, loadavg=os.getloadavg()[0])
        if "error" in record:
            print(f"{name:22s} FAILED after {time.time() - start:.0f} s: {record['error']}", flush=True)
        else:
            # the bare run's CPU time per position, times the positions this analysis embedded
            record["cpu_over_bare_passes"] = record["cpu_s"] / (bare["cpu_s"] * max(record["positions"], 1)
                                                                / bare["positions"])
            record["peak_over_bare"] = record["peak_mib"] / max(bare["peak_mib"], 1.0)
            print(f"{name:22s} {record['wall_s']:9.1f} s wall {record['cpu_s']:9.1f} s CPU {record['passes']:2d} "
                  f"passes  {record['cpu_over_bare_passes']:.2f}x their bare CPU  peak +{record['peak_mib']:.0f} MiB "
                  f"({record['peak_over_bare']:.2f}x the bare pass's)", flush=True)
        records.append(record)
        if args.json:
            with args.json.open("a", encoding="utf-8") as out:
                out.write(json.dumps(record) + "\n")
    failed = [r["analysis"] for r in records if "error" in r]
    if failed:
        sys.exit(f"failed at T = {args.T}: {', '.join(failed)}")


if __name__ == "__main__":
    main()
