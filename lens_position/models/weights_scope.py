"""One look at a model's weights per call: within a call of a public function (or a step of the
pipeline), the input door (:func:`lens_position.models.spec.as_loaded`) reads the bytes of a model's
weights once, at its first look, and afterwards only their layout (each tensor's version counter,
dtype, storage, offset, shape and strides).

Why: the door takes a checksum of every weight's bytes, so that a write through ``.data`` (which
bumps no version counter) is seen and the results carry the hash of the weights that made them.
That is about 0.1 s per GB, paid each time an analysis hands the model to a helper that is itself
public (the stream of passes, the prompt door, the rotary bands of each layer): tens of times per
call. No analysis writes to a model's weights, so within one call the first look stands; a write,
cast or swap that changes a tensor's layout or version is still seen at every look, and the bytes
are read again at the next call. Nothing persists between calls: the scope is a context variable
that ends with the outermost call.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, ParamSpec, TypeVar

__all__ = ["bytes_read", "mark_read", "one_look", "one_look_per_call"]

P = ParamSpec("P")
R = TypeVar("R")

#: the models whose bytes were read in the current scope, by id, held until the scope ends (so an id
#: is not reused by another object within it); None outside any scope
_SEEN: ContextVar[dict[int, Any] | None] = ContextVar("lens_position_weights_seen", default=None)


@contextlib.contextmanager
def one_look() -> Iterator[None]:
    """Within this block, each model's weight bytes are read at the door's first look only. Nested
    blocks join the outermost one."""
    if _SEEN.get() is not None:
        yield
        return
    token = _SEEN.set({})
    try:
        yield
    finally:
        _SEEN.reset(token)


def one_look_per_call(function: Callable[P, R]) -> Callable[P, R]:
    """``function`` run inside :func:`one_look` (a public analysis: the model is looked at in full
    once per call, however many helpers it hands the model to)."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_look():
            return function(*args, **kwargs)

    return wrapper


def bytes_read(owner: object) -> bool:
    """Whether the bytes of ``owner``'s weights were read in the current scope."""
    seen = _SEEN.get()
    return seen is not None and seen.get(id(owner)) is owner


def mark_read(owner: object) -> None:
    """Record that ``owner``'s weight bytes were read in the current scope (no-op outside one)."""
    seen = _SEEN.get()
    if seen is not None:
        seen[id(owner)] = owner
