"""Weight identity: which weights a result was computed with, as one sha256.

What is hashed
    A model's weights by the checkpoint's names and rows, whatever the backend
    (:func:`model_weights_sha256`): each weight's name, dtype, shape and bytes in row-major order, in
    sorted name order (:func:`state_dict_sha256`), so the same weights hash the same whether built in
    code, converted from a GGUF, read from the weight cache or booted in a ``TransformerBridge``. A
    bridge's weights are named as its checkpoint names them (:func:`weight_owners`); the key and value
    rows it repeats per query head are hashed once while the copies agree (:data:`REPEATED_ROWS`).
    TransformerLens's buffers made from the config (rotary tables, the causal mask) are not weights
    (:data:`DERIVED_BUFFERS`).

When
    At load (``load_model`` records it in the spec, and the weight cache in each entry's
    ``meta.json``); at every public function's door (:func:`lens_position.models.spec.public`), which
    takes :func:`weights_version` (each tensor's version counter, layout and a checksum of its bytes,
    about 0.1 s per GB on a CPU) and hashes the weights again whenever it changed; and on request
    (:func:`model_weights_sha256`).

What a changed weight does
    A weight written in place, through ``.data``, cast or replaced after the load changes the next
    result's provenance: ``model.weights_sha256`` is the hash of the weights as they are, and the
    load-time hash is kept beside it as ``weights_sha256_at_load`` (dropped when the edit is undone).
    Pipeline caches key their results by that hash, so an edited model never reads results of the
    original; the weight cache re-verifies an entry's hash on every load and rebuilds a damaged one.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Mapping
from typing import Any

import torch


def state_dict_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """Canonical sha256 of a state dict: names, dtypes, shapes and bytes, in sorted order.

    Independent of how the tensors were stored, so the same weights hash the same whether
    built in code, converted or read from the cache."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        _add_tensor(digest, name, state_dict[name])
    return digest.hexdigest()


#: The most bytes a hash copies at once: a weight in another layout than its own (a transposed
#: unembedding, 1 GB for a 128k vocabulary) is hashed in blocks of rows of at most this size.
HASH_BLOCK_BYTES = 64 * 2**20


def _add_tensor(digest: Any, name: str, tensor: torch.Tensor) -> None:
    """``name``, dtype, shape, then the bytes of ``tensor`` in row-major order, whatever its strides:
    read in place when it is contiguous on the host, else copied block by block of rows."""
    tensor = tensor.detach()
    digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
    if not tensor.numel():
        return
    if tensor.ndim == 0 or (tensor.is_contiguous() and tensor.device.type == "cpu"):
        digest.update(_row_major_bytes(tensor))
        return
    rows = max(1, HASH_BLOCK_BYTES // (tensor[0].numel() * tensor.element_size() or 1))
    for block in tensor.split(rows):
        digest.update(_row_major_bytes(block))


def _row_major_bytes(tensor: torch.Tensor) -> Any:
    """The bytes of ``tensor`` in row-major order, as a NumPy view (a copy only where it is not
    contiguous on the host; any dtype, bfloat16 included)."""
    flat = tensor.cpu().reshape(-1)
    if flat.stride(0) != 1:  # a strided view, or one element with a stride left from its parent
        flat = torch.empty(flat.shape, dtype=flat.dtype).copy_(flat)
    return flat.view(torch.uint8).numpy()


#: TransformerLens's buffers computed from the config, not read from a checkpoint: the rotary tables
#: (TransformerLens 3.x builds 2048 rows and extends them the first time a longer sequence runs), the
#: causal mask and its fill value. The config that makes them is the spec's (rotary base, NTK options,
#: context), so they are not part of a model's weights: a pass at T = 8192 changes no weight hash.
DERIVED_BUFFERS = frozenset({"rotary_sin", "rotary_cos", "mask", "IGNORE"})


def is_derived(name: str) -> bool:
    """Whether the state-dict entry ``name`` is one of :data:`DERIVED_BUFFERS`."""
    return name.rpartition(".")[2] in DERIVED_BUFFERS


def weights_of(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict without its :data:`DERIVED_BUFFERS`: the weights a hash stands for."""
    return {name: tensor for name, tensor in state.items() if not is_derived(name)}


#: The attribute a module whose rows the bridge backend repeated (grouped-query keys and values made
#: one per query head, :func:`lens_position.models.backends.bridge.ungroup_kv`) keeps:
#: ``{attribute: [(heads, d_head, times), ...]}``, the blocks of rows each copy repeats.
REPEATED_ROWS = "_lens_position_repeated_rows"


#: The prefix of the names :func:`weight_owners` gives the tensors a booted bridge made of its own
#: (a fused query/key/value projection split into three, say), which the checkpoint does not name.
BRIDGE_COPY = "bridge:"


def weight_owners(model: torch.nn.Module) -> dict[str, tuple[torch.nn.Module, str]] | None:
    """Each weight a TransformerLens ``TransformerBridge`` computes with, by its checkpoint name, with
    the module holding it and its attribute name there; None for a model without the bridge's
    wrappers (a ``HookedTransformer``, a Hugging Face model not booted on), whose state dict names
    its weights as loaded.

    After booting, the Hugging Face model's modules sit inside the bridge's wrappers (each a module
    whose ``_original_component`` is the module it replaced, beside aliases of its parts): the state
    dict names each weight several times, none of them the checkpoint's name. Here a wrapper stands
    where the module it wraps stood and its aliases are not followed, so every weight keeps its
    checkpoint name, once. Given the bridge itself (not its ``original_model``), a checkpoint weight
    the bridge no longer holds (a fused ``query_key_value`` it split) is left out, and a tensor it
    made of its own and computes with (the three projections) is in, named :data:`BRIDGE_COPY` and
    its state-dict name: the weights are those whose edit changes what the bridge computes. The zero
    ``bias`` the bridge gives an unembedding that has none is not a weight of the checkpoint and is
    left out while it is zero (so is a checkpoint's own unembedding bias while all of it is zero: its
    hash then differs from the load's, a false alarm, never a change unseen). :data:`DERIVED_BUFFERS`
    are left out, as from every hash."""
    hf_model = getattr(model, "original_model", None)
    root = hf_model if isinstance(hf_model, torch.nn.Module) else model
    owners: dict[str, tuple[torch.nn.Module, str]] = {}
    added_biases: set[int] = set()
    if not _unwrapped_owners(root, "", owners, added_biases):
        return None
    held = model.state_dict(keep_vars=True)
    if root is not model:  # the bridge: what it holds, no more
        live = {id(tensor) for tensor in held.values()}
        owners = {name: (owner, leaf) for name, (owner, leaf) in owners.items() if id(getattr(owner, leaf)) in live}
    seen = {id(getattr(owner, leaf)) for owner, leaf in owners.values()} | added_biases
    for key, tensor in sorted(held.items()):
        if id(tensor) not in seen and not is_derived(key):
            seen.add(id(tensor))
            owners[BRIDGE_COPY + key.replace("._original_component", "")] = _owner(model, key)
    return {name: owner for name, owner in owners.items() if not is_derived(name)}


def hashes_other_than_its_checkpoint(bridge: torch.nn.Module) -> bool:
    """Whether the weights a booted bridge computes with (:func:`weight_owners`) are not its
    checkpoint's, name for name: tensors of its own, or checkpoint weights it no longer holds. The
    hash taken before booting then cannot stand for them."""
    owners = weight_owners(bridge)
    if owners is None:
        return False
    checkpoint: dict[str, tuple[torch.nn.Module, str]] = {}
    _unwrapped_owners(getattr(bridge, "original_model", bridge), "", checkpoint, set())
    return set(owners) != {name for name in checkpoint if not is_derived(name)}


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    """The module holding the state-dict entry ``name`` of ``model``, and its attribute name there."""
    owner_name, _, leaf = name.rpartition(".")
    return (model.get_submodule(owner_name) if owner_name else model), leaf


def _unwrapped_owners(module: torch.nn.Module, prefix: str, owners: dict[str, tuple[torch.nn.Module, str]],
                      added_biases: set[int], unembedding: bool = False) -> bool:
    """Fill ``owners`` for ``module`` as :func:`weight_owners` names the checkpoint's weights, and
    ``added_biases`` with the ids of the zero biases the bridge added; whether a bridge wrapper was
    met. ``unembedding``: ``module`` is what a bridge's ``UnembeddingBridge`` wraps, whose zero
    ``bias`` the bridge added (a parameter on TransformerLens 3.9, a buffer on 4.x)."""
    original = module._modules.get("_original_component")
    if original is not None:
        _unwrapped_owners(original, prefix, owners, added_biases,
                          unembedding=type(module).__name__ == "UnembeddingBridge")
        return True
    tensors = [*module._parameters.items(),
               *((name, b) for name, b in module._buffers.items() if name not in module._non_persistent_buffers_set)]
    for name, tensor in tensors:
        if tensor is None:
            continue
        if unembedding and name == "bias" and not tensor.is_meta and not tensor.any():
            added_biases.add(id(tensor))
        else:
            owners[prefix + name] = (module, name)
    wrapped = False
    for name, child in module._modules.items():
        if child is not None:
            wrapped |= _unwrapped_owners(child, f"{prefix}{name}.", owners, added_biases)
    return wrapped


def model_weights_sha256(model: torch.nn.Module) -> str:
    """:func:`state_dict_sha256` of a model's weights (its state dict less :data:`DERIVED_BUFFERS`; a
    booted bridge's by the names and rows of its checkpoint, :func:`weight_owners` and
    :func:`_as_checkpointed`: the hash ``load_model`` records for the same weights), read one tensor
    at a time where accelerate offloaded part of the model (``device_map`` with host or disk
    targets): a weight offloaded to disk or the host (on ``meta`` between forwards) is read in for its
    turn only, so hashing never holds more than one module's weights at once. Equal to the hash of
    the same weights loaded whole."""
    owners = weight_owners(model)
    if owners is None:  # the state dict's own tensors
        state = weights_of(model.state_dict(keep_vars=True))
        owner_of: Callable[[str], tuple[torch.nn.Module, str]] = lambda name: _owner(model, name)  # noqa: E731
    else:
        state = {name: getattr(owner, leaf) for name, (owner, leaf) in owners.items()}
        owner_of = owners.__getitem__
    repeated = any(REPEATED_ROWS in module.__dict__ for module in model.modules())

    def as_hashed(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return _as_checkpointed(*owner_of(name), tensor) if repeated else tensor

    if not any(tensor.is_meta for tensor in state.values()):
        return state_dict_sha256({name: as_hashed(name, tensor) for name, tensor in state.items()})
    from accelerate.utils import align_module_device

    digest = hashlib.sha256()
    for name in sorted(state):
        owner, leaf = owner_of(name)
        offloaded = state[name].is_meta
        with align_module_device(owner, torch.device("cpu")) if offloaded else contextlib.nullcontext():
            _add_tensor(digest, name, as_hashed(name, getattr(owner, leaf) if offloaded else state[name]))
    return digest.hexdigest()


def _as_checkpointed(owner: torch.nn.Module, leaf: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as the checkpoint holds it: a weight whose rows the bridge backend repeated
    (:data:`REPEATED_ROWS`) with each block's first copy only, while every copy still equals it (the
    same keys and values as the checkpoint's); one whose copies differ (a single query head's key
    edited) is hashed as it is, so the edit shows."""
    blocks = getattr(owner, REPEATED_ROWS, {}).get(leaf)
    if blocks is None or tensor.is_meta:
        return tensor
    pieces, start = [], 0
    for heads, d_head, times in blocks:
        rows = heads * times * d_head
        if start + rows > tensor.shape[0]:
            return tensor
        copies = tensor[start:start + rows].reshape(heads, times, d_head, *tensor.shape[1:])
        if not torch.equal(copies, copies[:, :1].expand_as(copies)):
            return tensor
        pieces.append(copies[:, 0].reshape(heads * d_head, *tensor.shape[1:]))
        start += rows
    return torch.cat(pieces) if start == tensor.shape[0] else tensor


_CHECKSUM_ROWS = 1024


def _checksum(storage: torch.UntypedStorage) -> bytes:
    """A storage's bytes, read as int32 (bytes widened where the size is not a multiple of 4), cut
    into 1024 consecutive runs, each summed modulo 2**32: any change of one value changes its run's
    sum; a change of several is missed only if it leaves every run's sum as it was (values exchanged
    within one run, or changes that cancel modulo 2**32). The storage, not the tensor: a transposed
    weight is read in place, without a copy."""
    raw = torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)
    words = raw.view(torch.int32) if raw.numel() % 4 == 0 else raw.to(torch.int32)
    whole = words.numel() - words.numel() % _CHECKSUM_ROWS
    runs = words[:whole].view(_CHECKSUM_ROWS, -1).sum(1, dtype=torch.int32) if whole else words[:0]
    return runs.cpu().numpy().tobytes() + words[whole:].cpu().numpy().tobytes()


def weights_version(model: torch.nn.Module, *, read_bytes: bool = True) -> tuple[Any, ...]:
    """What says whether a model's weights may have changed since it was last taken: each tensor's
    ``_version`` (bumped by in-place writes), dtype, storage, offset, shape and strides (changed by a
    cast or a ``.data`` swap), and a checksum of the bytes of every storage (:func:`_checksum`:
    writes through ``.data`` bump no version). About 0.1 s per GB of weights on a CPU. Weights that
    accelerate keeps offloaded (on ``meta`` between forwards, read in from disk or the host at each
    one) have no bytes here to change: only their layout is taken. ``read_bytes=False``: the layout
    alone, with ``None`` in place of the checksum. TransformerLens's buffers made from the config (the
    rotary tables it extends on a long pass, the mask) are not weights and are left out
    (:data:`DERIVED_BUFFERS`)."""
    state = weights_of(model.state_dict(keep_vars=True))
    if not read_bytes:
        return (*_layout(state), None)
    digest = hashlib.sha256()
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in state.values():
        if tensor.is_meta:
            continue
        storage = tensor.untyped_storage()
        storages.setdefault(storage.data_ptr(), storage)
    for pointer in sorted(storages):
        digest.update(_checksum(storages[pointer]))
    return (*_layout(state), digest.hexdigest())


def _layout(state: dict[str, torch.Tensor]) -> tuple[Any, ...]:
    """Each tensor's version counter (None for a tensor made under ``torch.inference_mode()``, which keeps
    none: its writes are seen by the checksum), dtype, storage, offset, shape and strides."""
    return tuple((None if t.is_inference() else t._version, t.dtype, t.untyped_storage().data_ptr(),
                  t.storage_offset(), tuple(t.shape), t.stride()) for t in state.values())
