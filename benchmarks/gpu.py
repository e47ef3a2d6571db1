"""Throughput per model on a GPU, and the decomposition's cost over a bare forward pass.

One command on a GPU machine (after ``pip install -e .`` with a CUDA build of torch)::

    python benchmarks/gpu.py                                   # embedded models, cuda, float32
    python benchmarks/gpu.py --dtype bfloat16 --T 1024 --N 32
    python benchmarks/gpu.py --models tiny-llama --device cpu  # the same code path on a CPU

For each model it loads the weights on the device in the dtype, builds N random-token prompts
of T positions, and measures (after one warm-up batch, with the device synchronised):

- the bare forward pass (no hooks): tokens per second;
- ``decompose`` (attention scores hooked and reduced to float64 statistics on the device,
  then the held-out fits): tokens per second, and its wall time over the bare forward's;
- the peak device memory of each (CUDA only).

With ``--placed`` it also loads each model on the bridge with ``device_map="auto"`` (every weight
put on the GPU as it is read, never the whole model on the host first) and prints the host memory
that load added over the model's weights, and the largest difference of ``decompose`` between the
placed model and the one loaded whole and then moved (target 0).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from host_memory import Peaks, resident_mib  # noqa: E402  (benchmarks/host_memory.py)

from lens_position.analyses.decompose import decompose  # noqa: E402
from lens_position.core.data import build_prompts  # noqa: E402
from lens_position.ground.errors import BadInputError  # noqa: E402
from lens_position.pipeline.config import Compute  # noqa: E402
from lens_position.pipeline.devices import resolve_device  # noqa: E402
from lens_position.pipeline.models import load_request  # noqa: E402


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _peak_mb(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None


def _reset(device: str) -> None:
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def bare_forward_s(model, tokens: torch.Tensor, batch_size: int, device: str) -> float:
    """Wall seconds of forward passes over ``tokens`` in batches (no hooks, no grad)."""
    with torch.inference_mode():
        model(tokens[:batch_size].to(device))  # warm-up: kernels, allocator
        _sync(device)
        started = time.perf_counter()
        for i in range(0, len(tokens), batch_size):
            model(tokens[i:i + batch_size].to(device))
        _sync(device)
    return time.perf_counter() - started


def placed_check(request: str, device: str, T: int) -> str:
    """The host memory a placed load adds, over the weights' size, and decompose's largest
    difference against the model loaded whole (both on the bridge)."""
    from lens_position.models import load_model

    before = resident_mib()
    with Peaks() as peaks:
        placed = load_model(request, backend="bridge", device_map="auto")
    host = peaks.resident - before
    weights = sum(p.numel() * p.element_size() for p in placed.model.original_model.parameters()) / 2**20
    whole = load_model(request, backend="bridge", device=device)
    prompts = build_prompts(whole, source="random", T=min(T, 128), N=4, bos="force", seed=0)
    a = decompose(placed, prompts, progress=False).heads.select_dtypes("number")
    b = decompose(whole, prompts, progress=False).heads.select_dtypes("number")
    return (f"{request}: placed {placed.spec.extra['placement']}; host peak grew {host:,.0f} MiB for "
            f"{weights:,.0f} MiB of weights ({host / weights:.2f}x); decompose max |placed - whole| "
            f"{float((a - b).abs().max().max()):.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--T", type=int, default=512)
    parser.add_argument("--N", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--placed", action="store_true", help="also check a load placed by device_map='auto'")
    args = parser.parse_args()
    try:
        device = resolve_device(args.device)
    except BadInputError as error:  # no GPU here: say so in one line and fail, never pass silently
        print(f"benchmarks/gpu.py needs a GPU: {error}", file=sys.stderr)
        return 2
    compute = Compute(device=device, dtype=args.dtype)
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"device {name}, dtype {args.dtype}, T {args.T}, N {args.N}, batch {args.batch_size}")
    print(f"{'model':<18} {'forward tok/s':>14} {'decompose tok/s':>16} {'decompose/forward':>18} "
          f"{'peak MB fwd':>12} {'peak MB dec':>12}")
    for request in args.models.split(","):
        loaded = load_request(request, compute)
        T = min(args.T, loaded.spec.n_ctx)
        prompts = build_prompts(loaded, source="random", T=T, N=args.N, bos="force", seed=0)
        tokens = args.N * T
        _reset(device)
        forward = bare_forward_s(loaded.model, prompts.tokens, args.batch_size, device)
        peak_forward = _peak_mb(device)
        warm = build_prompts(loaded, source="random", T=T, N=max(2, min(args.batch_size, args.N)), bos="force",
                             seed=1)
        decompose(loaded, warm, batch_size=args.batch_size, progress=False)  # warm-up
        _reset(device)
        _sync(device)
        started = time.perf_counter()
        decompose(loaded, prompts, batch_size=args.batch_size, progress=False)
        _sync(device)
        dec = time.perf_counter() - started
        peak_dec = _peak_mb(device)
        fmt = lambda v: f"{v:>12.0f}" if v is not None else f"{'-':>12}"  # noqa: E731
        print(f"{request:<18} {tokens / forward:>14.0f} {tokens / dec:>16.0f} {dec / forward:>18.1f} "
              f"{fmt(peak_forward)} {fmt(peak_dec)}")
        del loaded
        if args.placed:
            print("  " + placed_check(request, device, args.T))
    return 0


if __name__ == "__main__":
    sys.exit(main())
