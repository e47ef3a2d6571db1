"""Host memory of a model split in two as it is read, against the same model loaded whole.

Loads a model on the bridge (TransformerLens 4.x: the only line whose bridge takes weights on
disk) three times, each in a process of its own, and runs one forward pass of ``--tokens`` tokens:
whole (``load_model(name, backend="bridge")``); split in two by bytes, the first half of the modules
on the host and the second on disk (``device_map={...: "cpu" | "disk"}``), as a model split over two
GPUs is split; and none, every module on disk. It prints what each load and pass added to the
process's resident memory after its imports (its peak, sampled every 5 ms; anonymous memory too),
and, for the whole and the split model, the weights held on the host: its peak over the peak of the
run that keeps none there (the same checks, passes and activations), over the size of the weights.
Target: the split at most 0.6x the weights.

    python benchmarks/split_load.py                   # smollm2-135m
    python benchmarks/split_load.py --model gemma3-270m --tokens 256

Resident memory counts the checkpoint's pages mapped from the weight cache (safetensors are
memory-mapped) as well as anonymous memory; the differential against the run with every module on
disk is what placing half the modules on the host costs. On a machine with two GPUs,
``load_model(name, n_devices=2, backend="bridge")`` places the halves on the GPUs instead, and the
host holds neither (benchmarks/gpu.py checks a GPU placement).
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import json
import subprocess
import sys
import time

from host_memory import Peaks, anonymous_mib, resident_mib


def _halves(config: object) -> tuple[dict[str, str], float]:
    """A device map of a model with this config, and the share of its bytes it puts on the host: its
    modules in order, each on the host while its middle byte lies in the first half of the weights
    (sized with keys and values ungrouped, as the bridge holds them), the rest on disk (tied
    embeddings and head kept together)."""
    import torch
    from accelerate import init_empty_weights
    from accelerate.utils import compute_module_sizes
    from transformers import AutoModelForCausalLM

    ungrouped = copy.deepcopy(config)  # sized as it computes: keys and values ungrouped at load
    ungrouped.num_key_value_heads = ungrouped.num_attention_heads  # type: ignore[attr-defined]
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(ungrouped, dtype=torch.float32)
    sizes = compute_module_sizes(model)
    n_layers = int(config.num_hidden_layers)  # type: ignore[attr-defined]
    order = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(n_layers)), "model.norm", "lm_head"]
    tied = bool(getattr(config, "tie_word_embeddings", False))
    total, used, mapping = sum(sizes.get(n, 0) for n in order if not (n == "lm_head" and tied)), 0, {}
    for name in order:
        size = 0 if (name == "lm_head" and tied) else sizes.get(name, 0)
        mapping[name] = "cpu" if used + size / 2 <= total / 2 or name == "model.embed_tokens" else "disk"
        used += size
    if tied:
        mapping["lm_head"] = mapping["model.embed_tokens"]
    mapping["model.rotary_emb"] = "cpu"
    host = sum(sizes.get(name, 0) for name in order if mapping[name] == "cpu" and not (name == "lm_head" and tied))
    return mapping, host / total


def _trim() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: resident memory keeps freed heap
        pass


def _measure(model: str, device_map: dict[str, str] | None, tokens: int) -> dict[str, float]:
    """Load ``model`` (placed by ``device_map`` when given) and run one pass, in this process."""
    import tempfile

    import torch

    import lens_position as lp

    torch.set_num_threads(2)
    baseline_resident, baseline_anonymous = resident_mib(), anonymous_mib()
    with Peaks() as peaks:
        started = time.perf_counter()
        placed = {} if device_map is None else {"device_map": device_map, "offload_folder": tempfile.mkdtemp()}
        loaded = lp.load_model(model, backend="bridge", **placed)
        seconds = time.perf_counter() - started
        ids = torch.randint(1, int(loaded.spec.extra["d_vocab"]) - 1, (1, tokens))
        with torch.no_grad():
            loaded.model(ids)
    gc.collect()
    _trim()  # freed heap back to the system, so what stays resident is what is held
    return {"resident": peaks.resident - baseline_resident, "anonymous": peaks.anonymous - baseline_anonymous,
            "held": resident_mib() - baseline_resident, "seconds": seconds,
            "placement": loaded.spec.extra.get("placement")}


def _prepare(model: str) -> dict[str, object]:
    """``model``'s weights' bytes and its split in two (its weight cache made now if missing)."""
    import lens_position as lp

    loaded = lp.load_model(model, backend="bridge")
    hf_model = loaded.model.original_model
    weights = sum(p.numel() * p.element_size() for p in hf_model.parameters())
    mapping, host_share = _halves(hf_model.config)
    return {"weights_mib": weights / 2**20, "map": mapping, "host_share": host_share}


def _run_child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--child", choices=["prepare", "run"], help=argparse.SUPPRESS)
    parser.add_argument("--map", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child == "prepare":
        print(json.dumps(_prepare(args.model)))
        return
    if args.child:
        print(json.dumps(_measure(args.model, json.loads(args.map), args.tokens)))
        return
    prepared = _run_child(["--model", args.model, "--child", "prepare"])
    weights, halves = float(prepared["weights_mib"]), dict(prepared["map"])  # type: ignore[call-overload]
    print(f"{args.model}: weights {weights:,.0f} MiB; split: {sum(v == 'cpu' for v in halves.values())} modules on "
          f"the host, {sum(v == 'disk' for v in halves.values())} on disk")
    maps = {"whole": None, "split": halves, "none": {name: "disk" for name in halves}}
    rows = {kind: _run_child(["--model", args.model, "--tokens", str(args.tokens), "--child", "run",
                              "--map", json.dumps(mapping)]) for kind, mapping in maps.items()}
    for kind, row in rows.items():
        print(f"  {kind:5s}: load {row['seconds']:5.1f} s; after a pass {row['held']:7,.0f} MiB resident; peak "
              f"{row['resident']:7,.0f} MiB resident, {row['anonymous']:7,.0f} MiB anonymous; placement "
              f"{row['placement']}")
    floor = rows["none"]["held"]  # the same run keeping no weight on the host
    for kind in ("whole", "split"):
        print(f"  {kind}: weights held on the host {rows[kind]['held'] - floor:7,.0f} MiB = "
              f"{(rows[kind]['held'] - floor) / weights:.2f}x the weights (peak over the floor's peak: "
              f"{(rows[kind]['resident'] - rows['none']['resident']) / weights:.2f}x)")
    print(f"split in two ({prepared['host_share']:.2f}x of the bytes mapped to the host), host memory over the whole "
          f"model's weights: {(rows['split']['held'] - floor) / weights:.2f}x (target at most 0.6x)")

if __name__ == "__main__":
    main()
