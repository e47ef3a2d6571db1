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


def time_load(name: str, cache_dir: str) -> tuple[float, bool]:
    started = time.perf_counter()
    loaded = load_model(name, cache_dir=cache_dir)
    return time.perf_counter() - started, bool(loaded.spec.extra["from_cache"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS))
    args = parser.parse_args()
    print(f"{'model':<26}{'cold s':>9}{'warm s':>9}{'cold/warm':>11}  warm <= {WARM_TARGET_SECONDS:g} s")
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="lens_position-bench-") as cache_dir:
            cold, cold_hit = time_load(name, cache_dir)
            warm, warm_hit = time_load(name, cache_dir)
        assert not cold_hit and warm_hit, "the cold load must convert and the warm one read the cache"
        verdict = "yes" if warm <= WARM_TARGET_SECONDS else "NO"
        print(f"{name:<26}{cold:>9.1f}{warm:>9.1f}{cold / warm:>11.1f}  {verdict}", flush=True)


if __name__ == "__main__":
    main()
