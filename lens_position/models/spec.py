"""What a loaded model is: the TransformerLens model behind the seam (``backend``: a
HookedTransformer or a TransformerBridge), its tokenizer and a spec of its position mechanisms
(RoPE kind and bases, NTK parameters, window, BOS policy)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypeAlias,
    TypeVar,
    Union,
    cast,
)

import torch

from lens_position.ground.errors import BadInputError, ContextLengthError, UnsupportedArchitectureError
from lens_position.models.argument_kinds import check_argument_kinds
from lens_position.models.backends import ModelBackend, backend_for, bridge_class, is_model
from lens_position.models.weights import model_weights_sha256, weights_version

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer
    from transformer_lens.model_bridge import TransformerBridge

RopeKind = Literal["standard", "ntk-aware", "ntk-by-parts", "linear", "yarn", "dynamic-ntk", "longrope", "none"]
Family = Literal["llama", "mistral", "qwen2", "gemma3", "custom"]
Role = Literal["standard", "ntk", "sliding", "interpolated", "no-rope"]
# Hugging Face ``rope_type`` -> our RopeKind; any other type is refused at load
HF_ROPE_KINDS: dict[str, RopeKind] = {"default": "standard", "llama3": "ntk-by-parts", "linear": "linear",
                                      "yarn": "yarn", "dynamic": "dynamic-ntk", "longrope": "longrope"}


#: What a public entry point accepts as a model: a :class:`LoadedModel`, or a bare ``HookedTransformer``
#: (any subclass) or ``TransformerBridge``, wrapped once at the door by :func:`as_loaded`; below the
#: door every function takes the ``LoadedModel``.
ModelLike: TypeAlias = Union["LoadedModel", "HookedTransformer", "TransformerBridge"]


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
        ``"ntk"`` if its RoPE is NTK-scaled (aware, by-parts, or YaRN: NTK-by-parts frequencies with
        an attention temperature), ``"interpolated"`` for linear position interpolation and LongRoPE's
        per-frequency factors and ``"no-rope"`` without RoPE (NoPE, learned absolute positions; neither is part of C3's
        comparison), else ``"standard"``. Dynamic NTK is ``"standard"``: it rescales only beyond
        the trained context, and lens_position analyses such a model within it (plain RoPE there)."""
        if self.has_sliding_window:
            return "sliding"
        if self.rope_kind in ("ntk-aware", "ntk-by-parts", "yarn"):
            return "ntk"
        if self.rope_kind in ("linear", "longrope"):  # LongRoPE: a rescale factor per frequency
            return "interpolated"
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


@dataclass(repr=False)
class LoadedModel:
    """A TransformerLens model (a HookedTransformer or a TransformerBridge) with its tokenizer and
    spec. ``tokenizer`` may be None for models built in code (then prompts must be given as token
    tensors). lens_position talks to the model through ``backend`` (the seam,
    :mod:`lens_position.models.backends`); ``spec.extra["backend"]`` says which."""

    model: HookedTransformer | TransformerBridge
    tokenizer: Any
    spec: ModelSpec
    _backend: ModelBackend | None = field(default=None, repr=False, compare=False)
    #: :func:`weights_version` of the weights ``spec.weights_sha256`` was taken from (None: not yet
    #: hashed); :func:`as_loaded` hashes them again when they have changed since.
    hashed_weights_version: tuple[Any, ...] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        if self.spec.weights_sha256 is not None and self.spec.extra.get("dtype") in (None, dtype):
            self.hashed_weights_version = weights_version(self.model)  # the spec was made for these weights

    @property
    def tokenizer_sha256(self) -> str | None:
        """:func:`tokenizer_sha256` of the model's tokenizer (taken once per tokenizer object)."""
        known = self.__dict__.get("_tokenizer_hash")
        if known is None or known[0] is not self.tokenizer:
            known = (self.tokenizer, tokenizer_sha256(self.tokenizer))
            self.__dict__["_tokenizer_hash"] = known
        return known[1]

    def __repr__(self) -> str:
        """A few lines: what the model is (name, family, backend, shape, window, rotary, dtype, device,
        the weights' hash); the module tree is ``.model``, the facts in full ``.spec``."""
        spec = self.spec
        kv = (f", {spec.n_kv_heads} key/value head{'s' if spec.n_kv_heads > 1 else ''}"
              if spec.n_kv_heads != spec.n_heads else "")
        if spec.window is not None:
            local = sum(1 for t in spec.attn_types if t == "local")
            window = f"window {spec.window} on {local} of {spec.n_layers} layers"
        else:
            window = "no sliding window"
        rotary = spec.rope_kind if spec.rotary_base is None else f"{spec.rope_kind} (base {spec.rotary_base:,.0f}"
        if spec.ntk_alpha is not None:
            rotary += f", NTK alpha {spec.ntk_alpha:g}"
        rotary += ")" if spec.rotary_base is not None else ""
        try:
            placed = f"{str(self.backend.dtype).removeprefix('torch.')} on {self.backend.device}"
        except StopIteration:  # a model without parameters
            placed = "no weights"
        weights = f"weights sha256 {spec.weights_sha256[:12]}…" if spec.weights_sha256 else "weights not hashed"
        return (f"LoadedModel {spec.name!r} ({spec.family}, {spec.extra.get('backend', 'hooked')} backend, "
                f"{type(self.model).__name__})\n"
                f"  {spec.n_layers} layers x {spec.n_heads} heads{kv}, d_model {spec.d_model}, context {spec.n_ctx}\n"
                f"  rotary: {rotary}; {window}; BOS {spec.bos_token_id}"
                f"{' (the tokenizer prepends it)' if spec.tokenizer_prepends_bos else ''}\n"
                f"  {placed}; {weights}\n"
                f"  .model (the module tree) · .tokenizer · .spec (every fact) · source {spec.source}")

    def _repr_html_(self) -> str:
        import html

        return f"<pre>{html.escape(repr(self))}</pre>"

    def adopt_weights(self) -> LoadedModel:
        """Let the spec's weight hash stand for the weights as they are now (after a cast or a move
        to devices at load, which changes no value that matters to provenance); returns ``self``."""
        self.hashed_weights_version = weights_version(self.model)
        return self

    @property
    def backend(self) -> ModelBackend:
        """The model behind the seam: hook points, runs with hooks, start/stop at a layer."""
        if self._backend is None or self._backend.model is not self.model:
            self._backend = backend_for(self.model)
        return self._backend

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


def tokenizer_sha256(tokenizer: Any) -> str | None:
    """sha256 of what a tokenizer maps text to: its vocabulary (every token and its id) and its
    special tokens' ids; None without a tokenizer. Two tokenizers with the same hash give the same
    ids for the same text (about 0.3 s for a 262k vocabulary)."""
    if tokenizer is None or not hasattr(tokenizer, "get_vocab"):
        return None
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: (item[1], item[0]))
    specials = {name: getattr(tokenizer, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}
    blob = json.dumps({"vocabulary": vocabulary, "specials": specials}, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8", errors="surrogatepass")).hexdigest()


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


ASSUMED_CONTEXT = 2048


def context_length(config: Any) -> int:
    """A Hugging Face config's context length in positions: ``max_position_embeddings`` or the
    family's own name for it; a family with no position table (BLOOM's ALiBi) names none, and then
    :data:`ASSUMED_CONTEXT` is the longest sequence lens_position runs (a bound on the analyses, not a
    fact of the model)."""
    for name in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return ASSUMED_CONTEXT


def check_has_attention(hf_config: Any) -> None:
    """UnsupportedArchitectureError for a Hugging Face config with no attention heads (a state-space
    or recurrent model)."""
    config = getattr(hf_config, "text_config", None) or hf_config
    try:
        heads = getattr(config, "num_attention_heads", None)
    except Exception:  # a per-layer attribute some configs refuse to give as one number
        heads = None
    if not isinstance(heads, int):
        architectures = ", ".join(getattr(hf_config, "architectures", None) or []) or "this model"
        raise UnsupportedArchitectureError(
            f"{architectures} (model_type {getattr(config, 'model_type', None)!r}) has no single number of attention "
            "heads (a state-space or recurrent model, or heads that vary by layer): lens_position measures where "
            "softmax attention reads position from, over layers of one head count")


def spec_from_hf_config(hf_config: Any, *, name: str = "custom", family: Family = "custom",
                        source: str = "custom", **overrides: Any) -> ModelSpec:
    """The ModelSpec of a Hugging Face decoder config (the bridge backend's facts): layer types
    from ``layer_types`` (``sliding_attention`` is local), the window from ``sliding_window``,
    RoPE from ``rope_parameters`` (``rope_type``: :data:`HF_ROPE_KINDS`; the parameters of a linear,
    YaRN or dynamic scaling in ``extra["rope_scaling"]``), per-layer NoPE (SmolLM3's
    ``no_rope_layers``) in ``extra``; then ``overrides``."""
    config = getattr(hf_config, "text_config", None) or hf_config
    check_has_attention(hf_config)
    n_heads = int(config.num_attention_heads)
    d_model = int(config.hidden_size)
    d_head = int(getattr(config, "head_dim", None) or d_model // n_heads)
    n_layers = int(config.num_hidden_layers)
    kinds = list(getattr(config, "layer_types", None) or [])
    window = getattr(config, "sliding_window", None)
    neo_kinds = list(getattr(config, "attention_layers", None) or [])
    if kinds:
        attn_types = tuple("local" if kind == "sliding_attention" and window else "global" for kind in kinds)
    elif neo_kinds and getattr(config, "window_size", None):
        # GPT-Neo's own names: `attention_layers` of "global" and "local", local layers of `window_size` keys
        window = int(config.window_size)
        attn_types = tuple("local" if kind == "local" else "global" for kind in neo_kinds)
    elif window and getattr(config, "use_sliding_window", True) is not False:
        # a window declared by `sliding_window` alone (Mistral, Mixtral, StarCoder2, Phi-3): every layer
        # (the load-time check compares these key sets with the model's own attention)
        attn_types = ("local",) * n_layers
    else:
        attn_types = ("global",) * n_layers
    params = getattr(config, "rope_parameters", None) or {}
    if isinstance(params, dict) and "full_attention" in params:
        global_params, local_params = params.get("full_attention") or {}, params.get("sliding_attention")
    else:
        global_params, local_params = params if isinstance(params, dict) else {}, None
    theta = global_params.get("rope_theta", getattr(config, "rope_theta", None))
    rope_type = global_params.get("rope_type", "default")
    if rope_type not in HF_ROPE_KINDS:
        raise BadInputError(f"RoPE scaling of type {rope_type!r} is not described by lens_position's spec yet "
                            f"({', '.join(HF_ROPE_KINDS)} are); load a checkpoint without it")
    rope_kind = HF_ROPE_KINDS[rope_type]
    extra: dict[str, Any] = {"d_vocab": int(config.vocab_size), "hf_model_type": getattr(config, "model_type", None)}
    if rope_kind in ("linear", "yarn", "dynamic-ntk", "longrope"):
        extra["rope_scaling"] = {k: v for k, v in global_params.items() if k != "rope_theta"}
    no_rope = getattr(config, "no_rope_layers", None)
    if no_rope is not None:
        extra["rope_layers"] = [bool(flag) for flag in no_rope]  # SmolLM3: 1 = RoPE, 0 = NoPE
    fields: dict[str, Any] = dict(
        name=name, family=family, source=source, n_layers=n_layers, n_heads=n_heads,
        n_kv_heads=int(getattr(config, "num_key_value_heads", None) or n_heads), d_model=d_model, d_head=d_head,
        n_ctx=context_length(config), rope_kind=rope_kind if theta is not None else "none",
        rotary_base=float(theta) if theta is not None else None,
        rotary_base_local=float(local_params["rope_theta"]) if local_params else None,
        ntk_by_parts=({k: float(global_params[k]) for k in ("factor", "low_freq_factor", "high_freq_factor")
                       if k in global_params} | {"original_context": float(global_params.get(
                           "original_max_position_embeddings", 0))}) if rope_kind == "ntk-by-parts" else None,
        window=int(window) if window and "local" in attn_types else None, attn_types=attn_types, extra=extra,
    )
    fields.update({k: v for k, v in overrides.items() if k != "extra"})
    fields["extra"] = {**extra, **overrides.get("extra", {})}
    return ModelSpec(**fields)


def spec_from_config(model: Any, *, name: str = "custom", family: Family = "custom",
                     source: str = "custom", **overrides: Any) -> ModelSpec:
    """The ModelSpec builder of the hooked backend: the facts read off a built HookedTransformer (layer types
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


def _current(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with a spec that states the weights as they are now: when a weight was written
    to, cast or replaced since the spec's hash was taken, its sha256 is taken again (the load-time one
    is kept as ``extra["weights_sha256_at_load"]``); ``extra["dtype"]`` is the dtype computed in."""
    version = weights_version(loaded.model)
    dtype = str(next(loaded.model.parameters()).dtype).removeprefix("torch.")
    spec = loaded.spec
    if loaded.hashed_weights_version != version:
        at_load = spec.extra.get("weights_sha256_at_load", spec.weights_sha256)
        fresh = model_weights_sha256(loaded.model)
        extra = {**spec.extra, "dtype": dtype}
        if fresh != at_load and at_load is not None:
            extra["weights_sha256_at_load"] = at_load
        else:  # as loaded again (an edit undone)
            extra.pop("weights_sha256_at_load", None)
        loaded.spec = dataclasses.replace(spec, weights_sha256=fresh, extra=extra)
        loaded.hashed_weights_version = version
    if loaded.spec.extra.get("dtype") != dtype:
        loaded.spec = dataclasses.replace(loaded.spec, extra={**loaded.spec.extra, "dtype": dtype})
    return loaded


def _bare_spec(model: Any, tokenizer: Any) -> ModelSpec:
    """The spec of a model built outside ``load_model``: its config, its weights' hash, its
    tokenizer and BOS policy, so its results carry the same provenance as a loaded model's."""
    prepends_bos, bos_id, tokenizer_name = False, None, None
    if tokenizer is not None:
        bos_id = getattr(tokenizer, "bos_token_id", None)
        tokenizer_name = getattr(tokenizer, "name_or_path", None) or type(tokenizer).__name__
        prepends_bos = tokenizer_prepends_bos(tokenizer)
    name = getattr(model.cfg, "model_name", None) or "custom"
    cls = f"{type(model).__module__}.{type(model).__qualname__}"
    common: dict[str, Any] = dict(name=name, source=f"custom:{cls}", tokenizer_prepends_bos=prepends_bos,
                                  bos_token_id=bos_id, weights_sha256=model_weights_sha256(model))
    bridge = bridge_class()
    if bridge is not None and isinstance(model, bridge):
        from lens_position.models.backends.bridge import prepare_bare_bridge

        n_kv = prepare_bare_bridge(model)
        spec = spec_from_hf_config(model.original_model.config, **common,
                                   extra={"tokenizer": tokenizer_name, "class": cls, "backend": "bridge",
                                          "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
                                          "ungrouped_kv_hooks": backend_for(model).kv_hooks_per_query_head})
        return dataclasses.replace(spec, n_kv_heads=n_kv)
    return spec_from_config(
        model, **common,
        extra={"tokenizer": tokenizer_name, "class": cls, "backend": "hooked",
               "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
               "ungrouped_kv_hooks": True},  # during lens_position's passes (HookedBackend)
    )


def as_loaded(model: ModelLike, tokenizer: Any = None) -> LoadedModel:
    """The one door from a user's model into lens_position: a LoadedModel as it is (its spec's weight
    hash taken again only where a weight changed since), or a bare ``HookedTransformer`` (or any
    subclass: ``HookedSAETransformer``, your own) or ``TransformerBridge`` (in compatibility mode)
    wrapped with a spec read off its config: the weights' sha256, the tokenizer and its BOS policy,
    the class. Wrapping hashes the weights (seconds for a 270M model): a public entry point wraps
    once and hands the LoadedModel down; wrap a model yourself (``as_loaded(model)``) to pay it once
    over many calls.

    A grouped-query model runs lens_position's passes with ungrouped key/value hooks (the setting
    ``load_model`` uses: the same numbers, one key/value entry per query head at ``hook_k``/
    ``hook_v``), so a head index means the same query head for every model and backend, whoever
    built it; the model's own setting is switched for those passes only and put back after them.
    """
    if isinstance(model, LoadedModel):
        return _current(model)
    if not is_model(model):
        raise TypeError(not_a_model_message(model))
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    return LoadedModel(model=model, tokenizer=tokenizer, spec=_bare_spec(model, tokenizer))


P = ParamSpec("P")
R = TypeVar("R")


class Entry(Protocol, Generic[P, R]):
    """A public function (:func:`public`): called, it takes any :data:`ModelLike` through the door once;
    its ``body`` takes the :class:`LoadedModel` only, for other public functions to compose."""

    body: Callable[Concatenate[LoadedModel, P], R]

    def __call__(self, model: ModelLike, /, *args: P.args, **kwargs: P.kwargs) -> R: ...


def public(body: Callable[Concatenate[LoadedModel, P], R]) -> Entry[P, R]:
    """Make ``body`` (whose first argument is a :class:`LoadedModel`) a public function: every other
    argument is checked to be of its annotated kind (:mod:`lens_position.models.argument_kinds`), the
    first goes through :func:`as_loaded`, once per call, and nothing below the door enters it again
    (a public function that composes others calls their ``.body``). Same name, docstring and signature
    as ``body``."""

    @functools.wraps(body)
    def door(model: ModelLike, *args: P.args, **kwargs: P.kwargs) -> R:  # model= works as a keyword too
        check_argument_kinds(body, model, args, kwargs)  # every argument of its annotated kind, before the model
        return body(as_loaded(model), *args, **kwargs)

    signature = inspect.signature(body)
    first, *rest = signature.parameters.values()
    door.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[first.replace(name="model", annotation="ModelLike"), *rest])  # what help() shows
    body.__qualname__ = f"{body.__qualname__}.body"  # pickled by reference, as the door's attribute
    entry = cast(Entry[P, R], door)
    entry.body = body
    return entry


def not_a_model_message(model: Any) -> str:
    """What to say to a caller who passed something other than a model, with the route that works
    for what it is: a name or path (load it), a transformers model (save it and load the folder)."""
    expected = "expected a LoadedModel, a HookedTransformer (or a subclass) or a TransformerBridge"
    if isinstance(model, (str, os.PathLike)):
        return (f"{expected}, got the {type(model).__name__} {str(model)!r}: load it first, "
                f"model = lp.load_model({str(model)!r}) (a registry name, a .gguf file or a checkpoint folder), "
                "and pass the model")
    if hasattr(model, "config") and hasattr(model, "save_pretrained"):
        return (f"{expected}, got the transformers model {type(model).__name__}: save it with its tokenizer "
                "(model.save_pretrained(folder); tokenizer.save_pretrained(folder)) and pass "
                "lp.load_model(folder), which converts and checks it")
    return f"{expected}, got {type(model).__name__}"


def attach_tokenizer(model: Any, tokenizer: Any, prepends_bos: bool) -> None:
    """Give the model its tokenizer as is, and make ``model.to_tokens`` follow the tokenizer's
    own BOS policy by default. (``HookedTransformer.set_tokenizer`` would swap in a re-loaded
    "with BOS" tokenizer, which needs a hub name.) Also make every forward pass refuse a
    sequence longer than ``n_ctx`` with a ContextLengthError."""
    if isinstance(getattr(type(model), "tokenizer", None), property):
        model._tokenizer = tokenizer  # a bridge's setter would re-configure it (and its d_vocab)
    else:
        model.tokenizer = tokenizer
    if tokenizer.padding_side is None:
        tokenizer.padding_side = "right"
    model.cfg.tokenizer_prepends_bos = prepends_bos
    model.cfg.default_prepend_bos = prepends_bos
    n_ctx, name = model.cfg.n_ctx, getattr(model.cfg, "model_name", None) or "the model"

    def refuse_long(_module: torch.nn.Module, args: tuple) -> None:
        tokens = args[0] if args else None
        if isinstance(tokens, torch.Tensor) and tokens.ndim >= 1 and not tokens.is_floating_point():
            check_length(n_ctx, int(tokens.shape[-1]), name)

    model.embed.register_forward_pre_hook(refuse_long)
