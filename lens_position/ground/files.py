"""Files as a user's machine gives them: the one place that reads a file safely and turns what the
operating system refuses into a sentence.

- :func:`read_bytes` / :func:`read_text` / :func:`read_json` read only regular files: a FIFO, a
  device or a socket handed over as a result, spec, corpus or manifest is refused at once (reading
  one would block forever), a folder is named as such, JSON nested past what a parser can take is a
  damaged file, not a crash.
- :func:`resource_error` turns an ``OSError`` (no space, read-only, permission, not a folder, too
  many open files, ...) or a ``MemoryError`` into a :class:`~lens_position.ground.errors.ResourceError`
  that names the path and what to do, never ``[Errno 28] ...``.
- :func:`pid_alive` tells a live writer's temporary folder from one a killed writer left.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any

from lens_position.ground.errors import BadInputError, CorruptFileError, ResourceError

# errno -> (what happened, what to do); "{path}" is filled in.
_SENTENCES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("the disk holding {path} is full", "free space there, or choose a folder on another disk"),
    errno.EDQUOT: ("your disk quota for {path} is used up", "free space there, or choose a folder on another disk"),
    errno.EROFS: ("{path} is on a read-only file system", "choose a folder you can write to"),
    errno.EACCES: ("permission denied for {path}", "choose a folder you own, or change its permissions"),
    errno.EPERM: ("the operation is not permitted on {path}", "choose a folder you own, or change its permissions"),
    errno.ENOTDIR: ("a part of {path} is a file, not a folder", "choose another path, or move that file"),
    errno.EISDIR: ("{path} is a folder where a file is expected", "name the file, not its folder"),
    errno.ENOENT: ("{path} does not exist", "check the path"),
    errno.EEXIST: ("{path} already exists", "choose another path, or remove it"),
    errno.ENAMETOOLONG: ("the path {path} is too long", "choose a shorter path"),
    errno.ELOOP: ("{path} is a loop of symbolic links", "fix the links, or choose another path"),
    errno.EMFILE: ("too many files are open (opening {path})", "raise the limit (`ulimit -n`) or run fewer things "
                   "at once"),
    errno.ENFILE: ("too many files are open on this machine (opening {path})", "run fewer things at once"),
    errno.EIO: ("the disk failed to read or write {path}", "check the disk; copy the data elsewhere"),
    errno.ENOTEMPTY: ("{path} is not empty", "choose another path"),
    errno.EXDEV: ("{path} is on another file system than its temporary copy", "choose a folder on one disk"),
}


def resource_error(error: BaseException, path: Any = None, doing: str = "") -> ResourceError:
    """A ResourceError that says what the machine refused, on which path, while doing what, and what
    to do. ``error`` is an ``OSError`` (its ``filename`` preferred over ``path``) or a
    ``MemoryError``; ``doing`` reads after "while" ("saving the result")."""
    where = f" while {doing}" if doing else ""
    if isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError":
        return ResourceError(f"out of memory{where}: lower N, T or the batch size, or use a machine with more "
                             "memory")
    if isinstance(error, ResourceError):
        return error
    named = getattr(error, "filename", None) or path
    shown = str(named) if named is not None else "the file"
    code = getattr(error, "errno", None)
    if code in _SENTENCES:
        what, route = _SENTENCES[code]
        return ResourceError(f"{what.format(path=shown)}{where}; {route}")
    reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
    return ResourceError(f"{shown}: {reason}{where}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def read_bytes(path: Path | str, what: str = "file") -> bytes:
    """The bytes of the regular file ``path``; BadInputError for anything else (a FIFO is refused
    without blocking), ResourceError for what the OS refuses. ``what`` names it in messages."""
    path = Path(path)
    try:
        handle = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise resource_error(error, path, f"reading the {what}") from error
    try:
        mode = os.fstat(handle).st_mode
        if not stat.S_ISREG(mode):
            raise BadInputError(f"the {what} {path} is {_kind(mode)}, not a regular file; pass a file")
        with os.fdopen(handle, "rb") as reader:
            handle = -1
            return reader.read()
    except OSError as error:
        raise resource_error(error, path, f"reading the {what}") from error
    finally:
        if handle >= 0:
            os.close(handle)


def read_text(path: Path | str, what: str = "file") -> str:
    """:func:`read_bytes` decoded as UTF-8 (CorruptFileError naming the file if it is not)."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise CorruptFileError(f"the {what} {path} is not UTF-8 text (byte {error.start}); pass a text file") from error


def read_json(path: Path | str, what: str = "file") -> Any:
    """:func:`read_text` parsed as JSON; CorruptFileError naming the file for text that is not JSON
    or nests deeper than a parser can take."""
    text = read_text(path, what)
    try:
        return json.loads(text)
    except RecursionError as error:
        raise CorruptFileError(f"the {what} {path} nests its JSON too deep to read; it is damaged or not "
                               "one lens_position wrote") from error
    except ValueError as error:
        raise CorruptFileError(f"the {what} {path} is not JSON ({error}); it is damaged or not one "
                               "lens_position wrote") from error


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (owned by anyone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by someone else
        return True
    except OSError:
        return False
    return True
