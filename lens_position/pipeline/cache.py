"""The step cache: every step's result on disk, keyed by everything it depends on.

An entry records the sha256 of each of its files (and of its provenance) when written, and every
read checks them: an entry edited by hand or damaged on disk is recomputed (with a warning), never
reused.

A key is the sha256 of the step name, the model's ``ModelSpec`` (weights hash included; not
how the load went), the data condition with the *contents* hash of its corpus, the sizes
the step runs with, the device and dtype, and the versions of lens_position, torch,
transformers and transformer_lens. Asking for the same step again reads it back, so an
interrupted run resumes where it stopped, and changing anything a result depends on
(an edited corpus file included) reruns what it affects.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lens_position.core.results import current_umask
from lens_position.ground.errors import BadInputError
from lens_position.ground.provenance import jsonable, package_versions

log = logging.getLogger(__name__)


# ModelSpec.extra entries that describe one load (how long it took, whether the weight cache was
# warm), not the model: they must not change a cache key.
LOAD_EVENT_KEYS = ("from_cache", "load_seconds", "cache_dir", "cache_path")


def model_identity(model_spec: Any) -> dict[str, Any]:
    """The model spec as JSON without the entries that describe one load (not the model)."""
    spec = jsonable(model_spec)
    if isinstance(spec, dict) and isinstance(spec.get("extra"), dict):
        spec = {**spec, "extra": {k: v for k, v in spec["extra"].items() if k not in LOAD_EVENT_KEYS}}
    return spec


def key_versions() -> dict[str, str]:
    """Versions of the packages a cached result depends on (``ground.provenance.PACKAGES``)."""
    return package_versions(numbers_only=True)


#: The layout of the tables steps write: raised when a table gains a column the claims or the report
#: read (2: every decomposition records its T), so results cached before are measured again, not
#: read without it.
TABLES_FORMAT = 2


def step_key(step: str, model_spec: Any, config: Mapping[str, Any]) -> str:
    """sha256 of the step's full configuration: step name, model spec (weights hash included;
    not how the load went), data and experiment options (``config``), the versions of
    lens_position, torch, transformers and transformer_lens, and :data:`TABLES_FORMAT`."""
    payload = {"step": step, "model": model_identity(model_spec), "config": jsonable(config),
               "versions": key_versions(), "tables_format": TABLES_FORMAT}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _json_sha256(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


# The Cache Directory Tagging standard's tag (https://bford.info/cachedir/): it marks the folder as
# lens_position's step cache (a run uses and cleans only a folder that has it) and tells backup
# tools they may skip it.
TAG = "CACHEDIR.TAG"
TAG_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
            "# This file is a cache directory tag created by lens_position (its step cache).\n")


def is_step_cache(folder: Path) -> bool:
    """Whether ``folder`` is a lens_position step cache: it holds the tag this package writes (or,
    written before the tag, only step folders of this package's entries)."""
    tag = folder / TAG
    if tag.is_file():
        try:
            return tag.read_bytes().startswith(TAG_TEXT.split("\n")[0].encode())
        except OSError:
            return False
    return _untagged_step_cache(folder)


def _untagged_step_cache(folder: Path) -> bool:
    """A step cache from before the tag: every entry a folder named for a step, holding entries with
    a ``provenance.json`` (or nothing at all)."""
    from lens_position.pipeline.steps import STEPS

    try:
        entries = list(folder.iterdir())
    except OSError:
        return False
    def step_folder(entry: Path) -> bool:
        items = [item for item in entry.iterdir() if not item.name.startswith(".")]
        return all((item / "provenance.json").is_file() for item in items)

    return all(entry.is_dir() and entry.name in STEPS and step_folder(entry) for entry in entries)


# A temporary entry folder older than this is a killed writer's leftover, not a live write.
STALE_AFTER_S = 3600.0


class StepCache:
    """Step results on disk: ``<root>/<step>/<model>-<key[:20]>/`` holding one Parquet file per
    table and ``provenance.json``.

    An entry is written in a temporary folder and renamed into place when complete, so an
    interrupted write never leaves a result that looks finished. Concurrent writers of the
    same entry are safe: the results are the same by construction of the key, so the first
    rename wins and the others discard theirs. Temporary folders left by killed writers
    (older than ``stale_after_s``) are removed when the cache is opened.
    """

    def __init__(self, root: Path, *, stale_after_s: float = STALE_AFTER_S):
        self.root = Path(root)
        self.stale_after_s = stale_after_s
        if self.root.exists() and not is_step_cache(self.root):
            raise BadInputError(f"{self.root} is not a lens_position step cache (it has no {TAG}): it is not "
                                "used, and nothing in it is touched; move it, or choose another --out")
        self.root.mkdir(parents=True, exist_ok=True)
        tag = self.root / TAG
        if not tag.is_file():
            tag.write_text(TAG_TEXT)
        self.removed_leftovers = self._clean_leftovers()

    def _clean_leftovers(self) -> list[Path]:
        removed: list[Path] = []
        if not self.root.is_dir():
            return removed
        now = time.time()
        for tmp in self.root.glob("*/.*-tmp*"):  # the temporaries this class names (store, _publish)
            try:
                if tmp.is_dir() and now - tmp.stat().st_mtime > self.stale_after_s:
                    shutil.rmtree(tmp, ignore_errors=True)
                    removed.append(tmp)
            except OSError:  # another process removed or renamed it meanwhile
                continue
        if removed:
            log.info("removed %d unfinished step-cache entries left by killed writers", len(removed))
        return removed

    def path(self, step: str, model: str, key: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in model)[:60]
        return self.root / step / f"{safe}-{key[:20]}"

    def load(self, step: str, model: str, key: str) -> tuple[dict[str, pd.DataFrame], dict] | None:
        folder = self.path(step, model, key)
        meta = folder / "provenance.json"
        if not meta.is_file():
            return None
        try:
            record = json.loads(meta.read_text())
            if record.get("key") != key:
                return None
            self._verify(folder, record)
            tables = {name: pd.read_parquet(folder / f"{name}.parquet") for name in record["tables"]}
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("ignoring the cached result %s (%s); recomputing it", folder, error)
            return None
        return tables, record["provenance"]

    @staticmethod
    def _verify(folder: Path, record: dict[str, Any]) -> None:
        """ValueError unless every table file and the provenance are those the entry was written
        with (their sha256 recorded in ``provenance.json``)."""
        hashes = record.get("sha256")
        if not isinstance(hashes, dict):
            raise ValueError("the entry records no hashes of its files")
        for name in record["tables"]:
            if _file_sha256(folder / f"{name}.parquet") != hashes.get(name):
                raise ValueError(f"{name}.parquet is not the file the entry was written with (edited or damaged)")
        if _json_sha256(record["provenance"]) != hashes.get("provenance.json"):
            raise ValueError("its provenance is not the one it was written with (edited)")

    def store(self, step: str, model: str, key: str, tables: Mapping[str, pd.DataFrame],
              provenance: Mapping[str, Any]) -> Path:
        folder = self.path(step, model, key)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-tmp", dir=folder.parent))
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it 0700 whatever the umask
        try:
            for name, frame in tables.items():
                frame.to_parquet(tmp / f"{name}.parquet", index=False)
            hashes = {name: _file_sha256(tmp / f"{name}.parquet") for name in tables}
            record = {"key": key, "step": step, "model": model, "tables": list(tables),
                      "provenance": jsonable(provenance)}
            record["sha256"] = {**hashes, "provenance.json": _json_sha256(record["provenance"])}
            (tmp / "provenance.json").write_text(json.dumps(record, indent=1))
            self._publish(tmp, folder, key)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return folder

    def _publish(self, tmp: Path, folder: Path, key: str) -> None:
        """Rename ``tmp`` to ``folder``. A complete entry of the same key already there (another
        writer won the race), whose files are those it recorded, is kept; an incomplete, edited or
        different one is moved aside first."""
        for _ in range(5):
            try:
                os.rename(tmp, folder)
                return
            except OSError:  # the target exists and is not empty
                if self._complete(folder, key):
                    return  # another writer stored the same result first: ours is discarded
                aside = folder.parent / f".{folder.name}-tmp-old-{os.getpid()}-{time.monotonic_ns()}"
                try:
                    os.rename(folder, aside)
                except FileNotFoundError:
                    continue  # it went away meanwhile: try again
                shutil.rmtree(aside, ignore_errors=True)
        raise OSError(f"could not store the step result in {folder}: other writers kept replacing it")

    @staticmethod
    def _complete(folder: Path, key: str) -> bool:
        try:
            record = json.loads((folder / "provenance.json").read_text())
            if record.get("key") != key:
                return False
            StepCache._verify(folder, record)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return False
        return True
