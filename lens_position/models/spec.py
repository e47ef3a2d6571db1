"""What a loaded model is: the HookedTransformer, its tokenizer and a spec of its
position mechanisms (RoPE kind and bases, NTK parameters, window, BOS policy)."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from transformer_lens import HookedTransformer

from lens_position.ground.errors import ContextLengthError

RopeKind = Literal["standard", "ntk-aware", "ntk-by-parts", "none"]
Family = Literal["llama", "mistral", "qwen2", "gemma3", "custom"]
Role = Literal["standard", "ntk", "sliding", "no-rope"]


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

    # -- derived facts: every module asks these, none re-derives them --------------------

    @property
    def layer_types(self) -> tuple[str, ...]:
        """``"global"`` or ``"local"`` for every layer (global where ``attn_types`` is empty)."""
        return tuple(self.attn_types) if self.attn_types else ("global",) * self.n_layers

    @property
    def layer_windows(self) -> tuple[int | None, ...]:
        """Keys a query of each layer sees: ``window`` for a local layer, None (every earlier
        key) for a global one."""
        return tuple(self.window if kind == "local" else None for kind in self.layer_types)

    def layer_window(self, layer: int) -> int | None:
        """Window size of ``layer`` (None for a global causal layer)."""
        return self.layer_windows[layer]

    def is_local(self, layer: int) -> bool:
        """Whether ``layer`` attends over a sliding window."""
        return self.layer_windows[layer] is not None

    @property
    def has_sliding_window(self) -> bool:
        """Whether any layer attends over a sliding window."""
        return any(window is not None for window in self.layer_windows)

    @property
    def role(self) -> Role:
        """The architecture role in a reproduction: ``"sliding"`` if any layer is local, else
        ``"ntk"`` if its RoPE is NTK-scaled (aware or by-parts), ``"no-rope"`` without RoPE (NoPE,
        learned absolute positions: no part of C3's comparison), else ``"standard"``."""
        if self.has_sliding_window:
            return "sliding"
        if self.rope_kind in ("ntk-aware", "ntk-by-parts"):
            return "ntk"
        if self.rope_kind == "none":  # NoPE or learned absolute positions: not a RoPE model
            return "no-rope"
        return "standard"

    @property
    def auto_bos_policy(self) -> str:
        """The ``bos=`` policy of ``build_prompts`` that puts this model's BOS at position 0:
        the tokenizer's own where it prepends BOS (Gemma-3), ``"force"`` where it does not
        (SmolLM2)."""
        return "tokenizer" if self.tokenizer_prepends_bos else "force"

    def check_context(self, T: int) -> None:
        """Raise ContextLengthError if ``T`` positions (position 0 included) exceed the context."""
        check_length(self.n_ctx, T, self.name)


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
        """Raise ContextLengthError if ``T`` positions (position 0 included) exceed the context
        (``ModelSpec.check_context``)."""
        self.spec.check_context(T)


def check_length(n_ctx: int, T: int, name: str = "the model") -> None:
    """Raise ContextLengthError if a sequence of ``T`` positions does not fit ``n_ctx``."""
    if T > n_ctx:
        raise ContextLengthError(
            f"a sequence of {T} positions is longer than the context of {name} (n_ctx = {n_ctx}); "
            f"use T <= {n_ctx}, or load the model with load_model(..., n_ctx={T}) to extend it "
            "(positions beyond the trained context are extrapolation)")


def tokenizer_prepends_bos(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` puts its ``bos_token_id`` at position 0 by itself (and only when
    asked for special tokens)."""
    bos = getattr(tokenizer, "bos_token_id", None)
    if tokenizer is None or bos is None:
        return False

    def encode(special: bool) -> list[int]:
        return list(tokenizer("a", add_special_tokens=special, verbose=False)["input_ids"])

    with_special = encode(True)
    return bool(with_special) and with_special[0] == bos and encode(False)[:1] != [bos]


def spec_from_config(model: HookedTransformer, *, name: str = "custom", family: Family = "custom",
                     source: str = "custom", **overrides: Any) -> ModelSpec:
    """The one ModelSpec builder: the facts read off a built HookedTransformer (layer types
    from its attention modules, so they say what the masks do; ``window`` only when some
    layer is local), then ``overrides`` for what the config cannot tell (RoPE scaling, BOS
    behaviour, weight hash, ...)."""
    cfg = model.cfg
    rotary = cfg.positional_embedding_type == "rotary"
    if not rotary:
        rope_kind: RopeKind = "none"
    elif cfg.use_NTK_by_parts_rope:
        rope_kind = "ntk-by-parts"
    else:
        rope_kind = "standard"
    attn_types = tuple(getattr(block.attn, "attn_type", "global") for block in model.blocks)
    local = "local" in attn_types
    fields = dict(
        name=name, family=family, source=source, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
        n_kv_heads=cfg.n_key_value_heads or cfg.n_heads, d_model=cfg.d_model, d_head=cfg.d_head,
        n_ctx=cfg.n_ctx, rope_kind=rope_kind, rotary_base=float(cfg.rotary_base) if rotary else None,
        rotary_base_local=float(cfg.rotary_base_local) if cfg.rotary_base_local is not None else None,
        window=int(cfg.window_size) if local and cfg.window_size else None, attn_types=attn_types,
    )
    fields.update(overrides)
    return ModelSpec(**fields)


# Bare models wrapped so far: model -> (weights version, tokenizer, LoadedModel). Hashing the
# weights costs a pass over them, so it is done once per model and redone only when a parameter
# has been written to since (torch counts in-place writes in ``tensor._version``).
_BARE: "weakref.WeakKeyDictionary[HookedTransformer, tuple[tuple[int, ...], Any, LoadedModel]]" = \
    weakref.WeakKeyDictionary()


def remember(loaded: LoadedModel) -> LoadedModel:
    """Make :func:`as_loaded` of ``loaded.model`` alone (the bare model, as the analyses hand it to
    one another) return ``loaded``, with its spec, instead of hashing the weights again to build a
    spec of its own (2.4 s for Gemma-3-270M), until a weight is written to. Returns ``loaded``."""
    _BARE[loaded.model] = (_weights_version(loaded.model), loaded.tokenizer, loaded)
    return loaded


def _weights_version(model: HookedTransformer) -> tuple[Any, ...]:
    # in-place writes bump ``_version``; a cast or a ``.data`` swap changes dtype or storage
    return tuple((t._version, t.dtype, t.data_ptr()) for t in model.state_dict(keep_vars=True).values())


def _current(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with a spec that states the weights as they are now: when a weight was written
    to, cast or replaced since the spec was made, its sha256 is taken again (the load-time one is
    kept as ``extra["weights_sha256_at_load"]``); ``extra["dtype"]`` is the dtype computed in."""
    version = _weights_version(loaded.model)
    known = _BARE.get(loaded.model)
    dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    spec = loaded.spec
    if known is None and spec.weights_sha256 is not None and spec.extra.get("dtype") in (None, dtype):
        pass  # first sight of a spec built elsewhere: its hash describes these weights
    elif known is None or known[0] != version or known[2] is not loaded:
        from lens_position.models.cache import state_dict_sha256

        at_load = spec.extra.get("weights_sha256_at_load", spec.weights_sha256)
        fresh = state_dict_sha256(loaded.model.state_dict())
        extra = {**spec.extra, "dtype": dtype}
        if fresh != at_load and at_load is not None:
            extra["weights_sha256_at_load"] = at_load
        loaded.spec = dataclasses.replace(spec, weights_sha256=fresh, extra=extra)
    if loaded.spec.extra.get("dtype") != dtype:
        loaded.spec = dataclasses.replace(loaded.spec, extra={**loaded.spec.extra, "dtype": dtype})
    _BARE[loaded.model] = (version, loaded.tokenizer, loaded)
    return loaded


def _bare_spec(model: HookedTransformer, tokenizer: Any) -> ModelSpec:
    """The spec of a model built outside ``load_model``: its config, its weights' hash, its
    tokenizer and BOS policy, so its results carry the same provenance as a loaded model's."""
    from lens_position.models.cache import state_dict_sha256

    prepends_bos, bos_id, tokenizer_name = False, None, None
    if tokenizer is not None:
        bos_id = getattr(tokenizer, "bos_token_id", None)
        tokenizer_name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        prepends_bos = tokenizer_prepends_bos(tokenizer)
    name = getattr(model.cfg, "model_name", None) or "custom"
    return spec_from_config(
        model, name=name, source=f"custom:{type(model).__module__}.{type(model).__qualname__}",
        tokenizer_prepends_bos=prepends_bos, bos_token_id=bos_id,
        weights_sha256=state_dict_sha256(model.state_dict()),
        extra={"tokenizer": tokenizer_name, "class": f"{type(model).__module__}.{type(model).__qualname__}",
               "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
               "ungrouped_kv_hooks": bool(model.cfg.ungroup_grouped_query_attention)},
    )


def _ungroup_kv_hooks(model: HookedTransformer) -> None:
    if model.cfg.n_key_value_heads and not model.cfg.ungroup_grouped_query_attention:
        model.set_ungroup_grouped_query_attention(True)


def as_loaded(model: "LoadedModel | HookedTransformer", tokenizer: Any = None) -> LoadedModel:
    """Accept a LoadedModel, or a bare ``HookedTransformer`` or any subclass of it
    (``HookedSAETransformer``, your own), wrapped with a spec read off its config: the weights'
    sha256, the tokenizer and its BOS policy, the class (cached per model until a weight changes).

    A grouped-query model (bare or loaded) is switched to ungrouped key/value hooks
    (``model.set_ungroup_grouped_query_attention(True)``, the setting ``load_model`` uses: the
    same numbers, one key/value entry per query head at ``hook_k``/``hook_v``), so a head index
    means the same query head for every model, whoever built it.
    """
    if isinstance(model, LoadedModel):
        _ungroup_kv_hooks(model.model)
        return _current(model)
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"expected a LoadedModel or a HookedTransformer (or a subclass), got {type(model).__name__}")
    _ungroup_kv_hooks(model)
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    version = _weights_version(model)
    known = _BARE.get(model)
    if known is not None and known[0] == version and known[1] is tokenizer:
        return known[2]
    loaded = LoadedModel(model=model, tokenizer=tokenizer, spec=_bare_spec(model, tokenizer))
    _BARE[model] = (version, tokenizer, loaded)
    return loaded


def attach_tokenizer(model: HookedTransformer, tokenizer: Any, prepends_bos: bool) -> None:
    """Give the model its tokenizer as is, and make ``model.to_tokens`` follow the tokenizer's
    own BOS policy by default. (``HookedTransformer.set_tokenizer`` would swap in a re-loaded
    "with BOS" tokenizer, which needs a hub name.) Also make every forward pass refuse a
    sequence longer than ``n_ctx`` with a ContextLengthError."""
    model.tokenizer = tokenizer
    if tokenizer.padding_side is None:
        tokenizer.padding_side = "right"
    model.cfg.tokenizer_prepends_bos = prepends_bos
    model.cfg.default_prepend_bos = prepends_bos
    n_ctx, name = model.cfg.n_ctx, model.cfg.model_name

    def refuse_long(_module: torch.nn.Module, args: tuple) -> None:
        tokens = args[0] if args else None
        if isinstance(tokens, torch.Tensor) and tokens.ndim >= 1:
            check_length(n_ctx, int(tokens.shape[-1]), name)

    model.embed.register_forward_pre_hook(refuse_long)
