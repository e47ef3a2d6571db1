"""Results as files: save a result object to a folder and load it back as the same object.

Every result dataclass of lens_position (``Decomposition``, ``ProbeResult``, ``BosReplacement``,
``SinkHeads``, ``SinkRate``, ``SinkReading``, ``TrajectoryPatching``, ``Fingerprint``,
``PatchSweep``) inherits :class:`SavedResult`, so::

    result.save("runs/smollm2-decomposition")
    again = Decomposition.load("runs/smollm2-decomposition")   # or load_result(path)

The folder holds one Parquet file per table (dtypes kept), one safetensors file for the
tensors, and ``result.json`` with the result's type, its other fields and its **provenance**
(model, data, seed, options, package versions), plus when and with which versions it was saved,
and the **sha256 of every file it wrote** (``files``). ``load`` checks each file against its hash
before reading it, so an edited table (a column scaled by hand, a re-encoded file) is refused
instead of read; any file that cannot be read (truncated, empty, not JSON / Parquet /
safetensors, not a lens_position result) raises :class:`~lens_position.ground.errors.CorruptFileError`
naming the file.
A folder is written next to its final place and swapped into it by renames
(:mod:`lens_position.core.folder_swap`), so a reader never sees half a result and a save killed at
any moment leaves the old result or the new one (the next save or load completes it). An existing
folder is replaced only if it holds a saved result and nothing else: a folder that also holds
files lens_position did not write (notes, figures) is refused, never deleted.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib
import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pandas as pd
import torch
from safetensors.torch import load_file, save_file

from lens_position.core import summaries
from lens_position.core.columns import recommended_first
from lens_position.core.folder_swap import NEW, recover, swap_in, temporary
from lens_position.core.summaries import Headline
from lens_position.ground.errors import BadInputError, CorruptFileError, LensPositionError, ResourceError
from lens_position.ground.files import read_json, resource_error
from lens_position.ground.paths import checked_path
from lens_position.ground.provenance import jsonable, package_versions

MANIFEST = "result.json"
TENSORS = "tensors.safetensors"
FORMAT_VERSION = 2  # 2: the manifest lists every file's sha256

R = TypeVar("R", bound="SavedResult")


def _restore(annotation: str, value: Any) -> Any:
    # JSON has no tuples: a field annotated as a list of tuples gets its pairs back as tuples.
    if isinstance(value, list) and annotation.replace(" ", "").startswith("list[tuple"):
        return [tuple(v) for v in value]
    return value


@dataclass(frozen=True)
class Table:
    """One table a reproduction writes: its file ``name``, the result's DataFrame ``attribute`` it
    is, what it holds (``meaning``, shown in the report and the docs) and what each of its own
    columns means (``columns``: those the shared registry, :data:`lens_position.core.columns.COLUMNS`,
    does not describe; the column reference shows both)."""

    name: str
    attribute: str
    meaning: str
    columns: Mapping[str, str] = field(default_factory=dict, hash=False)


class SavedResult:
    """Mixin for result dataclasses: ``save(path)`` / ``load(path)`` (module docstring), and what
    a reader sees first: a short ``repr`` and ``_repr_html_`` (what was measured, on what, the
    headline numbers with intervals, where the tables are), ``summary()`` and ``top_heads()``
    (:mod:`lens_position.core.summaries`). Subclasses are ``@dataclass(repr=False)`` so the
    short ``repr`` is theirs, and set ``WHAT``, ``HEADS`` and ``headline()``; a result a
    reproduction step writes also declares its ``TABLES`` and the ``KEYWORD`` that names it in
    :func:`lens_position.report.takeaways.result_tables`."""

    WHAT = "a lens_position result"
    TABLES: ClassVar[tuple[Table, ...]] = ()
    KEYWORD: ClassVar[str | None] = None
    HEADS: tuple[str, str] | None = None  # (per-head table, the column top_heads ranks by)
    INTERVALS = "95% bootstrap over sequences"  # how the headline intervals were made

    def __post_init__(self) -> None:
        # every table shows what identifies a row and the recommended numbers first (core.columns)
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, pd.DataFrame):
                setattr(self, f.name, recommended_first(value))

    def headline(self) -> list[Headline]:
        """The headline numbers, each with its interval (none for a result without them)."""
        return []

    def summary(self) -> pd.DataFrame:
        """The headline numbers as a small tidy frame: ``quantity``, ``label``, ``value``,
        ``lo``, ``hi`` (the interval; NaN without one), ``meaning``."""
        return summaries.summary_frame(self)

    def top_heads(self, n: int = 10, by: str | None = None) -> pd.DataFrame:
        """The ``n`` heads with the largest ``by`` (default: ``HEADS[1]``; a ``*_change`` column
        ranks by its absolute value), from the per-head table ``HEADS[0]``."""
        return summaries.top_heads(self, n, by)

    def __repr__(self) -> str:
        return summaries.text(self)

    def _repr_html_(self) -> str:
        return summaries.html_text(self)

    def save(self, path: str | Path) -> Path:
        """Write this result to the folder ``path`` (created; a previous saved result there is
        replaced, atomically). Returns the folder. A folder that holds anything else is refused."""
        if not dataclasses.is_dataclass(self):
            raise TypeError(f"{type(self).__name__} is not a dataclass")
        folder = checked_path(path, "the folder to save the result in")
        try:
            recover(folder, _complete)
            _check_replaceable(folder)
            return self._save(folder)
        except OSError as error:  # a read-only, full or foreign folder: the user's to fix, not a bug
            raise resource_error(error, folder, "saving the result") from error

    def _save(self, folder: Path) -> Path:
        folder.parent.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, Any] = {
            "type": f"{type(self).__module__}.{type(self).__qualname__}", "format": FORMAT_VERSION,
            "saved": {"at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
                      "versions": package_versions()},
            "frames": [], "tensors": [], "fields": {},
        }
        tensors: dict[str, torch.Tensor] = {}
        staging = temporary(folder, NEW)
        staging.mkdir(mode=0o777)  # the umask applies, as to any folder the user makes
        try:
            for f in dataclasses.fields(self):  # type: ignore[arg-type]  # every subclass is a dataclass
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
            manifest["files"] = {entry.name: _file_sha256(entry) for entry in sorted(staging.iterdir())}
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, allow_nan=True))
            swap_in(staging, folder)
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


def current_umask() -> int:
    """The process's umask (read from ``/proc/self/status``, where setting it to read it back
    would race with other threads; else by setting it and putting it back)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _check_replaceable(folder: Path) -> None:
    """BadInputError unless ``folder`` is absent, or holds a saved result and only its files. A folder
    another save swaps out while it is read (a thread of this process, another process) is read again."""
    for _ in range(64):
        try:
            identity = folder.stat().st_ino
        except FileNotFoundError:
            return
        try:
            return _check_holds_only_a_result(folder)
        except (LensPositionError, OSError):
            try:
                if folder.stat().st_ino == identity:
                    raise  # the same folder: its contents are the reason
            except FileNotFoundError:
                return  # moved aside by another save: nothing here to refuse


def _check_holds_only_a_result(folder: Path) -> None:
    if not folder.is_dir():
        raise BadInputError(f"{folder} is a file, not a folder: choose a new path for the result")
    if not (folder / MANIFEST).is_file():
        raise BadInputError(f"{folder} exists and does not hold a saved result: choose an empty or new path")
    try:
        own = set(_read_manifest(folder)["files"]) | {MANIFEST}
    except (CorruptFileError, BadInputError) as error:
        raise BadInputError(f"{folder} holds a saved result lens_position cannot read ({error}); it is not "
                            "replaced: remove it yourself, or choose another path") from error
    foreign = sorted(entry.name for entry in folder.iterdir() if entry.name not in own)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 5 else "")
        raise BadInputError(f"{folder} holds a saved result and files lens_position did not write ({shown}); "
                            "replacing the folder would delete them: save into another folder (e.g. "
                            f"{folder / 'result'}), or move them out")


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds a whole saved result: its manifest, and every file it lists with
    its hash (a temporary left by a killed save is put in place only then)."""
    try:
        manifest = _read_manifest(folder)
        for name in manifest["files"]:
            _verified(folder, manifest, name)
    except (LensPositionError, OSError):
        return False
    return True


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_manifest(folder: Path) -> dict[str, Any]:
    manifest_path = folder / MANIFEST
    try:
        manifest = read_json(manifest_path, "saved result's manifest")
    except (CorruptFileError, BadInputError, ResourceError) as error:
        raise CorruptFileError(f"{manifest_path} cannot be read as a saved result's manifest ({error}); "
                               "save the result again") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("type"), str):
        raise CorruptFileError(f"{manifest_path} is not a lens_position result manifest (no 'type'); "
                               "save the result again")
    saved_format = manifest.get("format")
    if isinstance(saved_format, int) and not isinstance(saved_format, bool) and saved_format > FORMAT_VERSION:
        raise BadInputError(f"{folder} was saved by a newer lens_position (result format {saved_format}; this version "
                            f"reads {FORMAT_VERSION}): upgrade lens_position (pip install -U lens_position) to read it")
    if saved_format != FORMAT_VERSION:
        raise BadInputError(f"{folder} was saved in format {saved_format}; this version reads "
                            f"{FORMAT_VERSION} (files with content hashes): save it again with this version")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        raise CorruptFileError(f"{manifest_path} lists no file hashes; save the result again")
    for key in ("frames", "tensors"):
        if not isinstance(manifest.get(key), list):
            raise CorruptFileError(f"{manifest_path} has no list {key!r}; save the result again")
    named = [*files, *manifest["frames"], *manifest["tensors"]]
    outside = [name for name in named if not (isinstance(name, str) and name and Path(name).name == name
                                               and name not in (".", ".."))]
    if outside:  # a saved result's files lie in its folder: "../x" would read another result's table
        raise CorruptFileError(f"{manifest_path} names {outside[0]!r}, which is not a file of this folder; "
                               "save the result again")
    if not isinstance(manifest.get("fields"), dict):
        raise CorruptFileError(f"{manifest_path} has no 'fields'; save the result again")
    return manifest


def _verified(folder: Path, manifest: dict[str, Any], name: str) -> Path:
    """``folder / name`` after checking it against the hash the manifest lists for it."""
    path = folder / name
    expected = manifest["files"].get(name)
    if path.exists() and not path.is_file():
        raise CorruptFileError(f"{path} is not a regular file (a FIFO, device or folder); save the result again")
    if expected is None:
        raise CorruptFileError(f"{path}: the manifest {folder / MANIFEST} lists no hash for it; save the result again")
    try:
        actual = _file_sha256(path)
    except OSError as error:
        raise CorruptFileError(f"{path} cannot be read ({type(error).__name__}: {error}); "
                               "the saved result is incomplete: save it again") from error
    if actual != expected:
        raise CorruptFileError(f"{path} has changed since it was saved (sha256 {actual[:12]}, the manifest says "
                               f"{expected[:12]}): an edited or damaged table is not read; save the result again")
    return path


def load_result(path: str | Path) -> SavedResult:
    """Read any result saved by ``SavedResult.save``, as the object it was, after checking every
    file against the sha256 its manifest lists (module docstring)."""
    folder = checked_path(path, "the saved result's folder")
    manifest_path = folder / MANIFEST
    if not folder.exists():
        recover(folder, _complete)  # a save killed between its two renames
    if not manifest_path.is_file():
        raise BadInputError(f"{folder} holds no saved result (no {MANIFEST}); save one with result.save(path)")
    manifest = _read_manifest(folder)
    module_name, _, class_name = manifest["type"].rpartition(".")
    if not module_name.startswith("lens_position."):
        raise BadInputError(f"{folder} holds a {manifest['type']}, not a lens_position result")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise CorruptFileError(f"{manifest_path} names the type {manifest['type']}, which this version of "
                               "lens_position does not have") from error
    if not (isinstance(cls, type) and issubclass(cls, SavedResult) and dataclasses.is_dataclass(cls)):
        raise CorruptFileError(f"{manifest_path} names {manifest['type']}, which is not a saved result type")
    values: dict[str, Any] = {}
    current = manifest_path
    try:
        if manifest["tensors"]:
            current = _verified(folder, manifest, TENSORS)
            tensors = load_file(str(current))
            values.update({name: tensors[name] for name in manifest["tensors"]})
        for name in manifest["frames"]:
            current = _verified(folder, manifest, f"{name}.parquet")
            values[name] = pd.read_parquet(current)
    except CorruptFileError:
        raise
    except Exception as error:  # pyarrow, safetensors and OS errors of a file that passed its hash
        raise CorruptFileError(f"{current} cannot be read ({type(error).__name__}: {error}); "
                               "save the result again") from error
    annotations = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    values.update({name: _restore(annotations.get(name, ""), v) for name, v in manifest["fields"].items()})
    missing = set(annotations) - set(values)
    if missing:
        raise BadInputError(f"{folder} lacks the fields {sorted(missing)} of {class_name}: saved by another version?")
    unknown = set(values) - set(annotations)
    if unknown:
        raise CorruptFileError(f"{manifest_path} has fields {sorted(unknown)} that {class_name} does not have")
    return cls(**values)
