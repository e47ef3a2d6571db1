"""Each input is checked once: a public entry point turns its prompts into a checked prompt set
at the door (``lens_position.core.inputs``), its layers and query range into checked values
(``lens_position.core.checks``), and passes them down; nothing below checks them again."""

import pytest
import torch
from sink_model import sink_reading_model

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.compare import decompose_conditions
from lens_position.analyses.patching import Patch
from lens_position.analyses.sinks import sink_reading_heads
from lens_position.core import checks, inputs
from lens_position.core.data import PromptSet
from lens_position.core.intervals import NO_INTERVALS
from lens_position.models.spec import as_loaded
from lens_position.models.tiny import byte_tokenizer
from lens_position.models.toy import offset_only_model, random_model, toy_tokens


@pytest.fixture
def counted(monkeypatch):
    """How often the door checks prompts of the shape handed in (``[N, T]``: an analysis's own
    one-token runs on a counterfactual token 0 are other inputs) and the checks module validates
    a query range / layers."""
    calls = {"prompts": 0, "query_range": 0, "layers": 0}

    def counting(name, function):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)
        return wrapper

    def counting_prompts(loaded, tokens, *args, **kwargs):
        calls["prompts"] += tokens.shape[1] > 1
        return check_tokens(loaded, tokens, *args, **kwargs)

    check_tokens = inputs._check_tokens
    monkeypatch.setattr(inputs, "_check_tokens", counting_prompts)
    monkeypatch.setattr(checks, "_query_range", counting("query_range", checks._query_range))
    monkeypatch.setattr(checks, "_layers", counting("layers", checks._layers))
    return calls


def test_bos_replacement_checks_its_prompts_and_query_range_once(counted):
    bos_replacement(offset_only_model(n_layers=2, bos_bonus=2.0), toy_tokens(3, 16, bos=True, seed=0),
                    query_range=(0, 8), seed=0, bootstrap=NO_INTERVALS)
    assert counted["prompts"] == 1
    assert counted["query_range"] == 1


def test_decompose_conditions_checks_its_prompts_once(counted):
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    tokens = toy_tokens(3, 16, bos=True, seed=0)
    content_only = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    decompose_conditions(loaded, tokens, {"erase": [Patch("hook_embed", content_only, position=0)],
                                          "again": [Patch("hook_embed", content_only, position=0)]},
                         layers=[1], query_range=(0, 8), batch_size=2)
    assert counted["prompts"] == 1
    assert counted["query_range"] == 1
    assert counted["layers"] <= 1


def test_sink_reading_heads_checks_its_prompts_once(counted):
    sink_reading_heads(sink_reading_model(), toy_tokens(3, 16, bos=True, seed=0), query_range=(0, 8), n_ablate=1,
                       bootstrap=NO_INTERVALS)
    assert counted["prompts"] == 1
    assert counted["query_range"] == 1


def test_a_checked_set_whose_tokens_change_in_place_is_checked_again(counted):
    loaded = offset_only_model(n_layers=2, bos_bonus=2.0)
    checked = inputs.checked_prompts(loaded, toy_tokens(2, 8, bos=True, seed=0))
    assert isinstance(checked, PromptSet) and inputs.checked_prompts(loaded, checked) is checked
    assert counted["prompts"] == 1
    checked.tokens[0, 1] = loaded.model.cfg.d_vocab  # outside the vocabulary, written after the check
    with pytest.raises(inputs.BadInputError, match="vocabulary"):
        inputs.checked_prompts(loaded, checked)
    assert counted["prompts"] == 2


def test_a_checked_query_range_is_checked_again_for_another_length(counted):
    checked = checks.check_query_range((0, 32), 16)
    assert tuple(checked) == (0, 16) and checks.check_query_range(checked, 16) is checked
    assert counted["query_range"] == 1
    assert tuple(checks.check_query_range(checked, 8)) == (0, 8)
    assert counted["query_range"] == 2


@pytest.fixture
def counted_models(monkeypatch):
    """How often a bare model is wrapped (its config read into a spec, its weights hashed) and how
    often a wrapped model's weights are hashed again."""
    from lens_position.models import spec, weights

    calls = {"wrapped": 0, "hashed": 0}
    bare_spec, hashing = spec._bare_spec, weights.state_dict_sha256

    def counting_spec(*args, **kwargs):
        calls["wrapped"] += 1
        return bare_spec(*args, **kwargs)

    def counting_hash(*args, **kwargs):
        calls["hashed"] += 1
        return hashing(*args, **kwargs)

    monkeypatch.setattr(spec, "_bare_spec", counting_spec)
    monkeypatch.setattr(weights, "state_dict_sha256", counting_hash)
    return calls


def with_tokenizer(bare):
    """A bare toy model that knows its BOS, as a user's model does through its tokenizer (the byte
    tokenizer's BOS id is the toy prompts' BOS id)."""
    bare.tokenizer = byte_tokenizer(prepend_bos=False)
    return bare


def test_analyze_checks_a_bare_model_and_its_prompts_once(counted, counted_models):
    """One ``analyze()`` on a bare HookedTransformer and raw token ids: the model is wrapped (and its
    weights hashed) once, the prompts checked once, although it runs three analyses, each a public
    entry point of its own."""
    from lens_position.analyses.analyze import analyze

    bare = with_tokenizer(offset_only_model(n_layers=2, bos_bonus=2.0).model)
    tokens = toy_tokens(4, 16, bos=True, seed=0)
    result = analyze(bare, tokens, early_queries=8, bootstrap=NO_INTERVALS, progress=False)
    assert result.bos is not None  # all three analyses ran
    assert counted_models == {"wrapped": 1, "hashed": 1}
    assert counted["prompts"] == 1


def test_every_public_analysis_wraps_a_bare_model_once(counted_models):
    """Each public analysis handed a bare model wraps it once at its door and hands the LoadedModel
    down: no analysis below the door wraps or hashes it again."""
    from lens_position.analyses.convergence import position0_convergence
    from lens_position.analyses.decompose import decompose
    from lens_position.analyses.probes import position_probe
    from lens_position.analyses.rotary_bands import rotary_bands
    from lens_position.analyses.sinks import sink_heads, window_sinks
    from lens_position.analyses.trajectory import trajectory_patching

    runs = {
        "decompose": lambda m, t: decompose(m, t, bootstrap=NO_INTERVALS, progress=False),
        "position_probe": lambda m, t: position_probe(m, t, ridge=1.0, bootstrap=NO_INTERVALS, progress=False),
        "sink_heads": lambda m, t: sink_heads(m, t, bootstrap=NO_INTERVALS, progress=False),
        "window_sinks": lambda m, t: window_sinks(m, t, bootstrap=NO_INTERVALS, progress=False),
        "bos_replacement": lambda m, t: bos_replacement(m, t, query_range=(0, 8), bootstrap=NO_INTERVALS,
                                                        progress=False),
        "sink_reading_heads": lambda m, t: sink_reading_heads(m, t, query_range=(0, 8), n_ablate=1,
                                                              bootstrap=NO_INTERVALS, progress=False),
        "trajectory_patching": lambda m, t: trajectory_patching(m, t, layers=[1], query_range=(0, 8),
                                                                progress=False),
        "rotary_bands": lambda m, t: rotary_bands(m, t, n_bands=2, bootstrap=NO_INTERVALS, progress=False),
        "position0_convergence": lambda m, t: position0_convergence(m, t, n_tokens=1, n_random=1,
                                                                    bootstrap=NO_INTERVALS, progress=False),
    }
    for name, run in runs.items():
        # convergence restores the position-0 state through the MLPs: a model that has them
        bare = with_tokenizer(random_model().model if name == "position0_convergence" else
                              offset_only_model(n_layers=2, bos_bonus=2.0).model)
        counted_models.update(wrapped=0, hashed=0)
        run(bare, toy_tokens(4, 16, bos=True, seed=0))
        assert counted_models == {"wrapped": 1, "hashed": 1}, name


def test_a_model_is_collected_once_the_user_drops_it():
    """Nothing in the package keeps a model the user let go of: after an analysis of it (a bare model
    and a LoadedModel, with prompts checked against it), dropping the last reference frees it."""
    import gc
    import weakref

    from lens_position.analyses.decompose import decompose

    for wrap in (lambda m: m.model, lambda m: m):
        model = wrap(offset_only_model(n_layers=2, bos_bonus=2.0))
        checked = inputs.checked_prompts(as_loaded(model), toy_tokens(2, 8, bos=True, seed=0))
        decompose(model, checked, bootstrap=NO_INTERVALS, progress=False)
        alive = weakref.ref(model.model if hasattr(model, "spec") else model)
        del model
        gc.collect()
        assert alive() is None
