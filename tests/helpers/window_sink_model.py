"""The hand-set model of the window-aware sink tests: one sliding-window layer (``W`` keys)
and one causal layer, three heads each, attention-only, ``W_O = 0`` (every layer reads the
embeddings), float64. Per head, the scores are closed forms (:func:`head_scores`):

- head 0, **window-first sink**: ``s[i, j] = -c cos(i - j)`` from one rotated pair (frequency
  1 rad per position). It increases with the offset on ``0..3 < pi``, so with ``W <= 4`` the
  oldest key a query can see wins: the window's first key, or position 0 while it is visible;
- head 1, **absolute-first sink**: ``s[i, j] = b`` for the BOS key at position 0, else 0
  (a non-rotated dimension reads the BOS marker);
- head 2, **uniform**: all scores 0.
"""

import math

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from lens_position.models.spec import LoadedModel, spec_from_config
from lens_position.models.toy import BOS_TOKEN_ID, TOY_VOCAB

WINDOW = 4
SHARPNESS = 12.0  # c
BONUS = 6.0  # b
CONTENT, BOS_MARKER = 0, 1


def window_sink_model(*, window: int = WINDOW, sharpness: float = SHARPNESS, bonus: float = BONUS) -> LoadedModel:
    if window > 4:
        raise ValueError("-cos(d) increases with the offset only on 0..3: window <= 4")
    d_head, rotary_dim, n_heads = 4, 2, 3
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=4, d_head=d_head, n_heads=n_heads, n_ctx=256, d_vocab=TOY_VOCAB, attn_only=True,
        normalization_type=None, positional_embedding_type="rotary", rotary_dim=rotary_dim,
        use_local_attn=True, attn_types=["local", "global"], window_size=window,
        dtype=torch.float64, default_prepend_bos=False, seed=0,
    )
    model = HookedTransformer(cfg)
    root = math.sqrt(math.sqrt(d_head))  # q and k each carry sqrt of the 1/sqrt(d_head) scale
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        model.embed.W_E[:, CONTENT] = 1.0
        model.embed.W_E[BOS_TOKEN_ID, BOS_MARKER] = 1.0
        for block in model.blocks:
            attn = block.attn
            # head 0: q = -sqrt(c) e_0, k = sqrt(c) e_0 in the rotated pair: q_i . k_j = -c cos(i - j)
            attn.W_Q[0, CONTENT, 0] = -math.sqrt(sharpness) * root
            attn.W_K[0, CONTENT, 0] = math.sqrt(sharpness) * root
            # head 1: a non-rotated dimension, 1 in the query, b on the BOS key
            attn.W_Q[1, CONTENT, rotary_dim] = root
            attn.W_K[1, BOS_MARKER, rotary_dim] = bonus * root
    spec = spec_from_config(model, name="toy-window-sinks", bos_token_id=BOS_TOKEN_ID)
    return LoadedModel(model=model, tokenizer=None, spec=spec)


def head_scores(length: int, *, sharpness: float = SHARPNESS, bonus: float = BONUS) -> torch.Tensor:
    """The closed-form scores of the three heads on a sequence with BOS at position 0,
    ``[head, query, key]`` (before masking)."""
    i = torch.arange(length, dtype=torch.float64)[:, None]
    j = torch.arange(length, dtype=torch.float64)[None, :]
    window_first = -sharpness * torch.cos(i - j)
    absolute_first = torch.zeros(length, length, dtype=torch.float64)
    absolute_first[:, 0] = bonus
    return torch.stack([window_first, absolute_first, torch.zeros(length, length, dtype=torch.float64)])


def closed_form_pattern(length: int, window: int | None, **kwargs: float) -> torch.Tensor:
    """Softmax of :func:`head_scores` over each query's key set, ``[head, query, key]``."""
    i = torch.arange(length)[:, None]
    j = torch.arange(length)[None, :]
    visible = j <= i
    if window is not None:
        visible = visible & (j > i - window)
    return head_scores(length, **kwargs).masked_fill(~visible, -math.inf).softmax(-1)
