"""A small decoder on TransformerLens's ``HookedRootModule``, with ``HookedTransformer``'s parameter
names, hook names and numerics, for the models lens_position builds in code on either
TransformerLens line (4.0 removed ``HookedTransformer``; ``HookedRootModule`` and ``HookPoint``
stay).

It computes what a ``HookedTransformer`` of the same configuration computes, step for step:
token embedding (``hook_embed``), learned absolute positions (``hook_pos_embed``) or RoPE in the
NeoX layout (pairs ``k, k + rotary_dim/2`` over the first ``rotary_dim`` dimensions of each head,
the rest passed through), optional RMSNorm (``normalization_type="RMS"``), grouped-query
attention (``_W_K``/``_W_V`` with one entry per key/value head; ``hook_k``/``hook_v`` per query
head while ``cfg.ungroup_grouped_query_attention`` is set), scores ``q·k / sqrt(d_head)``
masked to ``-inf`` outside the causal (or sliding-window, ``attn_types``) mask at
``hook_attn_scores``, softmax at ``hook_pattern``, ``hook_z``, ``hook_attn_out``, a gated SiLU
MLP unless ``attn_only``, the residual hooks, a final RMSNorm and the unembedding.
``forward(tokens, stop_at_layer=, start_at_layer=, return_type=)`` takes the arguments
``HookedTransformer.forward`` takes for these. ``tests/unit/models/test_mini.py`` checks every
hook against a ``HookedTransformer`` holding the same weights (TransformerLens 3.x).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import nn

from lens_position.ground.errors import BadInputError

try:  # TransformerLens 3.9 and 4.x both export it at the top level
    from transformer_lens import HookedRootModule
except ImportError:  # pragma: no cover - an older 3.x
    from transformer_lens.hook_points import HookedRootModule
from transformer_lens.hook_points import HookPoint

__all__ = ["MiniConfig", "MiniTransformer"]


@dataclass
class MiniConfig:
    """What a :class:`MiniTransformer` is; the fields are ``HookedTransformerConfig``'s of the same
    name (the ones the backend and the model spec read are all here)."""

    n_layers: int
    d_model: int
    d_head: int
    n_heads: int
    n_ctx: int
    d_vocab: int
    n_key_value_heads: int | None = None
    d_mlp: int | None = None
    attn_only: bool = False
    normalization_type: str | None = None
    positional_embedding_type: str = "rotary"
    rotary_dim: int | None = None
    rotary_base: float = 10_000.0
    use_local_attn: bool = False
    attn_types: list[str] | None = None
    window_size: int | None = None
    dtype: torch.dtype = torch.float32
    eps: float = 1e-5
    default_prepend_bos: bool = False
    tokenizer_prepends_bos: bool = False
    model_name: str = "mini"
    seed: int | None = None
    device: str | None = None
    # fixed facts, read by the backend and the spec the way a HookedTransformerConfig's are
    ungroup_grouped_query_attention: bool = False
    attention_dir: str = "causal"
    use_attention_sinks: bool = False
    rotary_adjacent_pairs: bool = False
    rotary_base_local: float | None = None
    use_NTK_by_parts_rope: bool = False
    use_attn_scale: bool = True
    attn_scores_soft_cap: float = -1.0
    original_architecture: str = "mini"
    n_devices: int = 1
    attn_scale: float = field(init=False)

    def __post_init__(self) -> None:
        if self.normalization_type not in (None, "RMS"):
            raise BadInputError(f"normalization_type={self.normalization_type!r}: MiniTransformer has RMSNorm or none")
        if self.positional_embedding_type not in ("rotary", "standard"):
            raise BadInputError(f"positional_embedding_type={self.positional_embedding_type!r}: rotary or standard")
        if not self.attn_only and not self.d_mlp:
            raise BadInputError("a MiniTransformer with MLPs needs d_mlp")
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            self.rotary_dim = self.d_head
        if self.attn_types is None:
            self.attn_types = ["global"] * self.n_layers
        if "local" in self.attn_types and not self.window_size:
            raise BadInputError("local layers need window_size")
        self.attn_scale = math.sqrt(self.d_head)


class RMSNorm(nn.Module):
    """``w * x / sqrt(mean(x²) + eps)`` with ``hook_scale`` and ``hook_normalized``."""

    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.dtype))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale) * self.w


def _rotary_tables(cfg: MiniConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)``, ``[n_ctx, rotary_dim]``: HookedTransformer's NeoX-layout tables."""
    rotary_dim = int(cfg.rotary_dim or cfg.d_head)
    precision = torch.float64 if cfg.dtype == torch.float64 else torch.float32
    pos = torch.arange(cfg.n_ctx, dtype=precision)
    dim = torch.arange(rotary_dim // 2, dtype=precision)
    freq = (cfg.rotary_base ** (dim / (rotary_dim / 2))).repeat(2)
    angles = pos[:, None] / freq[None, :]
    return torch.sin(angles).to(cfg.dtype), torch.cos(angles).to(cfg.dtype)


class Attention(nn.Module):
    """HookedTransformer's attention (module docstring), grouped where ``n_key_value_heads`` is set."""

    def __init__(self, cfg: MiniConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.attn_type = (cfg.attn_types or ["global"])[layer]
        n_kv = cfg.n_key_value_heads or cfg.n_heads
        self.repeat_kv_heads = cfg.n_heads // n_kv
        self.grouped = cfg.n_key_value_heads is not None
        shape_q, shape_kv = (cfg.n_heads, cfg.d_model, cfg.d_head), (n_kv, cfg.d_model, cfg.d_head)
        self.W_Q = nn.Parameter(torch.zeros(shape_q, dtype=cfg.dtype))
        self.b_Q = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head, dtype=cfg.dtype))
        self.W_O = nn.Parameter(torch.zeros(cfg.n_heads, cfg.d_head, cfg.d_model, dtype=cfg.dtype))
        self.b_O = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        prefix = "_" if self.grouped else ""
        for name in ("W_K", "W_V"):
            self.register_parameter(prefix + name, nn.Parameter(torch.zeros(shape_kv, dtype=cfg.dtype)))
        for name in ("b_K", "b_V"):
            self.register_parameter(prefix + name, nn.Parameter(torch.zeros(n_kv, cfg.d_head, dtype=cfg.dtype)))
        self.attn_scale = cfg.attn_scale
        if cfg.positional_embedding_type == "rotary":
            sin, cos = _rotary_tables(cfg)
            self.register_buffer("rotary_sin", sin, persistent=False)
            self.register_buffer("rotary_cos", cos, persistent=False)
        rotary = ("rot_k", "rot_q") if cfg.positional_embedding_type == "rotary" else ()
        for name in ("k", "q", "v", "z", "attn_scores", "pattern", "result", *rotary):
            setattr(self, f"hook_{name}", HookPoint())

    def _per_query_head(self, name: str) -> torch.Tensor:
        own = getattr(self, f"_{name}")
        return torch.repeat_interleave(own, dim=0, repeats=self.repeat_kv_heads)

    def __getattr__(self, name: str) -> Any:
        # W_K / W_V / b_K / b_V of a grouped layer: the key/value heads repeated per query head, as
        # HookedTransformer's GroupedQueryAttention gives them
        if name in ("W_K", "W_V", "b_K", "b_V") and "_" + name in self._parameters:
            return self._per_query_head(name)
        return super().__getattr__(name)

    def _rotate(self, x: Float[torch.Tensor, "batch pos head d_head"]) -> Float[torch.Tensor, "batch pos head d_head"]:
        rotary_dim = int(self.cfg.rotary_dim or self.cfg.d_head)
        x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
        half = rotary_dim // 2
        flipped = torch.cat([-x_rot[..., half:], x_rot[..., :half]], dim=-1)
        n = x.shape[1]
        rotated = x_rot * self.rotary_cos[None, :n, None, :] + flipped * self.rotary_sin[None, :n, None, :]
        return torch.cat([rotated, x_pass], dim=-1)

    def _mask(self, n: int, device: torch.device) -> torch.Tensor:
        query, key = torch.arange(n, device=device)[:, None], torch.arange(n, device=device)[None, :]
        mask = key <= query
        if self.attn_type == "local":
            mask = mask & (key > query - int(self.cfg.window_size or 0))
        return mask[None, None]

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        ungroup = not self.grouped or self.cfg.ungroup_grouped_query_attention
        w_k, b_k = (self.W_K, self.b_K) if ungroup else (self._W_K, self._b_K)
        w_v, b_v = (self.W_V, self.b_V) if ungroup else (self._W_V, self._b_V)
        q = self.hook_q(torch.einsum("bpm,hmd->bphd", x, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpm,hmd->bphd", x, w_k) + b_k)
        v = self.hook_v(torch.einsum("bpm,hmd->bphd", x, w_v) + b_v)
        if self.cfg.positional_embedding_type == "rotary":
            q, k = self.hook_rot_q(self._rotate(q)), self.hook_rot_k(self._rotate(k))
        if not ungroup:
            k = torch.repeat_interleave(k, dim=2, repeats=self.repeat_kv_heads)
            v = torch.repeat_interleave(v, dim=2, repeats=self.repeat_kv_heads)
        scores = q.permute(0, 2, 1, 3) @ k.permute(0, 2, 3, 1) / self.attn_scale
        scores = torch.where(self._mask(scores.shape[-1], scores.device), scores,
                             torch.tensor(-torch.inf, dtype=scores.dtype, device=scores.device))
        scores = self.hook_attn_scores(scores)
        pattern = F.softmax(scores, dim=-1)
        pattern = self.hook_pattern(torch.where(torch.isnan(pattern), torch.zeros_like(pattern), pattern))
        z = self.hook_z((pattern @ v.permute(0, 2, 1, 3)).permute(0, 2, 1, 3))
        return torch.einsum("bphd,hdm->bpm", z, self.W_O) + self.b_O


class MLP(nn.Module):
    """HookedTransformer's gated MLP: ``W_out(silu(x W_gate) * (x W_in) + b_in) + b_out``."""

    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        d_mlp = int(cfg.d_mlp or 0)
        self.W_in = nn.Parameter(torch.zeros(cfg.d_model, d_mlp, dtype=cfg.dtype))
        self.W_gate = nn.Parameter(torch.zeros(cfg.d_model, d_mlp, dtype=cfg.dtype))
        self.b_in = nn.Parameter(torch.zeros(d_mlp, dtype=cfg.dtype))
        self.W_out = nn.Parameter(torch.zeros(d_mlp, cfg.d_model, dtype=cfg.dtype))
        self.b_out = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype))
        self.hook_pre, self.hook_pre_linear, self.hook_post = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        pre = self.hook_pre(x @ self.W_gate)
        linear = self.hook_pre_linear(x @ self.W_in)
        return self.hook_post(F.silu(pre) * linear + self.b_in) @ self.W_out + self.b_out


class Block(nn.Module):
    """One layer: attention and (unless ``attn_only``) the MLP, each read through its norm."""

    def __init__(self, cfg: MiniConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        norm = cfg.normalization_type == "RMS"
        self.ln1: nn.Module = RMSNorm(cfg) if norm else nn.Identity()
        self.attn = Attention(cfg, layer)
        if not cfg.attn_only:
            self.ln2: nn.Module = RMSNorm(cfg) if norm else nn.Identity()
            self.mlp = MLP(cfg)
        mlp = () if cfg.attn_only else ("mlp_out", "resid_mid")
        for name in ("attn_out", "resid_pre", "resid_post", *mlp):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, resid: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(self.ln1(resid)))
        if self.cfg.attn_only:
            return self.hook_resid_post(resid + attn_out)
        mid = self.hook_resid_mid(resid + attn_out)
        return self.hook_resid_post(mid + self.hook_mlp_out(self.mlp(self.ln2(mid))))


class Embed(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.W_E = nn.Parameter(torch.zeros(cfg.d_vocab, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.W_pos = nn.Parameter(torch.zeros(cfg.n_ctx, cfg.d_model, dtype=cfg.dtype))

    def forward(self, tokens: Int[torch.Tensor, "batch pos"]) -> Float[torch.Tensor, "batch pos d_model"]:
        return self.W_pos[: tokens.shape[1]][None].expand(tokens.shape[0], -1, -1)


class Unembed(nn.Module):
    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.W_U = nn.Parameter(torch.zeros(cfg.d_model, cfg.d_vocab, dtype=cfg.dtype))
        self.b_U = nn.Parameter(torch.zeros(cfg.d_vocab, dtype=cfg.dtype))
        self.hook_in, self.hook_out = HookPoint(), HookPoint()

    def forward(self, x: Float[torch.Tensor, "batch pos d_model"]) -> Float[torch.Tensor, "batch pos d_vocab"]:
        return self.hook_out(self.hook_in(x) @ self.W_U + self.b_U)


class MiniTransformer(HookedRootModule):
    """The decoder of the module docstring; ``MiniTransformer(MiniConfig(...))`` has zero weights."""

    def __init__(self, cfg: MiniConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tokenizer = None
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        if cfg.positional_embedding_type == "standard":
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        self.blocks = nn.ModuleList([Block(cfg, layer) for layer in range(cfg.n_layers)])
        self.ln_final: nn.Module = RMSNorm(cfg) if cfg.normalization_type == "RMS" else nn.Identity()
        self.unembed = Unembed(cfg)
        self.setup()

    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        """``(output, ActivationCache)``, as ``HookedTransformer.run_with_cache`` returns them."""
        from transformer_lens.ActivationCache import ActivationCache

        out, cache = super().run_with_cache(*args, **kwargs)
        return out, ActivationCache(cache, self)

    def forward(self, tokens: torch.Tensor, return_type: str | None = "logits", *,
                stop_at_layer: int | None = None, start_at_layer: int | None = None) -> torch.Tensor | None:
        """Logits ``[batch, pos, d_vocab]`` (``return_type="logits"``), the mean next-token loss
        (``"loss"``), None; the residual stream after ``stop_at_layer`` blocks where that is set.
        ``start_at_layer``: ``tokens`` is the residual stream entering that block."""
        if start_at_layer is None:
            if tokens.ndim != 2 or tokens.is_floating_point():
                raise BadInputError(f"tokens must be an integer tensor [batch, pos], got {tuple(tokens.shape)}")
            if tokens.shape[1] > self.cfg.n_ctx:
                raise BadInputError(f"{tokens.shape[1]} tokens exceed this model's context of {self.cfg.n_ctx}")
            resid = self.hook_embed(self.embed(tokens))
            if self.cfg.positional_embedding_type == "standard":
                resid = resid + self.hook_pos_embed(self.pos_embed(tokens))
        else:
            resid = tokens
        for block in self.blocks[start_at_layer or 0: stop_at_layer]:
            resid = block(resid)
        if stop_at_layer is not None:
            return resid
        if return_type is None:
            return None
        logits = self.unembed(self.ln_final(resid))
        if return_type == "loss":
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))
        return logits
