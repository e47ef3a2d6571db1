"""The bridge backend's load path: the Hugging Face model from the same sources as the hooked
path (the tiny models, GGUF files dequantised by transformers, checkpoint folders, hub snapshots),
booted into a ``TransformerBridge`` (:mod:`lens_position.models.backends.bridge`), described by a
``ModelSpec`` read off its Hugging Face config."""

from __future__ import annotations

import copy
import dataclasses
import time
from typing import Any

from lens_position.ground.errors import BadInputError, LensPositionError, UnsupportedArchitectureError
from lens_position.ground.progress import stage
from lens_position.models import sources
from lens_position.models.hf_cache import read_gguf_cached
from lens_position.models.placement import Placement, check_bridge_takes, placed_summary, torch_dtype
from lens_position.models.rope import normalise_ntk_by_parts, ntk_aware_base
from lens_position.models.routes import working_routes
from lens_position.models.spec import (
    Family,
    LoadedModel,
    attach_tokenizer,
    check_has_attention,
    context_length,
    spec_from_hf_config,
    tokenizer_prepends_bos,
)
from lens_position.models.tiny import tiny_hf_model
from lens_position.models.verdicts import read_verdict, verdict_key, write_verdict
from lens_position.models.verify import (
    Reference,
    check_key_sets,
    check_kv_layout,
    check_ntk_tables,
    check_tokens,
    compare_with_reference,
    family_name,
    reference_of,
    rotary_tables,
)
from lens_position.models.weights import hashes_other_than_its_checkpoint, model_weights_sha256

_FAMILIES: dict[str | None, Family] = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2",
                                       "gemma3_text": "gemma3", "gemma3": "gemma3"}


def apply_hf_position_options(hf_model: Any, *, ntk_alpha: float | None = None,
                              ntk_by_parts: dict[str, float] | bool | None = None, window: int | None = None,
                              n_ctx: int | None = None) -> dict[str, Any]:
    """Apply ``load_model``'s position options to a Hugging Face model in place, as the hooked
    backend applies them to its config (:func:`lens_position.models.rope.apply_position_options`):
    NTK-aware ``θ·α^(d/(d-2))`` on every base; NTK-by-parts as ``rope_type="llama3"``; ``window`` on
    the local layers of a model that has them; ``n_ctx``. The rotary tables are rebuilt from the
    edited config. Returns the spec fields they imply."""
    config = hf_model.config
    tables_before = rotary_tables(hf_model)
    facts: dict[str, Any] = {}
    wants_parts = ntk_by_parts is not None and ntk_by_parts is not False
    if ntk_alpha is not None and wants_parts:
        raise BadInputError("choose one of ntk_alpha and ntk_by_parts, not both")
    trained_context = context_length(config)
    params = getattr(config, "rope_parameters", None)
    scaled = sorted({entry.get("rope_type", "default") for entry in _rope_entries(params)} - {"default"})
    if scaled and (ntk_alpha is not None or wants_parts):
        raise BadInputError(f"this model's RoPE is already scaled (rope_type {', '.join(scaled)}); NTK options "
                            "would stack a second scaling on it: load it without ntk_alpha / ntk_by_parts")
    if "dynamic" in scaled and n_ctx is not None and int(n_ctx) > trained_context:
        raise BadInputError(
            f"n_ctx={n_ctx} beyond the trained context ({trained_context}) of a dynamic-NTK model: its rotary "
            "frequencies would then depend on the longest sequence run so far (and Hugging Face measures that "
            "length against max_position_embeddings, which n_ctx replaces), so lens_position analyses it "
            f"within its trained context only (T <= {trained_context}, where it is plain RoPE)")
    if n_ctx is not None:
        if int(n_ctx) < 1:
            raise BadInputError(f"n_ctx must be a positive number of positions, got {n_ctx}")
        config.max_position_embeddings = int(n_ctx)  # read back by context_length
    if (ntk_alpha is not None or wants_parts) and not params:
        raise BadInputError("NTK options need a RoPE model; this one has no rope_parameters")
    if params:  # edited below: this model's own copy, never a dict another model or config shares
        params = config.rope_parameters = copy.deepcopy(params)
    entries = _rope_entries(params)
    d_head = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    rotary_dim = int(d_head * partial_rotary_factor(config))
    if ntk_alpha is not None:
        if not ntk_alpha > 0:
            raise BadInputError(f"ntk_alpha must be > 0 (1 is plain RoPE), got {ntk_alpha}")
        for entry in entries:
            entry["rope_theta"] = ntk_aware_base(float(entry["rope_theta"]), float(ntk_alpha), rotary_dim)
        if float(ntk_alpha) != 1.0:
            facts.update(rope_kind="ntk-aware")
        facts["ntk_alpha"] = float(ntk_alpha)
    if wants_parts:
        parts = normalise_ntk_by_parts(ntk_by_parts, trained_context)
        for entry in entries:
            entry.update(rope_type="llama3", factor=parts["factor"], low_freq_factor=parts["low_freq_factor"],
                         high_freq_factor=parts["high_freq_factor"],
                         original_max_position_embeddings=int(parts["original_context"]))
        facts.update(rope_kind="ntk-by-parts", ntk_by_parts=parts)
    if window is not None:
        if int(window) != window or window < 1:
            raise BadInputError(f"window must be a positive whole number of keys, got {window}")
        if not getattr(config, "sliding_window", None):
            from lens_position.models.routes import has_adapter, model_type_of

            route = ("; the hooked backend makes every layer local (load_model(..., backend='hooked', window=W))"
                     if has_adapter(model_type_of(config)) else "; load it without window=")
            raise BadInputError(
                f"window={window}: model_type {model_type_of(config)!r} has no sliding-window layers, and the bridge "
                f"runs the Hugging Face model's own masks, which have no window to set{route}")
        config.sliding_window = int(window)
    if ntk_alpha is not None or wants_parts:
        _rebuild_rotary(hf_model)
    if ntk_alpha is not None:
        check_ntk_tables(tables_before, rotary_tables(hf_model), ntk_alpha=float(ntk_alpha),
                         family=family_name(config))
        facts["ntk_verified"] = True
    return facts


def partial_rotary_factor(config: Any) -> float:
    """The share of each head's dimensions RoPE rotates: ``rope_parameters["partial_rotary_factor"]``
    (where transformers 5 keeps it), else the config's own attribute (older configs), else 1."""
    for entry in _rope_entries(getattr(config, "rope_parameters", None)):
        if entry.get("partial_rotary_factor") is not None:
            return float(entry["partial_rotary_factor"])
    return float(getattr(config, "partial_rotary_factor", None) or 1.0)


def _rope_entries(params: Any) -> list[dict[str, Any]]:
    """The RoPE parameter dicts of a config's ``rope_parameters``: one, or one per layer type."""
    if not isinstance(params, dict) or not params:
        return []
    if any(isinstance(v, dict) for v in params.values()):
        return [v for v in params.values() if isinstance(v, dict)]
    return [params]


def _rebuild_rotary(hf_model: Any) -> None:
    """Replace every rotary embedding module by one built from the (edited) config."""
    for parent in list(hf_model.modules()):
        for child_name, child in list(parent.named_children()):
            if type(child).__name__.endswith("RotaryEmbedding") and hasattr(child, "config"):
                buffer = next(iter(child.buffers()), None)
                rebuilt = type(child)(config=child.config)
                setattr(parent, child_name, rebuilt.to(buffer.device) if buffer is not None else rebuilt)


def load_bridged(name: str, source: str, kind: str, target: Any, options: dict[str, Any], *, device: str,
                 dtype: str, started: float, cache_dir: str | None = None, placement: Placement | None = None
                 ) -> LoadedModel:
    """A LoadedModel on the bridge backend, with the position options applied to the Hugging Face
    model (:func:`apply_hf_position_options`), verified at load (:func:`verify_bridge`); with a
    ``placement``, its weights placed on their devices as they are read."""
    from lens_position.models.backends import COUPLED_KV
    from lens_position.models.backends.bridge import boot_bridge

    check_bridge_takes(placement, int(_transformer_lens_version().split(".")[0]))
    if kind == "tiny" and placement is not None:
        raise BadInputError(f"{name} is built in code on the host; to place it, save it with save_pretrained and "
                            "load that folder with device_map")
    if kind == "tiny":
        hf_model, tokenizer, checked_sha256 = (*tiny_hf_model(target), None)
    elif kind == "gguf":  # with the weights' hash the weight cache has just checked them against
        hf_model, tokenizer, checked_sha256 = read_gguf_cached(target, cache_dir, placement)
    else:
        hf_model, tokenizer, checked_sha256 = (*sources.read_hf_folder(target, check=None, placement=placement), None)
    check_has_attention(hf_model.config)
    facts = apply_hf_position_options(hf_model, **{k: v for k, v in options.items() if v is not None})
    ntk_verified = facts.pop("ntk_verified", False)
    unchanged = all(value is None for value in options.values())  # no option touched the model after the check
    weights_sha256 = checked_sha256 if checked_sha256 and unchanged else model_weights_sha256(hf_model)
    prepends_bos = tokenizer_prepends_bos(tokenizer)
    model_type = getattr(hf_model.config, "model_type", None)
    spec = spec_from_hf_config(
        hf_model.config, name=name, family=_FAMILIES.get(model_type, "custom"), source=source,
        tokenizer_prepends_bos=prepends_bos, bos_token_id=tokenizer.bos_token_id,
        weights_sha256=weights_sha256, **facts,
        extra={"file": str(target) if kind != "tiny" else None, "from_cache": False, "ungrouped_kv_hooks": True,
               "backend": "bridge", "placement": placed_summary(hf_model, placement)})
    routes = working_routes(model_type, refused_by="bridge")
    refuse_learned_sinks(hf_model, family := family_name(hf_model.config))
    key = verdict_key(weights_sha256, {**options, **({"placed": True} if placement is not None else {})}, "bridge",
                      dtype, config=hf_model.config.to_dict())
    verified = read_verdict(key, cache_dir)
    if verified is not None:
        verified.pop("key", None)
    try:
        reference = None
        if verified is None and dtype == "float32":
            stage("running transformers' reference pass")
            tokens = check_tokens(int(spec.extra["d_vocab"]), spec.layer_windows, spec.n_ctx)
            reference = reference_of(hf_model, tokens, spec.n_layers)
            check_key_sets(reference, spec.layer_windows, family=family)
        # a verdict for these weights, options and versions was written after every check passed
        stage("booting the TransformerBridge")
        bridge = boot_bridge(hf_model, tokenizer, name=name, device=device, dtype=torch_dtype(dtype),
                             prepends_bos=prepends_bos, check_scores=verified is None)
        bridge.cfg.model_name = name
        if spec.rotary_base is not None:  # the bridge's config keeps TransformerLens's default (10000)
            bridge.cfg.rotary_base = spec.rotary_base
        attach_tokenizer(bridge, tokenizer, prepends_bos)
        if verified is None:
            stage("checking the bridge against transformers")
            verified = verify_bridge(bridge, reference, spec, family=family)
            if ntk_verified:  # checked on the model's rotary tables when the option was applied
                verified["ntk_alpha"] = "lowest frequency divided by ntk_alpha in every rotary table"
            if reference is not None:
                write_verdict(key, verified, cache_dir)
    except UnsupportedArchitectureError as refusal:
        text = str(refusal)
        if not text.startswith(family):
            text = f"{family} on the bridge: {text}"
        raise type(refusal)(text if "Routes that work" in text or "No backend" in text else f"{text} {routes}") \
            from refusal
    except LensPositionError:  # a refusal of lens_position's own (bad input, a resource fault): as it is
        raise
    except (RuntimeError, AttributeError, TypeError, IndexError, ValueError, KeyError, NotImplementedError) as crash:
        raise UnsupportedArchitectureError(
            f"TransformerLens {_transformer_lens_version()}'s TransformerBridge failed on {family} "
            f"({type(crash).__name__}: {str(crash)[:200]}): an error inside TransformerLens (or the family's Hugging "
            f"Face code), not in your checkpoint. {routes}") from crash
    bridge.__dict__[COUPLED_KV] = dict(verified.get("kv_single_head", {}))
    if hashes_other_than_its_checkpoint(bridge):  # it computes with tensors of its own (a fused QKV split in
        # three): the hash stands for what it holds, so an edit shows and an edit undone hashes as loaded
        spec = dataclasses.replace(spec, weights_sha256=model_weights_sha256(bridge))
    extra = {**spec.extra, "verified": verified, "load_seconds": round(time.perf_counter() - started, 3)}
    return LoadedModel(model=bridge, tokenizer=tokenizer, spec=dataclasses.replace(spec, extra=extra))


def refuse_learned_sinks(hf_model: Any, family: str) -> None:
    """UnsupportedArchitectureError for attention with a learned sink logit per head (GPT-OSS's
    ``sinks``: an extra column in every softmax that no key owns): the pattern is then not the softmax
    of the scores over the keys, so the decomposition's identity ``log A = t - z`` and every sink score
    read off the keys would be wrong."""
    for name, parameter in hf_model.named_parameters():
        if name.rsplit(".", 1)[-1] == "sinks":
            raise UnsupportedArchitectureError(
                f"{family}: its attention adds a learned sink logit per head to every softmax ({name}, "
                f"{tuple(parameter.shape)}): part of each query's attention goes to no key, so the pattern is not "
                "the softmax of the scores over the keys, and the decomposition (log A = t - z) and the sink scores "
                "lens_position reads off the keys do not describe it. Refused rather than analysed without its "
                "sink; no backend of lens_position models a learned sink yet")


def _transformer_lens_version() -> str:
    import importlib.metadata

    return importlib.metadata.version("transformer_lens")


def verify_bridge(bridge: Any, reference: Reference | None, spec: Any, *, family: str) -> dict[str, Any]:
    """The booted bridge against its source's ``reference`` (None: a dtype other than float32, whose
    round-off the float32 tolerances do not cover: the equivalence is not checked, and the verdict says
    so), its K/V hook layout and, with ``ntk_alpha``, its rotary tables
    (:mod:`lens_position.models.verify`). Returns the verdict recorded in the spec."""
    from lens_position.models.backends.bridge import BridgeBackend

    backend = BridgeBackend(bridge)
    routes = working_routes(spec.extra.get("hf_model_type"), refused_by="bridge")
    verdict: dict[str, Any] = {"equivalence": "not checked (not float32)"}
    if reference is not None:
        verdict = {"equivalence": compare_with_reference(backend, reference, family=family, routes=routes).to_dict()}
    coupled = check_kv_layout(backend, int(spec.extra["d_vocab"]), family=family)
    verdict["kv_layout"] = "[batch, pos, head, d_head], one entry per query head"
    if coupled:
        verdict["kv_single_head"] = coupled
    return verdict
