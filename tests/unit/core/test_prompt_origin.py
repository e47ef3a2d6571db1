"""Prompt sets are checked against the model they meet: the tokenizer that made them (its BOS id
and its hash), what sits at position 0, and, where intervals are computed, that no sequence
repeats another (intervals need independent units)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.decompose import decompose
from lens_position.core.data import build_prompts
from lens_position.core.inputs import checked_prompts
from lens_position.core.intervals import NO_INTERVALS, Bootstrap
from lens_position.ground.errors import BadInputError
from lens_position.models import load_model
from lens_position.models.spec import tokenizer_sha256

TEXT = "Where does absolute position come from in a transformer? " * 40


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama")


def with_tokenizer(loaded, tokenizer):
    other = copy.copy(loaded)
    other.tokenizer = tokenizer
    return other


@pytest.mark.fault(area="prompts", given="a PromptSet built with another model's tokenizer (another BOS id)",
                   happens="refused at the door, naming both BOS ids; never BOS-replaced on whatever sits at 0")
def test_a_prompt_set_of_another_tokenizers_bos_is_refused(tiny):
    prompts = build_prompts(tiny, text=TEXT, T=12, N=4)
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.bos_token = "<eos>"
    other = with_tokenizer(tiny, tokenizer)
    assert tokenizer.bos_token_id != tiny.tokenizer.bos_token_id
    with pytest.raises(BadInputError, match=r"BOS id is 1, but this model's is 2"):
        bos_replacement(other, prompts, bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="prompts", given="a PromptSet of natural text built with another tokenizer of the same BOS id "
                                         "(another vocabulary)",
                   happens="refused at the door by the tokenizer's hash: the same ids would be other text")
def test_a_prompt_set_of_another_vocabulary_is_refused(tiny):
    prompts = build_prompts(tiny, text=TEXT, T=12, N=4)
    tokenizer = copy.deepcopy(tiny.tokenizer)
    tokenizer.add_tokens(["position"])
    assert tokenizer_sha256(tokenizer) != tokenizer_sha256(tiny.tokenizer)
    with pytest.raises(BadInputError, match="another tokenizer"):
        decompose(with_tokenizer(tiny, tokenizer), prompts, bootstrap=NO_INTERVALS, progress=False)
    assert decompose(tiny, prompts, bootstrap=NO_INTERVALS, progress=False) is not None


@pytest.mark.fault(area="prompts", given="a PromptSet whose tokens[:, 0] was edited after it was built",
                   happens="refused: position 0 no longer holds the token the set's spec says (BOS)")
def test_an_edited_position_zero_is_refused(tiny):
    prompts = build_prompts(tiny, text=TEXT, T=12, N=4)
    prompts.tokens[1, 0] = 7
    with pytest.raises(BadInputError, match=r"position 0 of sequences \[1\] holds token\(s\) \[7\]"):
        bos_replacement(tiny, prompts, bootstrap=NO_INTERVALS, progress=False)


@pytest.mark.fault(area="prompts", given="repeated sequences (8 copies of one) where intervals are computed",
                   happens="refused: the intervals take sequences as independent samples (copies gave width 0); "
                           "without intervals the copies are allowed")
def test_copies_are_refused_where_intervals_are_computed(tiny):
    one = build_prompts(tiny, text=TEXT, T=12, N=1).tokens
    copies = one.expand(8, -1).clone()
    with pytest.raises(BadInputError, match="only 1 distinct"):
        decompose(tiny, copies, bootstrap=Bootstrap(n_resamples=50), progress=False)
    assert decompose(tiny, copies, bootstrap=NO_INTERVALS, progress=False) is not None


@settings(max_examples=25, deadline=None)
@given(n=st.integers(2, 9), source=st.integers(0, 8), target=st.integers(0, 8))
def test_any_repeated_row_is_found(tiny, n, source, target):
    """Property: one row copied over another, anywhere in a set of distinct rows, is refused."""
    tokens = torch.arange(n * 6).view(n, 6) % 250 + 3
    source, target = source % n, target % n
    if source == target:
        checked_prompts(tiny, tokens, distinct=True)
        return
    tokens[target] = tokens[source]
    with pytest.raises(BadInputError, match=f"only {n - 1} distinct"):
        checked_prompts(tiny, tokens, distinct=True)


def test_repeated_token_prompts_are_distinct_even_from_a_small_vocabulary(tiny):
    prompts = build_prompts(tiny, source="repeated", T=6, N=64, seed=3)
    assert len(torch.unique(prompts.tokens, dim=0)) == 64
