"""The ``bridge`` backend: a TransformerLens ``TransformerBridge`` (3.9 and the 4.x line) booted
from a Hugging Face model lens_position loaded itself, in compatibility mode (the 3.x hook
names), behind the seam.

What the bridge does differently from ``HookedTransformer``, and what this module sets so the
numbers are the same:

- **Grouped-query K/V.** ``hook_k``/``hook_v`` of the bridge hold one entry per key/value head,
  and TransformerLens 4.0 removed ``ungroup_grouped_query_attention``. :func:`ungroup_kv`
  repeats the K/V projection rows of the HF model once per query head before booting (the
  same keys and values, so the same forward pass): a patch of one query head's key then
  reaches that head only, as on the hooked backend.
- **Scores before the softmax.** lens_position reads ``hook_attn_scores`` as the scores before
  the softmax; an attention bridge that fires it on the post-softmax weights would give a silent
  wrong answer. :func:`check_scores_hook` runs the booted model once and refuses it unless
  ``softmax(hook_attn_scores) == hook_pattern`` in every layer.
- **The mask.** Masked scores are ``-inf`` in compatibility mode but ``finfo.min`` otherwise;
  the analyses take key sets from the model's spec (causal or window), never from the values.
- **BOS and padding.** The bridge would swap in a re-loaded "with BOS" tokenizer; the tokenizer
  is set back to ours, its padding side to the right, and the default BOS policy to the
  tokenizer's own (``ModelSpec.tokenizer_prepends_bos``).
- **start_at_layer.** 3.9's bridge refuses it; :class:`BridgeBackend` then runs the blocks before
  the start on placeholder tokens and puts the given residual in at the start block; on either
  release every hook before the start block is kept silent (4.x runs those blocks too, on the
  residual as input embeddings, and discards them).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib.metadata
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models.backends import COUPLED_KV, RotaryLayout, config_score_scale_and_cap, rotate
from lens_position.models.hook_names import block_of
from lens_position.models.pass_memory import check_pass_memory
from lens_position.models.weights import REPEATED_ROWS

log = logging.getLogger(__name__)

# TransformerLens 3.x's TransformerBridge.hooks() resolves its hook table anew for every named hook
_RESOLVES_EVERY_HOOK = int(importlib.metadata.version("transformer_lens").split(".")[0]) < 4
_SCORE_CHECK_TOKENS = 6
_SCORE_CHECK_TOL = 1e-4
_ROTARY_CHECK_TOL = 1e-4  # relative to the largest |q|: float32 rotation round-off is ~1e-7


def _repeated(tensor: torch.Tensor, blocks: list[tuple[int, int, int]]) -> torch.Tensor:
    """``tensor``'s rows (dimension 0) cut, in order, into ``blocks`` of ``(n_heads, d_head, times)``:
    each block's heads repeated ``times`` times (1: the block kept as is)."""
    pieces, start = [], 0
    for n, d_head, times in blocks:
        rows = tensor[start:start + n * d_head]
        pieces.append(rows.reshape(n, d_head, *tensor.shape[1:]).repeat_interleave(times, dim=0)
                      .reshape(n * times * d_head, *tensor.shape[1:]))
        start += n * d_head
    assert start == tensor.shape[0], (start, tensor.shape[0])
    return torch.cat(pieces).contiguous()


class _RepeatedOnRead(Mapping):
    """An offloaded module's weights (accelerate's ``weights_map``: its tensors on disk or on the host,
    read in at each forward) with the named ones repeated by row blocks as they are read, so a module
    whose parameters wait on the ``meta`` device is ungrouped without reading its weights now."""

    def __init__(self, weights: Mapping, blocks: dict[str, list[tuple[int, int, int]]]):
        self.weights, self.blocks = weights, blocks

    def __getitem__(self, key: str) -> torch.Tensor:
        value = self.weights[key]
        return _repeated(value, self.blocks[key]) if key in self.blocks else value

    def __iter__(self) -> Iterator[str]:
        return iter(self.weights)

    def __len__(self) -> int:
        return len(self.weights)


def _offload_hook(module: torch.nn.Module) -> Any:
    """accelerate's offloading hook on ``module`` (its parameters then live on ``meta`` between
    forwards), else None."""
    hook = getattr(module, "_hf_hook", None)
    return hook if getattr(hook, "offload", False) and getattr(hook, "weights_map", None) is not None else None


def _repeat_rows(module: torch.nn.Module, blocks: list[tuple[int, int, int]], names: tuple[str, ...]
                 = ("weight", "bias")) -> None:
    """Rebuild ``module``'s parameters ``names`` (those it has) with their rows repeated by
    ``blocks`` (:func:`_repeated`). A module offloaded by accelerate (``device_map`` with host or disk
    targets) gets ``meta`` parameters of the new shape and reads its weights repeated at each forward."""
    hook = _offload_hook(module)
    present = [name for name in names if getattr(module, name, None) is not None]
    for name in present:
        setattr(module, name, torch.nn.Parameter(_repeated(getattr(module, name).data, blocks), requires_grad=False))
    # so the weights' hash reads the checkpoint's rows while the copies agree
    module.__dict__.setdefault(REPEATED_ROWS, {}).update({name: blocks for name in present})
    if hook is not None:
        hook.weights_map = _RepeatedOnRead(hook.weights_map, {name: blocks for name in present})
    if hasattr(module, "out_features"):
        module.out_features = module.weight.shape[0]


def ungroup_kv(hf_model: torch.nn.Module) -> int:
    """Repeat each key/value head's projection rows (and biases) once per query head of its group,
    in place, so every attention layer is multi-head with the same keys and values as before
    (``repeat_kv``'s order: query head ``h`` reads key/value head ``h // group``). Covers separate
    ``k_proj``/``v_proj``, a fused ``qkv_proj`` (Phi-3: rows query, key, value) and a key norm over
    all key heads at once (OLMo-2's ``k_norm``: its weight is repeated too; the root mean square of
    a vector whose heads are all repeated equally is unchanged). Returns the number of key/value
    heads the model had (its own; the spec records it). Raises UnsupportedArchitectureError when
    the model is grouped but has no attention layout this function knows, rather than leave the
    bridge's hooks half-ungrouped."""
    config: Any = getattr(hf_model, "config", None)
    n_heads = int(config.num_attention_heads)
    n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
    if n_kv == n_heads:
        return n_kv
    group = n_heads // n_kv
    changed = 0
    with torch.no_grad():
        for module in hf_model.modules():
            if hasattr(module, "k_proj") and hasattr(module, "v_proj"):
                d_head = module.k_proj.out_features // n_kv
                for name in ("k_proj", "v_proj"):
                    _repeat_rows(getattr(module, name), [(n_kv, getattr(module, name).out_features // n_kv, group)])
            elif hasattr(module, "qkv_proj") and hasattr(module, "head_dim"):
                d_head = int(module.head_dim)
                _repeat_rows(module.qkv_proj, [(n_heads, d_head, 1), (n_kv, d_head, group), (n_kv, d_head, group)])
            else:
                continue
            norm: Any = getattr(module, "k_norm", None)
            weight = getattr(norm, "weight", None)
            # one norm over all key heads (OLMo-2), not one per head (Qwen3, Gemma-3): told apart by the
            # query norm, whose size is then every query head's (a single key head leaves the key norm's
            # size ambiguous)
            query_weight = getattr(getattr(module, "q_norm", None), "weight", None)
            whole = query_weight is not None and query_weight.numel() == n_heads * d_head != d_head
            if whole and weight is not None and weight.numel() == n_kv * d_head:
                _repeat_rows(norm, [(n_kv, d_head, group)], names=("weight",))
                if hasattr(norm, "normalized_shape"):
                    norm.normalized_shape = (n_heads * d_head,)
            if hasattr(module, "num_key_value_groups"):
                module.num_key_value_groups = 1
            if hasattr(module, "num_key_value_heads"):
                module.num_key_value_heads = n_heads
            changed += 1
    if not changed:
        raise UnsupportedArchitectureError(
            f"{type(hf_model).__name__} has grouped-query attention ({n_heads} query heads over {n_kv} key/value "
            "heads) in a layout lens_position cannot ungroup (no k_proj/v_proj or qkv_proj): its K/V hooks would "
            "not carry one entry per query head")
    config.num_key_value_heads = n_heads
    for sub in (getattr(config, "text_config", None),):
        if sub is not None and hasattr(sub, "num_key_value_heads"):
            sub.num_key_value_heads = n_heads
    return n_kv


#: The RoPE types whose frequencies depend on the prompt's length (Hugging Face recomputes them per pass).
_LENGTH_DEPENDENT = ("longrope", "dynamic")


def _frequencies_at(config: Any, probed: torch.Tensor, length: int) -> torch.Tensor:
    """The rotary frequencies a model of ``config`` rotates a prompt of ``length`` positions with, from
    Hugging Face's own RoPE functions: ``probed`` (read off a short run) where they do not depend on the
    length; LongRoPE's long factors past its original context, dynamic NTK's base past the context.
    Refused (UnsupportedArchitectureError) where those functions do not give ``probed`` at a short length:
    the mapping is then not the one assumed."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    rope_type = (parameters.get("rope_type") or parameters.get("type")) if isinstance(parameters, dict) else None
    if rope_type not in _LENGTH_DEPENDENT:
        return probed
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[rope_type]
    short, _ = init(config, "cpu")
    if short.shape != probed.shape or not torch.allclose(short.to(torch.float64), probed.to(torch.float64),
                                                         rtol=1e-4, atol=1e-7):
        raise UnsupportedArchitectureError(
            f"the {rope_type} RoPE of this model: Hugging Face's frequencies for it are not those its layers "
            "rotate with on a short run, so the frequencies at a prompt's length cannot be read reliably")
    at_length, _ = init(config, "cpu", seq_len=length)
    return at_length.to(probed.dtype)


def _broken_assumption(hf_model: Any, exc: AssertionError) -> str:
    """Why TransformerLens's bridge refused ``hf_model`` with an assertion: where it was made (its adapter's
    file and line, and the check), and the config switches that usually break it."""
    import traceback

    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ is not None else None
    where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {frame.line})" if frame is not None else ""
    config = hf_model.config
    switches = {name: getattr(config, name) for name in ("attention_bias", "use_bias", "bias", "mlp_bias",
                                                         "tie_word_embeddings") if hasattr(config, name)}
    return (f"TransformerBridge cannot host this {getattr(config, 'model_type', None)!r} checkpoint: its adapter "
            f"assumes what the checkpoint does not hold{where}; its config has {switches}. A variant of the family "
            "(attention without biases, say) that TransformerLens's adapter does not cover; load a checkpoint of "
            "the family's published shape, or see docs/howto/load-a-model.md for the families each backend hosts")


def boot_bridge(hf_model: torch.nn.Module, tokenizer: Any, *, name: str, device: str = "cpu",
                dtype: torch.dtype = torch.float32, prepends_bos: bool = False, check_scores: bool = True) -> Any:
    """A ``TransformerBridge`` over ``hf_model`` (K/V ungrouped, compatibility mode without weight
    processing, so activations equal the HF model's), with ``tokenizer`` as its own, its scores hook
    checked (:func:`check_scores_hook`) unless ``check_scores`` is False (a model whose verdict, for
    these weights, options and versions, recorded that check passing). The HF model is modified in
    place (:func:`ungroup_kv`): pass one you own."""
    from transformer_lens.model_bridge import TransformerBridge

    if not getattr(hf_model.config, "architectures", None):  # a config built in code names none
        hf_model.config.architectures = [type(hf_model).__name__]
    n_kv = ungroup_kv(hf_model)
    if getattr(hf_model, "hf_device_map", None) is None:  # a placed model was read in its dtype where it lies
        hf_model.to(dtype=dtype)
    hf_model.eval()
    # The bridge normalises the tokenizer it is given (and may re-load a "with BOS" copy from the
    # hub): it gets a copy marked as already adding BOS, and ours is put back afterwards.
    booted_tokenizer = None
    if tokenizer is not None:
        booted_tokenizer = copy.deepcopy(tokenizer)
        booted_tokenizer.init_kwargs["name_or_path"] = getattr(tokenizer, "name_or_path", None) or name
        booted_tokenizer.init_kwargs["add_bos_token"] = True
    with warnings.catch_warnings(), _quiet_transformer_lens():
        warnings.simplefilter("ignore")
        try:
            bridge = TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=booted_tokenizer,
                                                         device=device, dtype=dtype)
        except (ValueError, NotImplementedError, KeyError) as exc:
            if getattr(hf_model, "hf_device_map", None) and "device_map" in str(exc):
                raise BadInputError(f"TransformerBridge refuses where the weights were placed ({str(exc)[:300]}); "
                                    "place every module on GPUs, or every module on the host and disk") from exc
            architectures = ", ".join(getattr(hf_model.config, "architectures", None) or []) or \
                type(hf_model).__name__
            raise UnsupportedArchitectureError(
                f"TransformerBridge does not support {architectures} (model_type "
                f"{getattr(hf_model.config, 'model_type', None)!r}: {str(exc).split('. ')[0][:160]}).") from exc
        except AssertionError as exc:  # an assumption of TransformerLens's adapter this checkpoint breaks
            raise UnsupportedArchitectureError(_broken_assumption(hf_model, exc)) from exc
        bridge.enable_compatibility_mode(no_processing=True)
    if tokenizer is not None:
        if tokenizer.padding_side is None:
            tokenizer.padding_side = "right"
        bridge._tokenizer = tokenizer  # the setter would re-configure it (and re-derive d_vocab)
    bridge.cfg.default_prepend_bos = prepends_bos
    bridge.cfg.tokenizer_prepends_bos = prepends_bos
    bridge.__dict__["_lens_position_n_kv"] = n_kv
    if check_scores:
        check_scores_hook(bridge)
    return bridge


def prepare_bare_bridge(bridge: Any) -> int:
    """Check a user's own TransformerBridge fits the seam: it must be in compatibility mode (the 3.x
    hook names; BadInputError otherwise) and fire its scores hook before the softmax
    (:func:`check_scores_hook`). Its K/V cannot be ungrouped once booted (the bridge has sized its
    attention by then): ``hook_k``/``hook_v`` then keep one entry per key/value head, and a patch of a
    single head there is refused (:attr:`BridgeBackend.kv_hooks_per_query_head`). Returns the model's
    own number of key/value heads."""
    from lens_position.ground.errors import BadInputError

    if not getattr(bridge, "compatibility_mode", False) or "blocks.0.attn.hook_attn_scores" not in bridge.hook_dict:
        raise BadInputError("this TransformerBridge is not in compatibility mode (the 3.x hook names and "
                            "numerics lens_position reads); call bridge.enable_compatibility_mode(no_processing=True) "
                            "first, or load the model with lens_position.load_model(..., backend='bridge')")
    original = bridge.original_model
    check_scores_hook(bridge)
    known = bridge.__dict__.get("_lens_position_n_kv")
    if known is not None:  # booted by boot_bridge: K/V ungrouped before booting
        return int(known)
    return int(getattr(original.config, "num_key_value_heads", None) or original.config.num_attention_heads)


@contextlib.contextmanager
def _quiet_transformer_lens() -> Iterator[None]:
    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(max(level, logging.ERROR))
    try:
        yield
    finally:
        logger.setLevel(level)


def check_scores_hook(bridge: Any) -> None:
    """Refuse (UnsupportedArchitectureError) a bridge whose ``hook_attn_scores`` does not carry the
    scores before the softmax in every layer: run ``_SCORE_CHECK_TOKENS`` tokens once and require
    ``softmax(scores) == pattern`` (an attention bridge that fires the hook on the weights after the
    softmax fails it: the softmax of probabilities is not those probabilities)."""
    n_layers = int(bridge.cfg.n_layers)
    names = [f"blocks.{layer}.attn.hook_{kind}" for layer in range(n_layers) for kind in ("attn_scores", "pattern")]
    hook_dict = bridge.hook_dict  # once: it resolves the hook aliases on every access
    missing = [name for name in names if name not in hook_dict]
    if missing:
        raise UnsupportedArchitectureError(
            f"this model's attention bridge has no {missing[0]} (and {len(missing) - 1} more): lens_position "
            "needs the scores before the softmax and the pattern.")
    tokens = torch.arange(_SCORE_CHECK_TOKENS, device=_device(bridge)).unsqueeze(0) % max(2, int(bridge.cfg.d_vocab))
    backend = BridgeBackend(bridge)
    cache = backend.run_with_cache(tokens, names)
    for layer in range(n_layers):
        prefix = f"blocks.{layer}.attn.hook_"
        if any(prefix + kind not in cache for kind in ("attn_scores", "pattern")):
            raise UnsupportedArchitectureError(
                f"layer {layer}: the attention bridge did not fire hook_attn_scores / hook_pattern.")
        if not scores_before_softmax(cache[prefix + "attn_scores"], cache[prefix + "pattern"]):
            raise UnsupportedArchitectureError(
                f"layer {layer}: softmax(hook_attn_scores) is not hook_pattern on this model's attention bridge: the "
                "scores it fires are not the ones its softmax turns into the pattern (fired after the softmax, or "
                "before a further step: a temperature, a chunked mask, an extra sink column), so the scores "
                "lens_position would read are not the scores: refused rather than a wrong decomposition.")


def scores_before_softmax(scores: torch.Tensor, pattern: torch.Tensor) -> bool:
    """Whether ``scores`` are the scores the softmax turned into ``pattern`` (``softmax(scores) ==
    pattern`` within the round-off of the pattern's dtype: 1e-4 in float32, two units of the last
    place in bfloat16 or float16; masked cells at ``-inf`` or ``finfo.min`` included), rather than
    the weights after it: weights ``w`` give ``softmax(w) != w`` unless a row is uniform."""
    expected = torch.softmax(scores.to(torch.float64), dim=-1)
    tolerance = max(_SCORE_CHECK_TOL, 2 * torch.finfo(pattern.dtype).eps) if pattern.is_floating_point() \
        else _SCORE_CHECK_TOL
    return bool(torch.allclose(expected, pattern.to(torch.float64), atol=tolerance, rtol=0))


def _device(bridge: Any) -> torch.device:
    device = getattr(bridge.cfg, "device", None)
    return torch.device(device) if device else next(bridge.parameters()).device


def _as_batch_pos_head(activation: torch.Tensor, length: int, n_heads: int) -> torch.Tensor | None:
    """Queries as ``[batch, pos, head, d_head]`` from the layouts attention bridges fire them in:
    that one, Hugging Face's ``[batch, head, pos, d_head]``, or ``[batch, pos, head * d_head]`` (a query
    norm over every head at once, OLMo-2's); None for any other."""
    if activation.dim() == 3 and activation.shape[1] == length and activation.shape[2] % n_heads == 0:
        return activation.view(activation.shape[0], length, n_heads, -1)
    if activation.dim() != 4:
        return None
    if activation.shape[1] == length and activation.shape[2] == n_heads:
        return activation
    if activation.shape[1] == n_heads and activation.shape[2] == length:
        return activation.transpose(1, 2)
    return None


@dataclasses.dataclass
class _RotaryProbe:
    """What one layer's rotation is checked on (:meth:`BridgeBackend.rotary_layout`): the query and key
    hooks before the rotation and their values (float64, ``[batch, pos, head, d_head]``), the rotated
    queries where the bridge fires them (else ``rotated_here``), the tables and the scores."""

    query_name: str
    key_name: str
    rotated_here: bool
    pre_q: torch.Tensor
    pre_k: torch.Tensor
    rot_q: torch.Tensor | None
    cos: torch.Tensor | None
    sin: torch.Tensor | None
    scores: torch.Tensor | None

    @property
    def size(self) -> float:
        return float(self.pre_q.abs().max())

    def matches(self, layout: RotaryLayout) -> bool:
        """Whether ``layout`` turns the queries into the hooked rotated ones, or (rotated here) the
        queries and keys into the layer's scores, within float round-off."""
        if self.cos is None or self.sin is None:
            return False
        cos, sin = self.cos.to(torch.float64), self.sin.to(torch.float64)
        turned_q = rotate(self.pre_q, cos, sin, layout)
        if not self.rotated_here:
            return self.rot_q is not None and \
                float((turned_q - self.rot_q).abs().max()) <= _ROTARY_CHECK_TOL * self.size
        if self.scores is None:
            return False
        mine = torch.einsum("bqhd,bkhd->bhqk", turned_q, rotate(self.pre_k, cos, sin, layout)) / layout.scale
        if layout.soft_cap:
            mine = layout.soft_cap * torch.tanh(mine / layout.soft_cap)
        theirs = self.scores.to(torch.float64)
        visible = torch.isfinite(theirs) & (theirs > torch.finfo(self.scores.dtype).min / 2)
        return bool(visible.any()) and float((mine - theirs).abs()[visible].max()) <= _ROTARY_CHECK_TOL * max(
            1.0, float(theirs.abs()[visible].max()))


def _table_layout(cos: torch.Tensor, sin: torch.Tensor, layer: int) -> tuple[int, bool, torch.Tensor]:
    """``(rotary_dim, interleaved_table, frequencies)`` of a layer's cos/sin tables, read at position 1:
    each frequency in two halves (Hugging Face's usual layout) or twice in a row (Cohere's), else
    UnsupportedArchitectureError; the angle per position of each rotated pair (radians)."""
    row = cos.reshape(-1, cos.shape[-1])[1].to(torch.float64), sin.reshape(-1, sin.shape[-1])[1].to(torch.float64)
    rotary_dim = int(cos.shape[-1])
    half = rotary_dim // 2
    halves = all(bool(torch.allclose(t[:half], t[half:], rtol=1e-5, atol=1e-7)) for t in row)
    interleaved = all(bool(torch.allclose(t[0::2], t[1::2], rtol=1e-5, atol=1e-7)) for t in row)
    if not (halves or interleaved) or rotary_dim % 2:
        raise UnsupportedArchitectureError(
            f"layer {layer}: the rotary tables hook_cos/hook_sin are in neither known layout (each frequency "
            "in two halves, or twice in a row), so the frequency bands cannot be read")
    cos_k, sin_k = (t[:half] if halves else t[0::2] for t in row)
    return rotary_dim, not halves, torch.atan2(sin_k, cos_k)


class _NamedHook:
    """A bridge hook point seen under the name a caller registered it by."""

    __slots__ = ("_point", "name")

    def __init__(self, point: Any, name: str) -> None:
        self._point = point
        self.name = name

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._point, attribute)


class _AfterLastBlock(Exception):
    """Raised at the residual after the last block to end a pass there (``stop_at_layer = n_layers``)."""

    def __init__(self, residual: torch.Tensor) -> None:
        super().__init__()
        self.residual = residual


# Where the residual after the last block first appears: the final norm's input, else the unembedding's
_AFTER_BLOCKS = ("ln_final.hook_in", "unembed.hook_in")


class BridgeBackend:
    """The seam (:class:`~lens_position.models.backends.ModelBackend`) over a TransformerBridge in
    compatibility mode."""

    kind = "bridge"

    def __init__(self, model: Any) -> None:
        self.model = model
        self._silent_below: int | None = None

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
        return _device(self.model)

    @property
    def W_E(self) -> torch.Tensor:
        """The embedding rows as ``hook_embed`` carries them: the HF embedding times its scale where it
        has one (Gemma's ``embed_scale`` = sqrt(d_model); the bridge's own ``W_E`` is unscaled)."""
        embedding = self.model.original_model.get_input_embeddings()
        scale = getattr(embedding, "embed_scale", None)
        weight = embedding.weight
        return weight if scale is None else weight * torch.as_tensor(scale).to(weight.dtype)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def has_mlp(self) -> bool:
        return any(name.endswith("hook_mlp_out") for name in self.hook_dict)

    def attention_unsupported(self) -> str | None:
        cfg = self.model.cfg
        if getattr(cfg, "attention_dir", "causal") != "causal" or getattr(cfg, "use_attention_sinks", False):
            return (f"attention_dir={getattr(cfg, 'attention_dir', 'causal')!r}, use_attention_sinks="
                    f"{getattr(cfg, 'use_attention_sinks', False)}")
        return None

    def score_scale_and_cap(self) -> tuple[float | None, float | None]:
        return config_score_scale_and_cap(self.model.cfg)

    def single_head_kv_unsupported(self, part: str) -> str | None:
        return dict(self.model.__dict__.get(COUPLED_KV) or {}).get(part)

    def prefix_reuse_unsupported(self) -> str | None:
        return (f"{type(self.model).__name__} is not a HookedTransformer: its attention takes rotary "
                "positions from the length of the sequence it is given")

    @property
    def kv_hooks_per_query_head(self) -> bool:
        """Whether ``hook_k``/``hook_v`` carry one entry per query head (a model booted by
        :func:`boot_bridge`, or one without grouped-query attention)."""
        config = self.model.original_model.config
        n_kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        return n_kv == int(config.num_attention_heads)

    @property
    def native_start_at_layer(self) -> bool:
        """Whether this TransformerLens's bridge resumes from a residual itself (4.x; not 3.9)."""
        return hasattr(self.model, "_setup_start_at_layer")

    def _wrapped(self, name: Any, fn: Callable) -> Callable:
        """``fn`` as the bridge should call it: under the name it was registered with (many 3.x names
        are aliases of a bridge hook whose own name differs: ``blocks.0.hook_resid_pre`` is
        ``blocks.0.hook_in``), and silent before an emulated ``start_at_layer``."""
        def hook(activation: torch.Tensor, hook: Any) -> Any:
            named = _NamedHook(hook, name) if isinstance(name, str) else hook
            block = block_of(named.name)
            if self._silent_below is not None and (-1 if block is None else block) < self._silent_below:
                return None
            return fn(activation, hook=named)

        return hook

    def hooks(self, fwd_hooks: Sequence[Any]) -> contextlib.AbstractContextManager:
        wrapped = [(name, self._wrapped(name, fn)) for name, fn in fwd_hooks]
        if _RESOLVES_EVERY_HOOK and wrapped and all(isinstance(name, str) for name, _ in wrapped):
            return self.model.hooks(fwd_hooks=[self._grouped(wrapped)])
        return self.model.hooks(fwd_hooks=wrapped)

    def _grouped(self, hooks: Sequence[tuple[str, Callable]]) -> tuple[Callable, Callable]:
        """Named hooks as one ``(filter, hook)`` pair, for TransformerLens 3.x, whose ``hooks()``
        rebuilds the bridge's whole alias table for every named hook (20 ms each on SmolLM2: 2.5 s
        for the 124 hooks of a decomposition's pass) and once for a filter. The hook points are
        resolved here, once, as ``hooks()`` would (an alias to its hook point, a gated point refused
        by ``check_hooks_to_add``), except that a name the bridge does not have is an error instead
        of a hook silently never called; a point's hooks run in the order given."""
        points = self.model.hook_dict
        on_point: dict[int, list[Callable]] = {}
        for name, fn in hooks:
            point = points.get(name)
            if point is None:
                raise UnsupportedArchitectureError(
                    f"this TransformerBridge has no hook point {name!r}; the names it has are the keys of "
                    "model.backend.hook_dict (TransformerLens's compatibility-mode names)")
            self.model.check_hooks_to_add(point.name or name)
            on_point.setdefault(id(point), []).append(fn)

        def selected(name: str) -> bool:
            return id(points.get(name)) in on_point

        def hook(activation: torch.Tensor, hook: Any) -> Any:
            changed = False
            for fn in on_point[id(hook)]:
                result = fn(activation, hook)
                if result is not None:
                    activation, changed = result, True
            return activation if changed else None

        return selected, hook

    def forward(self, inputs: torch.Tensor, *, stop_at_layer: int | None = None,
                start_at_layer: int | None = None, return_type: str | None = "logits") -> torch.Tensor | None:
        """The bridge's forward pass, with ``HookedTransformer``'s ``stop_at_layer``: at the number of
        blocks it returns the residual after the last block, before the final norm and the
        unembedding (the bridge would run both, a ``[batch, T, d_vocab]`` float tensor for nothing)."""
        check_pass_memory(self, inputs)
        try:
            with self._stop_after_blocks(stop_at_layer):
                return self._forward(inputs, stop_at_layer, start_at_layer, return_type)
        except _AfterLastBlock as stop:
            return stop.residual

    def _forward(self, inputs: torch.Tensor, stop_at_layer: int | None, start_at_layer: int | None,
                 return_type: str | None) -> torch.Tensor | None:
        if start_at_layer is None or start_at_layer == 0 and not inputs.is_floating_point():
            return self.model(inputs, stop_at_layer=stop_at_layer, return_type=return_type)
        if not self.native_start_at_layer:
            return self._emulated_start(inputs, start_at_layer, stop_at_layer, return_type)
        # 4.x runs the blocks before the start too (on the residual as input embeddings, then discards
        # them): their hooks must not report what they saw
        self._silent_below = start_at_layer
        try:
            return self.model(inputs, stop_at_layer=stop_at_layer, start_at_layer=start_at_layer,
                              return_type=return_type)
        finally:
            self._silent_below = None

    @contextlib.contextmanager
    def _stop_after_blocks(self, stop_at_layer: int | None) -> Iterator[None]:
        """With ``stop_at_layer`` at (or past) the number of blocks, end the pass where the residual
        after the last block enters the final norm (or the unembedding, for a model without one),
        after every other hook there has seen it."""
        points = self.model.hook_dict
        name = next((n for n in _AFTER_BLOCKS if n in points), None)
        if stop_at_layer is None or stop_at_layer < self.n_layers or name is None:
            yield
            return

        def stop(_module: torch.nn.Module, _args: Any, residual: torch.Tensor) -> None:
            raise _AfterLastBlock(residual)

        handle = points[name].register_forward_hook(stop)
        try:
            yield
        finally:
            handle.remove()

    def _emulated_start(self, residual: torch.Tensor, start: int, stop: int | None,
                        return_type: str | None) -> torch.Tensor | None:
        """Blocks before ``start`` run on placeholder tokens with every hook silent; the residual
        replaces ``blocks.{start}.hook_resid_pre`` before any other hook there sees it."""
        point = self.model.hook_dict[f"blocks.{start}.hook_resid_pre"]
        handle = point.register_forward_hook(lambda _module, _args, _out: residual, prepend=True)
        placeholder = torch.zeros(residual.shape[:2], dtype=torch.long, device=residual.device)
        self._silent_below = start
        try:
            return self.model(placeholder, stop_at_layer=stop, return_type=return_type)
        finally:
            self._silent_below = None
            handle.remove()

    def run_with_cache(self, tokens: torch.Tensor, names: Sequence[str], *,
                       stop_at_layer: int | None = None) -> dict[str, torch.Tensor]:
        cache: dict[str, torch.Tensor] = {}

        def keep(activation: torch.Tensor, hook: Any) -> None:
            cache[hook.name] = activation.detach()

        with torch.no_grad(), self.hooks([(name, keep) for name in dict.fromkeys(names)]):
            self.forward(tokens, stop_at_layer=stop_at_layer, return_type=None)
        return cache

    def rotary_layout(self, layer: int, length: int | None = None) -> RotaryLayout:
        """Layer ``layer``'s RoPE as the Hugging Face module applies it: the ``cos``/``sin`` tables the
        bridge passes to that layer (``hook_cos``/``hook_sin``, position 1 of a short run), in either
        table layout (halves, or each frequency twice in a row), with the pairs (``k, k + rotary_dim/2``
        or ``2k, 2k+1``) found by checking against the layer's own rotation: ``hook_rot_q`` must equal
        the rotated ``q`` (after any query norm); where the bridge fires no ``hook_rot_q`` (fused QKV),
        ``q`` and ``k`` rotated here must give the layer's ``hook_attn_scores``. Neither pair layout
        matching is an UnsupportedArchitectureError; a layer that leaves ``q`` unrotated (per-layer
        NoPE) has no rotary embedding. ``scale`` is ``1 / scaling`` of the HF attention module. With
        ``length``, the frequencies are those the model rotates prompts of that length with
        (:func:`_frequencies_at`: LongRoPE's long factors past its original context, dynamic NTK)."""
        probe = self._rotary_probe(layer)
        rotary_dim, interleaved_table, frequencies = _table_layout(probe.cos, probe.sin, layer)
        scale, cap = self._scale_and_cap(layer)
        hooks = (probe.query_name, probe.key_name) if probe.rotated_here else ("hook_rot_q", "hook_rot_k")
        for adjacent in (False, True):
            layout = RotaryLayout(frequencies=frequencies, adjacent_pairs=adjacent, rotary_dim=rotary_dim, scale=scale,
                                  soft_cap=cap, query_hooks=hooks, rotated_here=probe.rotated_here,
                                  interleaved_table=interleaved_table)
            if probe.matches(layout):
                return layout if length is None else dataclasses.replace(
                    layout, frequencies=_frequencies_at(self.model.original_model.config, layout.frequencies, length))
        what = ("hook_rot_q is not the query rotated by the layer's cos/sin tables" if not probe.rotated_here else
                "the queries and keys rotated by the layer's cos/sin tables do not give its hook_attn_scores")
        raise UnsupportedArchitectureError(
            f"layer {layer}: {what}, neither in Hugging Face's layout (pairs k, k + rotary_dim/2) nor interleaved "
            "(pairs 2k, 2k+1): the model does more between its rotation and its scores (a norm after the "
            "rotation, a bias), so the frequency bands cannot be read reliably; the rotary-band split refuses "
            "it rather than split it wrongly")

    def _scale_and_cap(self, layer: int) -> tuple[float, float | None]:
        """``1 / scaling`` of layer ``layer``'s Hugging Face attention module, and the config's score cap."""
        module = self.model.blocks[layer].attn
        module = getattr(module, "original_component", None) or getattr(module, "_original_component", None)
        scaling = getattr(module, "scaling", None)
        if not scaling:
            raise UnsupportedArchitectureError(
                f"layer {layer}: the Hugging Face attention module has no 'scaling', so the score scale is unknown")
        config = self.model.original_model.config
        config = getattr(config, "text_config", None) or config
        cap = getattr(config, "attn_logit_softcapping", None)
        return 1.0 / float(scaling), float(cap) if cap else None

    def _rotary_probe(self, layer: int) -> _RotaryProbe:
        """One short run up to layer ``layer``, with what its rotation is checked on: the queries and keys
        before it (after any norm that fires), after it (where hooked), the tables and the scores."""
        prefix = f"blocks.{layer}.attn."
        hook_dict = self.hook_dict  # once: the bridge resolves its hook aliases on every access
        needed = [prefix + "hook_cos", prefix + "hook_sin", prefix + "hook_q", prefix + "hook_k"]
        if any(name not in hook_dict for name in needed):
            raise UnsupportedArchitectureError(
                f"layer {layer}: this model's attention bridge has no hook_cos/hook_sin/hook_q/hook_k, so its "
                "rotary tables and queries cannot be read, and the rotary-band split needs them")
        optional = [prefix + name for name in ("hook_q_normed", "hook_k_normed", "hook_rot_q", "hook_rot_k",
                                               "hook_attn_scores") if prefix + name in hook_dict]
        # ordinary tokens (id 0 is often padding, with a zero embedding and so zero queries), a length
        # other than the head count, so a query norm's [batch, head, pos, d_head] is told apart
        length = 3 if self.n_heads != 3 else 4
        tokens = (torch.arange(1, length + 1, device=self.device) % max(2, self.d_vocab)).unsqueeze(0)
        cache = self.run_with_cache(tokens, needed + optional, stop_at_layer=layer + 1)
        names = [prefix + (f"{kind}_normed" if prefix + f"{kind}_normed" in cache else kind)
                 for kind in ("hook_q", "hook_k")]
        fired = [cache.get(name) for name in (*names, prefix + "hook_rot_q", prefix + "hook_rot_k")]
        if fired[0] is None or fired[1] is None:
            raise UnsupportedArchitectureError(f"layer {layer}: the attention bridge did not fire hook_q/hook_k")
        rotated_here = fired[2] is None or fired[3] is None
        pre_q, pre_k, rot_q, _ = (None if x is None else _as_batch_pos_head(x, length, self.n_heads) for x in fired)
        if (pre_q is None or pre_k is None or pre_q.shape != pre_k.shape
                or (not rotated_here and (rot_q is None or rot_q.shape != pre_q.shape))):
            raise UnsupportedArchitectureError(
                f"layer {layer}: the queries and keys before and after the rotation come in layouts lens_position "
                "cannot line up ([batch, pos, head, d_head] expected), so the frequency bands cannot be read")
        scores = cache.get(prefix + "hook_attn_scores")
        as_fired = [tuple(x.shape) for x in fired[:2] if x is not None]
        if rotated_here and (scores is None or any(shape != tuple(pre_q.shape) for shape in as_fired)):
            raise UnsupportedArchitectureError(
                f"layer {layer}: the attention bridge fires no hook_rot_q/hook_rot_k, and its hook_q/hook_k are not "
                "[batch, pos, head, d_head] with hook_attn_scores beside them, so the rotation lens_position would "
                "apply itself cannot be checked against the layer's scores")
        probe = _RotaryProbe(names[0].removeprefix(prefix), names[1].removeprefix(prefix), rotated_here,
                             pre_q.to(torch.float64), pre_k.to(torch.float64),
                             None if rot_q is None else rot_q.to(torch.float64),
                             cache.get(prefix + "hook_cos"), cache.get(prefix + "hook_sin"), scores)
        if not probe.size > 0:
            raise UnsupportedArchitectureError(
                f"layer {layer}: the queries of a {length}-token run are zero, so the rotary tables cannot be "
                "checked against the layer's rotation")
        if probe.cos is None or probe.sin is None or (
                rot_q is not None and not rotated_here
                and float((probe.rot_q - probe.pre_q).abs().max()) <= _ROTARY_CHECK_TOL * probe.size):
            raise UnsupportedArchitectureError(
                f"layer {layer} has no rotary embedding (its queries are not rotated: per-layer NoPE): there "
                "are no frequency bands to split; choose layers that use RoPE")
        return probe
