"""The ``hooked`` backend: a TransformerLens 3.x ``HookedTransformer`` behind the seam (the
reference path: every adapter, GGUF file, checkpoint folder and zoo model loads into it)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models.backends import COUPLED_KV, RotaryLayout, config_score_scale_and_cap
from lens_position.models.pass_memory import check_pass_memory


class HookedBackend:
    """The seam (:class:`~lens_position.models.backends.ModelBackend`) over a HookedTransformer.

    A grouped-query model runs with ungrouped key/value hooks (one ``hook_k``/``hook_v`` entry per
    query head, the same numbers) during the backend's own runs only: the flag is set for the run
    and put back in ``finally``, so the user's model keeps its own setting (and the meaning of its
    own ``hook_v`` patches) after any analysis, interrupted or not."""

    kind = "hooked"

    def __init__(self, model: Any) -> None:
        self.model = model

    @contextlib.contextmanager
    def _kv_per_query_head(self) -> Iterator[None]:
        cfg = self.model.cfg
        if not cfg.n_key_value_heads or cfg.ungroup_grouped_query_attention:
            yield
            return
        cfg.ungroup_grouped_query_attention = True
        try:
            yield
        finally:
            cfg.ungroup_grouped_query_attention = False

    @property
    def hook_dict(self) -> Mapping[str, Any]:
        return self.model.hook_dict

    @property
    def n_layers(self) -> int:
        return int(self.model.cfg.n_layers)

    @property
    def n_heads(self) -> int:
        return int(self.model.cfg.n_heads)

    @property
    def d_model(self) -> int:
        return int(self.model.cfg.d_model)

    @property
    def d_vocab(self) -> int:
        return int(self.model.cfg.d_vocab)

    @property
    def device(self) -> torch.device:
        return torch.device(self.model.cfg.device) if self.model.cfg.device else next(self.model.parameters()).device

    kv_hooks_per_query_head = True  # ungrouped during the backend's runs

    @property
    def W_E(self) -> torch.Tensor:
        return self.model.W_E

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def has_mlp(self) -> bool:
        return not self.model.cfg.attn_only

    def attention_unsupported(self) -> str | None:
        cfg = self.model.cfg
        if cfg.attention_dir != "causal" or getattr(cfg, "use_attention_sinks", False):
            return (f"attention_dir={cfg.attention_dir!r}, use_attention_sinks="
                    f"{getattr(cfg, 'use_attention_sinks', False)}")
        return None

    def score_scale_and_cap(self) -> tuple[float | None, float | None]:
        return config_score_scale_and_cap(self.model.cfg)

    def single_head_kv_unsupported(self, part: str) -> str | None:
        return dict(self.model.__dict__.get(COUPLED_KV) or {}).get(part)

    def prefix_reuse_unsupported(self) -> str | None:
        """It needs causal attention whose position information is rotary or already in the residual
        stream (learned absolute embeddings), and the q/k/v/z hooks of every block: the queries are
        padded at ``hook_q`` so that TransformerLens applies rotary positions, the causal mask and
        sliding windows at their absolute positions."""
        cfg = self.model.cfg
        if cfg.positional_embedding_type not in ("rotary", "standard"):
            return f"positional embedding {cfg.positional_embedding_type!r} (supported: rotary, standard)"
        if cfg.attention_dir != "causal":
            return f"attention is {cfg.attention_dir}, not causal: every position depends on every other"
        needed = [f"blocks.{layer}.attn.hook_{part}" for layer in range(cfg.n_layers) for part in "qkvz"]
        missing = [name for name in needed if name not in self.model.hook_dict]
        return f"the model has no hooks {missing[:3]}" if missing else None

    def hooks(self, fwd_hooks: Sequence[Any]) -> AbstractContextManager:
        return self.model.hooks(fwd_hooks=list(fwd_hooks))

    def forward(self, inputs: torch.Tensor, *, stop_at_layer: int | None = None,
                start_at_layer: int | None = None, return_type: str | None = "logits") -> torch.Tensor | None:
        check_pass_memory(self, inputs)
        with self._kv_per_query_head():
            return self.model(inputs, stop_at_layer=stop_at_layer, start_at_layer=start_at_layer,
                              return_type=return_type)

    def run_with_cache(self, tokens: torch.Tensor, names: Sequence[str], *,
                       stop_at_layer: int | None = None) -> dict[str, torch.Tensor]:
        wanted = set(names)
        check_pass_memory(self, tokens)
        with self._kv_per_query_head():
            _, cache = self.model.run_with_cache(tokens, names_filter=lambda name: name in wanted, return_type=None,
                                                 stop_at_layer=stop_at_layer)
        return {name: cache[name] for name in names if name in cache.cache_dict}

    def rotary_layout(self, layer: int, length: int | None = None) -> RotaryLayout:
        """Layer ``layer``'s RoPE from its own tables (``rotary_sin``/``rotary_cos`` at position 1)
        and config; UnsupportedArchitectureError where the layer has no rotary embedding. A hooked
        model's tables do not depend on the prompt's ``length``."""
        cfg = self.model.cfg
        attn = self.model.blocks[layer].attn
        if cfg.positional_embedding_type != "rotary" or not hasattr(attn, "rotary_sin"):
            raise UnsupportedArchitectureError(
                f"layer {layer} has no rotary embedding (positional_embedding_type="
                f"{cfg.positional_embedding_type!r}): there are no frequency bands to split")
        sin, cos = attn.rotary_sin[1].to(torch.float64), attn.rotary_cos[1].to(torch.float64)
        angles = torch.atan2(sin, cos)
        half = int(cfg.rotary_dim) // 2
        cap = getattr(cfg, "attn_scores_soft_cap", -1.0)
        return RotaryLayout(frequencies=angles[0::2] if cfg.rotary_adjacent_pairs else angles[:half],
                            adjacent_pairs=bool(cfg.rotary_adjacent_pairs), rotary_dim=int(cfg.rotary_dim),
                            scale=float(attn.attn_scale), soft_cap=float(cap) if cap and cap > 0 else None)


def new_hooked_transformer(config: Mapping[str, Any] | Any, *, what: str, **model_kwargs: Any) -> Any:
    """``HookedTransformer(config, **model_kwargs)`` on TransformerLens 3.x, ``config`` a
    ``HookedTransformerConfig`` or the keyword arguments of one.

    TransformerLens 3.9 warns "HookedTransformer is deprecated" on every construction; the warning
    is addressed to code that names the class, and lens_position chooses its backend itself
    (``load_model(..., backend=...)``), so it is silenced here, for this construction only. Where
    TransformerLens 4.x removed the class, building ``what`` is refused with an
    UnsupportedArchitectureError that says what works instead (not 4.x's bare ImportError).
    """
    import warnings

    from lens_position.models.backends import hooked_available

    if not hooked_available():
        from importlib.metadata import version

        raise UnsupportedArchitectureError(
            f"{what} is built as a HookedTransformer, which TransformerLens 4.0 removed (installed: "
            f"transformer_lens {version('transformer_lens')}): build it where TransformerLens 3.x is "
            "installed (pip install 'transformer-lens>=3,<4'). On 4.x, load_model(...) loads models "
            "through the bridge backend (TransformerBridge), the tiny in-code models ('tiny-llama', "
            "'tiny-gemma3', ...) included")
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    if isinstance(config, Mapping):
        config = HookedTransformerConfig(**config)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*HookedTransformer is deprecated.*")
        return HookedTransformer(config, **model_kwargs)
