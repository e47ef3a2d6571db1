"""Test-only reference for the eviction definition of sink_metric: next-token loss from token-by-token
decoding of a Hugging Face model whose key/value cache keeps only the first ``sinks`` tokens and the
last ``window`` (StreamingLLM's evaluation loop, mit-han-lab/streaming-llm ``eval_long_ppl.py``, with the
cache evicted by hand and positions left as they were: no position shift)."""

import torch
from transformers import DynamicCache


def evicting_decode_loss(hf_model, ids: torch.Tensor, window: int, sinks: int, first: int) -> float:
    """Mean cross-entropy (nats) of predicting ``ids[t + 1]`` at ``t = first .. T-2``, one token at a time;
    before token ``t`` is fed the cache holds the first ``sinks`` tokens and the ``window - 1`` before ``t``."""
    cache, held, losses = DynamicCache(), [], []
    with torch.no_grad():
        for t in range(len(ids) - 1):
            keep = [k for k, position in enumerate(held) if position < sinks or t - position < window]
            if len(keep) < len(held):
                for layer in cache.layers:
                    layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
                held = [held[k] for k in keep]
            out = hf_model(input_ids=ids[None, t:t + 1], cache=cache, position_ids=torch.tensor([[t]]),
                           use_cache=True)
            held.append(t)
            if t >= first:
                losses.append(float(-out.logits[0, -1].double().log_softmax(-1)[ids[t + 1]]))
    return sum(losses) / len(losses)
