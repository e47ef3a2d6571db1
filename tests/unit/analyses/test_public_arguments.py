"""Every public function, every argument, bad values by class: each call ends in a result or a
``LensPositionError`` (one sentence naming the argument and the route), never another exception type.

The baseline calls are small and valid; hypothesis replaces one keyword argument at a time with a
value drawn for its annotated type (wrong types, out-of-range numbers, NaN and infinities, empty and
unknown strings, misshapen ranges), over the signature of each ``@public`` function."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sink_model import sink_reading_model

import lens_position as lp
from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import window_sinks
from lens_position.analyses.trajectory import trajectory_patching
from lens_position.core.intervals import NO_INTERVALS
from lens_position.ground.errors import LensPositionError
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

TOKENS = toy_tokens(4, 16, bos=True, seed=0)
QUIET = {"bootstrap": NO_INTERVALS, "progress": False}

#: name -> (function, model, positional arguments, keyword arguments): a small valid call.
CALLS = {
    "decompose": (lp.decompose, "offset", (TOKENS,), QUIET),
    "sink_heads": (lp.sink_heads, "offset", (TOKENS,), QUIET),
    "window_sinks": (window_sinks, "offset", (TOKENS,), QUIET),
    "attention_rollout": (lp.attention_rollout, "offset", (TOKENS,), QUIET),
    "massive_activations": (lp.massive_activations, "offset", (TOKENS,), QUIET),
    "massive_intervention": (lp.massive_intervention, "offset", (TOKENS,), {"layer": 0, "entries": [(0, 1)], **QUIET}),
    "sink_metric": (lp.sink_metric, "offset", (TOKENS,), {"progress": False}),
    "position_probe": (lp.position_probe, "offset", (TOKENS,), {"ridge": 1.0, **QUIET}),
    "bos_replacement": (lp.bos_replacement, "offset", (TOKENS[:3],), {"query_range": (0, 8), "seed": 0, **QUIET}),
    "sink_reading_heads": (lp.sink_reading_heads, "sink", (TOKENS[:3],),
                           {"counterfactual": "token:3", "query_range": (0, 8), "n_ablate": 1, **QUIET}),
    "trajectory_patching": (trajectory_patching, "sink", (TOKENS[:3],),
                            {"counterfactual": "token:3", "query_range": (0, 8), "progress": False}),
    "rotary_bands": (rotary_bands, "offset", (TOKENS,), {"n_bands": 2, **QUIET}),
    "position0_convergence": (position0_convergence, "random", (TOKENS,), {"n_tokens": 1, "n_random": 1, **QUIET}),
    "check_positions": (lp.check_positions, "offset", (TOKENS,), {}),
    "sink_origin": (lp.sink_origin, "tiny", (), {"T": 8, "N": 4, "conditions": ["bos", "no_bos"], **QUIET}),
    "check_prompts": (lp.check_prompts, "offset", (TOKENS,), {}),
    "decompose_dense": (lp.decompose_dense, "offset", (TOKENS,), {}),
    "analyze": (lp.analyze, "offset", (TOKENS,), {"early_queries": 8, "sink_length": 8, **QUIET}),
    "fingerprint": (lp.fingerprint, "tiny", (), {"T": 8, "N": 2, "source": "random", "progress": False}),
    "length_sweep": (lp.length_sweep, "tiny", ((8, 12),), {"N": 2, "source": "random", **QUIET}),
    "sink_rate": (lp.sink_rate, "tiny", (), {"T": 8, "N": 2, "conditions": ["random"], **QUIET}),
    "positional_leakage": (lp.positional_leakage, "tiny", (), {"n_samples": 2, "n_seeds": 1, "max_length": 16,
                                                               "n_boot": 20, "n_perm": 20, "progress": False}),
    "run_patches": (lp.run_patches, "offset", (TOKENS, [[]], lambda logits: logits[:, -1, 0]), {"progress": False}),
}
MODELS = {"offset": lambda: offset_only_model(n_layers=2, bos_bonus=2.0),
          "sink": sink_reading_model,
          "random": lambda: random_model(n_layers=2, d_vocab=50, seed=5),
          "tiny": lambda: lp.load_model("tiny-llama")}
_LOADED: dict[str, object] = {}


def _model(kind: str):
    if kind not in _LOADED:
        _LOADED[kind] = MODELS[kind]()
    return _LOADED[kind]


class Unusable:
    """An object of no type any argument takes."""


NUMBERS = st.sampled_from([-1, 0, 2.5, -0.5, math.nan, math.inf, -math.inf, 10**12, True, "3"])


def bad_values(annotation: str) -> st.SearchStrategy:
    """Values of the wrong kind or out of range for an argument annotated ``annotation``."""
    annotation = annotation.replace(" ", "")
    wrong = st.sampled_from([Unusable(), "", "no-such-value", b"bytes", [Unusable()], {"a": 1}])
    if annotation.startswith(("tuple[int,int]", "tuple[int,int]|None")):
        return wrong | st.sampled_from([(5, 2), (0,), (-1, 3), (0.5, 3), "0:8", (0, 10**9), (math.nan, 2)])
    if "Sequence[int]" in annotation or "list[int]" in annotation:
        return wrong | st.sampled_from([[99], [-1], "0", [0.5], [], [True], [math.nan]])
    if annotation.startswith(("int", "float")) or "|int" in annotation or "|float" in annotation:
        return wrong | NUMBERS
    if annotation.startswith("bool"):
        return wrong | st.sampled_from(["yes", 2, math.nan])
    if annotation.startswith("str") or "Literal" in annotation:
        return wrong | st.sampled_from([3, ["token:3"], "token:", "token:-1", "token:999999", "  "])
    return wrong | NUMBERS


def _arguments():
    for name, (function, _, _, kwargs) in sorted(CALLS.items()):
        for parameter in list(inspect.signature(function).parameters.values())[1:]:
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            if parameter.name in ("progress", "prompts") and parameter.name not in kwargs:
                continue  # progress is any truthy value; prompts have their own tests (test_inputs.py)
            yield name, parameter.name, str(parameter.annotation)


ARGUMENTS = list(_arguments())


@pytest.mark.fault(area="options", given="any public function with a wrong type or an out-of-range value in any "
                                         "argument (a hypothesis strategy per annotated type, over every signature)",
                   happens="a LensPositionError (one sentence naming the argument), or a result; never another "
                           "exception type")
@pytest.mark.parametrize("name, argument, annotation", ARGUMENTS, ids=[f"{n}-{a}" for n, a, _ in ARGUMENTS])
@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_bad_argument_is_a_lens_position_error_or_a_result(name, argument, annotation, data):
    function, kind, args, kwargs = CALLS[name]
    value = data.draw(bad_values(annotation), label=argument)
    names = list(inspect.signature(function).parameters)[1:]
    if argument in names[:len(args)]:  # given by position in the baseline call: replaced there
        at = names.index(argument)
        args, kwargs = (*args[:at], value, *args[at + 1:]), kwargs
    else:
        kwargs = {**kwargs, argument: value}
    try:
        function(_model(kind), *args, **kwargs)
    except LensPositionError:
        pass
    except Exception as error:  # noqa: BLE001 - the property: nothing but the package's own errors
        raise AssertionError(f"{name}({argument}={value!r}) raised {type(error).__name__}: {error}") from error


def test_every_public_function_of_the_package_is_called_here():
    """The baseline calls cover every function ``lens_position`` exports that goes through the door."""
    exported = {name for name in lp.__all__ if hasattr(getattr(lp, name), "body")}
    assert exported - set(CALLS) == set(), sorted(exported - set(CALLS))
    assert torch.equal(TOKENS, toy_tokens(4, 16, bos=True, seed=0))  # no call wrote into the shared tokens


@pytest.mark.parametrize("options", [{"layers": "0:2"}, {"layers": 1}, {"layers": __import__("numpy").int64(1)},
                                     {"layers": (0, 1)}, {"query_range": [0, 8]}, {"batch_size": __import__(
                                         "numpy").int64(2)}, {"layers": None}])
def test_every_documented_form_of_an_argument_passes_the_door(options):
    """The door checks kinds, not forms: a layer string as on the command line, one layer, numpy
    integers and a list for a range each reach the body, which reads them as documented."""
    result = lp.decompose(_model("offset"), TOKENS, **options, **QUIET)
    assert len(result.layers) >= 1
