"""``load_model``: any supported checkpoint behind the model seam, offline and exact.

Two backends (:mod:`lens_position.models.backends`): ``hooked`` builds a TransformerLens 3.x
``HookedTransformer`` through lens_position's adapters (the path described below); ``bridge``
boots a ``TransformerBridge`` (TransformerLens 3.9 and 4.x) on the Hugging Face model read from the
same sources. ``backend="auto"`` means whatever works: hooked where this TransformerLens has it and an
adapter converts the family exactly, else the bridge.

Every load is verified (:mod:`lens_position.models.verify`): the booted model against the Hugging
Face model it came from (logits and every layer's pattern on a few fixed tokens, once per weight-cache
entry or verdict), the key sets the spec reads against the model's own attention, the K/V hook layout
against a one-head patch, and ``ntk_alpha`` against the model's rotary tables; ``spec.extra["verified"]``
records what was found. A model that fails is refused with the family, the size of the difference and
the routes that work.

The path of a load, top to bottom:

1. resolve ``name_or_path``: a registry name, a ``.gguf`` file, a local HF checkpoint
   folder, or (online only) a hub id, downloaded to a snapshot folder;
2. get HookedTransformer config + weights: built in code (tiny models), or converted from
   the HF model by the family adapter and kept in the weight cache (GGUF files, folders);
3. apply the position options (NTK-aware α, NTK-by-parts, window, n_ctx) to the config;
4. build the HookedTransformer, load the weights unprocessed (activations equal HF's), attach
   the tokenizer, and describe it all in a ``ModelSpec``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from lens_position.ground.errors import BadInputError, UnknownModelError, UnsupportedArchitectureError
from lens_position.ground.paths import checked_path
from lens_position.ground.progress import stage, stages
from lens_position.models import sources
from lens_position.models.adapters import (
    FAMILY_OF_ARCHITECTURE,
    build_hooked,
    convert_state_dict,
    hooked_config,
)
from lens_position.models.backends import COUPLED_KV, bridge_class, resolve_backend
from lens_position.models.backends.hooked import HookedBackend
from lens_position.models.cache import CachedModel, cache_root, cached_convert
from lens_position.models.placement import check_device, check_n_devices, check_placement
from lens_position.models.registry import REGISTRY, check_model_name, is_zoo_name, lookup, unknown_model_message
from lens_position.models.rope import apply_position_options, check_position_options
from lens_position.models.routes import model_type_of, working_routes
from lens_position.models.source_hash import source_identity
from lens_position.models.spec import (
    Family,
    LoadedModel,
    attach_tokenizer,
    spec_from_config,
    tokenizer_prepends_bos,
)
from lens_position.models.tiny import tiny_hf_model
from lens_position.models.verify import (
    check_key_sets,
    check_kv_layout,
    check_ntk_scaling,
    check_tokens,
    compare_with_reference,
    family_name,
    reference_of,
)
from lens_position.models.weights import state_dict_sha256

log = logging.getLogger(__name__)


def load_model(
    name_or_path: str, *, ntk_alpha: float | None = None, ntk_by_parts: dict | bool | None = None,
    window: int | None = None, n_ctx: int | None = None, cache_dir: str | None = None,
    offline: bool | None = None, device: str = "cpu", backend: str = "auto", dtype: str = "float32",
    n_devices: int = 1, device_map: str | dict[str, str | int] | None = None,
    max_memory: dict[str | int, str | int] | None = None, offload_folder: str | None = None,
) -> LoadedModel:
    """Load a model behind the seam (a ``HookedTransformer`` or a ``TransformerBridge``) with its
    tokenizer and ``ModelSpec``.

    ``name_or_path``: a name from ``KNOWN_MODELS``, a ``.gguf`` file, a local Hugging Face
    checkpoint folder, or a hub id (``org/name``). Nothing is downloaded unless you pass
    ``offline=False``: only then is a hub id fetched (into the Hugging Face cache); with the
    default a hub id is refused with an error saying so. Local files are read with
    ``trust_remote_code=False``: a folder whose config names custom code is refused.

    Position options (any RoPE model; each overrides the registry entry's default):
    ``ntk_alpha`` NTK-aware scaling, rotary base ``θ·α^(d/(d-2))`` (1 = identity);
    ``ntk_by_parts`` Llama-3 NTK-by-parts, a dict with any of ``factor``, ``low_freq_factor``,
    ``high_freq_factor``, ``original_context`` (defaults 8, 1, 4, the model's n_ctx; ``{}``
    or True for all defaults); ``window`` sliding-window length in keys for the local
    layers (all layers, if the model has none); ``n_ctx`` context length (positions).

    ``cache_dir`` overrides ``$LENS_POSITION_CACHE`` (default ``~/.cache/lens_position``).
    The model computes in fp32, weights unfolded, and ``hook_k``/``hook_v`` carry one entry
    per query head (grouped-query KV heads are repeated), so a single head can be patched.
    A forward pass longer than ``n_ctx`` raises ContextLengthError.

    ``backend``: ``"hooked"`` (HookedTransformer, TransformerLens 3.x: every adapter, GGUF, folders,
    the whole zoo), ``"bridge"`` (TransformerBridge booted on the Hugging Face model, TransformerLens 3.9
    and 4.x; also the decoder families the adapters do not convert, e.g. Qwen3, SmolLM3, and the zoo's
    checkpoints but ``learned``, converted by :mod:`lens_position.models.zoo.hf`) or
    ``"auto"`` (whatever works: hooked where TransformerLens has it and the family has an adapter that
    converts it exactly, else the bridge); ``spec.extra["backend"]`` says which ran (and
    ``spec.extra["auto"]`` why the bridge, when auto fell back to it). ``dtype`` (``float32``,
    ``bfloat16``, ``float16``) casts the weights after loading; ``n_devices > 1`` splits the layers over
    GPUs (hooked: after loading on the host; bridge: as read). ``device_map``, ``max_memory``,
    ``offload_folder``: each weight placed as it is read, on the bridge (``Placement`` in
    :mod:`lens_position.models.placement`; ``spec.extra["placement"]`` counts modules per device).
    Each stage of a load that runs over a second (reading the file, dequantising, converting,
    verifying, writing or reading the weight cache) says so where progress goes
    (:func:`lens_position.ground.progress.stages`), and the load ends with a line of their times.
    """
    shown = Path(str(name_or_path)).name if str(name_or_path) not in REGISTRY else str(name_or_path)
    with stages(f"loading {shown}"):
        return _load(name_or_path, ntk_alpha=ntk_alpha, ntk_by_parts=ntk_by_parts, window=window, n_ctx=n_ctx,
                     cache_dir=cache_dir, offline=offline, device=device, backend=backend, dtype=dtype,
                     n_devices=n_devices, device_map=device_map, max_memory=max_memory,
                     offload_folder=offload_folder)


def _load(name_or_path: str, *, ntk_alpha: float | None, ntk_by_parts: dict | bool | None, window: int | None,
          n_ctx: int | None, cache_dir: str | None, offline: bool | None, device: str, backend: str, dtype: str,
          n_devices: int, device_map: Any, max_memory: Any, offload_folder: str | None) -> LoadedModel:
    """:func:`load_model`'s work, inside its stages."""
    started = time.perf_counter()
    checked_path(name_or_path, "the model name or path")
    if cache_dir is not None:
        checked_path(cache_dir, "cache_dir")
    check_position_options(ntk_alpha=ntk_alpha, ntk_by_parts=ntk_by_parts, window=window, n_ctx=n_ctx)
    n_devices, chosen, placement = _where(device, n_devices, backend, dtype, device_map, max_memory, offload_folder)
    if is_zoo_name(name_or_path):
        if placement is not None:
            raise BadInputError(f"{name_or_path} is a small zoo model read whole; load it without device_map (or "
                                "with n_devices on the hooked backend)")
        loaded = _load_zoo(str(name_or_path), ntk_alpha=ntk_alpha, ntk_by_parts=ntk_by_parts, window=window,
                           n_ctx=n_ctx, device=device, backend=backend)  # "auto": learned positions run mini
        return _placed(loaded, device, dtype, n_devices)
    source, loader_kind, target, defaults = _resolve(name_or_path, offline)
    given = {"ntk_alpha": ntk_alpha, "ntk_by_parts": ntk_by_parts, "window": window, "n_ctx": n_ctx}
    if ntk_alpha is not None or ntk_by_parts is not None:  # the user's RoPE scaling replaces the entry's
        defaults = {k: v for k, v in defaults.items() if k not in ("ntk_alpha", "ntk_by_parts")}
    options = {**defaults, **{k: v for k, v in given.items() if v is not None}}
    local = not source.startswith(("registry:", "hub:"))
    name = Path(str(name_or_path)).name if local else str(name_or_path)

    def bridged() -> LoadedModel:
        from lens_position.models.bridged import load_bridged

        split = placement if placement is not None else check_placement(n_devices=n_devices, backend="bridge",
                                                                         dtype=dtype)
        return load_bridged(name, source, loader_kind, target, options, device=device, dtype=dtype,
                            started=started, cache_dir=cache_dir, placement=split)

    if chosen == "bridge":
        return bridged()
    try:
        loaded = _load_hooked(name, source, loader_kind, target, options, cache_dir,
                              "cpu" if n_devices > 1 else device, started)  # split over the GPUs from the host
    except UnsupportedArchitectureError as hooked_refusal:
        if backend != "auto" or bridge_class() is None:
            raise
        return _bridge_instead(name, hooked_refusal, bridged)
    return _placed(loaded, device, dtype, n_devices)


def _where(device: str, n_devices: Any, backend: str, dtype: str, device_map: Any, max_memory: Any,
           offload_folder: Any) -> tuple[int, str, Any]:
    """The checked ``n_devices``, the backend to try first and the :class:`Placement` of a load (None:
    read whole), each refused by name before any weight is read when this machine cannot honour it."""
    check_device(device)
    n_devices = check_n_devices(n_devices, device)
    stage("importing TransformerLens")
    chosen = "bridge" if device_map is not None and backend == "auto" else resolve_backend(backend)
    return n_devices, chosen, check_placement(device_map=device_map, max_memory=max_memory,
                                              offload_folder=offload_folder, n_devices=n_devices, backend=chosen,
                                              dtype=dtype)


def _bridge_instead(name: str, hooked_refusal: UnsupportedArchitectureError,
                    bridged: Callable[[], LoadedModel]) -> LoadedModel:
    """``auto`` after the hooked backend refused ``name``: the bridge, which hosts the families the
    adapters do not convert; a refusal naming both reasons when it refuses too."""
    reason = str(hooked_refusal).split(";")[0]
    try:
        loaded = bridged()
    except UnsupportedArchitectureError as bridge_refusal:
        raise UnsupportedArchitectureError(
            f"neither backend hosts {name}. The hooked backend: {reason}. The bridge: {bridge_refusal}") \
            from bridge_refusal
    loaded.spec = dataclasses.replace(loaded.spec, extra={**loaded.spec.extra,
                                                         "auto": f"the bridge (the hooked backend: {reason})"})
    return loaded


def _load_hooked(name: str, source: str, loader_kind: str, target: Any, options: dict[str, Any],
                 cache_dir: str | None, device: str, started: float) -> LoadedModel:
    """The hooked backend's load: config and weights converted by the family adapter (or read from
    the weight cache), the position options applied, the HookedTransformer built with its tokenizer."""
    base = _base_model(loader_kind, target, cache_dir)
    stage("building the HookedTransformer")
    family = adapter_for_cfg(base.cfg)
    cfg, facts = apply_position_options(base.cfg, **options)
    cfg["model_name"] = name
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformer_lens")
        model = build_hooked(cfg, base.state_dict, device)
    tokenizer = base.tokenizer
    prepends_bos = tokenizer_prepends_bos(tokenizer)
    attach_tokenizer(model, tokenizer, prepends_bos)
    spec = spec_from_config(
        model, name=name, family=family, source=source, rope_kind=facts["rope_kind"],
        ntk_alpha=facts["ntk_alpha"], ntk_by_parts=facts["ntk_by_parts"],
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id,
        weights_sha256=base.weights_sha256,
        extra={"hf_model_type": base.meta.get("model_type"), "file": base.meta.get("file"),
               "from_cache": base.from_cache, "ungrouped_kv_hooks": True, "d_vocab": cfg["d_vocab"],
               "backend": "hooked",
               **({"unscaled_rotary_base": facts["unscaled_rotary_base"]} if "unscaled_rotary_base" in facts else {})},
    )
    family_text = f"{family} (model_type {base.meta.get('model_type')!r})"
    stage("checking its hooks")
    verified = {**base.meta.get("verified", {}), **verify_hooked(model, spec, family_text)}
    extra = {**spec.extra, "verified": verified, "load_seconds": round(time.perf_counter() - started, 3)}
    return LoadedModel(model=model, tokenizer=tokenizer, spec=dataclasses.replace(spec, extra=extra))


def _placed(loaded: LoadedModel, device: str, dtype: str, n_devices: int) -> LoadedModel:
    """``loaded`` cast to ``dtype`` and split over ``n_devices`` GPUs where asked (float32 on one
    device: as loaded)."""
    if dtype == "float32" and n_devices == 1:
        return loaded
    from lens_position.models.placement import place

    place(loaded.model, device=device, dtype=dtype, n_devices=n_devices)
    return loaded.adopt_weights()


def _load_zoo(name: str, device: str, backend: str, **options: Any) -> LoadedModel:
    """A zoo checkpoint (``zoo:<variant>[:seed<k>]``), exactly as trained, on ``backend`` (the
    bridge: converted to a Hugging Face model, :mod:`lens_position.models.zoo.hf`): position
    options would change the very mechanism the zoo controls, so they are refused."""
    given = [k for k, v in options.items() if v is not None]
    if given:
        raise BadInputError(f"{name} loads as trained; position options ({', '.join(given)}) are not "
                            "applied to zoo models (each variant is its own trained model)")
    from lens_position.models.zoo.store import load_zoo_model

    return load_zoo_model(name, device=device, backend=backend)


def _resolve(name_or_path: str, offline: bool | None) -> tuple[str, str, Any, dict[str, Any]]:
    """``(source description, loader kind, loader target, default options)``."""
    name = str(name_or_path)
    if name in REGISTRY:
        entry = lookup(name)
        if entry.kind == "tiny":
            return f"registry:{name}", "tiny", name, dict(entry.options)
        return f"registry:{name}", "gguf", entry.locate(), dict(entry.options)
    path = Path(name).expanduser()
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise BadInputError(
                f"{path} is a file but not a .gguf; pass a .gguf file, a Hugging Face checkpoint "
                "folder, or a registry name")
        return f"gguf:{path.resolve()}", "gguf", path.resolve(), {}
    if path.is_dir():
        return f"hf-folder:{path.resolve()}", "hf-folder", path.resolve(), {}
    check_model_name(name, allow_hub=True)
    if "/" in name and not name.startswith("/"):
        if offline is not False:  # downloading is an explicit request, never a fallback
            raise BadInputError(
                f"{name!r} is not a registry name or a local path, and lens_position does not download "
                "unless asked: pass load_model(..., offline=False) to download this hub checkpoint (with "
                "network access), or download it yourself and pass its folder")
        return f"hub:{name}", "hf-folder", sources.download_hub(name), {}
    raise UnknownModelError(unknown_model_message(name))


def _base_model(kind: str, target: Any, cache_dir: str | None) -> CachedModel:
    """Config + weights before position options: built in code, or converted and cached."""
    if kind == "tiny":
        hf_model, tokenizer = tiny_hf_model(target)
        cfg = hooked_config(hf_model.config)
        state_dict = convert_state_dict(hf_model, cfg)
        meta = {"model_type": hf_model.config.model_type, "file": None,
                "verified": verify_conversion(hf_model, cfg, state_dict)}
        return CachedModel(cfg, state_dict, tokenizer, state_dict_sha256(state_dict), meta, False)
    reader = sources.read_gguf if kind == "gguf" else sources.read_hf_folder
    identity = source_identity(target, cache_root(cache_dir))

    def build() -> tuple[dict[str, Any], dict[str, torch.Tensor], Any, dict[str, Any]]:
        log.info("converting %s (first load; later loads read the weight cache)", target)
        hf_model, tokenizer = reader(target)
        stage("converting to TransformerLens's layout")
        cfg = hooked_config(hf_model.config)
        state_dict = convert_state_dict(hf_model, cfg)
        stage("checking the conversion against transformers")
        verified = verify_conversion(hf_model, cfg, state_dict)
        return cfg, state_dict, tokenizer, {"model_type": hf_model.config.model_type, "file": str(target),
                                            "verified": verified}

    return cached_convert(identity, build, _load_tokenizer, cache_dir, verify=check_structure)


def verify_conversion(hf_model: Any, cfg: dict[str, Any], state_dict: dict[str, torch.Tensor]) -> dict[str, Any]:
    """The converted weights, built as a HookedTransformer, against the Hugging Face model they came
    from (eager attention), before any position option: logits and every layer's pattern on the check
    tokens, and the source's key sets against the ones the hooked config gives
    (:mod:`lens_position.models.verify`). EquivalenceError naming the family and the route that works
    when they differ; else the verdict recorded with the weight-cache entry (checked once per entry)."""
    family = family_name(hf_model.config)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="transformer_lens")
        model = build_hooked(cfg, state_dict, "cpu")
    windows = [int(cfg["window_size"]) if getattr(block.attn, "attn_type", "global") == "local" else None
               for block in model.blocks]
    tokens = check_tokens(int(cfg["d_vocab"]), windows, int(cfg["n_ctx"]))
    reference = reference_of(hf_model, tokens, int(cfg["n_layers"]))
    check_key_sets(reference, windows, family=family)
    routes = working_routes(model_type_of(hf_model.config), refused_by="hooked")
    agreement = compare_with_reference(HookedBackend(model), reference, family=family, routes=routes)
    return {"equivalence": agreement.to_dict()}


def verify_hooked(model: Any, spec: Any, family: str) -> dict[str, Any]:
    """What every hooked load checks on the model it built (cheap): the K/V hook layout and, with
    ``ntk_alpha``, the rotary tables (:mod:`lens_position.models.verify`)."""
    backend = HookedBackend(model)
    coupled = check_kv_layout(backend, int(model.cfg.d_vocab), family=family)
    verdict: dict[str, Any] = {"kv_layout": "[batch, pos, head, d_head], one entry per query head"}
    if coupled:
        verdict["kv_single_head"] = coupled
    model.__dict__[COUPLED_KV] = coupled
    if spec.ntk_alpha is not None and spec.rotary_base is not None:
        unscaled = float(spec.extra["unscaled_rotary_base"])
        layers = [layer for layer in range(spec.n_layers) if spec.rotary_base_local is None or not spec.is_local(layer)]
        check_ntk_scaling(backend, ntk_alpha=spec.ntk_alpha, rotary_base=unscaled, layers=layers[:1], family=family)
        verdict["ntk_alpha"] = "lowest frequency divided by ntk_alpha"
    return verdict


def check_structure(cached: CachedModel) -> None:
    """Raise ValueError unless the weights have the shapes the config says (a second line of
    defence behind the entry's hashes: an entry whose ``n_heads`` or ``d_model`` no longer fits
    its weights is rebuilt, rather than failing every load with a raw error)."""
    cfg, weights = cached.cfg, cached.state_dict
    n_heads, n_kv = cfg["n_heads"], cfg.get("n_key_value_heads") or cfg["n_heads"]
    d_model, d_head = cfg["d_model"], cfg["d_head"]
    expected: dict[str, tuple[int, ...]] = {"embed.W_E": (cfg["d_vocab"], d_model),
                "unembed.W_U": (d_model, cfg.get("d_vocab_out") or cfg["d_vocab"])}
    for layer in range(cfg["n_layers"]):
        attn = f"blocks.{layer}.attn"
        expected[f"{attn}.W_Q"] = (n_heads, d_model, d_head)
        expected[f"{attn}.W_O"] = (n_heads, d_head, d_model)
        kv_prefix = "_" if f"{attn}._W_K" in weights else ""
        expected[f"{attn}.{kv_prefix}W_K"] = (n_kv if kv_prefix else n_heads, d_model, d_head)
        expected[f"{attn}.{kv_prefix}W_V"] = (n_kv if kv_prefix else n_heads, d_model, d_head)
    if f"blocks.{cfg['n_layers']}.attn.W_Q" in weights:
        raise ValueError(f"the weights have more than n_layers={cfg['n_layers']} blocks")
    for name, shape in expected.items():
        if name not in weights:
            raise ValueError(f"the weights have no {name}")
        if tuple(weights[name].shape) != shape:
            raise ValueError(f"{name} has shape {tuple(weights[name].shape)}, the config says {shape}")


def _load_tokenizer(folder: Path) -> Any:
    from transformers import AutoTokenizer

    with sources.hub_offline():
        return AutoTokenizer.from_pretrained(folder, **sources.NO_REMOTE_CODE)


def adapter_for_cfg(cfg: dict[str, Any]) -> Family:
    """Family name from a HookedTransformerConfig dict's ``original_architecture``."""
    return cast(Family, FAMILY_OF_ARCHITECTURE[cfg["original_architecture"]])


def describe(loaded: LoadedModel) -> str:
    """One line saying what a loaded model is (family, size, position mechanisms, BOS policy)."""
    s = loaded.spec
    rope = f"RoPE {s.rope_kind}, θ = {s.rotary_base:g}"
    if s.rotary_base_local is not None:
        rope += f" (local θ = {s.rotary_base_local:g})"
    if s.ntk_alpha is not None:
        rope += f", α = {s.ntk_alpha:g}"
    if s.ntk_by_parts:
        rope += ", by-parts " + ", ".join(f"{k} {v:g}" for k, v in s.ntk_by_parts.items())
    n_local = sum(s.is_local(layer) for layer in range(s.n_layers))
    attn = (f"{n_local} local (window {s.window}) + {s.n_layers - n_local} global layers" if n_local
            else f"{s.n_layers} global layers")
    bos = (f"tokenizer prepends BOS id {s.bos_token_id}" if s.tokenizer_prepends_bos
           else f"tokenizer adds no BOS (bos_token_id {s.bos_token_id})")
    return (f"{s.name}: {s.family}, {attn}, {s.n_heads} heads ({s.n_kv_heads} kv) × d_head {s.d_head}, "
            f"d_model {s.d_model}, n_ctx {s.n_ctx}; {rope}; {bos}; weights sha256 "
            f"{(s.weights_sha256 or '?')[:12]}")
