"""Provenance: which model, data, seed and package versions made a result.

Every result object in lens_position carries a ``provenance`` dict built here, so a
DataFrame written to disk can always be traced back to what produced it.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib.metadata as _md
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lens_position.ground.errors import BadInputError
from lens_position.ground.version import __version__

# The packages whose versions a result records, and whether a new version can change a number
# (a kernel, a hook's semantics, a tokenizer): those are part of a cached step's key.
PACKAGES: dict[str, bool] = {"lens_position": True, "torch": True, "transformer_lens": True, "transformers": True,
                             "gguf": False, "numpy": False, "pandas": False}


def _version(name: str) -> str:
    if name == "lens_position":  # the imported tree's version, which an editable install's metadata may lag
        return __version__
    try:
        return _md.version(name)
    except _md.PackageNotFoundError:
        return "absent"


def package_versions(*, numbers_only: bool = False) -> dict[str, str]:
    """Installed versions of the packages a result depends on ("absent" if not installed), with
    Python's; ``numbers_only``: only the packages that can change a number (a cache key's)."""
    if numbers_only:
        return {name: _version(name) for name, changes_numbers in PACKAGES.items() if changes_numbers}
    return {"python": platform.python_version(), **{name: _version(name) for name in PACKAGES}}


def jsonable(obj: Any, *, strict: bool = False) -> Any:
    """``obj`` as plain JSON types: ``to_dict`` objects and dataclasses as dicts, tuples as lists,
    paths as strings, numpy/torch scalars as Python numbers.

    ``strict`` is for a saved result that must read back as it was written: NaN stays NaN and a
    value with no JSON form raises BadInputError. Otherwise (provenance records, cache keys) NaN
    becomes null, as standard JSON wants, and a value with no JSON form is written as its repr.
    """
    if obj is None or isinstance(obj, (str, bool, int)):
        return obj
    if isinstance(obj, float):
        return None if obj != obj and not strict else float(obj)
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict(), strict=strict)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj), strict=strict)
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v, strict=strict) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v, strict=strict) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 0) == 0:  # numpy / torch scalars
        return jsonable(obj.item(), strict=strict)
    if strict:
        raise BadInputError(f"cannot save a value of type {type(obj).__name__} in a result's JSON fields")
    return repr(obj)


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
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }
