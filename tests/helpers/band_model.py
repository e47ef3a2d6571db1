"""The one-band ground truth of the rotary-band tests: :func:`lens_position.models.toy.offset_only_model`
(scores a function of the offset only) with ``d_head = 16``, so 4 rotated pairs (one band each)
and 8 unrotated dimensions, plus a BOS key that carries a vector in **one** rotated pair only.
The key at position 0 then gets a score term ``|q_p||k_p| cos(theta_p i + phi)`` from pair ``p``
alone: every absolute-position signal of the scores lives in band ``p``."""

import torch

from lens_position.models.spec import LoadedModel
from lens_position.models.toy import offset_only_model

D_HEAD = 16
ROTARY_DIM = D_HEAD // 2
BOS_MARKER = 1


def one_band_model(pair: int, *, strength: float = 2.0, n_layers: int = 1, n_heads: int = 2,
                   window: int | None = None, seed: int = 0) -> LoadedModel:
    loaded = offset_only_model(n_layers=n_layers, n_heads=n_heads, d_head=D_HEAD, window=window, seed=seed)
    half = ROTARY_DIM // 2
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for block in loaded.model.blocks:
            # GPT-NeoX pairs: dimensions (p, p + rotary_dim / 2) turn together
            block.attn.W_K[:, BOS_MARKER, pair] = strength * torch.randn(n_heads, generator=generator,
                                                                         dtype=torch.float64)
            block.attn.W_K[:, BOS_MARKER, pair + half] = strength * torch.randn(n_heads, generator=generator,
                                                                                dtype=torch.float64)
    return loaded
