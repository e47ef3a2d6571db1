"""What a checkpoint holds, as the sha256 of its bytes: the key of the weight cache.

A cache keyed by a file's size and modification time serves old weights for a file rewritten with
the same size and time. The key here is the content's sha256. Hashing a file of a few hundred MB
takes about a second, so the hash is computed once and kept in a small memo beside the cache
(``<cache>/<path key>.source.json``) with the file's stat signature: size, modification and
status-change times (ns) and inode. Any write to a file changes its status-change time (which no
user call can set back), so a signature that differs in anything triggers hashing again; an equal
signature reuses the memo. The signature never stands in for the hash: it only says when the hash
must be taken again.

A checkpoint folder's content is that of its top-level files (what ``transformers`` reads:
config, weights, index, tokenizer files), hidden files excepted, names and bytes in sorted order.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

from lens_position.ground.errors import ResourceError

log = logging.getLogger(__name__)

_CHUNK = 1 << 24


def checkpoint_files(path: Path) -> list[Path]:
    """The files whose bytes make a source's content: the file itself, or a folder's top-level
    regular files (hidden ones excepted), sorted by name."""
    if path.is_file():
        return [path]
    return sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))


def stat_signature(path: Path) -> list[list[Any]]:
    """``[name, size, mtime_ns, ctime_ns, inode]`` of each of ``checkpoint_files(path)``."""
    rows = []
    for file in checkpoint_files(path):
        stat = file.stat()
        rows.append([file.name, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino])
    return rows


#: What a loader reads of a checkpoint folder (config, weights and their index, tokenizer files): a file
#: of these this user cannot read is refused; another unreadable file is hashed by its name and size.
_LOADED_SUFFIXES = (".json", ".safetensors", ".bin", ".model", ".pt", ".pth", ".gguf", ".tiktoken")
_LOADED_NAMES = ("merges.txt", "vocab.txt")


def content_sha256(path: Path) -> str:
    """sha256 over the names and bytes of ``checkpoint_files(path)`` (read in 16 MiB chunks). A file of
    a folder that this user may not read and that no loader reads (notes, a README of another user) counts
    by its name and size; one a loader reads is refused (ResourceError naming it)."""
    digest = hashlib.sha256()
    for file in checkpoint_files(path):
        digest.update(f"{file.name}|{file.stat().st_size}|".encode())
        try:
            with file.open("rb") as handle:
                while chunk := handle.read(_CHUNK):
                    digest.update(chunk)
        except PermissionError:
            if file == path or file.name.endswith(_LOADED_SUFFIXES) or file.name in _LOADED_NAMES:
                raise ResourceError(f"{file} cannot be read by this user (permission denied), and loading the "
                                    "checkpoint reads it: make it readable (chmod a+r) or copy the checkpoint to a "
                                    "folder of your own") from None
            log.debug("%s is not readable by this user; no loader reads it: hashed by its name and size", file)
            digest.update(b"unreadable|")
    return digest.hexdigest()


def _memo_path(path: Path, memo_dir: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return memo_dir / f"{key}.source.json"


def source_sha256(path: Path, memo_dir: Path) -> str:
    """The content sha256 of a checkpoint file or folder: from the memo in ``memo_dir`` when the
    files' stat signature is the one recorded with it, else hashed now (and the memo rewritten)."""
    path = path.resolve()
    signature = stat_signature(path)
    memo = _memo_path(path, memo_dir)
    try:
        recorded = json.loads(memo.read_text())
        if recorded.get("path") == str(path) and recorded.get("signature") == signature:
            return str(recorded["sha256"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        pass  # no memo yet, or an unreadable one: hash
    sha = content_sha256(path)
    if stat_signature(path) != signature:  # written to while being hashed: do not memoise
        return sha
    try:
        memo_dir.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        tmp.write_text(json.dumps({"path": str(path), "signature": signature, "sha256": sha}))
        os.replace(tmp, memo)
    except OSError as error:  # a read-only cache still loads; the next load hashes again
        log.debug("could not record the hash of %s in %s: %s", path, memo, error)
    return sha


def source_identity(path: Path, memo_dir: Path) -> dict[str, Any]:
    """What the weight cache keys an entry by: the source's absolute path and content sha256."""
    return {"path": str(path.resolve()), "sha256": source_sha256(path, memo_dir)}
