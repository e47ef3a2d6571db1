"""Cold and warm load time of each default model, beside transformers' own load of the same GGUF.

Each load runs in a fresh Python process and is timed from its first import to the model in hand
(what a new notebook or command waits for):

- **transformers** (the baseline): ``AutoTokenizer`` and ``AutoModelForCausalLM.from_pretrained``
  of the same ``.gguf``, dequantised to float32: what the file costs without lens_position;
- **cold**: ``load_model`` with an empty weight cache (read the GGUF, dequantise, convert, check
  the conversion against transformers, write the cache);
- **warm**: ``load_model`` again, reading the cache.

The imports of torch, transformers and TransformerLens (paid once per process, whatever is loaded)
are timed apart from the ``load_model`` call. Prints seconds, the calls' times as ratios to the
baseline measured in the same run, and whether smollm2-135m meets its goals: the ``load_model``
call cold at most 15 s and warm at most 3 s on an idle 2-core machine (a busy machine stretches
every column alike).

    python benchmarks/load.py                       # the default models
    python benchmarks/load.py --models smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

GOALS = {"smollm2-135m": (15.0, 3.0)}  # cold, warm seconds

TRANSFORMERS = """
import time; started = time.perf_counter()
from pathlib import Path
from transformers import AutoModelForCausalLM, AutoTokenizer
import torch
path = Path({path!r})
AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
print(time.perf_counter() - started)
"""

LENS_POSITION = """
import time; started = time.perf_counter()
import torch, transformers, transformer_lens
from lens_position import load_model
imported = time.perf_counter()
loaded = load_model({name!r}, cache_dir={cache!r})
print(imported - started, time.perf_counter() - imported, loaded.spec.extra["from_cache"])
"""


def timed(code: str) -> list[str]:
    """The last stdout line of ``code`` run in a fresh interpreter, split into words."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout.strip().splitlines()[-1].split()


def main() -> None:
    from lens_position.models import DEFAULT_MODELS
    from lens_position.models.registry import lookup

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=DEFAULT_MODELS)
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{'model':<24}{'transformers s':>16}{'imports s':>11}{'cold s':>9}{'cold/tf':>9}{'warm s':>9}"
          f"{'warm/tf':>9}  goal")
    rows = []
    for name in args.models:
        path = str(lookup(name).locate())
        baseline = float(timed(TRANSFORMERS.format(path=path))[0])
        with tempfile.TemporaryDirectory(prefix="lens_position-bench-") as cache:
            imports, cold, cold_hit = timed(LENS_POSITION.format(name=name, cache=cache))
            _, warm, warm_hit = timed(LENS_POSITION.format(name=name, cache=cache))
        if cold_hit != "False" or warm_hit != "True":
            raise RuntimeError("the cold load must convert and the warm one read the cache")
        cold_s, warm_s = float(cold), float(warm)
        goal = GOALS.get(name)
        verdict = "-" if goal is None else (
            f"cold <= {goal[0]:g} s {'yes' if cold_s <= goal[0] else 'NO'}, "
            f"warm <= {goal[1]:g} s {'yes' if warm_s <= goal[1] else 'NO'}")
        print(f"{name:<24}{baseline:>16.1f}{float(imports):>11.1f}{cold_s:>9.1f}{cold_s / baseline:>9.2f}{warm_s:>9.1f}"
              f"{warm_s / baseline:>9.2f}  {verdict}", flush=True)
        rows.append({"model": name, "transformers_s": baseline, "imports_s": float(imports), "cold_s": cold_s,
                     "warm_s": warm_s})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
