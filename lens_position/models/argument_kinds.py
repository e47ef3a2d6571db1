"""The door's check of every argument's kind, read off the public function's own annotations.

A public function (:func:`lens_position.models.spec.public`) checks what each argument *means* in
its body (a layer inside the model, a fraction in [0, 1], a known condition name). What kind of
value each argument is, the door checks first, for every argument of every public function alike:
a number where a number is annotated (``int``: an integer, never ``True``), a string where a
string is, a sequence (not a string) where a sequence is (each item of the annotated kind where that
is one of the package's classes), a mapping (or an object with its methods, as TransformerLens's
``ActivationCache``), a callable, an instance of the package's own classes (``Bootstrap``,
``PositionBins``, ``Patch``). A value of another kind is a ``BadInputError`` naming the argument, the kinds it takes
and what it got, before anything runs; a function's own range checks and their messages are
unchanged. Arguments annotated with a prompt type are left to the input door
(:mod:`lens_position.core.inputs`), and an annotation this module cannot read is not checked.
"""

from __future__ import annotations

import collections.abc as abc
import functools
import inspect
import numbers
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lens_position.ground.errors import BadInputError

#: Items of a sequence checked one by one, at most (a longer one is checked on its first items).
_ITEMS_CHECKED = 1000


@dataclass(frozen=True)
class Kind:
    """What an argument takes: ``types`` (isinstance), ``sequence`` (any non-string sequence, an array
    or a tensor, whose items are of ``items`` where given), ``callable``."""

    types: tuple[type, ...] = ()
    sequence: bool = False
    items: Kind | None = None
    callable: bool = False
    none: bool = False

    def accepts(self, value: Any) -> bool:
        if value is None:
            return self.none
        if self.callable and callable(value):
            return True
        if isinstance(value, bool) and bool not in self.types and not self.sequence:
            return False  # True is no whole number, nor a size
        if self.types and isinstance(value, self.types):
            return True
        if abc.Mapping in self.types and hasattr(value, "keys") and hasattr(value, "__getitem__"):
            return True  # a mapping by its methods (TransformerLens's ActivationCache)
        if self.sequence and _is_sequence(value):
            return self.items is None or isinstance(value, (np.ndarray, torch.Tensor)) or all(
                self.items.accepts(item) for item in list(value)[:_ITEMS_CHECKED])
        return False

    def describe(self) -> str:
        names = [_NAMES.get(t, t.__name__) for t in self.types]
        if self.sequence:
            names.append("a sequence" + (f" of {self.items.describe()}" if self.items is not None else ""))
        if self.callable:
            names.append("a function")
        if self.none:
            names.append("None")
        return " or ".join(dict.fromkeys(names))


_NAMES = {numbers.Integral: "an integer", numbers.Real: "a number", str: "a string", bool: "True or False",
          abc.Mapping: "a mapping"}


def _is_sequence(value: Any) -> bool:
    return (isinstance(value, (abc.Sequence, np.ndarray, torch.Tensor, abc.Set))
            and not isinstance(value, (str, bytes, bytearray)))


def kind_of(hint: Any) -> Kind | None:
    """The :class:`Kind` an annotation ``hint`` stands for; None where it cannot be read (anything goes)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, typing.TypeVar) or hint is inspect.Parameter.empty:
        return None
    if origin is typing.Annotated:
        return kind_of(args[0])
    if origin in (typing.Union, types.UnionType):
        read = [kind_of(arg) for arg in args if arg is not type(None)]
        parts = [part for part in read if part is not None]
        if len(parts) < len(read):
            return None
        return Kind(types=tuple(t for p in parts for t in p.types), sequence=any(p.sequence for p in parts),
                    items=next((p.items for p in parts if p.items is not None), None),
                    callable=any(p.callable for p in parts), none=type(None) in args)
    if origin is typing.Literal:
        return Kind(types=tuple({type(arg) for arg in args}))
    if hint is type(None):
        return Kind(none=True)
    return _plain_kind(hint, origin, args)


def _plain_kind(hint: Any, origin: Any, args: tuple[Any, ...]) -> Kind | None:
    if hint is bool:
        return Kind(types=(bool,))
    if hint is int:
        return Kind(types=(numbers.Integral,))
    if hint is float:
        return Kind(types=(numbers.Real,))
    if hint is str:
        return Kind(types=(str,))
    if origin is abc.Callable or hint is abc.Callable:
        return Kind(callable=True)
    base = origin or hint
    if base in (tuple, list, abc.Sequence, abc.Iterable, abc.Collection, set, frozenset, abc.Set):
        items = kind_of(args[0]) if args and (base is not tuple or len(args) == 2 and args[1] is Ellipsis) else None
        # items are checked when they are the package's own values (patches); numbers and names are the
        # body's to check, with its own words (TransformerLens also names hooks by tuples)
        own = items is not None and not items.sequence and any(t not in _NAMES for t in items.types)
        return Kind(sequence=True, items=items if own else None)
    if base in (dict, abc.Mapping, abc.MutableMapping):
        return Kind(types=(abc.Mapping,))
    array = getattr(hint, "array_type", None)  # a jaxtyping annotation: Float[Tensor, "..."]
    if isinstance(array, type):
        return Kind(types=(array,))
    if isinstance(base, type) and base.__module__.startswith(("lens_position", "torch")):
        return Kind(types=(base,))
    return None


@functools.cache
def _kinds(body: Callable[..., Any]) -> tuple[inspect.Signature, dict[str, Kind]]:
    """``body``'s signature and the kind of each argument after the model (those it can read)."""
    signature = inspect.signature(body)
    kinds: dict[str, Kind] = {}
    for parameter in list(signature.parameters.values())[1:]:
        annotation = parameter.annotation
        if not isinstance(annotation, str) or "Prompts" in annotation or "ActivationCache" in annotation:
            continue
        try:
            hint = eval(annotation, body.__globals__)  # noqa: S307 - the package's own annotation, in its module
        except Exception:  # noqa: BLE001 - a name only the type checker sees: not checked here
            continue
        kind = kind_of(hint)
        if kind is not None:
            kinds[parameter.name] = kind
    return signature, kinds


def check_argument_kinds(body: Callable[..., Any], model: Any, args: tuple[Any, ...],
                         kwargs: Mapping[str, Any]) -> None:
    """BadInputError naming the first argument of a call of ``body`` whose value is not of its annotated kind."""
    signature, kinds = _kinds(body)
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError as error:
        raise BadInputError(f"{body.__name__.removesuffix('.body')}(): {error}") from None
    for name, value in bound.arguments.items():
        kind = kinds.get(name)
        if kind is not None and not kind.accepts(value):
            shown = repr(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise BadInputError(f"{body.__name__}: {name} must be {kind.describe()}, got {type(value).__name__} "
                                f"{shown}")
