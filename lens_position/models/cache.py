"""Weight cache: converted HookedTransformer weights on disk, so a second load takes seconds.

Converting a GGUF means dequantizing every tensor through ``transformers`` (SmolLM2 about
30 s, Gemma-3 about 90 s). The cache stores the result of that work, before any position
option is applied (options only change the config, never the weights):

    $LENS_POSITION_CACHE/<key>/weights.safetensors   HookedTransformer state dict, fp32
    $LENS_POSITION_CACHE/<key>/hooked_config.json    HookedTransformerConfig kwargs
    $LENS_POSITION_CACHE/<key>/tokenizer/            tokenizer.save_pretrained(...)
    $LENS_POSITION_CACHE/<key>/meta.json             source identity, format, versions, sha256

``<key>`` hashes the source's identity (absolute path, size and mtime of its files) and the
cache format, so a changed source file lands in a new entry. ``meta.json`` records the
canonical sha256 of the weights (``state_dict_sha256``); a load recomputes it, and an
entry that fails any check (missing file, unreadable JSON or safetensors, sha256 or
version mismatch) is deleted and rebuilt from the source with a warning.
The default location is ``~/.cache/lens_position``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from lens_position.provenance import package_versions

log = logging.getLogger(__name__)

CACHE_ENV = "LENS_POSITION_CACHE"
CACHE_FORMAT = 1
# Versions whose change can change the converted weights or the config mapping.
_VERSION_KEYS = ("lens_position", "transformer_lens", "transformers")


def default_cache_dir() -> Path:
    """``$LENS_POSITION_CACHE`` if set, else ``~/.cache/lens_position``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lens_position"


def file_identity(path: Path) -> dict[str, Any]:
    """What identifies a source file without reading it: absolute path, size, mtime (ns)."""
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def state_dict_sha256(state_dict: dict[str, torch.Tensor]) -> str:
    """Canonical sha256 of a state dict: names, dtypes, shapes and bytes, in sorted order.

    Independent of how the tensors were stored, so the same weights hash the same whether
    built in code, converted or read from the cache."""
    digest = hashlib.sha256()
    for name in sorted(state_dict):
        tensor = state_dict[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy() if tensor.numel() else b"")
    return digest.hexdigest()


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
    blob = json.dumps({"identity": identity, "format": CACHE_FORMAT}, sort_keys=True)
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


def read_entry(entry: Path, identity: dict[str, Any], tokenizer_loader: Callable[[Path], Any]) -> CachedModel:
    """Read and verify one cache entry; StaleEntry if it is missing, corrupt or stale."""
    try:
        meta = json.loads((entry / "meta.json").read_text())
        cfg = _cfg_from_json(json.loads((entry / "hooked_config.json").read_text()))
    except (OSError, ValueError) as error:
        raise StaleEntry(f"unreadable metadata ({error})") from error
    if meta.get("format") != CACHE_FORMAT or meta.get("identity") != identity:
        raise StaleEntry("written for another source or cache format")
    if meta.get("versions") != _versions():
        raise StaleEntry(f"written by {meta.get('versions')}, now {_versions()}")
    try:
        state_dict = load_file(entry / "weights.safetensors")
    except Exception as error:  # safetensors raises its own error types for bad headers
        raise StaleEntry(f"unreadable weights ({type(error).__name__}: {error})") from error
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
    return CachedModel(cfg, state_dict, tokenizer, sha, meta, from_cache=True)


def write_entry(entry: Path, identity: dict[str, Any], cfg: dict[str, Any],
                state_dict: dict[str, torch.Tensor], tokenizer: Any,
                extra_meta: dict[str, Any]) -> str:
    """Write an entry atomically (to a temporary folder, then rename); return its sha256."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".{entry.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        # safetensors refuses tensors that share memory (tied embeddings): store copies.
        tensors = {k: v.detach().cpu().clone().contiguous() for k, v in state_dict.items()}
        save_file(tensors, tmp / "weights.safetensors")
        sha = state_dict_sha256(tensors)
        (tmp / "hooked_config.json").write_text(json.dumps(_cfg_to_json(cfg), indent=1))
        tokenizer.save_pretrained(tmp / "tokenizer")
        meta = {"format": CACHE_FORMAT, "identity": identity, "versions": _versions(),
                "weights_sha256": sha, **extra_meta}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        if entry.exists():
            shutil.rmtree(entry)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return sha


def _remove_superseded(cache_dir: Path, identity: dict[str, Any], keep: Path) -> None:
    """Delete entries for the same source path with an older identity (the file changed)."""
    if identity.get("path") is None:
        return
    for meta_path in cache_dir.glob("*/meta.json"):
        if meta_path.parent == keep:
            continue
        try:
            old = json.loads(meta_path.read_text()).get("identity", {})
        except (OSError, ValueError):
            continue
        if old.get("path") == identity.get("path"):
            log.info("removing superseded cache entry %s", meta_path.parent)
            shutil.rmtree(meta_path.parent, ignore_errors=True)


def cached_convert(
    identity: dict[str, Any], build: Callable[[], tuple[dict[str, Any], dict[str, torch.Tensor], Any, dict[str, Any]]],
    tokenizer_loader: Callable[[Path], Any], cache_dir: str | Path | None = None,
) -> CachedModel:
    """Return the cached conversion of a source, building (and caching) it if needed.

    ``build()`` returns ``(cfg, state_dict, tokenizer, extra_meta)``; it runs only on a
    miss or when the entry fails its checks.
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    entry = root / _entry_key(identity)
    if entry.exists():
        try:
            return read_entry(entry, identity, tokenizer_loader)
        except StaleEntry as why:
            log.warning("cache entry %s is corrupt or stale (%s); rebuilding it", entry, why)
            shutil.rmtree(entry, ignore_errors=True)
    cfg, state_dict, tokenizer, extra_meta = build()
    sha = write_entry(entry, identity, cfg, state_dict, tokenizer, extra_meta)
    _remove_superseded(root, identity, keep=entry)
    meta = json.loads((entry / "meta.json").read_text())
    return CachedModel(cfg, state_dict, tokenizer, sha, meta, from_cache=False)
