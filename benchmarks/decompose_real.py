"""Per-layer T, R, M, C (mean over heads) on the real default models, printed as measured.

    python benchmarks/decompose_real.py                         # both models
    python benchmarks/decompose_real.py --models gemma3-270m --N 4 --query-range 0 32

Defaults: SmolLM2-135M at T = 256 and Gemma-3-270M at T = 640 (longer than its local
window of 512, so the local layers slide), N = 8 natural-text windows of CPython's help
text, the tokenizer's own BOS policy (SmolLM2: no BOS; Gemma-3: ``<bos>``), all queries and
all keys. Also checks the exact identity log A = t - z against ``hook_pattern`` on two
sequences. Columns: fractions of Var(log A); ``_ho`` = held-out (split-half cross-fit).
With ``--probe`` it also prints the position probe (held-out R² of log(i+1) from
``resid_pre``, and the shuffled-position control) on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_T = {"smollm2-135m": 256, "gemma3-270m": 640}


def measure(name: str, T: int, N: int, bos: str, query_range: tuple[int, int] | None, keys: str,
            probe: bool = False) -> dict:
    from lens_position.analyses.decompose import check_identity, decompose
    from lens_position.analyses.probes import position_probe
    from lens_position.core.data import build_prompts
    from lens_position.models import load_model

    loaded = load_model(name)
    prompts = build_prompts(loaded, T=T, N=N, bos=bos, seed=0)
    identity = check_identity(loaded, prompts.tokens[:2])
    start = time.perf_counter()
    result = decompose(loaded, prompts, query_range=query_range, keys=keys, progress=True)
    seconds = time.perf_counter() - start
    probes = position_probe(loaded, prompts, progress=False).layers if probe else None
    return {"probes": probes,"name": name, "T": T, "N": N, "bos": bos, "position0": prompts.spec.position0,
            "query_range": query_range, "keys": keys, "seconds": seconds,
            "identity_max_abs_error_pattern": float(identity.max_abs_error_pattern.max()),
            "identity_max_abs_error_log": float(identity.max_abs_error_log.max()),
            "layers": result.layers, "heads": result.heads}


def table(measured: dict) -> str:
    layers = measured["layers"].rename(columns=lambda c: c.replace("_heldout", "_ho"))
    window = measured["heads"].groupby("layer").window.first()
    layers.insert(2, "window", layers.layer.map(window))
    by_type = layers.groupby("layer_type")[["total", "R", "M", "C", "total_ho", "R_ho", "M_ho", "C_ho"]].mean()
    header = (f"{measured['name']}: T={measured['T']}, N={measured['N']}, bos={measured['bos']} "
              f"(position 0: {measured['position0']}), queries={measured['query_range'] or 'all'}, "
              f"keys={measured['keys']}; decompose took {measured['seconds']:.0f} s; identity "
              f"log A = t - z: max |exp(t-z) - A| = {measured['identity_max_abs_error_pattern']:.1e}, "
              f"max |(t-z) - log A| (A > 1e-6) = {measured['identity_max_abs_error_log']:.1e}")
    lines = [header, layers.to_string(index=False, float_format=lambda x: f"{x:.4f}"),
             "mean by layer type:", by_type.to_string(float_format=lambda x: f"{x:.4f}")]
    if measured["probes"] is not None:
        lines += ["position probe (penalty chosen by CV within training; positions 1..T-1; "
                  "half of the sequences held out):",
                  measured["probes"].to_string(index=False, float_format=lambda x: f"{x:.3f}")]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_T))
    parser.add_argument("--T", type=int, help="positions per sequence (default: 256 SmolLM2, 640 Gemma-3)")
    parser.add_argument("--N", type=int, default=8)
    parser.add_argument("--bos", default="tokenizer")
    parser.add_argument("--query-range", type=int, nargs=2)
    parser.add_argument("--keys", default="all", choices=["all", "no-bos"])
    parser.add_argument("--probe", action="store_true", help="also run the position probe")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", help="also write the per-layer tables here")
    args = parser.parse_args()
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    everything = {}
    for name in args.models:
        measured = measure(name, args.T or DEFAULT_T.get(name, 256), args.N, args.bos,
                           tuple(args.query_range) if args.query_range else None, args.keys, args.probe)
        print(table(measured), flush=True)
        print()
        everything[name] = {k: v for k, v in measured.items() if k not in ("layers", "heads", "probes")}
        everything[name]["layers"] = measured["layers"].to_dict(orient="records")
        if measured["probes"] is not None:
            everything[name]["probes"] = measured["probes"].to_dict(orient="records")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(everything, handle, indent=1)


if __name__ == "__main__":
    main()
