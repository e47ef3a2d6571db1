"""Model requests of a run: ``"name@option=value@..."`` strings, checked and loaded."""

from __future__ import annotations

import difflib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lens_position.ground.errors import BadInputError

# Load options a model request may carry after '@' (see parse_model_request) and their types.
_LOAD_OPTIONS: dict[str, type] = {"ntk_alpha": float, "ntk_by_parts": dict, "window": int, "n_ctx": int}
_EXAMPLES = {"ntk_alpha": "4", "ntk_by_parts": '{"factor":4}', "window": "64", "n_ctx": "4096"}


log = logging.getLogger(__name__)

def parse_model_request(request: str) -> tuple[str, dict[str, Any]]:
    """Split ``"name@option=value@..."`` into the model name and ``load_model`` options.

    Options: ``ntk_alpha=<float>``, ``ntk_by_parts`` (Llama-3 defaults) or
    ``ntk_by_parts=<json object>``, ``window=<int>``, ``n_ctx=<int>``; e.g.
    ``tiny-llama@ntk_alpha=8`` or ``smollm2-135m@ntk_by_parts={"factor":4}``. A path that holds an
    ``@`` of its own (``runs/v2@final/model.gguf``) is read as a path: options are peeled off the
    end only where they name a load option.
    """
    name, parts = _split_request(request)
    options: dict[str, Any] = {}
    for part in parts:
        key, _, value = part.partition("=")
        if key not in _LOAD_OPTIONS:
            near = difflib.get_close_matches(key, _LOAD_OPTIONS, n=1, cutoff=0.6)
            guess = f" (did you mean {near[0]!r}?)" if near else ""
            raise BadInputError(f"unknown load option {key!r} in model {request!r}{guess}; use "
                                f"{', '.join(_LOAD_OPTIONS)}")
        kind = _LOAD_OPTIONS[key]
        try:
            if kind is dict:
                options[key] = json.loads(value) if value else {}
                if not isinstance(options[key], dict):
                    raise ValueError("not a JSON object")
            else:
                options[key] = kind(value)
        except ValueError:
            wanted = {int: "a whole number", float: "a number", dict: "a JSON object such as {\"factor\": 4}, or "
                      "nothing (the defaults)"}[kind]
            raise BadInputError(f"bad value {value!r} for {key} in model {request!r}: {key} takes {wanted}, e.g. "
                                f"{name}@{key}={_EXAMPLES[key]}") from None
    if not name:
        raise BadInputError(f"model request {request!r} has no model name")
    return name, options


def _split_request(request: str) -> tuple[str, list[str]]:
    """(name, option parts): ``@option=value`` parts peeled off the end while they name a load
    option; an existing path is a name whole."""
    if Path(request).expanduser().exists():
        return request, []
    name: str = request
    parts: list[str] = []
    while "@" in name:
        head, _, tail = name.rpartition("@")
        if tail.partition("=")[0] not in _LOAD_OPTIONS:
            break
        parts.insert(0, tail)
        name = head
    if "@" in name and not Path(name).expanduser().exists():
        first, _, rest = name.partition("@")  # an unknown option (a typo) after a name that is no path
        return first, [rest.split("@")[0], *parts]
    return name, parts


def load_request(request: str, compute: Any = None) -> Any:
    """Load the model a request names (offline), with its '@' options, on ``compute``'s
    device and in its dtype (``lens_position.pipeline.devices``)."""
    from lens_position.models import load_model

    name, options = parse_model_request(request)
    if compute is None:
        return load_model(name, offline=True, **options)
    from lens_position.pipeline.devices import load_on

    return load_on(lambda **kw: load_model(name, offline=True, backend=compute.backend, **options, **kw), compute)


def check_models(requests: Sequence[str]) -> None:
    """Fail fast on a request whose name is neither a registry model nor an existing path
    (UnknownModelError) or whose options are malformed (BadInputError)."""
    from lens_position.models.registry import check_model_name

    if not requests:
        raise BadInputError("no models given; pass --models with at least one name")
    if len(set(requests)) != len(requests):
        raise BadInputError(f"a model is listed twice in {', '.join(requests)}")
    for request in requests:
        name, _ = parse_model_request(request)
        if name.startswith("zoo:"):
            from lens_position.models.zoo.store import find

            find(name)
        else:
            check_model_name(name)  # a missing path is a missing file, not an unknown model


def check_layers(model: str, layers: Sequence[int] | None, n_layers: int) -> None:
    """Refuse ``--layers`` that name a layer ``model`` (of ``n_layers`` blocks) does not have."""
    beyond = [layer for layer in layers or () if not 0 <= layer < n_layers]
    if beyond:
        raise BadInputError(f"--layers {','.join(map(str, layers or ()))}: {model} has {n_layers} layers (0 to "
                            f"{n_layers - 1}), so layer {beyond[0]} does not exist; use layers 0 to {n_layers - 1}, "
                            f"e.g. --layers 0:{n_layers}")


def check_shapes(requests: Sequence[str], *, layers: Sequence[int] | None, T: int | None) -> None:
    """Refuse, from each model's config alone (:func:`lens_position.models.shape.model_shape`),
    ``layers`` it does not have and a ``T`` beyond its context; a model whose config cannot be
    read that way is checked when it loads."""
    from lens_position.models.shape import model_shape
    from lens_position.models.spec import check_length

    for request in requests:
        name, options = parse_model_request(request)
        shape = model_shape(name, options)
        if shape is None:
            continue
        check_layers(request, layers, shape.n_layers)
        if T is not None:
            check_length(shape.n_ctx, T, request)


def expand_zoo(requests: Sequence[str], backend: str = "auto",
               seeds: Sequence[int] | None = None) -> tuple[str, ...]:
    """Replace the request ``zoo`` by every shipped zoo checkpoint (all variants; all seeds, or
    those in ``seeds``) that ``backend`` can run: with ``backend="bridge"`` named, the variants no
    Hugging Face family computes (learned absolute positions) are left out, with a warning that
    names them and the backend that runs them (``"auto"`` runs every variant on either
    TransformerLens line). A checkpoint named explicitly is kept (and refused when it loads)."""
    expanded: list[str] = []
    for request in requests:
        if request == "zoo":
            from lens_position.models.zoo.store import checkpoints

            found = [c for c in checkpoints() if seeds is None or c.seed in seeds]
            if backend == "bridge":  # "auto" on 4.x loads learned positions as a MiniTransformer
                from lens_position.ground.errors import UnsupportedArchitectureError
                from lens_position.models.zoo.hf import check_convertible

                kept, left = [], []
                for checkpoint in found:
                    try:
                        check_convertible(checkpoint.recipe)
                        kept.append(checkpoint)
                    except UnsupportedArchitectureError:
                        left.append(checkpoint.name)
                if left:
                    log.warning("the zoo on the bridge backend leaves out %s: learned absolute positions have no "
                                "Hugging Face family; they run on backend='auto' (a HookedTransformer on "
                                "TransformerLens 3.x, a MiniTransformer on 4.x)",
                                ", ".join(left))
                found = kept
            expanded.extend(c.name for c in found)
        else:
            expanded.append(request)
    return tuple(expanded)


def architecture_label(spec: Any, request: str | None = None) -> tuple[str, str]:
    """(label, role) of a model: e.g. ("NTK-scaled RoPE: smollm2-135m-ntk", "ntk"); the role is
    ``ModelSpec.role``."""
    from lens_position.analyses.claims import ROLE_NAMES

    return f"{ROLE_NAMES[spec.role]}: {request or spec.name}", spec.role
