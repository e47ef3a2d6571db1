"""Host memory of loading a checkpoint, against the size of its weights.

Writes a random-initialised checkpoint folder shaped like Llama-3.2-1B (16 layers, d_model 2048,
32 query and 8 key/value heads, MLP 8192, vocabulary 128256, tied embeddings: 1.24 B parameters,
4.9 GB in float32; a byte-level tokenizer), then loads it with ``load_model(folder)`` in a process of
its own, twice: cold (an empty weight cache, so the folder is read, converted, verified against the
Hugging Face model and written to the cache) and warm (the hooked backend reads its cache; the bridge,
which boots on the Hugging Face model, reads the folder again). For each it prints the peak of the
process's resident and anonymous memory over what it held after its imports (lens_position,
TransformerLens and transformers: about 190 MiB resident, whatever the model; sampled every 5 ms),
over the size of the checkpoint's weights and over the weights the loaded model holds. Target: at most
1.3x the checkpoint's weights, cold and warm.

The two sizes differ for a checkpoint with tied embeddings (this one): the hooked backend keeps its own
unembedding, as TransformerLens's ``HookedTransformer`` does (an edit of the embedding leaves the
unembedding alone), so it holds 1.21x the checkpoint's bytes; the bridge keeps them tied, and holds
its keys and values once per query head (1.08x).

    python benchmarks/load_memory.py                        # the 1B shape
    python benchmarks/load_memory.py --layers 4 --d-model 1024 --vocab 32000   # a smaller shape
    python benchmarks/load_memory.py --folder /tmp/llama-1b-shape   # keep the folder for reruns

Resident memory counts the weight files' pages the process maps (safetensors are memory-mapped) as
well as the memory it allocates (anonymous); anonymous memory is what the load itself holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from host_memory import Peaks, anonymous_mib, resident_mib

TARGET = 1.3


def write_checkpoint(folder: Path, layers: int, d_model: int, vocab: int) -> int:
    """A random Llama checkpoint of this shape in ``folder`` (kept when already there); its weights'
    size in bytes (float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from lens_position.models.tiny import byte_tokenizer

    config = LlamaConfig(hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=layers,
                         num_attention_heads=d_model // 64, num_key_value_heads=max(d_model // 256, 1),
                         head_dim=64, vocab_size=vocab, max_position_embeddings=131072, rope_theta=500000.0,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-5)
    if not (folder / "config.json").is_file():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        model.save_pretrained(folder, safe_serialization=True)
        byte_tokenizer(prepend_bos=True).save_pretrained(folder)
        del model
    with torch.device("meta"):
        shape = LlamaForCausalLM(config)
    return sum(p.numel() * 4 for p in shape.parameters())


def _one_load(folder: str, cache_dir: str) -> dict[str, float]:
    """Run in a process of its own: one ``load_model(folder)``, its peaks over the imports' memory."""
    import transformer_lens  # noqa: F401  (imported by the load otherwise: a fixed cost, not the load's)
    import transformers  # noqa: F401

    from lens_position.models import load_model

    base_resident, base_anonymous = resident_mib(), anonymous_mib()
    with Peaks() as peaks:
        loaded = load_model(folder, cache_dir=cache_dir)
    return {"resident_mib": peaks.resident - base_resident, "anonymous_mib": peaks.anonymous - base_anonymous,
            "from_cache": bool(loaded.spec.extra["from_cache"]), "seconds": loaded.spec.extra["load_seconds"],
            "backend": loaded.spec.extra["backend"], "model_weights_mib": held_weights_mib(loaded.model)}


def held_weights_mib(model: object) -> float:
    """The bytes of the weights a loaded model holds, each memory block counted once (the hooked backend
    keeps the unembedding apart from a tied embedding, as TransformerLens does; the bridge keeps them
    tied, as the Hugging Face model does), MiB."""
    from lens_position.models.weights import weights_of

    blocks = {tensor.untyped_storage().data_ptr(): tensor.untyped_storage().nbytes()
              for tensor in weights_of(model.state_dict()).values()}  # type: ignore[attr-defined]
    return sum(blocks.values()) / 2**20


def _in_process(folder: Path, cache_dir: str) -> dict[str, float]:
    code = ("import json, sys; sys.path.insert(0, sys.argv[3]); import load_memory; "
            "print(json.dumps(load_memory._one_load(sys.argv[1], sys.argv[2])))")
    out = subprocess.run([sys.executable, "-c", code, str(folder), cache_dir, str(Path(__file__).parent)],
                         check=True, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--folder", type=Path, help="where the checkpoint is written (kept); default a temporary one")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lens_position-load-") as scratch:
        folder = args.folder or Path(scratch) / "checkpoint"
        folder.mkdir(parents=True, exist_ok=True)
        weights = write_checkpoint(folder, args.layers, args.d_model, args.vocab) / 2**20
        cache_dir = str(Path(scratch) / "cache")
        runs = {"cold": _in_process(folder, cache_dir), "warm": _in_process(folder, cache_dir)}
    if runs["cold"]["from_cache"]:
        raise RuntimeError("the first load must read the folder, not a weight cache")
    held = runs["cold"]["model_weights_mib"]
    print(f"checkpoint weights: {weights:,.0f} MiB float32 ({args.layers} layers, d_model {args.d_model}, vocab "
          f"{args.vocab}); the loaded model ({runs['cold']['backend']} backend) holds {held:,.0f} MiB of weights")
    print(f"{'load':<6}{'cache':>6}{'seconds':>9}{'resident MiB':>14}{'/ checkpoint':>14}{'/ held':>8}"
          f"{'anonymous MiB':>15}{'/ held':>8}   resident <= {TARGET}x checkpoint")
    for name, run in runs.items():
        verdict = "yes" if run["resident_mib"] <= TARGET * weights else "NO"
        print(f"{name:<6}{'read' if run['from_cache'] else '-':>6}{run['seconds']:>9.1f}{run['resident_mib']:>14,.0f}"
              f"{run['resident_mib'] / weights:>13.2f}x{run['resident_mib'] / held:>7.2f}x"
              f"{run['anonymous_mib']:>15,.0f}{run['anonymous_mib'] / held:>7.2f}x   {verdict}")
    if args.json:
        args.json.write_text(json.dumps({"weights_mib": weights, **runs}, indent=1))


if __name__ == "__main__":
    main()
