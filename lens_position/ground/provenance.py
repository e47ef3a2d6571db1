"""Provenance: which model, data, seed and package versions made a result.

Every result object in lens_position carries a ``provenance`` dict built here, so a
DataFrame written to disk can always be traced back to what produced it.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata as _md
import platform
from typing import Any

_PACKAGES = ("lens_position", "torch", "transformer_lens", "transformers", "gguf", "numpy", "pandas")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on ("absent" if not installed)."""
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = _md.version(name)
        except _md.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def _as_dict(obj: Any) -> Any:
    if obj is None:
        return None
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return obj


def collect(
    *, model: Any = None, data: Any = None, seed: int | None = None, tokens_sha256: str | None = None,
    **extra: Any
) -> dict[str, Any]:
    """Build a provenance record.

    ``model`` is a ``ModelSpec`` (or ``LoadedModel``), ``data`` a ``PromptSpec`` (or
    ``PromptSet``); anything with ``to_dict()`` is stored as that dict. ``extra`` holds the
    analysis options (query range, key set, bins, ...). ``tokens_sha256`` is the hash of the
    token ids the analysis read (the prompt set's identity, whatever built it).
    """
    if model is not None and hasattr(model, "spec"):
        model = model.spec
    if data is not None and hasattr(data, "spec") and not hasattr(data, "to_dict"):
        data = data.spec
    return {
        "model": _as_dict(model),
        "data": _as_dict(data),
        "seed": seed,
        "tokens_sha256": tokens_sha256,
        "options": {k: _as_dict(v) for k, v in extra.items()},
        "versions": package_versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
