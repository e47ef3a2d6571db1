"""The model seam: what the analyses, patching, the stream loop and the pipeline ask of a model.

Two backends sit behind it: ``hooked`` (TransformerLens 3.x ``HookedTransformer``: the adapters,
GGUF, local folders, the zoo; the reference path) and ``bridge`` (``TransformerBridge``, the only
model class of TransformerLens 4.x, in compatibility mode for the 3.x hook names). Both give the
same hook names with the same shapes and meanings:

- ``hook_embed``; ``blocks.l.hook_resid_pre`` / ``hook_resid_mid`` / ``hook_resid_post``;
- ``blocks.l.attn.hook_q`` / ``hook_k`` / ``hook_v`` (before RoPE) and ``hook_rot_q`` /
  ``hook_rot_k`` (after), ``[batch, pos, head, d_head]`` with **one key/value entry per query
  head** (a grouped-query model's K/V are repeated, the same numbers);
- ``blocks.l.attn.hook_attn_scores``: scores after RoPE and scaling, *before* the softmax, with
  the causal or window mask applied (``[batch, head, query, key]``);
- ``blocks.l.attn.hook_pattern`` (after the softmax) and ``blocks.l.attn.hook_z`` (per-head
  outputs before the output projection).

Nothing in lens_position outside ``lens_position.models`` imports a TransformerLens model class:
it holds a :class:`~lens_position.models.spec.LoadedModel` and talks to ``loaded.backend``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from jaxtyping import Float

BackendName = Literal["hooked", "bridge"]
BACKENDS: tuple[str, ...] = ("auto", "hooked", "bridge")

FwdHook = tuple[str | Callable[[str], bool], Callable]
# Where a load records, on the TransformerLens model itself, why a one-head patch of hook_k or hook_v
# is not one head's (lens_position.models.verify.check_kv_layout): {"k" or "v": reason}.
COUPLED_KV = "_lens_position_coupled_kv"


@dataclass(frozen=True)
class RotaryLayout:
    """How one attention layer applies RoPE, as the model itself does it.

    ``frequencies``: the angle each rotated pair turns through per position (radians), read off
    the model's own rotary tables at position 1 (so NTK scaling, local bases and per-layer tables
    are what the model uses). ``adjacent_pairs``: pairs are dimensions ``2k, 2k+1`` (else ``k`` and
    ``k + rotary_dim/2``). ``rotary_dim``: the rotated dimensions (the first ones of ``d_head``).
    ``scale``: what the scores are divided by (``q . k / scale``). ``soft_cap``: the score
    soft-cap (None where the scores are not capped).

    ``query_hooks``: the hooks (query, key) the analyses read the rotated queries and keys from,
    ``[batch, pos, head, d_head]``. Where the model fires no hook after its rotation (the fused-QKV
    attention bridges of GPT-NeoX and Phi-3), they are the hooks before it and ``rotated_here`` is
    True: :func:`rotate` turns them with the layer's own ``hook_cos``/``hook_sin``, a rotation the
    backend checked against the layer's ``hook_attn_scores`` when it read the layout.
    ``interleaved_table``: the cos/sin tables repeat each frequency in adjacent entries (Cohere's)
    rather than in two halves (Hugging Face's usual layout)."""

    frequencies: torch.Tensor
    adjacent_pairs: bool
    rotary_dim: int
    scale: float
    soft_cap: float | None = None
    query_hooks: tuple[str, str] = ("hook_rot_q", "hook_rot_k")
    rotated_here: bool = False
    interleaved_table: bool = False


def per_dimension(table: Float[torch.Tensor, "*lead rot"], pairs_adjacent: bool, interleaved_table: bool
                  ) -> Float[torch.Tensor, "*lead rot"]:
    """A cos or sin table as one entry per rotated dimension in the pair layout: each frequency's
    entry on both dimensions of its pair (``2k, 2k+1`` when ``pairs_adjacent``, else ``k, k + rot/2``),
    whichever of the two table layouts (``interleaved_table`` or halves) it came in."""
    per_frequency = table[..., 0::2] if interleaved_table else table[..., : table.shape[-1] // 2]
    if pairs_adjacent:
        return per_frequency.repeat_interleave(2, dim=-1)
    return torch.cat([per_frequency, per_frequency], dim=-1)


def rotate(x: Float[torch.Tensor, "batch pos head d_head"], cos: Float[torch.Tensor, "*lead pos rot"],
           sin: Float[torch.Tensor, "*lead pos rot"], layout: RotaryLayout
           ) -> Float[torch.Tensor, "batch pos head d_head"]:
    """``x`` turned by RoPE as the layer turns it: its first ``layout.rotary_dim`` dimensions by the
    tables ``cos``/``sin`` (``[pos, rot]`` with any leading batch axes of size 1 or ``batch``, as
    ``hook_cos``/``hook_sin`` fire them), in the layout's pairs; the other dimensions unchanged."""
    size = layout.rotary_dim
    cos, sin = (per_dimension(table.reshape(-1, *table.shape[-2:]), layout.adjacent_pairs,
                              layout.interleaved_table)[:, :, None, :].to(x.dtype) for table in (cos, sin))
    part = x[..., :size]
    if layout.adjacent_pairs:
        partner = torch.stack([-part[..., 1::2], part[..., 0::2]], dim=-1).flatten(-2)
    else:
        half = size // 2
        partner = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
    return torch.cat([part * cos + partner * sin, x[..., size:]], dim=-1)


@runtime_checkable
class ModelBackend(Protocol):
    """One model behind the seam (see the module docstring for the hook points).

    ``kind``: ``"hooked"`` or ``"bridge"``; ``model``: the TransformerLens module itself (kept
    for users who reach for it; lens_position never does outside this package).
    """

    @property
    def kind(self) -> str: ...

    @property
    def model(self) -> Any: ...

    @property
    def kv_hooks_per_query_head(self) -> bool: ...

    @property
    def hook_dict(self) -> Mapping[str, Any]: ...

    @property
    def n_layers(self) -> int: ...

    @property
    def n_heads(self) -> int: ...

    @property
    def d_model(self) -> int: ...

    @property
    def d_vocab(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def W_E(self) -> torch.Tensor: ...

    @property
    def dtype(self) -> torch.dtype: ...

    @property
    def has_mlp(self) -> bool: ...

    def attention_unsupported(self) -> str | None:
        """Why the attention is not a plain causal softmax over the scores at ``hook_attn_scores``
        (None: it is), the form the decomposition's identity ``log A = t - z`` needs."""
        ...

    def score_scale_and_cap(self) -> tuple[float | None, float | None]:
        """What turns ``q . k`` into the scores at ``hook_attn_scores``: the divisor (None: the
        attention's default, ``sqrt(d_head)``) and the soft-cap ``c`` of ``c tanh(s / c)`` (None: no
        cap)."""
        ...

    def prefix_reuse_unsupported(self) -> str | None:
        """Why a patched pass cannot compute only the positions from ``p`` on, the earlier ones taken
        from the unpatched run (None: it can; :func:`lens_position.analyses.patching.run_patches`)."""
        ...

    def single_head_kv_unsupported(self, part: str) -> str | None:
        """Why a patch of one head's key (``part`` ``"k"``) or value (``"v"``) moves other heads too, as
        the load-time check found (None: it moves that head only, or the model was not checked)."""
        ...

    def hooks(self, fwd_hooks: Sequence[FwdHook]) -> AbstractContextManager: ...

    def forward(self, inputs: torch.Tensor, *, stop_at_layer: int | None = None,
                start_at_layer: int | None = None, return_type: str | None = "logits") -> torch.Tensor | None:
        """One pass of ``inputs`` (tokens, or with ``start_at_layer`` the residual entering that
        block). With ``stop_at_layer`` it ends before that block and returns the residual there; at
        the number of blocks, the residual after the last one, before the final norm and the
        unembedding (neither runs), on every backend."""
        ...

    def run_with_cache(self, tokens: torch.Tensor, names: Sequence[str], *,
                       stop_at_layer: int | None = None) -> dict[str, torch.Tensor]: ...

    def rotary_layout(self, layer: int, length: int | None = None) -> RotaryLayout: ...


def hooked_available() -> bool:
    """Whether the installed TransformerLens still has ``HookedTransformer`` (the 3.x line)."""
    return hooked_class() is not None


def hooked_class() -> type[Any] | None:
    """``HookedTransformer`` where TransformerLens has it (3.x), else None (4.x removed it)."""
    try:
        import transformer_lens
        return transformer_lens.HookedTransformer
    except (ImportError, AttributeError):
        return None


def bridge_class() -> type[Any] | None:
    """``TransformerBridge`` where TransformerLens has it (3.9 and 4.x), else None."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return None
    return TransformerBridge


def resolve_backend(backend: str) -> BackendName:
    """``"hooked"`` or ``"bridge"`` for a requested backend: ``auto`` takes hooked where this
    TransformerLens has it, else the bridge. BadInputError for another name or a backend this
    TransformerLens lacks."""
    from lens_position.ground.errors import BadInputError

    if backend not in BACKENDS:
        raise BadInputError(f"unknown backend {backend!r}; use {', '.join(BACKENDS)}")
    if backend == "auto":
        return "hooked" if hooked_available() else "bridge"
    if backend == "hooked" and not hooked_available():
        raise BadInputError("backend='hooked' needs HookedTransformer, which TransformerLens 4.0 removed; use "
                            "backend='bridge' (or 'auto'), or install transformer_lens 3.x for the hooked backend")
    if backend == "bridge" and bridge_class() is None:
        raise BadInputError("backend='bridge' needs TransformerBridge (TransformerLens 3.9 or 4.x); use "
                            "backend='hooked' or upgrade transformer_lens")
    return backend  # type: ignore[return-value]


def backend_for(model: Any) -> ModelBackend:
    """The backend of a TransformerLens model: a HookedTransformer (or subclass) or a
    TransformerBridge. TypeError for anything else."""
    hooked = hooked_class()
    if (hooked is not None and isinstance(model, hooked)) or _is_mini(model):
        from lens_position.models.backends.hooked import HookedBackend
        return HookedBackend(model)
    bridge = bridge_class()
    if bridge is not None and isinstance(model, bridge):
        from lens_position.models.backends.bridge import BridgeBackend
        return BridgeBackend(model)
    raise TypeError(f"expected a LoadedModel, a HookedTransformer or a TransformerBridge, got {type(model).__name__}")


def _is_mini(model: Any) -> bool:
    """Whether ``model`` is a :class:`~lens_position.models.mini.MiniTransformer`: HookedTransformer's
    names and numerics on ``HookedRootModule``, hosted by the hooked backend on either line."""
    from lens_position.models.mini import MiniTransformer

    return isinstance(model, MiniTransformer)


def config_score_scale_and_cap(cfg: Any) -> tuple[float | None, float | None]:
    """:meth:`ModelBackend.score_scale_and_cap` from a TransformerLens config (either backend's): a
    TransformerBridge's config leaves ``attn_scale`` unset (-1), which means the attention's own
    default."""
    scale = None
    if getattr(cfg, "use_attn_scale", True):
        value = float(getattr(cfg, "attn_scale", -1.0) or -1.0)
        scale = value if value > 0 else None
    else:
        scale = 1.0
    cap = float(getattr(cfg, "attn_scores_soft_cap", -1.0) or -1.0)
    return scale, cap if cap > 0 else None


def vocabulary_size(model: Any) -> int:
    """The vocabulary size of a TransformerLens model (either backend), without wrapping it."""
    return int(model.cfg.d_vocab)


def is_model(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens model a backend wraps."""
    hooked, bridge = hooked_class(), bridge_class()
    return ((hooked is not None and isinstance(model, hooked)) or (bridge is not None and isinstance(model, bridge))
            or _is_mini(model))
