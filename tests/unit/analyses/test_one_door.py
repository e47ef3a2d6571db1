"""Door plus body: every public function takes its model through the door (``as_loaded``) once per
call, whatever it composes; below the door, bodies and helpers take the ``LoadedModel`` only.

Counted here on both kinds of model a researcher hands in: a ``LoadedModel`` (each door entry takes
the weights' hash again where they changed: ``_current``) and a bare ``HookedTransformer`` (each
door entry wraps it and hashes its weights: ``_bare_spec``). The source itself is checked too: no
function calls ``as_loaded`` unless it is the door, and every function that takes a
``ModelLike`` is a public one (decorated ``@public``) or hands the model straight to one."""

import ast
import inspect
import pathlib

import griffe
import pytest
import torch
from sink_model import sink_reading_model

import lens_position as lp
from lens_position.analyses import patching
from lens_position.analyses.compare import decompose_conditions
from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.prompt_sets import across_prompt_sets
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import window_sinks
from lens_position.analyses.trajectory import trajectory_patching
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.stream import stream
from lens_position.models import spec
from lens_position.models.toy import offset_only_model, random_model, toy_tokens

PACKAGE = pathlib.Path(lp.__file__).parent


@pytest.fixture
def doors(monkeypatch):
    """How many times the door was entered, on a LoadedModel or a bare model."""
    calls = {"n": 0}
    current, bare = spec._current, spec._bare_spec

    def counting(function):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            return function(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(spec, "_current", counting(current))
    monkeypatch.setattr(spec, "_bare_spec", counting(bare))
    return calls


def _tokens(n=4, T=16):
    return toy_tokens(n, T, bos=True, seed=0)


def _last_logit(logits):
    return logits[:, -1, 0].mean()


QUIET = dict(bootstrap=NO_INTERVALS, progress=False)
CALLS = {
    "decompose": lambda m: lp.decompose(m, _tokens(), **QUIET),
    "decompose_dense": lambda m: lp.decompose_dense(m, _tokens()),
    "attention_rollout": lambda m: lp.attention_rollout(m, _tokens(), **QUIET),
    "sink_heads": lambda m: lp.sink_heads(m, _tokens(), **QUIET),
    "window_sinks": lambda m: window_sinks(m, _tokens(), **QUIET),
    "bos_replacement": lambda m: lp.bos_replacement(m, _tokens(3), query_range=(0, 8), seed=0, **QUIET),
    "sink_reading_heads": lambda m: lp.sink_reading_heads(m, _tokens(3), counterfactual="token:3", query_range=(0, 8),
                                                          n_ablate=1, **QUIET),
    "trajectory_patching": lambda m: trajectory_patching(m, _tokens(3), counterfactual="token:3", query_range=(0, 8),
                                                         progress=False),
    "massive_activations": lambda m: lp.massive_activations(m, _tokens(), **QUIET),
    "massive_intervention": lambda m: lp.massive_intervention(m, _tokens(), layer=0, entries=[(0, 1)], **QUIET),
    "sink_metric": lambda m: lp.sink_metric(m, _tokens(), progress=False),
    "sink_origin": lambda m: lp.sink_origin(m, T=8, N=4, conditions=["bos", "no_bos"], **QUIET),
    "position0_convergence": lambda m: position0_convergence(m, _tokens(), **QUIET),
    "rotary_bands": lambda m: rotary_bands(m, _tokens(), n_bands=2, **QUIET),
    "check_positions": lambda m: lp.check_positions(m, _tokens()),
    "decompose_conditions": lambda m: decompose_conditions(m, _tokens(), {"none": []}, progress=False),
    "across_prompt_sets": lambda m: across_prompt_sets(m, 2, T=8, N=4, source="random", **QUIET),
    "analyze": lambda m: lp.analyze(m, _tokens(), **QUIET),
    "stream": lambda m: stream(m, _tokens(), [], progress=False),
    "cache_activations": lambda m: patching.cache_activations(m, _tokens(), ["blocks.0.hook_resid_pre"]),
    "run_patches": lambda m: patching.run_patches(m, _tokens(), [[]], _last_logit),
    "resid_pre_sweep": lambda m: lp.resid_pre_sweep(m, _tokens(2, 6), _tokens(2, 6), _last_logit, layers=[0],
                                                     positions=[1], **QUIET),
    "head_ablation": lambda m: patching.head_ablation(m, [(0, 0)], "zero"),
}


MODELS = {"sink_reading_heads": sink_reading_model, "trajectory_patching": sink_reading_model,
          "position0_convergence": lambda: random_model(n_layers=2, d_vocab=50, seed=5),
          "across_prompt_sets": lambda: lp.load_model("tiny-llama"), "sink_origin": lambda: lp.load_model("tiny-llama")}


@pytest.mark.parametrize("name", sorted(CALLS))
@pytest.mark.parametrize("kind", ["loaded", "bare"])
def test_a_public_call_enters_the_door_once(doors, name, kind):
    loaded = MODELS.get(name, lambda: offset_only_model(n_layers=2, bos_bonus=2.0))()
    model = loaded if kind == "loaded" else loaded.model
    CALLS[name](model)
    assert doors["n"] == 1, f"{name} entered the door {doors['n']} times"


def test_an_edit_between_two_public_calls_is_seen_by_the_second():
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    first = lp.decompose(loaded, _tokens(), **QUIET).provenance["model"]["weights_sha256"]
    next(loaded.model.parameters()).data[0] += 1.0  # through .data: no version counter moves
    second = lp.sink_heads(loaded, _tokens(), **QUIET).provenance["model"]["weights_sha256"]
    assert second != first


def _functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                yield path.relative_to(PACKAGE), node


def _calls(node, name):
    return [sub for sub in ast.walk(node) if isinstance(sub, ast.Call)
            and (getattr(sub.func, "id", None) == name or getattr(sub.func, "attr", None) == name)]


def test_only_the_door_enters_the_door():
    callers = sorted(f"{path}:{node.name}" for path, node in _functions() if _calls(node, "as_loaded")
                     and node.name not in ("door", "public"))
    assert callers == [], "as_loaded is called below the door by " + ", ".join(callers)


def test_a_function_taking_any_model_is_public_or_hands_it_straight_to_one():
    """A ``ModelLike`` parameter means a door: the function is ``@public``, or its body is one call
    that passes the model on (``resid_pre_sweep`` to ``activation_sweep``)."""
    loose = []
    for path, node in _functions():
        arguments = node.args.posonlyargs + node.args.args
        annotation = ast.unparse(arguments[0].annotation or ast.Constant(None)) if arguments else ""
        if "ModelLike" not in annotation or "Tokenizer" in annotation:  # build_prompts takes either
            continue
        decorated = any(ast.unparse(d) == "public" for d in node.decorator_list)
        body = [s for s in node.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
        delegates = len(body) == 1 and isinstance(body[0], ast.Return)
        if not (decorated or delegates or node.name in ("as_loaded", "door", "__call__")):
            loose.append(f"{path}:{node.name}")
    assert loose == []


def test_a_body_is_the_function_itself():
    """``decompose.body`` is what ``decompose`` runs after the door: a composed call gives the same numbers."""
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    tokens = _tokens()
    through_door = lp.decompose(loaded, tokens, **QUIET).heads["R"]
    body = lp.decompose.body(loaded, lp.core.inputs.checked_prompts(loaded, tokens), **QUIET).heads["R"]
    assert torch.equal(torch.tensor(through_door.to_numpy()), torch.tensor(body.to_numpy()))


def test_the_model_is_passed_by_position_or_by_its_name():
    """``help()`` shows ``model`` as the first parameter, so ``model=`` works as a keyword too."""
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    by_position = lp.sink_heads(loaded, _tokens(), **QUIET).scores
    by_name = lp.sink_heads(model=loaded, prompts=_tokens(), **QUIET).scores
    assert torch.equal(by_position, by_name)
    first = next(iter(inspect.signature(lp.sink_heads).parameters.values()))
    assert (first.name, first.annotation, first.kind) == ("model", "ModelLike", first.POSITIONAL_OR_KEYWORD)


def test_the_api_pages_show_the_doors_signature():
    """The rendered API pages read the source through griffe: its extension gives every ``@public``
    function the door's first parameter, as ``help()`` shows it."""
    extension = griffe.load_extensions(str(PACKAGE.parent / "docs/hooks/griffe_door.py") + ":PublicDoor")
    module = griffe.load("lens_position.analyses.decompose", extensions=extension, search_paths=[str(PACKAGE.parent)])
    first = next(iter(module["decompose"].parameters))
    assert (first.name, str(first.annotation)) == ("model", "ModelLike")


#: The door's converters: each turns a user's prompts into checked ones, and is called by public functions only.
PROMPT_DOORS = ("checked_prompts", "as_tokens")


@pytest.mark.parametrize("door", PROMPT_DOORS)
def test_only_public_functions_check_prompts(door):
    """Prompts are checked once, at the public function's door: below it, reducers and helpers take
    ``CheckedPrompts`` (the checker's own module, and ``as_tokens``, a converter, are the door)."""
    callers = sorted(f"{path}:{node.name}" for path, node in _functions() if _calls(node, door)
                     and not any(ast.unparse(d) == "public" for d in node.decorator_list)
                     and str(path) != "core/inputs.py" and node.name not in PROMPT_DOORS)
    assert callers == [], f"{door} is called below the door by " + ", ".join(callers)


def test_no_reducer_or_helper_takes_raw_prompts():
    """A parameter named ``prompts`` below the door is typed ``CheckedPrompts``."""
    raw = []
    for path, node in _functions():
        if (any(ast.unparse(d) == "public" for d in node.decorator_list) or str(path) == "core/inputs.py"
                or node.name in PROMPT_DOORS):
            continue
        for argument in node.args.posonlyargs + node.args.args + node.args.kwonlyargs:
            annotation = ast.unparse(argument.annotation) if argument.annotation else ""
            if argument.arg == "prompts" and "Prompts" in annotation and "CheckedPrompts" not in annotation:
                raw.append(f"{path}:{node.name}({annotation})")
    assert raw == []


@pytest.mark.parametrize("reducer", ["DecompositionReducer", "ProbeReducer", "SinkScoreReducer", "RolloutReducer",
                                     "WindowSinkReducer"])
def test_a_reducer_given_unchecked_prompts_or_a_bare_model_names_the_route(reducer):
    from lens_position.analyses import decompose, probes, rollout, sinks

    cls = next(getattr(m, reducer) for m in (decompose, probes, rollout, sinks) if hasattr(m, reducer))
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    with pytest.raises(lp.BadInputError, match=r"check_prompts\(model, prompts\)"):
        cls(loaded, _tokens())
    with pytest.raises(lp.BadInputError, match=r"as_loaded\(model\)"):
        cls(loaded.model, lp.check_prompts(loaded, _tokens()))
    shorter = offset_only_model(n_layers=2, bos_bonus=2.0, n_ctx=8)  # the 16 positions do not fit its context
    with pytest.raises(lp.BadInputError, match="checked for another model"):
        cls(shorter, lp.check_prompts(loaded, _tokens()))
    assert cls(loaded, lp.check_prompts(loaded, _tokens())) is not None
