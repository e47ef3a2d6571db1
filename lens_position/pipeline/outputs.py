"""The output folder of a run, written whole.

Every file is written under a temporary name in the folder and renamed into place, so no
reader ever sees a half-written file. The run's manifest, ``provenance.json``, is written
twice: first marked ``"complete": false`` before any output is replaced, last (the final
rename) with ``"complete": true`` and the list of the run's files. In between, outputs of
an earlier run that this run does not write (another command's tables, the other table
format, a screenshot) are removed. So the folder always either describes one complete run
or says, in its manifest, that it is incomplete; never one run's tables beside another's
provenance.

The folder is **owned** by the runs that write it: a run only ever replaces or removes files a
previous run's manifest lists (never a file of the user's that happens to be called
``report.png``); a folder that is not empty and holds no manifest is refused unless the run is
told ``force=True`` (``--force``: its files are then kept, and replaced only where this run
writes the same name); a lock (an advisory ``flock`` on the folder, held for the run) refuses a
second run into a folder in use; the empty path is refused (it would mean the current
folder). Files get the user's umask (``0644`` under ``022``), as any other program's would.
"""

from __future__ import annotations

import fcntl
import fnmatch
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lens_position.core.results import current_umask
from lens_position.ground.errors import BadInputError, LensPositionError
from lens_position.ground.files import read_json
from lens_position.ground.paths import checked_path
from lens_position.ground.provenance import jsonable
from lens_position.pipeline.cache import is_step_cache

MANIFEST = "provenance.json"
OWN_ENTRIES = frozenset({MANIFEST, "cache"})  # what a run puts in its folder besides its outputs
TABLE_SUFFIXES = {"parquet": ".parquet", "csv": ".csv"}
_TMP_MARK = ".tmp-"


def atomic_write(path: Path, write: Callable[[Path], Any], *, suffix: str = "") -> Path:
    """Call ``write(tmp)`` with a temporary path beside ``path``, then rename it to ``path``."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=f".{path.stem}{_TMP_MARK}", suffix=suffix or path.suffix, dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        write(tmp)
        os.chmod(tmp, user_file_mode())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def user_file_mode() -> int:
    """``0o666`` less the process's umask: the mode ``open()`` would give a new file
    (``mkstemp`` makes its files 0600, whatever the umask)."""
    return 0o666 & ~current_umask()


def write_table(frame: pd.DataFrame, path_stem: Path, fmt: str) -> Path:
    """Write ``frame`` as ``<stem>.parquet`` or ``<stem>.csv`` (whole: temporary name, then rename)."""
    if fmt not in TABLE_SUFFIXES:
        raise BadInputError(f"unknown table format {fmt!r}; use parquet or csv")
    path = Path(path_stem).with_suffix(TABLE_SUFFIXES[fmt])
    if fmt == "parquet":
        return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the run in ``out`` (None when there is none, it is unreadable, or it is
    not a run's manifest: a JSON object with ``complete``)."""
    try:
        manifest = read_json(Path(out) / MANIFEST, "run manifest")  # a FIFO is refused, never waited on
    except (LensPositionError, OSError):
        return None
    return manifest if isinstance(manifest, dict) and "complete" in manifest else None


def _listed(manifest: Mapping[str, Any] | None) -> set[str]:
    """The plain file names a manifest lists as its run's (never a path out of the folder)."""
    files = manifest.get("files", ()) if manifest else ()
    return {name for name in files if isinstance(name, str) and name and Path(name).name == name
            and name not in OWN_ENTRIES and not name.startswith(".")}


class OutputFolder:
    """One run's outputs in ``out`` (see the module docstring). ``known_names`` and
    ``known_patterns`` are the names any run of this package may write; of them, those a
    previous run's manifest lists and this run does not write are removed before its manifest
    is completed. ``force``: accept a non-empty folder that holds no run (its files are kept).
    Use as a context manager, or call :meth:`close`, to release the folder's lock."""

    def __init__(self, out: Path, known_names: Iterable[str], known_patterns: Iterable[str] = (), *,
                 force: bool = False):
        self.out = prepare_output(out)
        self.known = set(known_names)
        self.patterns = tuple(known_patterns)  # glob patterns of names a run may write (per-condition reports)
        self.written: dict[str, Path] = {}
        self._lock = _take_lock(self.out)
        try:
            self.previous = read_manifest(self.out)
            foreign = sorted(entry.name for entry in self.out.iterdir()
                             if entry.name not in OWN_ENTRIES and _TMP_MARK not in entry.name
                             and not entry.name.startswith(".write-test-"))
            cache = self.out / "cache"
            if cache.exists() and not is_step_cache(cache):  # the user's own folder named cache: never ours
                raise BadInputError(
                    f"the output folder {self.out} holds a folder 'cache' that is not lens_position's step cache "
                    "(no CACHEDIR.TAG): a run keeps its step cache there, so it does not write into this folder, "
                    "--force or not, and touches nothing in it; choose another --out")
            if self.previous is None and foreign and not force:
                raise BadInputError(
                    f"the output folder {self.out} is not empty ({', '.join(foreign[:3])}"
                    f"{', ...' if len(foreign) > 3 else ''}) and holds no run of lens_position (no {MANIFEST}); "
                    "choose a new or empty folder, or pass --force (force=True) to write into it: its own "
                    "files are kept, only files of the same name are replaced")
            for leftover in self.out.glob(f".*{_TMP_MARK}*"):  # a killed run's temporaries
                if leftover.is_file():
                    leftover.unlink(missing_ok=True)
            if self.previous is None:  # claim the folder before anything (the step cache) is written
                self._write_manifest({"complete": False, "files": [],
                                      "note": "a run started here and did not finish; rerun the command"})
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> OutputFolder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the folder's lock (idempotent)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _write_manifest(self, record: Mapping[str, Any]) -> Path:
        return atomic_write(self.out / MANIFEST, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))

    def begin(self, info: Mapping[str, Any]) -> None:
        """Mark the folder as holding an incomplete run, before any output is replaced; the
        manifest keeps listing the previous run's files, so an interrupted run forgets none."""
        record = {"complete": False, **jsonable(info), "files": sorted(_listed(self.previous)),
                  "note": "this run did not finish writing its outputs; rerun the command"}
        self._write_manifest(record)

    def table(self, name: str, frame: pd.DataFrame, fmt: str) -> Path:
        path = write_table(frame, self.out / name, fmt)
        self.written[name] = path
        return path

    def text(self, key: str, filename: str, text: str) -> Path:
        path = atomic_write(self.out / filename, lambda tmp: tmp.write_text(text, encoding="utf-8"))
        self.written[key] = path
        return path

    def file(self, key: str, filename: str, write: Callable[[Path], Any]) -> Path:
        path = atomic_write(self.out / filename, write)
        self.written[key] = path
        return path

    def finish(self, provenance: Mapping[str, Any]) -> Path:
        """Remove the previous run's outputs this run did not write (only files its manifest
        lists), then rename the manifest into place (the last write of a run)."""
        mine = {p.name for p in self.written.values()}
        ours = {name for name in _listed(self.previous)
                if name in self.known or any(fnmatch.fnmatchcase(name, pattern) for pattern in self.patterns)}
        for name in ours - mine:
            path = self.out / name
            if path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)
        record = {**jsonable(provenance), "complete": True, "files": sorted(mine)}
        path = self._write_manifest(record)
        self.written["provenance"] = path
        self.previous = record
        return path


def _take_lock(out: Path) -> Any:
    """An exclusive, non-blocking ``flock`` on the folder itself (released when the handle is
    closed or the process ends: a killed run never leaves a stale lock); BadInputError if
    another run holds it."""
    handle = os.open(out, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(handle)
        raise BadInputError(f"another run is writing to {out} (it holds the folder's lock); wait for it to finish "
                            "or choose another --out") from error
    return handle


def prepare_output(out: Path | str) -> Path:
    """Create the output folder and check it is writable (BadInputError otherwise; also for the
    empty path, which would mean the current folder)."""
    if out is None:
        raise BadInputError("no output folder given; name a folder (--out DIR)")
    out = checked_path(out, "the output folder (--out)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-test-"):
            pass
    except OSError as error:
        raise BadInputError(f"cannot write to the output folder {out}: {error.strerror or error}; "
                            "choose another --out") from error
    return out


def load_tables(out: Path) -> dict[str, pd.DataFrame]:
    """Read back the tables the run in ``out`` wrote (Parquet or CSV). Refuses a folder whose
    manifest says its run is incomplete."""
    from lens_position.pipeline.steps import TABLES

    manifest = read_manifest(out)
    if manifest is not None and manifest.get("complete") is False:
        raise BadInputError(f"the run in {out} did not finish writing its outputs (see {MANIFEST}); "
                            "rerun its command")
    listed = set(manifest.get("files", ())) if manifest else None
    tables = {}
    for name in TABLES:
        for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
            path = Path(out) / f"{name}{suffix}"
            if path.is_file() and (listed is None or path.name in listed):
                tables[name] = reader(path)
                break
    return tables
