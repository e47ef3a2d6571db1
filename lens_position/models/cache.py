"""Weight cache: converted HookedTransformer weights on disk, so a second load takes seconds.

Converting a GGUF means dequantizing every tensor through ``transformers`` (SmolLM2 about
30 s, Gemma-3 about 90 s). The cache stores the result of that work, before any position
option is applied (options only change the config, never the weights):

    $LENS_POSITION_CACHE/<key>/weights.safetensors   HookedTransformer state dict, fp32
    $LENS_POSITION_CACHE/<key>/hooked_config.json    HookedTransformerConfig kwargs
    $LENS_POSITION_CACHE/<key>/tokenizer/            tokenizer.save_pretrained(...)
    $LENS_POSITION_CACHE/<key>/meta.json             source identity, format, versions, sha256, layouts

Each weight is stored as it lies in memory (the hooked model keeps ``W_Q``, ``W_O``, the gated MLP
and the unembedding transposed, :func:`~lens_position.models.adapters.lay_out_for_linear`), its
order of axes in ``meta.json``'s ``layouts``: a load maps the file (safetensors) and gives each
weight back with the strides it was written with, copying nothing.

``<key>`` hashes the source's identity (its absolute path and the sha256 of its content,
:mod:`lens_position.models.source_hash`), the cache format and the versions of lens_position,
TransformerLens and transformers, so a changed source file lands in a new entry, even one rewritten
with the same size and modification time, and two environments with other versions sharing a cache
keep an entry each. A new entry replaces the older one of the same source (same versions), and one
of an earlier cache format; entries of other versions stay until you delete them (each a folder of
``$LENS_POSITION_CACHE``).

Everything an entry holds is verified on every load: ``meta.json`` records the canonical
sha256 of the weights (``state_dict_sha256``), of the hooked config (its JSON, canonical)
and of every tokenizer file, and the tokenizer's BOS id; a load recomputes them all. An
entry that fails any check (a missing file, unreadable JSON, safetensors or tokenizer, a
hash or version mismatch, an edited ``n_heads`` or ``rotary_base``, a changed BOS) is
removed and rebuilt from the source with a warning, so a damaged entry never gives
different numbers under the original weights' hash, and never fails every later load. An
entry that lacks any of these hashes is rebuilt too.

Writes are safe under concurrent loads, threads or processes: one lock file per entry
(``<key>.lock``, `filelock`) makes a single writer build it while the others wait and then
read it; the writer builds in a temporary folder named with its process id and renames it
in whole. A temporary folder left by a killed writer (its process gone) is removed at the
next load of that entry.
The default location is ``~/.cache/lens_position``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock
from safetensors.torch import load_file, save_file

from lens_position.ground.errors import BadInputError
from lens_position.ground.files import pid_alive, resource_error
from lens_position.ground.paths import checked_path
from lens_position.ground.progress import stage
from lens_position.ground.provenance import package_versions
from lens_position.models.weights import state_dict_sha256

log = logging.getLogger(__name__)

CACHE_ENV = "LENS_POSITION_CACHE"
CACHE_FORMAT = 3  # 2: keyed by the source's content sha256; 3: each weight in its own layout
# Versions whose change can change the converted weights or the config mapping.
_VERSION_KEYS = ("lens_position", "transformer_lens", "transformers")
# The hashes every entry's meta.json records; an entry lacking one is rebuilt.
_HASHED = ("weights_sha256", "config_sha256", "tokenizer_sha256")


def default_cache_dir() -> Path:
    """``$LENS_POSITION_CACHE`` if set (and not empty), else ``~/.cache/lens_position``; a value of
    spaces only is refused (BadInputError), not taken as a folder named by them. Without a home folder
    of its own (``HOME`` empty, relative or ``/``, as under cron or a service unit) the cache goes to
    ``$XDG_CACHE_HOME/lens_position`` when that is an absolute path, and is otherwise refused with the
    route: it never lands at the file system's root or in whatever folder the process runs in."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return checked_path(env, f"${CACHE_ENV}").expanduser()
    home = os.path.expanduser("~")
    if home and os.path.isabs(home) and Path(home) != Path(Path(home).anchor):
        return Path(home) / ".cache" / "lens_position"
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "lens_position"
    raise BadInputError(f"there is no home folder to keep the weight cache in (HOME is {os.environ.get('HOME')!r}): "
                        f"set {CACHE_ENV} to a writable folder (for instance {CACHE_ENV}=/var/tmp/lens_position), "
                        "or pass load_model(..., cache_dir=...)")


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """The cache's folder: ``cache_dir`` when given, else :func:`default_cache_dir`."""
    return checked_path(cache_dir, "cache_dir").expanduser() if cache_dir is not None else default_cache_dir()


@dataclass
class CachedModel:
    """What the cache holds for one source."""

    cfg: dict[str, Any]
    state_dict: dict[str, torch.Tensor]
    tokenizer: Any
    weights_sha256: str
    meta: dict[str, Any]
    from_cache: bool


def _entry_key(identity: dict[str, Any]) -> str:
    """The entry's folder name: the source's identity, the cache format and the versions that make
    the conversion (two environments with other versions keep an entry each, never rebuilding each
    other's)."""
    blob = json.dumps({"identity": identity, "format": CACHE_FORMAT, "versions": _versions()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _cfg_to_json(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v).removeprefix("torch.") if isinstance(v, torch.dtype) else v) for k, v in cfg.items()}


def _cfg_from_json(data: dict[str, Any]) -> dict[str, Any]:
    cfg = dict(data)
    if "dtype" in cfg:
        cfg["dtype"] = getattr(torch, cfg["dtype"])
    return cfg


def _versions() -> dict[str, str]:
    versions = package_versions()
    return {k: versions[k] for k in _VERSION_KEYS}


class StaleEntry(Exception):
    """A cache entry that must be rebuilt (the message says why)."""


def _config_sha256(cfg_json: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg_json, sort_keys=True).encode()).hexdigest()


def _folder_sha256(folder: Path) -> str:
    """sha256 over every file of ``folder``: relative names and contents, in sorted order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}|{path.stat().st_size}|".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _check(meta: dict[str, Any], key: str, actual: Any, what: str) -> None:
    if meta.get(key) != actual:
        raise StaleEntry(f"{what} does not match the one recorded when the entry was written")


def read_entry(entry: Path, identity: dict[str, Any], tokenizer_loader: Callable[[Path], Any]) -> CachedModel:
    """Read and verify one cache entry; StaleEntry if it is missing, corrupt, edited or stale."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        cfg_json = json.loads((entry / "hooked_config.json").read_text())
        cfg = _cfg_from_json(cfg_json)
    except (OSError, ValueError, TypeError, AttributeError) as error:
        raise StaleEntry(f"unreadable metadata ({type(error).__name__}: {error})") from error
    if not isinstance(meta, dict) or meta.get("format") != CACHE_FORMAT or meta.get("identity") != identity:
        raise StaleEntry("written for another source or cache format")
    if meta.get("versions") != _versions():
        raise StaleEntry(f"written by {meta.get('versions')}, now {_versions()}")
    if not isinstance(meta.get("verified"), dict):
        raise StaleEntry("it records no load-time verification of the conversion")
    missing = [key for key in _HASHED if not isinstance(meta.get(key), str)]
    if missing:
        raise StaleEntry(f"its meta.json lacks {', '.join(missing)}")
    _check(meta, "config_sha256", _config_sha256(cfg_json), "hooked_config.json")
    try:
        _check(meta, "tokenizer_sha256", _folder_sha256(entry / "tokenizer"), "the tokenizer files")
    except OSError as error:
        raise StaleEntry(f"unreadable tokenizer files ({error})") from error
    stage("reading the weight cache")
    try:
        state_dict = load_file(entry / "weights.safetensors")
    except Exception as error:  # safetensors raises its own error types for bad headers
        raise StaleEntry(f"unreadable weights ({type(error).__name__}: {error})") from error
    state_dict = _restored(state_dict, meta.get("layouts"))
    # Hashing (GIL released by hashlib) and parsing the tokenizer each take seconds for
    # Gemma-3's 262k vocabulary: do them at the same time.
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(state_dict_sha256, state_dict)
        try:
            tokenizer = tokenizer_loader(entry / "tokenizer")
        except Exception as error:  # tokenizers raise many types on a damaged file
            raise StaleEntry(f"unreadable tokenizer ({type(error).__name__}: {error})") from error
        sha = hashing.result()
    if sha != meta.get("weights_sha256"):
        raise StaleEntry(f"weights sha256 {sha[:12]}… does not match the recorded "
                         f"{str(meta.get('weights_sha256'))[:12]}…")
    _check(meta, "bos_token_id", getattr(tokenizer, "bos_token_id", None), "the tokenizer's BOS token id")
    return CachedModel(cfg, state_dict, tokenizer, sha, meta, from_cache=True)


def storage_order(tensor: torch.Tensor) -> tuple[int, ...]:
    """The order of axes in which ``tensor`` lies in memory (``tensor.permute(order)`` is
    contiguous), or the identity when its strides are no permutation of a contiguous layout."""
    order = tuple(sorted(range(tensor.ndim), key=lambda axis: -tensor.stride(axis)))
    return order if tensor.permute(order).is_contiguous() else tuple(range(tensor.ndim))


def stored_layouts(state_dict: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, list[int]]]:
    """What :func:`write_entry` saves: each weight as it lies in memory (permuted to contiguous, no
    copy), and the order of axes of each one not stored in its own (``meta.json``'s ``layouts``), so a
    read gives every weight back with the strides it was written with. A weight that shares memory
    with an earlier one (safetensors refuses those) or lies in no permutation of a contiguous layout
    is copied, one at a time."""
    tensors: dict[str, torch.Tensor] = {}
    layouts: dict[str, list[int]] = {}
    taken: set[int] = set()
    for name, tensor in state_dict.items():
        tensor = tensor.detach().cpu()
        order = storage_order(tensor)
        stored = tensor.permute(order)
        pointer = stored.untyped_storage().data_ptr()
        if not stored.is_contiguous() or (stored.numel() and pointer in taken):
            stored = stored.clone(memory_format=torch.contiguous_format)
        taken.add(stored.untyped_storage().data_ptr())
        tensors[name] = stored
        if order != tuple(range(tensor.ndim)):
            layouts[name] = list(order)
    return tensors, layouts


def _restored(state_dict: dict[str, torch.Tensor], layouts: Any) -> dict[str, torch.Tensor]:
    """The weights of an entry with the strides they were written with (views, no copy); StaleEntry
    when ``layouts`` names a weight the file lacks or an order that is no permutation of its axes."""
    if not isinstance(layouts, dict):
        raise StaleEntry("its meta.json records no layouts")
    restored = dict(state_dict)
    for name, order in layouts.items():
        tensor = state_dict.get(name)
        if (tensor is None or not isinstance(order, list) or not all(type(axis) is int for axis in order)
                or sorted(order) != list(range(tensor.ndim))):
            raise StaleEntry(f"its layout of {name!r} ({order!r}) does not fit its weights")
        restored[name] = tensor.permute(inverse_order(tuple(order)))
    return restored


def inverse_order(order: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``order`` (``t.permute(order).permute(inverse_order(order))`` is ``t``)."""
    inverse = [0] * len(order)
    for position, axis in enumerate(order):
        inverse[axis] = position
    return tuple(inverse)


def temporary_name(entry: Path) -> Path:
    """``.<key>.tmp-<pid>-<random>``: the pid tells a later load whether the writer still runs."""
    return entry.parent / f".{entry.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"


LEFTOVER_AGE_S = 3600  # a temporary folder without a readable pid counts as abandoned after this


def remove_leftovers(entry: Path) -> list[Path]:
    """Remove the temporary folders of ``entry`` whose writer is gone (killed mid-write):
    those whose process no longer exists, or, without a pid in the name, older than an hour.
    A live writer's folder carries a running pid (or is recent), so it is never taken."""
    removed = []
    for tmp in entry.parent.glob(f".{entry.name}.tmp-*"):
        fields = tmp.name.rsplit(".tmp-", 1)[1].split("-")
        if len(fields) == 2 and fields[0].isdigit():
            abandoned = not pid_alive(int(fields[0]))
        else:
            try:
                abandoned = time.time() - tmp.stat().st_mtime > LEFTOVER_AGE_S
            except OSError:
                continue
        if abandoned:
            log.info("removing %s, left by a writer that was stopped", tmp)
            shutil.rmtree(tmp, ignore_errors=True)
            removed.append(tmp)
    return removed


def discard_entry(entry: Path) -> None:
    """Remove an entry: renamed aside first, so no reader ever sees it half deleted."""
    if not entry.exists():
        return
    trash = entry.parent / f".{entry.name}.trash-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        os.replace(entry, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _save_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``save_file``, its failed write (safetensors raises its own SafetensorError, naming the OS error:
    a full disk, a quota) as the ``OSError`` it is, so the load goes on without the cache."""
    try:
        save_file(tensors, path)
    except Exception as error:
        if type(error).__name__ != "SafetensorError":
            raise
        code = re.search(r"os error (\d+)", str(error))
        raise OSError(int(code.group(1)) if code else errno.EIO, str(error), str(path)) from error


def write_entry(entry: Path, identity: dict[str, Any], cfg: dict[str, Any],
                state_dict: dict[str, torch.Tensor], tokenizer: Any,
                extra_meta: dict[str, Any]) -> str:
    """Write an entry atomically (to a temporary folder, then rename); return its sha256.

    Callers hold the entry's lock (:func:`cached_convert`). Should another writer (one that
    does not lock, e.g. an older lens_position) rename its complete entry in first, this
    one is discarded and theirs kept."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(entry)
    tmp.mkdir()
    try:
        tensors, layouts = stored_layouts(state_dict)
        _save_weights(tensors, tmp / "weights.safetensors")
        sha = state_dict_sha256(state_dict)
        cfg_json = _cfg_to_json(cfg)
        (tmp / "hooked_config.json").write_text(json.dumps(cfg_json, indent=1))
        tokenizer.save_pretrained(tmp / "tokenizer")
        meta = {"format": CACHE_FORMAT, "identity": identity, "versions": _versions(),
                "weights_sha256": sha, "config_sha256": _config_sha256(cfg_json),
                "tokenizer_sha256": _folder_sha256(tmp / "tokenizer"),
                "bos_token_id": getattr(tokenizer, "bos_token_id", None), "layouts": layouts, **extra_meta}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        discard_entry(entry)
        try:
            os.replace(tmp, entry)
        except OSError:  # "Directory not empty": another writer's entry won the rename
            if not (entry / "meta.json").is_file():
                raise
            log.info("cache entry %s was written by another process first; keeping it", entry)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sha


def _remove_superseded(cache_dir: Path, identity: dict[str, Any], keep: Path) -> None:
    """Delete these versions' entries for the same source path with another content (the file
    changed) or of an earlier cache format (never read again: this format's key differs); entries
    other versions wrote are left to them."""
    if identity.get("path") is None:
        return
    for meta_path in cache_dir.glob("*/meta.json"):
        if meta_path.parent == keep:
            continue
        try:
            meta = json.loads(meta_path.read_text())
            old = meta.get("identity", {})
        except (OSError, ValueError, AttributeError):
            continue
        earlier_format = isinstance(meta.get("format"), int) and meta["format"] <= CACHE_FORMAT
        if not (earlier_format and meta.get("versions") == _versions()):
            continue  # another version's entry: its environment may still use it
        if old.get("path") == identity.get("path"):
            log.info("removing superseded cache entry %s", meta_path.parent)
            discard_entry(meta_path.parent)


def cached_convert(
    identity: dict[str, Any], build: Callable[[], tuple[dict[str, Any], dict[str, torch.Tensor], Any, dict[str, Any]]],
    tokenizer_loader: Callable[[Path], Any], cache_dir: str | Path | None = None,
    verify: Callable[[CachedModel], None] | None = None,
) -> CachedModel:
    """Return the cached conversion of a source, building (and caching) it if needed.

    ``build()`` returns ``(cfg, state_dict, tokenizer, extra_meta)``; it runs only on a
    miss or when the entry fails its checks. ``verify(cached)`` may check an entry read
    from the cache further (e.g. that its config and weights make a model) and raise
    anything to have it rebuilt.
    """
    root = cache_root(cache_dir)
    entry = root / _entry_key(identity)

    def read() -> CachedModel:
        cached = read_entry(entry, identity, tokenizer_loader)
        if verify is not None:
            try:
                verify(cached)
            except Exception as error:  # whatever a damaged config makes the model builder raise
                raise StaleEntry(f"it does not make a model ({type(error).__name__}: {error})") from error
        return cached

    remove_leftovers(entry)  # safe without the lock: it only takes folders whose writer is gone
    if entry.exists():  # the common case: read without waiting for a lock
        try:
            return read()
        except StaleEntry:
            pass  # decided again below, under the lock: another process may be rewriting it
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(root / f"{entry.name}.lock"))
        lock.acquire()
    except OSError as error:  # a read-only or foreign folder, a file in its place, a full disk
        return _uncached(build, error, root)
    try:
        if entry.exists():
            try:
                return read()  # another process built it while this one waited
            except StaleEntry as why:
                log.warning("cache entry %s is corrupt or stale (%s); rebuilding it", entry, why)
                discard_entry(entry)
        cfg, state_dict, tokenizer, extra_meta = build()
        stage("writing the weight cache")
        try:
            sha = write_entry(entry, identity, cfg, state_dict, tokenizer, extra_meta)
        except OSError as error:
            log.warning("%s; the model is loaded without it", resource_error(error, entry, "writing the weight cache"))
            return CachedModel(cfg, state_dict, tokenizer, state_dict_sha256(state_dict), dict(extra_meta), False)
        _remove_superseded(root, identity, keep=entry)
        meta = json.loads((entry / "meta.json").read_text())
    finally:
        lock.release()
    return CachedModel(cfg, state_dict, tokenizer, sha, meta, from_cache=False)


def _uncached(build: Callable[[], tuple[dict[str, Any], dict[str, torch.Tensor], Any, dict[str, Any]]],
              error: OSError, root: Path) -> CachedModel:
    """The conversion without the cache, when its folder cannot be written: the model loads (a
    cache only saves time), with a warning naming the folder and how to have one."""
    log.warning("%s; the model is converted without caching it (the next load converts it again): set "
                "$%s or pass cache_dir= to a folder you can write to", resource_error(error, root, "opening the "
                "weight cache"), CACHE_ENV)
    cfg, state_dict, tokenizer, extra_meta = build()
    return CachedModel(cfg, state_dict, tokenizer, state_dict_sha256(state_dict), dict(extra_meta), False)
