"""Where a warning points: at the researcher's own line, the first frame outside lens_position,
however deep inside the package it was raised (analyses hand the model and prompts down through
helpers and decorators, so no fixed ``stacklevel`` is right for every route)."""

from __future__ import annotations

import sys
from pathlib import Path

__all__ = ["outside_stacklevel"]

_PACKAGE = str(Path(__file__).resolve().parent.parent)


def outside_stacklevel() -> int:
    """The ``stacklevel`` that makes ``warnings.warn``, called in the function that calls this, name
    the first frame outside the lens_position package (the last frame when every frame is inside)."""
    frame = sys._getframe(1)
    level = 1
    while frame.f_back is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    return level
