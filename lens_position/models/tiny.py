"""Tiny random models, one per family, built in code in well under a second.

Each is a real Hugging Face model (``LlamaForCausalLM``, ``MistralForCausalLM``,
``Qwen2ForCausalLM``, ``Gemma3ForCausalLM``) initialised from a fixed seed, with a
byte-level tokenizer (259 ids: ``<pad>`` 0, ``<bos>`` 1, ``<eos>`` 2, then byte ``b`` at
``3 + b``). They go through exactly the same adapter as a downloaded checkpoint, so they
test the adapters against HF offline, and they let every analysis run end to end in
seconds. Weights are drawn with a larger std than HF's default (0.02) so that attention
patterns are far from uniform, as in trained models.

- ``tiny-llama``: 3 layers, d_model 64, 4 heads / 2 kv heads, θ = 10 000, causal.
- ``tiny-mistral``: tiny-llama's very weights (same seed and shapes) with a sliding window
  of 32 keys on every layer: the pair isolates the effect of the window.
- ``tiny-qwen2``: as tiny-llama with q/k/v biases, θ = 1 000 000.
- ``tiny-gemma3``: 6 layers (5 local with window 16, then 1 global), 4 heads / 1 kv head,
  θ = 1 000 000 global / 10 000 local, QK-norm, ``query_pre_attn_scalar`` 24. Its tokenizer
  prepends ``<bos>``, as Gemma-3's does; the others' do not, as SmolLM2's does not.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from lens_position.models.tiny_configs import (  # noqa: F401  (the names tests and callers import from here)
    BOS_ID,
    EOS_ID,
    N_SPECIAL,
    PAD_ID,
    TINY_CONFIGS,
    TINY_INIT_STD,
    TINY_N_CTX,
    TINY_SEED,
    TINY_VECTOR_NOISE,
    VOCAB_SIZE,
)

_HF_MODEL_CLASS = {"LlamaConfig": "LlamaForCausalLM", "MistralConfig": "MistralForCausalLM",
                   "Qwen2Config": "Qwen2ForCausalLM", "Gemma3TextConfig": "Gemma3ForCausalLM"}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what ByteLevel pre-tokenizes to)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(printable, map(chr, chars)))


def byte_tokenizer(prepend_bos: bool) -> PreTrainedTokenizerFast:
    """A byte-level tokenizer: one token per UTF-8 byte (id ``3 + byte``), lossless.

    With ``prepend_bos`` it puts ``<bos>`` (id 1) at position 0 of every encoding, like
    Gemma-3's tokenizer.
    """
    specials = ["<pad>", "<bos>", "<eos>"]
    vocab = {s: i for i, s in enumerate(specials)}
    vocab.update({char: N_SPECIAL + b for b, char in _bytes_to_unicode().items()})
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(specials)
    if prepend_bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", BOS_ID)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>")


def tiny_hf_model(name: str) -> tuple[Any, PreTrainedTokenizerFast]:
    """The HF model (fp32, eval mode) and tokenizer of a tiny registry model.

    Weights depend only on ``name`` (fixed seed); the global RNG state is left untouched.
    """
    config_class, kwargs, prepends_bos = TINY_CONFIGS[name]
    # a copy: a config keeps the dicts it is given (rope_parameters), and load options edit the config
    config = getattr(transformers, config_class)(**copy.deepcopy(kwargs))
    config._name_or_path = name
    config._attn_implementation = "eager"
    model_class = getattr(transformers, _HF_MODEL_CLASS[config_class])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_SEED)
        model = model_class(config).to(torch.float32)
        # HF initialises norms to 1 (or 0 under Gemma's 1 + w) and biases to 0; perturb them
        # so the adapters' norm and bias conventions are actually exercised.
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.ndim == 1:
                    parameter.add_(TINY_VECTOR_NOISE * torch.randn_like(parameter))
    model.eval()
    return model, byte_tokenizer(prepends_bos)
