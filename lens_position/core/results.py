"""Results as files: save a result object to a folder and load it back as the same object.

Every result dataclass of lens_position (``Decomposition``, ``ProbeResult``, ``BosReplacement``,
``SinkHeads``, ``SinkRate``, ``SinkReading``, ``TrajectoryPatching``, ``Fingerprint``,
``PatchSweep``) inherits :class:`SavedResult`, so::

    result.save("runs/smollm2-decomposition")
    again = Decomposition.load("runs/smollm2-decomposition")   # or load_result(path)

The folder holds one Parquet file per table (dtypes kept), one safetensors file for the
tensors, and ``result.json`` with the result's type, its other fields and its **provenance**
(model, data, seed, options, package versions), plus when and with which versions it was saved.
A folder is written next to its final place and renamed into it, so a reader never sees half a
result; an existing folder is replaced only if it holds a saved result.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from lens_position.ground.errors import BadInputError
from lens_position.ground.provenance import jsonable, package_versions

MANIFEST = "result.json"
TENSORS = "tensors.safetensors"
FORMAT_VERSION = 1

R = TypeVar("R", bound="SavedResult")


def _restore(annotation: str, value: Any) -> Any:
    # JSON has no tuples: a field annotated as a list of tuples gets its pairs back as tuples.
    if isinstance(value, list) and annotation.replace(" ", "").startswith("list[tuple"):
        return [tuple(v) for v in value]
    return value


class SavedResult:
    """Mixin for result dataclasses: ``save(path)`` / ``load(path)`` (module docstring)."""

    def save(self, path: str | Path) -> Path:
        """Write this result to the folder ``path`` (created; a previous saved result there is
        replaced). Returns the folder."""
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__} is not a dataclass")
        folder = Path(path)
        if folder.exists() and not (folder / MANIFEST).is_file():
            raise BadInputError(f"{folder} exists and does not hold a saved result: choose an empty or new path")
        folder.parent.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, Any] = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}", "format": FORMAT_VERSION,
            "saved": {"at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                      "versions": package_versions()},
            "frames": [], "tensors": [], "fields": {},
        }
        tensors: dict[str, torch.Tensor] = {}
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
        try:
            for f in dataclasses.fields(self):
                value = getattr(self, f.name)
                if isinstance(value, pd.DataFrame):
                    value.to_parquet(staging / f"{f.name}.parquet")
                    manifest["frames"].append(f.name)
                elif isinstance(value, torch.Tensor):
                    tensors[f.name] = value.detach().cpu().contiguous()
                    manifest["tensors"].append(f.name)
                else:
                    manifest["fields"][f.name] = jsonable(value, strict=True)
            if tensors:
                save_file(tensors, str(staging / TENSORS))
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, allow_nan=True))
            if folder.exists():
                shutil.rmtree(folder)
            staging.rename(folder)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
        return folder

    @classmethod
    def load(cls: type[R], path: str | Path) -> R:
        """Read a result saved by :meth:`save`; it must be of this class (``load_result`` takes any)."""
        result = load_result(path)
        if not isinstance(result, cls):
            raise BadInputError(f"{path} holds a {type(result).__name__}, not a {cls.__name__}: "
                                f"use {type(result).__name__}.load or lens_position.core.results.load_result")
        return result


def load_result(path: str | Path) -> SavedResult:
    """Read any result saved by ``SavedResult.save``, as the object it was."""
    folder = Path(path)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise BadInputError(f"{folder} holds no saved result (no {MANIFEST}); save one with result.save(path)")
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format") != FORMAT_VERSION:
        raise BadInputError(f"{folder} was saved in format {manifest.get('format')}; this version reads {FORMAT_VERSION}")
    module_name, _, class_name = manifest["type"].rpartition(".")
    if not module_name.startswith("lens_position."):
        raise BadInputError(f"{folder} holds a {manifest['type']}, not a lens_position result")
    cls = getattr(importlib.import_module(module_name), class_name)
    tensors = load_file(str(folder / TENSORS)) if manifest["tensors"] else {}
    annotations = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {name: pd.read_parquet(folder / f"{name}.parquet") for name in manifest["frames"]}
    values.update({name: tensors[name] for name in manifest["tensors"]})
    values.update({name: _restore(annotations.get(name, ""), v) for name, v in manifest["fields"].items()})
    missing = set(annotations) - set(values)
    if missing:
        raise BadInputError(f"{folder} lacks the fields {sorted(missing)} of {class_name}: saved by another version?")
    return cls(**values)
