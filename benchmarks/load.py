"""Cold versus warm load time of each default model.

Cold: an empty temporary weight cache, so the GGUF is dequantized and converted. Warm: the
same load again, reading the cache. Prints seconds and the cold/warm ratio per model; the
target is a warm load of at most 10 s.

    python benchmarks/load.py                       # all default models
    python benchmarks/load.py --models smollm2-135m
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lens_position.models import DEFAULT_MODELS, load_model  # noqa: E402

WARM_TARGET_SECONDS = 10.0


def time_load(name: str, cache_dir: str) -> tuple[float, float, bool]:
    """Wall seconds, CPU seconds (all threads of this process), and whether the cache was read."""
    started, cpu_started = time.perf_counter(), time.process_time()
    loaded = load_model(name, cache_dir=cache_dir)
    return (time.perf_counter() - started, time.process_time() - cpu_started,
            bool(loaded.spec.extra["from_cache"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=DEFAULT_MODELS,
                        help="default models (tiny models are built in code and never cached)")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times "
          "stretch on a busy machine; CPU seconds do not)")
    print(f"{'model':<26}{'cold s':>9}{'warm s':>9}{'cold/warm':>11}{'cold cpu s':>12}{'warm cpu s':>12}"
          f"  warm <= {WARM_TARGET_SECONDS:g} s")
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="lens_position-bench-") as cache_dir:
            cold, cold_cpu, cold_hit = time_load(name, cache_dir)
            warm, warm_cpu, warm_hit = time_load(name, cache_dir)
        if cold_hit or not warm_hit:
            raise RuntimeError("the cold load must convert and the warm one read the cache")
        verdict = "yes" if warm <= WARM_TARGET_SECONDS else "NO"
        print(f"{name:<26}{cold:>9.1f}{warm:>9.1f}{cold / warm:>11.1f}{cold_cpu:>12.1f}{warm_cpu:>12.1f}"
              f"  {verdict}", flush=True)


if __name__ == "__main__":
    main()
