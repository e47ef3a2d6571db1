"""What a loaded model is: the HookedTransformer, its tokenizer and a spec of its
position mechanisms (RoPE kind and bases, NTK parameters, window, BOS policy)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from transformer_lens import HookedTransformer

from lens_position.errors import ContextLengthError

RopeKind = Literal["standard", "ntk-aware", "ntk-by-parts", "none"]
Family = Literal["llama", "mistral", "qwen2", "gemma3", "custom"]


@dataclass(frozen=True)
class ModelSpec:
    """The facts about a model that every lens_position result must state.

    ``attn_types`` has one entry per layer, ``"global"`` (causal over all earlier keys) or
    ``"local"`` (sliding window of ``window`` keys, the query included).
    ``tokenizer_prepends_bos`` says whether the tokenizer itself puts ``bos_token_id`` at
    position 0 (Gemma-3: yes; SmolLM2: no).
    """

    name: str
    family: Family
    source: str  # "registry:<name>", "gguf:<path>", "hf-folder:<path>", "hub:<id>", "custom"
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_model: int
    d_head: int
    n_ctx: int
    rope_kind: RopeKind
    rotary_base: float | None
    rotary_base_local: float | None = None
    ntk_alpha: float | None = None
    ntk_by_parts: dict[str, float] | None = None
    window: int | None = None
    attn_types: tuple[str, ...] = ()
    tokenizer_prepends_bos: bool = False
    bos_token_id: int | None = None
    weights_sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["attn_types"] = list(self.attn_types)
        return d

    def layer_window(self, layer: int) -> int | None:
        """Window size of ``layer`` (None for a global causal layer)."""
        if self.attn_types and self.attn_types[layer] == "local":
            return self.window
        return None


@dataclass
class LoadedModel:
    """A HookedTransformer with its tokenizer and spec. ``tokenizer`` may be None for
    models built in code (then prompts must be given as token tensors)."""

    model: HookedTransformer
    tokenizer: Any
    spec: ModelSpec

    def to_dict(self) -> dict[str, Any]:
        return self.spec.to_dict()

    def check_length(self, T: int) -> None:
        """Raise ContextLengthError if ``T`` positions (position 0 included) exceed the context."""
        check_length(self.model.cfg.n_ctx, T, self.spec.name)


def check_length(n_ctx: int, T: int, name: str = "the model") -> None:
    """Raise ContextLengthError if a sequence of ``T`` positions does not fit ``n_ctx``."""
    if T > n_ctx:
        raise ContextLengthError(
            f"a sequence of {T} positions is longer than the context of {name} (n_ctx = {n_ctx}); "
            f"use T <= {n_ctx}, or load the model with load_model(..., n_ctx={T}) to extend it "
            "(positions beyond the trained context are extrapolation)")


def spec_from_config(model: HookedTransformer, *, name: str = "custom", family: Family = "custom",
                     source: str = "custom", **overrides: Any) -> ModelSpec:
    """Read a ModelSpec off a HookedTransformer's config (for models built in code)."""
    cfg = model.cfg
    rotary = cfg.positional_embedding_type == "rotary"
    if not rotary:
        rope_kind: RopeKind = "none"
    elif cfg.use_NTK_by_parts_rope:
        rope_kind = "ntk-by-parts"
    else:
        rope_kind = "standard"
    attn_types = tuple(cfg.attn_types) if cfg.attn_types else ("global",) * cfg.n_layers
    fields = dict(
        name=name, family=family, source=source, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_key_value_heads or cfg.n_heads, d_model=cfg.d_model, d_head=cfg.d_head,
        n_ctx=cfg.n_ctx, rope_kind=rope_kind, rotary_base=float(cfg.rotary_base) if rotary else None,
        rotary_base_local=cfg.rotary_base_local, window=cfg.window_size, attn_types=attn_types,
    )
    fields.update(overrides)
    return ModelSpec(**fields)


def as_loaded(model: "LoadedModel | HookedTransformer", tokenizer: Any = None) -> LoadedModel:
    """Accept a LoadedModel or a bare HookedTransformer (wrapped with a spec read off its config)."""
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, HookedTransformer):
        return LoadedModel(model=model, tokenizer=tokenizer or model.tokenizer,
                           spec=spec_from_config(model))
    raise TypeError(f"expected a LoadedModel or HookedTransformer, got {type(model).__name__}")
