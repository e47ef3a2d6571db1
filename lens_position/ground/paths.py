"""The one check of a path a user hands over: a corpus, an output folder, a cache folder, a spec.

``Path("")`` is ``Path(".")``: an empty string given as a path would silently read or write the
current folder (a corpus of every ``.txt`` file under it, an output or cache folder that is
wherever the command happened to run). :func:`checked_path` refuses it, and a path of spaces
only, before it becomes a :class:`~pathlib.Path`; every public door that takes a path calls it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lens_position.ground.errors import BadInputError


def checked_path(value: Any, what: str) -> Path:
    """``value`` (a ``str`` or ``os.PathLike``) as a :class:`Path`, or BadInputError when it is
    empty, blank (spaces, tabs, newlines only), holds a NUL byte or is not a path at all.
    ``what`` names the argument in the message (``"corpus"``, ``"--out"``, ``"cache_dir"``)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise BadInputError(f"{what} must be a path (a string or pathlib.Path), got {type(value).__name__} "
                            f"{value!r}")
    text = os.fspath(value)
    if isinstance(text, bytes):
        raise BadInputError(f"{what} must be a text path, got bytes {text!r}")
    if not text.strip():
        raise BadInputError(f"{what} is the empty path {text!r}, which would be the current folder; name a "
                            "file or folder (use '.' to mean the current folder)")
    if "\x00" in text:
        raise BadInputError(f"{what} {text!r} holds a NUL byte, which no file name can; check how it was built")
    return Path(text)
