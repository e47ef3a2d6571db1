"""Checks of single arguments, each written once and used by every analysis.

A check returns the value in the form the code uses (a sorted list of layers, a clipped
query range, an ``int``) or raises :class:`~lens_position.ground.errors.BadInputError` with a
message that says what to pass instead. Nothing here truncates or rounds silently: a layer
``0.7`` or a size ``2.7`` is refused, not turned into ``0`` or ``2``.

The context-length check lives with the model facts
(:func:`lens_position.models.spec.check_length`); the check of a whole prompt set is
:func:`lens_position.core.inputs.checked_prompts`.
"""

from __future__ import annotations

import hashlib
import math
import numbers
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from lens_position.ground.errors import BadInputError

if TYPE_CHECKING:  # torch is imported where a tensor is checked: the command line's argument types need none
    import torch

MAX_SEED = 2**63 - 1  # numpy's and torch's generators both take any seed in 0..2**63-1


def check_int(name: str, value: Any) -> int:
    """``value`` as an ``int`` if it is a whole number (``3``, ``np.int64(3)``, ``3.0``)."""
    if isinstance(value, bool):  # True == 1 would pass every other test
        raise BadInputError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and float(value).is_integer():
        return int(float(value))
    if hasattr(value, "ndim") and value.ndim == 0 and hasattr(value, "item"):
        return check_int(name, value.item())  # a 0-d tensor or array
    raise BadInputError(f"{name} must be an integer, got {value!r}")


def check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    """A size (``N``, ``T``, ``batch_size``, ...) as an ``int`` that is at least ``minimum``."""
    count = check_int(name, value)
    if count < minimum:
        raise BadInputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return count


def check_seed(seed: Any) -> int:
    """A random seed: an integer in ``0 .. 2**63 - 1``."""
    value = check_int("seed", seed)
    if not 0 <= value <= MAX_SEED:
        raise BadInputError(f"seed must be an integer in 0..2**63-1, got {seed!r}")
    return value


def parse_layers(text: str) -> list[int]:
    """Layers written as on the command line: ``"0,4,8"``, ``"2:6"`` (layers 2 to 5, as
    ``range(2, 6)``) or both mixed, ``"0,2:4"``. Sorted, without repeats."""
    layers: list[int] = []
    try:
        for part in filter(None, (p.strip() for p in text.split(","))):
            if ":" in part:
                start, stop = (int(x) for x in part.split(":", 1))
                layers.extend(range(start, stop))
            else:
                layers.append(int(part))
    except ValueError:
        raise BadInputError(f"expected layer indices like 0,4,8 or 2:6, got {text!r}") from None
    if not layers or min(layers) < 0:
        raise BadInputError(f"expected one or more layer indices >= 0, got {text!r}")
    return sorted(set(layers))


class CheckedLayers(list):
    """Layers :func:`check_layers` accepted for a model of ``n_layers`` layers (sorted, no
    repeats); handed back to it unchanged, it is returned without a second check."""

    def __init__(self, layers: Iterable[int], n_layers: int) -> None:
        super().__init__(layers)
        self.n_layers = n_layers
        self._as_checked = tuple(self)


def check_layers(layers: Any, n_layers: int) -> list[int]:
    """Layers to analyse: ``None`` (all), one layer, a non-empty collection of layers in
    ``0 .. n_layers - 1``, or a string as on the command line (``"0:6"`` is layers 0 to 5,
    ``"0,6"`` layers 0 and 6: :func:`parse_layers`; a tuple ``(0, 6)`` is the two layers 0 and 6).
    Returns them sorted, without repeats, as :class:`CheckedLayers`."""
    if (isinstance(layers, CheckedLayers) and layers.n_layers == n_layers
            and tuple(layers) == layers._as_checked):
        return layers
    return CheckedLayers(_layers(layers, n_layers), n_layers)


def _layers(layers: Any, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, str):
        layers = parse_layers(layers)
    if isinstance(layers, bytes) or not isinstance(layers, Iterable) and not isinstance(layers, numbers.Number):
        raise BadInputError(f"layers must be a layer index or a list of them, got {layers!r}")
    items = [layers] if isinstance(layers, numbers.Number) else list(layers)
    chosen = sorted({check_int("each layer", layer) for layer in items})
    if not chosen:
        raise BadInputError(f"layers is empty; pass layers in 0..{n_layers - 1}, or None for all")
    outside = [layer for layer in chosen if not 0 <= layer < n_layers]
    if outside:
        raise BadInputError(f"layer {outside[0]} is out of range for a model of {n_layers} layers "
                            f"(valid: 0..{n_layers - 1}); got layers={layers!r}")
    return chosen


class QueryRange(tuple):
    """A query range ``(start, stop)`` :func:`check_query_range` accepted for sequences of
    ``length`` positions; handed back to it for the same length, it is returned without a
    second check."""

    length: int

    def __new__(cls, start: int, stop: int, length: int) -> QueryRange:
        pair = super().__new__(cls, (start, stop))
        pair.length = length
        return pair

    def __getnewargs__(self) -> tuple[int, int, int]:
        return self[0], self[1], self.length


def check_query_range(query_range: Any, length: int, name: str = "query_range") -> tuple[int, int]:
    """Queries ``start <= i < stop`` of sequences of ``length`` positions, as a :class:`QueryRange`.

    ``None`` means all queries. ``stop`` beyond the sequence is cut to ``length`` (so a
    default such as ``(0, 32)`` works for short prompts); the range must keep at least one
    query."""
    if isinstance(query_range, QueryRange) and query_range.length == length:
        return query_range
    return QueryRange(*_query_range(query_range, length, name), length)


def _query_range(query_range: Any, length: int, name: str) -> tuple[int, int]:
    if query_range is None:
        return 0, length
    if isinstance(query_range, (str, bytes)) or not isinstance(query_range, Iterable):
        raise BadInputError(f"{name} must be a pair (start, stop), got {query_range!r}")
    pair = list(query_range)
    if len(pair) != 2:
        raise BadInputError(f"{name} must be a pair (start, stop), got {query_range!r}")
    start, stop = check_int(f"{name} start", pair[0]), check_int(f"{name} stop", pair[1])
    stop = min(stop, length)
    if not 0 <= start < stop:
        raise BadInputError(f"{name} {tuple(query_range)} selects no queries of prompts with T={length} "
                            f"positions; use 0 <= start < stop with start < {length}")
    if stop < 2:
        raise BadInputError(
            f"{name} {tuple(query_range)} holds only query 0, which sees only itself (its attention on "
            "position 0 is 1 in every head): nothing to measure; use a range with stop >= 2 "
            f"(and prompts of T >= 2; these have T={length})")
    return start, stop


def check_position(position: Any, length: int, name: str = "position") -> int:
    """One position of sequences of ``length`` positions, in ``0 .. length - 1``."""
    value = check_int(name, position)
    if not 0 <= value < length:
        raise BadInputError(f"{name} {position!r} is out of range for prompts of {length} positions "
                            f"(valid: 0..{length - 1})")
    return value


def check_heads(heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> list[tuple[int, int]]:
    """``(layer, head)`` pairs of a model of ``n_layers`` layers of ``n_heads`` (query) heads each."""
    checked = []
    for layer, head in heads:
        check_layers([layer], n_layers)
        index = check_int("head", head)
        if not 0 <= index < n_heads:
            raise BadInputError(f"head {head} is out of range ({n_heads} heads)")
        checked.append((int(layer), index))
    return checked


def check_fraction(name: str, value: Any) -> float:
    """A threshold in ``[0, 1]`` (a sink's ``eps``, a share): finite, not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadInputError(f"{name} must be a number in [0, 1], got {value!r}")
    number = float(value)
    if not 0.0 <= number <= 1.0:  # NaN fails both comparisons
        raise BadInputError(f"{name} must lie in [0, 1] (a fraction of attention), got {value!r}")
    return number


def check_positive(name: str, value: Any) -> float:
    """A finite real number ``> 0`` (a ridge penalty, a tolerance): not NaN, not an infinity, not a bool."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise BadInputError(f"{name} must be a positive number, got {value!r}")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise BadInputError(f"{name} must be a finite number > 0, got {value!r}")
    return number


def tokens_sha256(tokens: torch.Tensor) -> str:
    """The identity of a prompt set: sha256 of its token ids as int64, with their shape."""
    import torch

    ids = tokens.detach().to("cpu", torch.int64).contiguous()
    digest = hashlib.sha256(f"{tuple(ids.shape)}|".encode())
    digest.update(ids.numpy().tobytes())
    return digest.hexdigest()


def check_same_origin(base: dict[str, Any], other: dict[str, Any], what: str = "the condition") -> None:
    """Refuse to pair two results (a base and a condition) unless their provenance names the same
    model weights (``model.weights_sha256``) and the same prompts (``tokens_sha256``). A side that
    records a hash the other lacks is refused too: pairing needs proof on both sides."""
    facts = {"model weights (sha256)": lambda p: (p.get("model") or {}).get("weights_sha256"),
             "prompts (token ids sha256)": lambda p: p.get("tokens_sha256")}
    for label, read in facts.items():
        mine, theirs = read(base or {}), read(other or {})
        if mine is None and theirs is None:
            continue
        if mine != theirs:
            raise BadInputError(
                f"{what} and the base come from different {label}: {str(theirs)[:12]} vs {str(mine)[:12]}; "
                "a paired comparison needs both decomposed from the same model on the same prompts")


def check_same_model(loaded: Any, provenance: dict[str, Any], what: str) -> None:
    """Refuse a result ``what`` measured on another model than ``loaded`` (its provenance names
    other weights, or none): an input computed on one model says nothing of another's activations."""
    theirs = ((provenance or {}).get("model") or {}).get("weights_sha256")
    mine = loaded.spec.weights_sha256
    if theirs is None or mine is None or theirs != mine:
        name = ((provenance or {}).get("model") or {}).get("name", "an unnamed model")
        raise BadInputError(
            f"{what} was measured on {name} (weights {str(theirs)[:12]}), not on {loaded.spec.name} (weights "
            f"{str(mine)[:12]}); measure it on this model, e.g. massive_activations(model, prompts)")
