"""Wall time and peak memory of `lens-position reproduce`, in total and per step.

Runs the reproduction into a fresh output folder (so no step comes from the result cache;
model weights come from the warm weight cache when it is there), then prints one row per
(model, step) with its wall time and the peak resident memory reached during it, the totals,
and the slowest step. Target for the full default run on 2 cores: at most 15 min warm and
8 GB peak.

    python benchmarks/reproduce.py                         # the full default run
    python benchmarks/reproduce.py --quick --models tiny-llama,tiny-gemma3
    python benchmarks/reproduce.py --json benchmark.json   # also save the numbers
    python benchmarks/reproduce.py --executor ray --quick --models smollm2-135m,gemma3-270m
        # the same run serially and on a local Ray instance (all CPUs), one after the other,
        # each into a fresh folder; prints the wall-time ratio serial / Ray (Ray's start included)
    python benchmarks/reproduce.py --baseline /tmp/base   # this version vs an earlier commit
        # (git worktree add /tmp/base <commit>): the same command line run by each, one after
        # the other in a fresh process and output folder; prints both wall and CPU times, their
        # ratio, and the max |difference| over every numeric column of every table both write
        # (target <= 1e-10). --fast: smollm2-135m only; --threads 1: both on one torch thread
        # (steadier CPU times on a busy machine).
    python benchmarks/reproduce.py --intervals-ratio       # also rerun without intervals: the cost ratio
    python benchmarks/reproduce.py --quick --models smollm2-135m,smollm2-135m-ntk,smollm2-135m-ntk-parts,gemma3-270m \
        --peak-alone gemma3-270m
        # the run over every model, then the run of gemma3-270m alone, each in a process of its own;
        # prints both peaks and their ratio. Target: at most 1.2x (each model is released before the
        # next loads, so a run over several models needs what its largest needs)

**Against the floor.** Every forward pass the reproduction makes is recorded (its model, input
shape, ``start_at_layer``, ``stop_at_layer``, return type); after the run each model is loaded
again and the same passes are replayed bare (no hooks, no statistics, random inputs of the same
shape). The script prints, per model, the wall time of its steps over the time of its bare
passes. Target: at most 1.3x (what the analyses add to the forward passes they need).

With ``--intervals-ratio`` the same reproduction runs a second time in this invocation with
``n_resamples = 0`` (no bootstrap intervals, statistics kept per half instead of per
sequence), and the script prints the wall-time and CPU-time ratios of the run with intervals
to the run without. Target: at most 1.2x (a bootstrap refits re-weighted statistics and must
not cost forward passes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from lens_position.pipeline import DEFAULT_MODELS, RunConfig, run  # noqa: E402

# Ray may cost at most this much more wall time than the serial executor on one 2-core machine
# (its gain is on clusters; here it must not be a loss worth avoiding).
MAX_RAY_OVER_SERIAL = 1.3


def compare_executors(args: argparse.Namespace) -> int:
    """Serial, then Ray (a local instance started and stopped inside the timed block), same run."""
    import pandas as pd

    times, results = {}, {}
    for executor in ("serial", "ray"):
        with tempfile.TemporaryDirectory(prefix=f"lens-position-bench-{executor}-") as tmp:
            started = time.perf_counter()
            results[executor] = run(RunConfig(out=Path(tmp) / "results", models=tuple(args.models.split(",")),
                                              quick=args.quick, T=args.T, N=args.N, use_cache=False,
                                              browser_check=False, progress=False, executor=executor))
            times[executor] = time.perf_counter() - started
        print(f"{executor:>6}: {times[executor]:.1f} s wall")
        if executor == "serial":
            print_steps(results[executor])
    same = all(pd.DataFrame.equals(results["serial"].tables[k], results["ray"].tables[k])
               for k in results["serial"].tables)
    ratio = times["ray"] / times["serial"]
    print(f"wall time Ray / serial = {ratio:.2f} (serial / Ray = {1 / ratio:.2f}) on {os.cpu_count()} CPUs, "
          f"1-minute load average {os.getloadavg()[0]:.1f}; tables bitwise identical: {same} "
          "(torch threads differ: 1 per Ray actor, all cores serially; rounding-level differences expected)")
    print(f"target Ray <= {MAX_RAY_OVER_SERIAL}x serial: {'met' if ratio <= MAX_RAY_OVER_SERIAL else 'NOT met'}")
    return 0 if ratio <= MAX_RAY_OVER_SERIAL else 1

TARGET_WALL_S = 15 * 60
TARGET_PEAK_MB = 8 * 1024
TARGET_INTERVALS_RATIO = 1.2
TARGET_OVER_BARE = 1.3


class ForwardLog:
    """Records every ``HookedTransformer.forward`` call made inside the ``with`` block: per model
    (in order of first call), ``(input shape, integer input?, start_at_layer, stop_at_layer,
    return_type)``."""

    def __init__(self) -> None:
        self.calls: dict[int, list[tuple]] = {}

    def __enter__(self) -> ForwardLog:
        from transformer_lens import HookedTransformer

        self._original = original = HookedTransformer.forward
        log = self

        def forward(model, input, *args, **kwargs):
            log.calls.setdefault(id(model), []).append((
                tuple(input.shape), not torch.is_floating_point(input), kwargs.get("start_at_layer"),
                kwargs.get("stop_at_layer"), kwargs.get("return_type", "logits")))
            return original(model, input, *args, **kwargs)

        HookedTransformer.forward = forward
        return self

    def __exit__(self, *exc) -> None:
        from transformer_lens import HookedTransformer

        HookedTransformer.forward = self._original


def replay_bare(model_request: str, calls: list[tuple]) -> tuple[float, float]:
    """(wall s, CPU s of this process) to run ``calls`` (a :class:`ForwardLog` list) on the model ``model_request``
    names,
    without hooks, on random inputs of the recorded shapes. A pass the analysis ended inside its
    last block is replayed to the end of that block (a slight overestimate of the bare time)."""
    from lens_position.pipeline.models import load_request

    model = load_request(model_request).model
    generator = torch.Generator().manual_seed(0)
    inputs = {}
    total, cpu = 0.0, 0.0
    with torch.no_grad():
        for shape, integer, start, stop, return_type in calls:
            key = (shape, integer)
            if key not in inputs:
                inputs[key] = (torch.randint(0, model.cfg.d_vocab, shape, generator=generator) if integer
                               else torch.randn(shape, generator=generator))
            started, cpu_started = time.perf_counter(), time.process_time()
            model(inputs[key], start_at_layer=start, stop_at_layer=stop,
                  return_type=None if return_type is None else "logits")
            total += time.perf_counter() - started
            cpu += time.process_time() - cpu_started
    return total, cpu


def _timed(config: RunConfig) -> tuple[object, float, float]:
    """(result, wall s, CPU s of this process) of one reproduction."""
    started, cpu_started = time.perf_counter(), time.process_time()
    result = run(config)
    return result, time.perf_counter() - started, time.process_time() - cpu_started


MAX_TABLE_DIFFERENCE = 1e-10
FAST_MODELS = ("smollm2-135m",)


def _timed_cli(pythonpath: Path, args: argparse.Namespace, models: str, out: Path) -> dict:
    """Run ``lens-position reproduce`` from the package at ``pythonpath`` in a fresh process:
    wall time of the whole command, CPU time of the child (all its threads)."""
    import subprocess

    command = [sys.executable, "-m", "lens_position.cli.commands", "reproduce", "--models", models, "--out", str(out),
               "--no-progress", "--no-cache"]
    command += ["--quick"] if args.quick else []
    command += ["--T", str(args.T)] if args.T else []
    command += ["--N", str(args.N)] if args.N else []
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    if args.threads:  # both versions' torch on this many threads (the baseline has no --threads option)
        env.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    completed = subprocess.run(command, env=env, cwd=str(pythonpath), capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if completed.returncode not in (0,):
        tail = (completed.stdout + completed.stderr)[-2000:]
        raise SystemExit(f"reproduce from {pythonpath} exited with {completed.returncode}:\n{tail}")
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "load_average_1min": os.getloadavg()[0]}


# Columns whose meaning changed after the baseline, mapped explicitly (never matched by name):
# table -> {baseline column: this version's column with the baseline's definition}. Issue 10 made
# ``sink_rate`` Gu et al.'s rate as their code computes it (each prompt thresholded, then averaged);
# the baseline's ``sink_rate`` (scores averaged over prompts, thresholded once) is now
# ``sink_rate_pooled``. A column of this version named like a mapped baseline column is a new
# definition with no baseline counterpart.
RENAMED = {"sink_rate": {"sink_rate": "sink_rate_pooled"}}
# Columns renamed with their definition unchanged (a column named like a pandas attribute, ``T``,
# became ``total``; the sink rate's sequence length ``T`` became ``seq_len``): a baseline's
# frame gets the new names before anything is compared.
_TOTAL = {f"T{s}": f"total{s}" for s in ("", "_lo", "_hi", "_heldout", "_heldout_lo", "_heldout_hi")}
SAME_DEFINITION = {"sink_rate": {"T": "seq_len"}, **{t: _TOTAL for t in (
    "decompose_layers", "decompose_heads", "decompose_replicates", "decompose_early_layers",
    "decompose_early_heads", "decompose_early_replicates")}}
# Columns that say which inputs a row measured, with the value a baseline without the column used.
# Where they differ, the two versions measured different prompts: those rows are compared on the
# baseline's inputs, recomputed by this version (``_recompute_on_baseline_inputs``).
INPUT_COLUMNS = {"sink_rate": {"condition": None, "seq_len": None, "N": None, "eps": None, "bos": None,
                               "protocol": "windows"}}


def _interval_names(columns: list[str]) -> list[str]:
    """Column names with ``X_lo``/``X_hi`` pairs written once as ``X_lo/_hi``."""
    out, names = [], set(columns)
    for column in columns:
        if column.endswith("_hi") and column[:-3] + "_lo" in names:
            continue
        out.append(column + "/_hi" if column.endswith("_lo") and column[:-3] + "_hi" in names else column)
    return out


def _column_difference(x, y) -> float:
    """Max |y - x| of two aligned columns (0 where both are NaN; inf where only one is, or where
    non-numeric values differ)."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_numeric_dtype(x) and pd.api.types.is_numeric_dtype(y) and not pd.api.types.is_bool_dtype(x):
        x, y = x.to_numpy(dtype=float), y.to_numpy(dtype=float)
        if not len(x):
            return 0.0
        nan_x, nan_y = np.isnan(x), np.isnan(y)
        if (nan_x != nan_y).any():
            return float("inf")
        return float(np.abs(x - y)[~nan_x].max(initial=0.0))
    return 0.0 if x.astype(str).reset_index(drop=True).equals(y.astype(str).reset_index(drop=True)) else float("inf")


def _input_changes(table: str, a, b) -> dict[str, tuple]:
    """The input columns of ``table`` whose values differ between baseline ``a`` and this
    version ``b``: ``{column: (baseline values, this version's values)}``."""
    changes = {}
    for column, default in INPUT_COLUMNS.get(table, {}).items():
        old = a[column].astype(str).tolist() if column in a.columns else [str(default)] * len(a)
        new = b[column].astype(str).tolist() if column in b.columns else [None] * len(b)
        if old != new:
            changes[column] = (sorted(set(old)), sorted(set(map(str, new))))
    return changes


def _table_differences(base: Path, new: Path) -> tuple[dict[str, float], list[str]]:
    """Max |this version - baseline| over the columns with the same definition in both, per table
    both write (inf when a table's rows or a non-numeric column differ), and lines saying what
    was mapped, what is new, and what was measured on different inputs."""
    import pandas as pd

    out, notes = {}, []
    tables = sorted(p.stem for p in base.glob("*.parquet"))
    only_new = sorted(p.stem for p in new.glob("*.parquet") if not (base / p.name).is_file())
    for table in tables:
        if not (new / f"{table}.parquet").is_file():
            notes.append(f"{table}: written by the baseline only")
            out[table] = float("inf")
            continue
        a, b = pd.read_parquet(base / f"{table}.parquet"), pd.read_parquet(new / f"{table}.parquet")
        a = a.rename(columns=SAME_DEFINITION.get(table, {}))
        renamed = RENAMED.get(table, {})
        counterpart = {column: renamed.get(column, column) for column in a.columns}
        inputs = INPUT_COLUMNS.get(table, {})
        if len(a) != len(b):
            notes.append(f"{table}: {len(a)} rows in the baseline, {len(b)} here")
            out[table] = float("inf")
            continue
        changes = _input_changes(table, a, b)
        if changes:
            described = "; ".join(f"{c} {'/'.join(o)} -> {'/'.join(n)}" for c, (o, n) in changes.items())
            notes.append(f"{table}: different inputs in the two runs ({described}); compared below on the "
                         "baseline's inputs, recomputed by this version")
            out[table] = float("nan")  # filled by the recomputation
        else:
            out[table] = max([_column_difference(a[old], b[mine]) for old, mine in counterpart.items()
                              if mine in b.columns and old not in inputs] + [0.0])
        for old, mine in renamed.items():
            notes.append(f"{table}: baseline column {old!r} is this version's {mine!r} (same definition); "
                         f"this version's {old!r} is a new definition with no baseline counterpart")
        missing = [c for c, mine in counterpart.items() if mine not in b.columns]
        if missing:
            notes.append(f"{table}: baseline columns missing here: {', '.join(missing)}")
            out[table] = float("inf")
        new_columns = [c for c in b.columns if c not in set(counterpart.values()) or c in renamed]
        if new_columns:
            notes.append(f"{table}: new columns (no baseline counterpart): {', '.join(_interval_names(new_columns))}")
    if only_new:
        notes.append(f"tables new in this version (no baseline counterpart): {', '.join(only_new)}")
    return out, notes


def _recompute_on_baseline_inputs(table: str, base: Path) -> float:
    """Max |difference| between the baseline's ``table`` and this version's computation of the
    same definition on the baseline's inputs (``sink_rate``: the pooled rate and the count of
    sink heads under the baseline's protocol, ``windows``, and BOS policy)."""
    import pandas as pd

    from lens_position.analyses.sinks import sink_rate
    from lens_position.core.intervals import NO_INTERVALS
    from lens_position.pipeline.models import load_request

    if table != "sink_rate":
        raise ValueError(f"no recomputation on the baseline's inputs for {table}")
    prov = json.loads((base / "provenance.json").read_text())
    settings, seed = prov["settings"], prov.get("seed", 0)
    a = pd.read_parquet(base / f"{table}.parquet")
    worst = 0.0
    for model, rows in a.groupby("model", sort=False):
        loaded = load_request(model)
        rows = rows.rename(columns=SAME_DEFINITION.get(table, {}))
        for (T, N, eps, bos), group in rows.groupby(["seq_len", "N", "eps", "bos"], sort=False):
            result = sink_rate(loaded, conditions=tuple(group["condition"]), T=int(T), N=int(N), eps=float(eps),
                               seed=seed, protocol="windows", bos=bos, batch_size=settings["batch_size"],
                               bootstrap=NO_INTERVALS, progress=False).frame.set_index("condition")
            mine = result.loc[group["condition"]]
            for old, column in (("sink_rate", "sink_rate_pooled"), ("n_sink_heads", "n_sink_heads")):
                worst = max(worst, float((mine[column].to_numpy(dtype=float)
                                          - group[old].to_numpy(dtype=float)).__abs__().max()))
    return worst


def compare_with_baseline(args: argparse.Namespace) -> int:
    """This version and the baseline, the same reproduction each (module docstring)."""
    here = Path(__file__).resolve().parent.parent
    models = ",".join(FAST_MODELS) if args.fast else args.models
    print(f"load before: {os.getloadavg()}, {os.cpu_count()} CPUs; models {models}; torch threads "
          f"{args.threads or 'default'}", flush=True)
    runs = {}
    with tempfile.TemporaryDirectory(prefix="lens-position-bench-baseline-") as tmp:
        for name, path in (("baseline", args.baseline.resolve()), ("this version", here)):
            runs[name] = _timed_cli(path, args, models, Path(tmp) / name.replace(" ", "_"))
            print(f"{name:>13}: {runs[name]['wall_s']:.1f} s wall, {runs[name]['cpu_s']:.1f} s CPU "
                  f"(1-minute load at the end {runs[name]['load_average_1min']:.1f})", flush=True)
        differences, notes = _table_differences(Path(tmp) / "baseline", Path(tmp) / "this_version")
        for table in [t for t, d in differences.items() if d != d]:  # NaN: measured on different inputs
            differences[table] = _recompute_on_baseline_inputs(table, Path(tmp) / "baseline")
    wall_ratio = runs["this version"]["wall_s"] / runs["baseline"]["wall_s"]
    cpu_ratio = runs["this version"]["cpu_s"] / runs["baseline"]["cpu_s"]
    worst = max(differences.values()) if differences else float("inf")
    for line in notes:
        print(f"  note: {line}")
    for table, diff in differences.items():
        print(f"  max |difference| {table:<18} {diff:.2e}")
    print(f"wall time this version / baseline = {wall_ratio:.2f}x, CPU time = {cpu_ratio:.2f}x; "
          f"max |difference| over every table: {worst:.2e} (target <= {MAX_TABLE_DIFFERENCE:g})")
    met = worst <= MAX_TABLE_DIFFERENCE
    if args.json:
        args.json.write_text(json.dumps({"models": models, "runs": runs, "wall_ratio": wall_ratio,
                                         "cpu_ratio": cpu_ratio, "max_difference": differences}, indent=1))
    return 0 if met else 1


def _tokens(record) -> int | None:
    """Prompt tokens a step ran on (N x T of its sizes; None for a model load)."""
    options = record.provenance.get("step_options") or {}
    if "N" in options and "T" in options:
        return int(options["N"]) * int(options["T"])
    return None


def print_steps(result) -> list[dict]:
    """Print (and return) one row per (model, step): wall, CPU, peak memory, tokens, CPU per token."""
    rows = [{"model": s.model, "step": s.step, "wall_s": round(s.wall_s, 2), "cpu_s": round(s.cpu_s, 2),
             "peak_rss_mb": round(s.peak_rss_mb), "tokens": _tokens(s)} for s in result.steps]
    print(f"\n{'model':<28} {'step':<14} {'wall s':>8} {'CPU s':>8} {'peak MB':>9} {'N x T':>7} {'CPU ms/token':>13}")
    for row in rows:
        per_token = f"{1000 * row['cpu_s'] / row['tokens']:>13.2f}" if row["tokens"] else f"{'':>13}"
        print(f"{row['model']:<28} {row['step']:<14} {row['wall_s']:>8.1f} {row['cpu_s']:>8.1f} "
              f"{row['peak_rss_mb']:>9} {row['tokens'] or '':>7} {per_token}")
    return rows


def _peak_of_run(models: str, args: argparse.Namespace, out: Path) -> tuple[float, float]:
    """Peak resident memory (MiB) and wall time of `reproduce` on ``models`` in a fresh process."""
    import subprocess

    code = ("import resource, sys; from lens_position.cli.commands import main; status = main(sys.argv[1:]); "
            "print('PEAK_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss); sys.exit(status)")
    command = [sys.executable, "-c", code, "reproduce", "--models", models, "--out", str(out), "--no-progress",
               "--no-browser-check", *(["--quick"] if args.quick else []),
               *(["--T", str(args.T)] if args.T else []), *(["--N", str(args.N)] if args.N else [])]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"reproduce on {models} failed:\n{done.stderr[-2000:]}")
    peak = next(int(line.split()[1]) for line in done.stdout.splitlines() if line.startswith("PEAK_KIB"))
    return peak / 1024, time.perf_counter() - started


def compare_peak_alone(args: argparse.Namespace) -> int:
    """The run over every model against the run of one model alone: peak memory of each and the ratio."""
    with tempfile.TemporaryDirectory(prefix="lens-position-bench-") as tmp:
        every, every_s = _peak_of_run(args.models, args, Path(tmp) / "every")
        alone, alone_s = _peak_of_run(args.peak_alone, args, Path(tmp) / "alone")
    print(f"peak of the run over {args.models}: {every:.0f} MiB ({every_s:.0f} s)")
    print(f"peak of {args.peak_alone} alone: {alone:.0f} MiB ({alone_s:.0f} s)")
    print(f"ratio (every model / {args.peak_alone} alone): {every / alone:.3f} (target <= 1.2)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(DEFAULT_MODELS))
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--T", type=int, default=None)
    parser.add_argument("--N", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: a fresh temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write the measurements here as JSON")
    parser.add_argument("--executor", choices=("serial", "ray"), default="serial",
                        help="ray: time the same run serially and on Ray and print the ratio")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="a checkout of an earlier commit: time both versions and compare their tables")
    parser.add_argument("--fast", action="store_true", help="with --baseline: smollm2-135m only")
    parser.add_argument("--threads", type=int, default=0,
                        help="with --baseline: torch threads of both runs (OMP_NUM_THREADS; default: torch's own). "
                             "On a busy machine 1 keeps OpenMP's spin-waiting out of the CPU times")
    parser.add_argument("--intervals-ratio", action="store_true",
                        help="rerun without bootstrap intervals and print the cost ratio")
    parser.add_argument("--peak-alone", default=None, metavar="MODEL",
                        help="also run MODEL alone, each run in its own process, and print the peak-memory ratio")
    args = parser.parse_args()
    if args.peak_alone is not None:
        return compare_peak_alone(args)
    if args.baseline is not None:
        return compare_with_baseline(args)
    if args.executor == "ray":
        return compare_executors(args)

    with tempfile.TemporaryDirectory(prefix="lens-position-bench-") as tmp:
        out = args.out or Path(tmp) / "results"
        config = RunConfig(out=out, models=tuple(args.models.split(",")), quick=args.quick, T=args.T,
                           N=args.N, use_cache=False, progress=True)
        with ForwardLog() as forwards:
            result, total_s, cpu_with_s = _timed(config)
        ratio = None
        if args.intervals_ratio:
            # the same run (browser check included), only without intervals
            _, plain_s, cpu_plain_s = _timed(dataclasses.replace(config, out=Path(tmp) / "no-intervals",
                                                                 n_resamples=0))
            ratio = {"wall_with_s": round(total_s, 1), "wall_without_s": round(plain_s, 1),
                     "cpu_with_s": round(cpu_with_s, 1), "cpu_without_s": round(cpu_plain_s, 1),
                     "wall_ratio": round(total_s / plain_s, 3),
                     "cpu_ratio": round(cpu_with_s / cpu_plain_s, 3)}
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cpu_total_s = time.process_time()
    load_1min = os.getloadavg()[0]
    # serial executor: the models made their first forward pass in the order of their steps
    model_order = list(dict.fromkeys(s.model for s in result.steps if s.step != "load"))
    bare = {}
    if len(model_order) == len(forwards.calls):
        for name, calls in zip(model_order, forwards.calls.values()):
            bare_s, bare_cpu_s = replay_bare(name, calls)
            bare[name] = {"passes": len(calls), "bare_s": bare_s, "bare_cpu_s": bare_cpu_s}
    else:
        print(f"note: {len(forwards.calls)} models made forward passes but the steps name {len(model_order)}; "
              "no per-model comparison with bare passes")

    rows = print_steps(result)
    by_step: dict[str, float] = {}
    for row in rows:
        by_step[row["step"]] = by_step.get(row["step"], 0.0) + row["wall_s"]
    print("\nper step, summed over models: " + ", ".join(f"{k} {v:.0f} s" for k, v in
                                                        sorted(by_step.items(), key=lambda kv: -kv[1])))
    slowest = max(rows, key=lambda r: r["wall_s"])
    steps_s = sum(r["wall_s"] for r in rows)
    print(f"slowest step: {slowest['step']} on {slowest['model']} ({slowest['wall_s']:.1f} s)")
    print(f"total wall time {total_s:.0f} s (steps {steps_s:.0f} s; report, tables and browser check "
          f"{total_s - steps_s:.0f} s); peak memory {peak_mb:.0f} MB; on {os.cpu_count()} CPUs")
    # With other work on the machine, wall time overstates the cost; CPU time over the threads
    # torch uses estimates the wall time on an otherwise idle machine.
    threads = torch.get_num_threads()
    print(f"CPU time {cpu_total_s:.0f} s over {threads} threads (≈ {cpu_total_s / threads:.0f} s of wall time "
          f"on an idle machine); 1-minute load average at the end {load_1min:.1f}")
    if ratio is not None:
        print(f"intervals: with {ratio['wall_with_s']:.0f} s wall / {ratio['cpu_with_s']:.0f} s CPU, without "
              f"{ratio['wall_without_s']:.0f} s wall / {ratio['cpu_without_s']:.0f} s CPU: ratio "
              f"{ratio['wall_ratio']:.2f}x wall, {ratio['cpu_ratio']:.2f}x CPU (target ≤ {TARGET_INTERVALS_RATIO}x)")
    for name, entry in bare.items():
        steps_of_model = sum(r["wall_s"] for r in rows if r["model"] == name and r["step"] != "load")
        cpu_of_model = sum(r["cpu_s"] for r in rows if r["model"] == name and r["step"] != "load")
        entry["steps_s"], entry["steps_cpu_s"] = round(steps_of_model, 1), round(cpu_of_model, 1)
        entry["over_bare"] = steps_of_model / entry["bare_s"] if entry["bare_s"] else float("nan")
        entry["cpu_over_bare"] = cpu_of_model / entry["bare_cpu_s"] if entry["bare_cpu_s"] else float("nan")
        print(f"{name}: steps {steps_of_model:.1f} s wall / {cpu_of_model:.1f} s CPU over {entry['passes']} bare "
              f"forward passes {entry['bare_s']:.1f} s wall / {entry['bare_cpu_s']:.1f} s CPU = "
              f"{entry['over_bare']:.2f}x wall, {entry['cpu_over_bare']:.2f}x CPU (target <= {TARGET_OVER_BARE}x)")
    if bare:
        all_bare = sum(e["bare_s"] for e in bare.values())
        print(f"whole run: {total_s:.0f} s over {all_bare:.0f} s of bare forward passes = {total_s / all_bare:.2f}x "
              "(loading, report and browser check included)")
    within = total_s <= TARGET_WALL_S and peak_mb <= TARGET_PEAK_MB
    print(f"target ≤ {TARGET_WALL_S / 60:.0f} min and ≤ {TARGET_PEAK_MB / 1024:.0f} GB: "
          f"{'met' if within else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({
            "models": args.models.split(","), "quick": args.quick, "settings": result.provenance["settings"],
            "cpus": os.cpu_count(), "total_wall_s": round(total_s, 1), "total_cpu_s": round(cpu_total_s, 1),
            "torch_threads": threads, "load_average_1min": load_1min, "peak_rss_mb": round(peak_mb),
            "steps": rows, "per_step_s": by_step, "slowest": slowest, "intervals_ratio": ratio, "bare": bare,
            "claims": result.claims[result.claims["architecture"] == "overall"][["claim", "measured", "verdict"]]
            .to_dict("records"),
        }, indent=1, default=str))
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
