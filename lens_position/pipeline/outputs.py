"""The output folder of a run, written whole.

Every file is written under a temporary name in the folder and renamed into place, so no
reader ever sees a half-written file. The run's manifest, ``provenance.json``, is written
twice: first marked ``"complete": false`` before any output is replaced, last (the final
rename) with ``"complete": true`` and the list of the run's files. In between, outputs of
an earlier run that this run does not write (another command's tables, the other table
format, a screenshot) are removed. So the folder always either describes one complete run
or says, in its manifest, that it is incomplete; never one run's tables beside another's
provenance.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

import pandas as pd

from lens_position.ground.errors import BadInputError
from lens_position.ground.provenance import jsonable

MANIFEST = "provenance.json"
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
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def write_table(frame: pd.DataFrame, path_stem: Path, fmt: str) -> Path:
    """Write ``frame`` as ``<stem>.parquet`` or ``<stem>.csv`` (whole: temporary name, then rename)."""
    if fmt not in TABLE_SUFFIXES:
        raise BadInputError(f"unknown table format {fmt!r}; use parquet or csv")
    path = Path(path_stem).with_suffix(TABLE_SUFFIXES[fmt])
    if fmt == "parquet":
        return atomic_write(path, lambda tmp: frame.to_parquet(tmp, index=False))
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def read_manifest(out: Path) -> dict[str, Any] | None:
    """The manifest of the run in ``out`` (None when there is none or it is unreadable)."""
    try:
        return json.loads((Path(out) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


class OutputFolder:
    """One run's outputs in ``out`` (see the module docstring). ``known_names`` are the file
    names any run of this package may write there; those not written by this run are removed
    before its manifest is completed."""

    def __init__(self, out: Path, known_names: Iterable[str], known_patterns: Iterable[str] = ()):
        self.out = prepare_output(out)
        self.known = set(known_names)
        self.patterns = tuple(known_patterns)  # glob patterns of names a run may write (per-condition reports)
        self.written: dict[str, Path] = {}
        for leftover in self.out.glob(f".*{_TMP_MARK}*"):  # a killed run's temporaries
            if leftover.is_file():
                leftover.unlink(missing_ok=True)

    def begin(self, info: Mapping[str, Any]) -> None:
        """Mark the folder as holding an incomplete run, before any output is replaced."""
        record = {"complete": False, **jsonable(info),
                  "note": "this run did not finish writing its outputs; rerun the command"}
        atomic_write(self.out / MANIFEST, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))

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
        """Remove earlier runs' outputs this run did not write, then rename the manifest into
        place (the last write of a run)."""
        mine = {p.name for p in self.written.values()}
        matching = {p.name for pattern in self.patterns for p in self.out.glob(pattern) if p.is_file()}
        for name in (self.known | matching) - mine:
            (self.out / name).unlink(missing_ok=True)
        record = {**jsonable(provenance), "complete": True, "files": sorted(mine)}
        path = atomic_write(self.out / MANIFEST, lambda tmp: tmp.write_text(json.dumps(record, indent=1)))
        self.written["provenance"] = path
        return path


def prepare_output(out: Path) -> Path:
    """Create the output folder and check it is writable (BadInputError otherwise)."""
    out = Path(out)
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
    from lens_position.report import html as report_module

    manifest = read_manifest(out)
    if manifest is not None and manifest.get("complete") is False:
        raise BadInputError(f"the run in {out} did not finish writing its outputs (see {MANIFEST}); "
                            "rerun its command")
    listed = set(manifest.get("files", ())) if manifest else None
    tables = {}
    for name in report_module.TABLES:
        for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
            path = Path(out) / f"{name}{suffix}"
            if path.is_file() and (listed is None or path.name in listed):
                tables[name] = reader(path)
                break
    return tables
