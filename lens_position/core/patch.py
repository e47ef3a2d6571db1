"""``Patch``: one intervention as a value (what is replaced, where, with what, for which prompts).

The stream loop (:mod:`lens_position.core.stream`) applies patches batch by batch; the named
patch constructors and sweeps live in :mod:`lens_position.analyses.patching`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Int

from lens_position.core.checks import check_int, check_position
from lens_position.ground.errors import BadInputError, NonFiniteError
from lens_position.models.backends import ModelBackend
from lens_position.models.hook_names import BLOCK_HOOK, HEAD_AXIS_HOOK, KEY_VALUE_HOOK, POSITION_AXIS_HOOK


def act_name(name: str | tuple) -> str:
    """A full hook name from any name TransformerLens accepts: the name itself
    (``"blocks.3.hook_resid_pre"``), ``utils.get_act_name`` shorthand (``"resid_pre3"``,
    ``"k0"``) or the tuple an ``ActivationCache`` is indexed with (``("resid_pre", 3)``,
    ``("pattern", 1, "attn")``)."""
    if isinstance(name, str) and (name.startswith(("blocks.", "hook_", "ln_final.", "unembed.")) or "." in name):
        return name
    try:  # TransformerLens 3.9 moved get_act_name to utilities (utils still works, with a warning)
        from transformer_lens.utilities import get_act_name
    except ImportError:  # pragma: no cover - older 3.x
        from transformer_lens.utils import get_act_name
    try:
        args = (name,) if isinstance(name, str) else tuple(name)
        return get_act_name(*args)
    except Exception as exc:  # get_act_name's own errors are assertions and KeyErrors
        raise BadInputError(f"{name!r} is not a hook name TransformerLens knows; use a name like "
                            "'blocks.3.hook_resid_pre', get_act_name('resid_pre', 3) or ('resid_pre', 3)") from exc


def source_activation(source: Any, name: str) -> torch.Tensor:
    """The activation ``name`` of a source run held in a dict or a TransformerLens
    ``ActivationCache`` (from ``model.run_with_cache`` or :func:`cache_activations`)."""
    try:
        keys = list(source.keys())
    except AttributeError:
        raise BadInputError(f"a source run must be a dict or an ActivationCache of activations by hook name, "
                            f"got {type(source).__name__}") from None
    if name not in keys:
        raise BadInputError(f"the source run has no {name}; cache it first "
                            f"(model.run_with_cache(tokens, names_filter=[{name!r}]) or cache_activations)")
    return source[name]


# --------------------------------------------------------------------------- the value


def _check_finite_value(value: Any, label: str) -> None:
    """A patch value must be finite numbers: a NaN written into the residual stream spreads to
    every later score of the prompt and gives all-NaN tables."""
    if isinstance(value, bool) or not isinstance(value, (torch.Tensor, numbers.Real)):
        raise BadInputError(f"patch {label}: value must be a tensor or a number, got {type(value).__name__}")
    if isinstance(value, torch.Tensor):
        if not (value.is_floating_point() or value.is_complex()) and value.dtype != torch.bool:
            return  # integer values are finite by construction
        finite = bool(torch.isfinite(value).all()) if value.numel() else True
    else:
        finite = math.isfinite(float(value))
    if not finite:
        raise NonFiniteError(f"patch {label}: the value holds NaN or infinite numbers; patch with finite "
                             "values (a cached activation of a run that itself had non-finite weights?)")


@dataclass(frozen=True, eq=False)
class Patch:
    """One intervention: ``activation[rows, position, head] = value`` at ``hook_name``.

    - ``hook_name``: a TransformerLens hook whose activation has the position on axis 1
      (``hook_embed``, ``blocks.l.hook_resid_pre``, ``blocks.l.attn.hook_k`` /
      ``hook_v`` / ``hook_z`` / ``hook_result``, ...); ``get_act_name`` shorthand and
      ``("resid_pre", 3)`` tuples are accepted (:func:`act_name`).
    - ``position``: index on the position axis (None: every position).
    - ``head``: a **query head**, for every hook with a head axis (``[batch pos head d_head]``;
      None: all heads), ``hook_k`` / ``hook_v`` included, and for every model: lens_position
      runs grouped-query models with ungrouped key/value hooks (``load_model`` builds them so;
      a bare ``HookedTransformer`` is switched by :func:`~lens_position.models.spec.as_loaded`),
      so ``hook_k`` has one entry per query head and a key patch on head ``h`` reaches head
      ``h`` only. :func:`kv_head_of` says which key/value head of the checkpoint it copies.
    - ``value``: the replacement, broadcast against ``activation[rows, position, head]``: a
      float (``0.0`` is zero ablation), a tensor without a batch axis (the same vector for
      every row), or a tensor whose first axis is the batch (one value per prompt, in the
      order of the target prompts).
    - ``label``: free-form description that ends up in result tables.
    - ``rows``: the prompts (indices into the streamed prompts) the patch applies to; None:
      every prompt. A per-prompt ``value`` then has one entry per element of ``rows``.
    """

    hook_name: str
    value: torch.Tensor | float
    position: int | None = None
    head: int | None = None
    label: str = ""
    rows: Int[torch.Tensor, "row"] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hook_name", act_name(self.hook_name))
        for name in ("position", "head"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_int(f"Patch {name}", getattr(self, name)))
        if not isinstance(self.label, str):
            raise BadInputError(f"Patch label must be a string, got {type(self.label).__name__}")
        if isinstance(self.value, torch.Tensor) and self.value.device.type == "meta":
            raise BadInputError(f"patch {self.label or self.hook_name}: its value is on the meta device (a shape "
                                "without numbers); patch with a tensor that holds values")
        _check_finite_value(self.value, self.label or self.hook_name)
        if self.rows is not None:
            object.__setattr__(self, "rows", torch.as_tensor(self.rows, dtype=torch.int64).reshape(-1).cpu())

    @property
    def layer(self) -> int:
        """The block this patch sits in; -1 for the embedding (before block 0)."""
        match = BLOCK_HOOK.match(self.hook_name)
        return int(match.group(1)) if match else -1

    def _index(self) -> tuple:
        index: tuple = (slice(None) if self.position is None else self.position,)
        if self.head is not None:
            index += (self.head,)
        return index

    def apply(self, activation: torch.Tensor, sequences: Int[torch.Tensor, "batch"] | None = None) -> torch.Tensor:
        """Write ``value`` into ``activation[:, position, head]`` in place; return it.

        ``sequences``: the prompt index of each batch row (as :func:`lens_position.core.stream.stream`
        hands them). A per-prompt ``value`` is then indexed by it, and a patch with ``rows``
        writes only the batch rows whose prompt is among its ``rows``. Without
        ``sequences`` the batch rows are the prompts ``0..batch-1``.
        """
        n_batch = activation.shape[0]
        if sequences is None and self.rows is None:
            batch: slice | torch.Tensor = slice(None)
            pick = None  # the value's batch axis, if any, must match the activation's
        else:
            sequences = torch.arange(n_batch) if sequences is None else sequences.cpu()
            if self.rows is None:
                batch, pick = slice(None), sequences
            else:
                # position of each batch row's prompt within self.rows (-1: not patched)
                matches = sequences[:, None] == self.rows[None, :]
                found = matches.any(1)
                if not bool(found.any()):
                    return activation
                batch = found.nonzero().squeeze(1)
                pick = matches.to(torch.int64).argmax(1)[batch]
        index = (batch,) + self._index()
        target = activation[index]
        value = self.value
        if isinstance(value, torch.Tensor):
            if pick is not None and self._per_prompt():
                if int(pick.max()) >= value.shape[0]:
                    raise BadInputError(
                        f"patch {self.label or self.hook_name} has values for {value.shape[0]} prompts "
                        f"but is applied to prompt {int(pick.max())}; give one value per prompt")
                value = value[pick.to(value.device)]
            value = value.to(device=activation.device, dtype=activation.dtype)
            try:
                value = torch.broadcast_to(value, target.shape)
            except RuntimeError as exc:
                raise BadInputError(
                    f"patch value of shape {tuple(getattr(self.value, 'shape', ()))} does not fit "
                    f"{self.hook_name}[position={self.position}, head={self.head}] of shape "
                    f"{tuple(target.shape)} (batch first); give one value per prompt or one "
                    "for all"
                ) from exc
        try:
            activation[index] = value
        except RuntimeError as error:  # a finite number the activation's dtype cannot hold
            raise NonFiniteError(f"patch {self.label or self.hook_name}: its value does not fit the activation's "
                                 f"dtype {str(activation.dtype).removeprefix('torch.')} ({error}); patch with values "
                                 "of the model's range") from error
        return activation

    def hook(self) -> tuple[str, Callable]:
        """A ``(hook_name, fn)`` forward hook applying this patch to a batch holding the
        prompts ``0..batch-1`` (a single pass over all prompts); batched passes go through
        :func:`lens_position.core.stream.stream`, which tells the patch which prompts it sees."""

        def fn(activation: torch.Tensor, hook: Any) -> torch.Tensor:
            return self.apply(activation)

        return (self.hook_name, fn)

    def check_prompts(self, n_prompts: int) -> None:
        """Raise BadInputError unless a per-prompt ``value`` has one entry per prompt it
        covers (``len(rows)``, or ``n_prompts`` streamed prompts without ``rows``)."""
        if self.rows is not None and len(self.rows) and (int(self.rows.min()) < 0 or int(self.rows.max()) >= n_prompts):
            raise BadInputError(f"patch {self.label or self.hook_name} names rows outside the {n_prompts} prompts")
        value = self.value
        if not isinstance(value, torch.Tensor) or not self._per_prompt():
            return
        expected = len(self.rows) if self.rows is not None else n_prompts
        if value.shape[0] != expected:
            raise BadInputError(
                f"patch value of shape {tuple(value.shape)} does not fit {self.hook_name}"
                f"[position={self.position}, head={self.head}]: its first axis holds one value per prompt, "
                f"but the patch covers {expected} prompts; give one value per prompt or one for all")

    def _per_prompt(self) -> bool:
        """Whether ``value`` has a batch axis (one value per prompt)."""
        return isinstance(self.value, torch.Tensor) and self.value.ndim >= 1 and \
            self.value.ndim == self._target_ndim()

    def _target_ndim(self) -> int:
        """Rank of ``activation[:, position, head]`` for this hook (batch axis included)."""
        full = 4 if HEAD_AXIS_HOOK.search(self.hook_name) else 3
        return full - (self.position is not None) - (self.head is not None)

    def validate(self, backend: ModelBackend, n_pos: int) -> None:
        """Raise BadInputError if this patch cannot apply to the model behind ``backend``
        (``loaded.backend``) on ``n_pos`` positions."""
        if self.hook_name not in backend.hook_dict:
            raise BadInputError(f"the model has no hook named {self.hook_name!r}")
        if not POSITION_AXIS_HOOK.match(self.hook_name):
            raise BadInputError(
                f"{self.hook_name!r} is not a [batch, pos, ...] activation; patch attention "
                "through hook_k / hook_v / hook_z, or the residual stream"
            )
        if self.position is not None:
            check_position(self.position, n_pos)
        if self.head is not None:
            if not HEAD_AXIS_HOOK.search(self.hook_name):
                raise BadInputError(f"{self.hook_name!r} has no head axis; drop head=")
            if KEY_VALUE_HOOK.search(self.hook_name) and not backend.kv_hooks_per_query_head:
                raise BadInputError(
                    f"{self.hook_name} of this model carries one entry per key/value head (a TransformerBridge "
                    "booted outside lens_position cannot be ungrouped); a patch of one query head's key or value "
                    "needs one entry per query head: load the model with load_model(..., backend='bridge'), "
                    "or patch without head=")
            if KEY_VALUE_HOOK.search(self.hook_name):
                reason = backend.single_head_kv_unsupported("k" if self.hook_name.endswith("hook_k") else "v")
                if reason is not None:
                    raise BadInputError(f"head={self.head} at {self.hook_name}: {reason}; patch without head= (every "
                                        "head at that position), or one head's output at hook_z")
            # every head axis holds the query heads, hook_k / hook_v included: both backends carry
            # one key/value entry per query head
            if not 0 <= self.head < backend.n_heads:
                raise BadInputError(
                    f"head {self.head} is out of range at {self.hook_name} ({backend.n_heads} heads)"
                )


Condition = Sequence[Patch]


def patches_as_hooks(patches: Sequence[Patch]) -> list[tuple[str, Callable]]:
    """Forward hooks applying ``patches`` to a batch holding all prompts in order (one pass,
    ``model.hooks(...)``); for batched passes give the patches to
    :func:`lens_position.core.stream.stream` (or ``decompose(patches=...)``) instead."""
    return [p.hook() for p in patches]
