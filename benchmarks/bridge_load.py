"""A second load on the bridge against the hooked backend's cached load, side by side.

Each measurement is a fresh process that loads the model once (filling its weight cache, or its
verdict file on the bridge) and then times a second ``load_model``: what a user pays in every new
session once the caches exist. The bridge runs in this interpreter's environment (TransformerLens
4.x: the bridge is its only model class); the hooked backend runs under ``--hooked-python``, an
environment with TransformerLens 3.x (``.venv`` after ``make setup``). Runs alternate, bridge then
hooked, so drift on a noisy machine falls on both. Prints each pair, the median ratio
bridge / hooked against the target (at most 1.2x), and whether the second load printed anything
(it must not: no progress bars from transformers, hub or tqdm).

    .venv-tl4/bin/python benchmarks/bridge_load.py                       # SmolLM2-135M, 5 pairs
    .venv-tl4/bin/python benchmarks/bridge_load.py --repeats 9 --hooked-python .venv/bin/python
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 1.2


def child(model: str, backend: str, cache_dir: str) -> None:
    """In a fresh process: load once, then time the second load and capture what it prints."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import importlib.metadata

    from lens_position.models import load_model

    load_model(model, backend=backend, cache_dir=cache_dir)
    out, err = io.StringIO(), io.StringIO()
    started, cpu_started = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        load_model(model, backend=backend, cache_dir=cache_dir)
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu_started,
                      "printed": (out.getvalue() + err.getvalue()).strip()[:200],
                      "transformer_lens": importlib.metadata.version("transformer_lens")}))


def measure(python: str, model: str, backend: str, cache_dir: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([python, __file__, "--child", model, backend, cache_dir], capture_output=True, text=True,
                          env=env, cwd=ROOT, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{backend} load under {python} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hooked-python", default=str(ROOT / ".venv" / "bin" / "python"))
    parser.add_argument("--child", nargs=3, metavar=("MODEL", "BACKEND", "CACHE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; one thread per process")
    ratios = []
    with tempfile.TemporaryDirectory(prefix="lens_position-bench-") as bridge_cache, \
            tempfile.TemporaryDirectory(prefix="lens_position-bench-") as hooked_cache:
        for repeat in range(args.repeats):
            bridge = measure(sys.executable, args.model, "bridge", bridge_cache)
            hooked = measure(args.hooked_python, args.model, "hooked", hooked_cache)
            ratios.append(bridge["seconds"] / hooked["seconds"])
            print(f"pair {repeat + 1}: bridge (TransformerLens {bridge['transformer_lens']}) {bridge['seconds']:.2f} s "
                  f"({bridge['cpu']:.2f} s CPU), hooked (TransformerLens {hooked['transformer_lens']}) "
                  f"{hooked['seconds']:.2f} s ({hooked['cpu']:.2f} s CPU): {ratios[-1]:.2f}x", flush=True)
            for name, result in (("bridge", bridge), ("hooked", hooked)):
                if result["printed"]:
                    print(f"  the {name} backend's second load printed: {result['printed']!r}")
    median = statistics.median(ratios)
    print(f"second load, bridge over hooked: median {median:.2f}x (range {min(ratios):.2f}-{max(ratios):.2f}x); "
          f"target at most {TARGET}x: {'met' if median <= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
