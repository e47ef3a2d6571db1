"""Short forward passes of a grouped-query model on the hooked backend: keys and values computed once
per key/value head (lens_position's ``calculate_qkv_matrices``) against TransformerLens's own method,
which repeats ``W_K`` and ``W_V`` once per query head and copies them transposed on every pass.

    python benchmarks/grouped_kv.py                                   # smollm2-135m, T = 32
    python benchmarks/grouped_kv.py --model /tmp/llama-1b-shape --T 32   # a folder (load_memory.py --folder)

Both run on the same loaded model, alternately (``--repeats`` pairs of ``--passes`` passes each,
to the last block, one thread); the baseline is the model as TransformerLens 3.x builds it (its
method, ``_W_K``/``_W_V`` contiguous). Prints each side's CPU time and their ratio; asserts that the
two give the same residual, bit for bit. TransformerLens 3.x only (4.x has no HookedTransformer).
"""

from __future__ import annotations

import argparse
import os
import time
from types import MethodType

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--T", type=int, default=32)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    from lens_position.models import load_model
    from lens_position.models.adapters import _calculate_qkv_matrices

    torch.set_num_threads(1)
    model = load_model(args.model, backend="hooked").model
    tokens = torch.randint(0, model.cfg.d_vocab, (1, args.T), generator=torch.Generator().manual_seed(0))
    n_layers = model.cfg.n_layers

    def run() -> tuple[float, torch.Tensor]:
        start = time.process_time()
        with torch.no_grad():
            for _ in range(args.passes):
                out = model(tokens, return_type=None, stop_at_layer=n_layers)
        return time.process_time() - start, out

    times: dict[str, list[float]] = {"once per key head": [], "TransformerLens": []}
    for _ in range(args.repeats):
        seconds, ours = run()
        times["once per key head"].append(seconds)
        kept = []
        for block in model.blocks:  # TransformerLens as it builds the model
            attn = block.attn
            del attn.calculate_qkv_matrices
            kept.append((attn._W_K.data, attn._W_V.data))
            attn._W_K.data, attn._W_V.data = attn._W_K.data.contiguous(), attn._W_V.data.contiguous()
        try:
            seconds, theirs = run()
        finally:
            for block, (w_k, w_v) in zip(model.blocks, kept):
                block.attn.calculate_qkv_matrices = MethodType(_calculate_qkv_matrices, block.attn)
                block.attn._W_K.data, block.attn._W_V.data = w_k, w_v
        times["TransformerLens"].append(seconds)
        assert torch.equal(ours, theirs), "the two methods gave different residuals"
    for name, values in times.items():
        print(f"{name:18s} CPU s per {args.passes} passes: " + ", ".join(f"{v:.3f}" for v in values))
    ratio = sum(times["once per key head"]) / sum(times["TransformerLens"])
    print(f"{args.model}, T = {args.T}: {ratio:.2f}x TransformerLens's CPU time (same residual, bit for bit)")


if __name__ == "__main__":
    main()
