"""Each input is checked once: a public entry point turns its prompts into a checked prompt set
at the door (``lens_position.core.inputs``), its layers and query range into checked values
(``lens_position.core.checks``), and passes them down; nothing below checks them again."""

import pytest
import torch

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.compare import decompose_conditions
from lens_position.analyses.patching import Patch
from lens_position.analyses.sinks import sink_reading_heads
from lens_position.core import checks, inputs
from lens_position.core.data import PromptSet
from lens_position.core.intervals import NO_INTERVALS
from lens_position.models.toy import offset_only_model, toy_tokens
from sink_model import sink_reading_model


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
