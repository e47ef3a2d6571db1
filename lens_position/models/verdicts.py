"""Load-time verdicts kept by content: a model verified once (its weights' sha256, the load's
position options, the backend, the dtype and the versions that compute it) is not verified again.

    $LENS_POSITION_CACHE/verified/<key>.json    the verdict recorded in the spec (``extra["verified"]``)

A verdict that cannot be read is ignored (the model is verified again); one is written whole
(a temporary file renamed over it) or not at all.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lens_position.ground.provenance import jsonable, package_versions
from lens_position.models.cache import cache_root

_FORMAT = 1


def verdict_key(weights_sha256: str, options: dict[str, Any], backend: str, dtype: str,
                config: dict[str, Any] | None = None) -> str:
    """The key of one model's verdict: what it computes depends on nothing else (its weights, its
    config as loaded, the load's options, backend, dtype and the package versions)."""
    settings = {name: value for name, value in (config or {}).items() if name not in _NOT_COMPUTATION}
    blob = json.dumps({"weights": weights_sha256, "options": jsonable(options), "backend": backend, "dtype": dtype,
                       "config": jsonable(settings), "versions": package_versions(numbers_only=True),
                       "format": _FORMAT}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


# config entries that name where a model came from, not what it computes
_NOT_COMPUTATION = frozenset({"_name_or_path", "name_or_path", "transformers_version", "_commit_hash"})


def _path(key: str, cache_dir: str | None) -> Path:
    return cache_root(cache_dir) / "verified" / f"{key}.json"


def read_verdict(key: str, cache_dir: str | None = None) -> dict[str, Any] | None:
    """The verdict recorded under ``key``, or None (never recorded, or unreadable)."""
    try:
        verdict = json.loads(_path(key, cache_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return verdict if isinstance(verdict, dict) and verdict.get("key") == key else None


def write_verdict(key: str, verdict: dict[str, Any], cache_dir: str | None = None) -> None:
    """Record ``verdict`` under ``key``; a cache folder that cannot be written only means the next
    load verifies again."""
    path = _path(key, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({**jsonable(verdict), "key": key}), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        return
