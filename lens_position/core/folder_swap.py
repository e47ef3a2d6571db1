"""A folder written whole beside its place and swapped in, so that a kill at any moment leaves the
old folder or the new one, never neither, and never deletes what was not ours.

A save writes ``.<name>.new-<pid>-<random>`` next to ``<name>``; when complete, the old ``<name>``
(if any) is renamed to ``.<name>.old-<pid>-<random>``, the new one renamed into place, and the old
one removed. Each step is a rename, atomic on one file system. A kill between the two renames
leaves no ``<name>``, but a complete ``.new`` (and the ``.old``) beside it: :func:`recover`, run by
the next save or load of that path, renames the newest complete one into place and removes the
temporaries whose writer is gone (a live writer's, named by its running process id, are left alone).
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from lens_position.ground.files import pid_alive

log = logging.getLogger(__name__)

NEW, OLD = "new", "old"


def temporary(folder: Path, kind: str) -> Path:
    """``.<name>.<kind>-<pid>-<random>`` beside ``folder`` (not created)."""
    return folder.parent / f".{folder.name}.{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _temporaries(folder: Path, kind: str) -> list[Path]:
    return sorted(folder.parent.glob(f".{folder.name}.{kind}-*"))


def _writer_alive(path: Path) -> bool:
    fields = path.name.rsplit("-", 2)
    return len(fields) == 3 and fields[1].isdigit() and int(fields[1]) != os.getpid() and pid_alive(int(fields[1]))


def swap_in(staging: Path, folder: Path) -> None:
    """Put the complete folder ``staging`` at ``folder``: the old one renamed aside, the new one
    renamed in, then the old one removed. Should the second rename fail, the old one is put back."""
    aside = None
    if folder.exists():
        aside = temporary(folder, OLD)
        os.rename(folder, aside)
    try:
        os.rename(staging, folder)
    except OSError:
        if aside is not None and not folder.exists():
            os.rename(aside, folder)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def recover(folder: Path, complete: Callable[[Path], bool]) -> Path | None:
    """Finish what a killed save of ``folder`` left: when ``folder`` is missing, the newest complete
    ``.new`` temporary (else the newest complete ``.old``) is renamed into place; then every
    temporary whose writer is gone is removed. Returns the temporary put in place, if any.
    ``complete(path)`` says whether a temporary holds a whole, verified result."""
    restored = None
    if not folder.exists():
        for kind in (NEW, OLD):
            candidates = [p for p in _temporaries(folder, kind) if not _writer_alive(p) and complete(p)]
            if candidates:
                restored = max(candidates, key=lambda p: p.stat().st_mtime_ns)
                os.rename(restored, folder)
                log.warning("%s: completed a save that was interrupted (from %s)", folder, restored.name)
                break
    for kind in (NEW, OLD):
        for leftover in _temporaries(folder, kind):
            if not _writer_alive(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
    return restored
