"""Scores with a known absolute signal: ``g(i - j)`` plus a key-0 bonus that varies between
sequences, plus noise (the interval-coverage tests and the prompt-set spread tests use them)."""

import torch

LENGTH = 20


def synthetic_scores(seed: int, bonus_mean: float = 1.0, bonus_sd: float = 0.6, noise: float = 0.5):
    """A hook replacing the scores by ``g(i - j) + b_n 1[j = 0] + noise``: the key-0 bonus ``b_n``
    varies between sequences (so the absolute signal does), the noise between pairs."""
    generator = torch.Generator().manual_seed(seed)
    g = -0.15 * torch.arange(LENGTH, dtype=torch.float64)

    def hook(scores, hook):
        n, h, q, k = scores.shape
        d = (torch.arange(q)[:, None] - torch.arange(k)[None, :]).clamp(min=0)
        bonus = bonus_mean + bonus_sd * torch.randn(n, 1, 1, 1, generator=generator, dtype=torch.float64)
        values = g[d] + bonus * (torch.arange(k) == 0) + noise * torch.randn(n, h, q, k, generator=generator,
                                                                            dtype=torch.float64)
        return torch.where(torch.isfinite(scores), values.to(scores.dtype), scores)

    return ("blocks.0.attn.hook_attn_scores", hook)
