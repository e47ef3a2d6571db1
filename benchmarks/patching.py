"""resid_pre patching sweep: lens_position versus TransformerLens, same model, prompt, metric.

Both sweep every (layer, position): patch ``resid_pre[layer][:, position]`` from the source
run into the target run and evaluate the metric on the logits.

- TransformerLens: ``transformer_lens.patching.get_act_patch_resid_pre`` runs one full
  forward pass per (layer, position).
- lens_position: ``lens_position.analyses.patching.resid_pre_sweep`` resumes each layer from the
  cached target residual (``start_at_layer``) and batches all positions of a layer into one
  forward pass.

Prompt: ``T`` tokens of the default natural text (BOS forced); the source run is the same
text with token ``T // 2`` replaced. Metric: log-probability of the target's true next
token after position ``T - 2``, at position ``T - 2`` (mean over the batch).

Prints the largest absolute difference between the two sweeps (must be <= 1e-4), the wall
time of each and their ratio (target >= 5x). Model: SmolLM2-135M via
``load_model("smollm2-135m")``; if it cannot be loaded it falls back to ``tiny-llama`` and
says so.

    python benchmarks/patching.py
    python benchmarks/patching.py --model tiny-llama --T 24
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# TransformerLens shows a progress bar per patch; it would drown the result lines.
os.environ.setdefault("TQDM_DISABLE", "1")

import torch  # noqa: E402
from transformer_lens.patching import get_act_patch_resid_pre  # noqa: E402

from lens_position.core.data import build_prompts  # noqa: E402
from lens_position.models import load_model  # noqa: E402
from lens_position.analyses.patching import resid_pre_sweep  # noqa: E402

TOLERANCE = 1e-4
TARGET_SPEEDUP = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--T", type=int, default=16, help="prompt length, position 0 included")
    parser.add_argument("--N", type=int, default=1, help="prompts in the batch")
    parser.add_argument("--batch-size", type=int, default=64, help="rows per lens_position forward pass")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    name, note = args.model, ""
    try:
        loaded = load_model(name)
    except Exception as error:  # the fallback is the point: say why and go on
        note = f"could not load {name} ({type(error).__name__}: {error}); fell back to tiny-llama"
        name, loaded = "tiny-llama", load_model("tiny-llama")
    model = loaded.model
    prompts = build_prompts(loaded, source="natural", T=args.T, N=args.N, bos="force", seed=args.seed)
    target = prompts.tokens
    source = target.clone()
    middle = args.T // 2
    source[:, middle] = (source[:, middle] + 1) % loaded.model.cfg.d_vocab
    answer = target[:, -1]

    def metric(logits: torch.Tensor) -> torch.Tensor:
        log_probs = logits[:, -2].log_softmax(-1)
        return log_probs.gather(-1, answer[: len(log_probs), None].to(log_probs.device)).mean()

    with torch.no_grad():
        metric(model(target))  # warm-up: first-call allocations count for neither side

    started = time.perf_counter()
    ours = resid_pre_sweep(loaded, prompts, source, metric, batch_size=args.batch_size)
    ours_s = time.perf_counter() - started

    started = time.perf_counter()
    with torch.no_grad():
        _, source_cache = model.run_with_cache(source, names_filter=lambda n: n.endswith("hook_resid_pre"))
        theirs = get_act_patch_resid_pre(model, target, source_cache, metric)
    theirs_s = time.perf_counter() - started

    diff = float((ours.values.cpu() - theirs.cpu()).abs().max())
    result = {
        "model": name, "note": note, "T": args.T, "N": args.N, "layers": model.cfg.n_layers,
        "conditions": int(ours.values.numel()), "max_abs_diff": diff, "tolerance": TOLERANCE,
        "lens_position_s": ours_s, "transformer_lens_s": theirs_s, "speedup": theirs_s / ours_s,
        "target_speedup": TARGET_SPEEDUP, "torch_threads": torch.get_num_threads(),
        "metric_range": [float(theirs.min()), float(theirs.max())],
        # an oversubscribed CPU slows many small passes (TransformerLens) more than a few
        # large ones (ours): read the speed-up together with the load
        "load_average_1min": os.getloadavg()[0], "cpu_count": os.cpu_count(),
    }
    if note:
        print(note)
    print(f"model {name}: {model.cfg.n_layers} layers x {args.T} positions = {result['conditions']} patches, "
          f"N = {args.N}, {torch.get_num_threads()} threads, load average {result['load_average_1min']:.1f} "
          f"on {result['cpu_count']} CPUs")
    print(f"metric over the sweep: {result['metric_range'][0]:.4f} .. {result['metric_range'][1]:.4f}")
    print(f"max |lens_position - transformer_lens| = {diff:.2e}  (must be <= {TOLERANCE:g}): "
          f"{'OK' if diff <= TOLERANCE else 'FAIL'}")
    print(f"transformer_lens {theirs_s:.2f} s, lens_position {ours_s:.2f} s, speed-up {result['speedup']:.1f}x "
          f"(target >= {TARGET_SPEEDUP:g}x): {'OK' if result['speedup'] >= TARGET_SPEEDUP else 'below target'}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
    if diff > TOLERANCE:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
