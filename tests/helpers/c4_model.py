"""A synthetic C4 model whose fraction of R' removed by BOS replacement is known: 1.

:func:`lens_position.models.toy.offset_only_model` with a key-0 bonus read from the BOS marker
(``bos_bonus``), plus token-dependent *query* noise: every token embeds, besides the content
direction, a random vector in two free directions, which ``W_Q`` maps into the rotated
query dimensions. The keys do not depend on the token, so with another token at position 0 the
scores are a function of the offset and of the query's own (random, independent across
positions) token: their expectation over prompts is offset-only, R' = 0, and all of the base
run's R' came from the BOS marker. A finite sample still fits some of the query noise as
absolute position, in-sample, and the more so the fewer prompts: the in-sample fraction
removed sits below 1 and climbs with N; a held-out estimate does not."""

import torch

from lens_position.models.spec import LoadedModel
from lens_position.models.toy import TOY_VOCAB, offset_only_model

NOISE_DIRECTIONS = (2, 3)


def c4_model(*, bos_bonus: float = 1.5, noise: float = 1.0, seed: int = 0) -> LoadedModel:
    loaded = offset_only_model(n_heads=2, d_head=8, bos_bonus=bos_bonus, seed=seed)
    generator = torch.Generator().manual_seed(seed + 7)
    rotary_dim = loaded.model.cfg.rotary_dim
    with torch.no_grad():
        loaded.model.embed.W_E[:, list(NOISE_DIRECTIONS)] = torch.randn(TOY_VOCAB, 2, generator=generator,
                                                                        dtype=torch.float64)
        for block in loaded.model.blocks:
            for direction in NOISE_DIRECTIONS:
                block.attn.W_Q[:, direction, :rotary_dim] = noise * torch.randn(
                    loaded.model.cfg.n_heads, rotary_dim, generator=generator, dtype=torch.float64)
    return loaded
