"""A folder written whole beside its place and swapped in, so that a kill at any moment leaves the
old folder or the new one, never neither, and never deletes what was not ours.

A save writes ``.<name>.new-<pid>-<random>`` next to ``<name>``; when complete, the old ``<name>``
(if any) is renamed to ``.<name>.old-<pid>-<random>``, the new one renamed into place, and the old
one removed. Each step is a rename, atomic on one file system. A kill between the two renames
leaves no ``<name>``, but a complete ``.new`` (and the ``.old``) beside it: :func:`recover`, run by
the next save or load of that path, renames the newest complete one into place and removes the
temporaries whose writer is gone (a live writer's, named by its running process id, are left alone;
so are this process's own, another thread's save in progress: a temporary's name carries a token of
the process that made it, so a later process given the same id takes it for a dead writer's).

A ``<name>`` that is a symbolic link stands for the folder it points to: the save is written beside
that folder and swapped in there, and the link is left as it is (``--out`` through a link writes into
its target the same way).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from lens_position.ground.files import pid_alive

log = logging.getLogger(__name__)

NEW, OLD = "new", "old"
#: This process's token, the first 8 hex digits of its temporaries' random part (module docstring).
_PROCESS = uuid.uuid4().hex[:8]


def through_link(folder: Path) -> Path:
    """``folder``, or the folder it points to when it is a symbolic link (module docstring)."""
    return Path(os.path.realpath(folder)) if folder.is_symlink() else folder


def temporary(folder: Path, kind: str) -> Path:
    """``.<name>.<kind>-<pid>-<process token><random>`` beside ``folder`` (not created)."""
    folder = through_link(folder)
    return folder.parent / f".{folder.name}.{kind}-{os.getpid()}-{_PROCESS}{uuid.uuid4().hex[:8]}"


def _temporaries(folder: Path, kind: str) -> list[Path]:
    return sorted(folder.parent.glob(f".{folder.name}.{kind}-*"))


def _writer_alive(path: Path) -> bool:
    """Whether the save that made ``path`` may still run: this process's (another thread's), or one of a
    running process other than this one (the same id with another token is a dead writer's)."""
    fields = path.name.rsplit("-", 2)
    if len(fields) != 3 or not fields[1].isdigit():
        return False
    if int(fields[1]) == os.getpid():
        return fields[2].startswith(_PROCESS)
    return pid_alive(int(fields[1]))


#: How often a swap tries again when another save (a thread of this process, another process) put its
#: folder in place between this one's two renames: each try moves that folder aside in turn.
_SWAP_TRIES = 64


def swap_in(staging: Path, folder: Path) -> None:
    """Put the complete folder ``staging`` at ``folder``: the old one renamed aside, the new one
    renamed in, then the old one removed. Should the second rename fail, the old one is put back.
    Saves racing for one path each land whole, the last one to rename staying in place."""
    folder = through_link(folder)
    asides: list[Path] = []
    for _ in range(_SWAP_TRIES):
        if folder.exists():
            aside = temporary(folder, OLD)
            try:
                os.rename(folder, aside)
                asides.append(aside)
            except FileNotFoundError:  # another save moved it aside first
                pass
        try:
            os.rename(staging, folder)
            break
        except OSError as error:
            if error.errno in (errno.ENOTEMPTY, errno.EEXIST) and staging.exists():
                continue  # another save renamed its folder in meanwhile: move that one aside too
            if asides and not folder.exists():
                os.rename(asides.pop(), folder)
            raise
    else:
        raise OSError(errno.EBUSY, f"{_SWAP_TRIES} other saves replaced it while this one was swapped in", str(folder))
    for aside in asides:
        shutil.rmtree(aside, ignore_errors=True)


def recover(folder: Path, complete: Callable[[Path], bool]) -> Path | None:
    """Finish what a killed save of ``folder`` left: when ``folder`` is missing, the newest complete
    ``.new`` temporary (else the newest complete ``.old``) is renamed into place; then every
    temporary whose writer is gone is removed. Returns the temporary put in place, if any.
    ``complete(path)`` says whether a temporary holds a whole, verified result."""
    folder = through_link(folder)
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
