"""The input door: whatever a researcher hands in is checked once, before any forward pass, and
either analysed as what it is or refused with an error that says what to do."""

import hashlib

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses import bos, decompose, patching, probes, sinks, trajectory
from lens_position.analyses.decompose import PositionBins
from lens_position.core.checks import check_count, check_layers, check_query_range, check_seed
from lens_position.core.data import DEFAULT_BOS, build_prompts, prompts_from_texts
from lens_position.core.inputs import checked_prompts, checked_rows
from lens_position.ground.errors import BadInputError, ContextLengthError, PaddedPromptsError
from lens_position.models.tiny import BOS_ID, PAD_ID, VOCAB_SIZE

TEXTS = ["The cat sat on the mat.", "A much longer sentence about where position comes from.",
         "Short one, but not too short."]


@pytest.fixture
def forward_passes(tiny_llama):
    """Counts forward passes of the tiny model (the embedding runs first in every pass)."""
    calls = []
    handle = tiny_llama.model.embed.register_forward_pre_hook(lambda *_: calls.append(1))
    yield calls
    handle.remove()


def _tokens(n=3, t=12, seed=0):
    return torch.randint(3, VOCAB_SIZE, (n, t), generator=torch.Generator().manual_seed(seed))


# Every public analysis that takes prompts, called with little work beyond the prompts.
ANALYSES = {
    "decompose": lambda m, p: decompose.decompose(m, p, progress=False),
    "decompose_dense": lambda m, p: decompose.decompose_dense(m, p),
    "position_probe": lambda m, p: probes.position_probe(m, p, ridge=1.0, progress=False),
    "bos_replacement": lambda m, p: bos.bos_replacement(m, p, replacements=("mean",)),
    "sink_heads": lambda m, p: sinks.sink_heads(m, p),
    "sink_reading_heads": lambda m, p: sinks.sink_reading_heads(m, p),
    "trajectory_patching": lambda m, p: trajectory.trajectory_patching(m, p, layers=[1]),
    "run_patches": lambda m, p: patching.run_patches(m, p, [[]], lambda logits: logits[:, -1, 0]),
    "cache_activations": lambda m, p: patching.cache_activations(m, p, ["blocks.0.hook_resid_pre"]),
}


@pytest.mark.fault(area="prompts", given="token id -1 in a token tensor (any analysis)",
                   happens="refused before any forward pass: BadInputError, the ids are outside the vocabulary")
@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_every_analysis_refuses_a_negative_token_id_before_any_forward_pass(tiny_llama, forward_passes, analysis):
    tokens = _tokens()
    tokens[1, 5] = -1
    with pytest.raises(BadInputError, match="vocabulary"):
        ANALYSES[analysis](tiny_llama, tokens)
    assert forward_passes == []


@pytest.mark.fault(area="prompts", given="token ids >= d_vocab (prompts from another tokenizer)",
                   happens="refused before any forward pass: BadInputError naming the vocabulary size")
@pytest.mark.parametrize("analysis", ["decompose", "position_probe", "sink_heads"])
def test_ids_from_a_larger_vocabulary_are_refused(tiny_llama, forward_passes, analysis):
    tokens = _tokens()
    tokens[0, 3] = VOCAB_SIZE
    with pytest.raises(BadInputError, match=f"0..{VOCAB_SIZE - 1}"):
        ANALYSES[analysis](tiny_llama, tokens)
    assert forward_passes == []


@pytest.mark.fault(area="prompts", given="an empty batch (0 sequences), or sequences of one position",
                   happens="refused: BadInputError saying the analysis needs T >= 2 or at least one sequence")
def test_empty_and_one_position_prompts_are_refused(tiny_llama, forward_passes):
    with pytest.raises(BadInputError, match="no sequences"):
        decompose.decompose(tiny_llama, torch.zeros(0, 8, dtype=torch.long), progress=False)
    with pytest.raises(BadInputError, match="T >= 2"):
        decompose.decompose(tiny_llama, _tokens(t=1), progress=False)
    with pytest.raises(BadInputError, match="T >= 2"):
        probes.position_probe(tiny_llama, _tokens(t=1), ridge=1.0, progress=False)
    assert forward_passes == []


@pytest.mark.fault(area="options", given="batch_size <= 0",
                   happens="refused: BadInputError naming batch_size")
@pytest.mark.parametrize("batch_size", [0, -3, 2.5])
def test_non_positive_or_fractional_batch_size_is_refused(tiny_llama, batch_size):
    with pytest.raises(BadInputError, match="batch_size"):
        decompose.decompose(tiny_llama, _tokens(), batch_size=batch_size, progress=False)
    with pytest.raises(BadInputError, match="batch_size"):
        probes.position_probe(tiny_llama, _tokens(), batch_size=batch_size, progress=False)


@pytest.mark.fault(area="options", given="a fractional layer (layers=[0.7]) or size (T=2.7, N=1.5)",
                   happens="refused: BadInputError, never truncated")
def test_fractional_layers_and_sizes_are_refused_not_truncated(tiny_llama):
    with pytest.raises(BadInputError, match="integer"):
        decompose.decompose(tiny_llama, _tokens(), layers=[0.7], progress=False)
    with pytest.raises(BadInputError, match="integer"):
        trajectory.trajectory_patching(tiny_llama, _tokens(t=4).index_fill(1, torch.tensor([0]), BOS_ID),
                                       layers=[0.7])
    with pytest.raises(BadInputError, match="T must be an integer"):
        build_prompts(tiny_llama, source="random", T=2.7, N=2)
    with pytest.raises(BadInputError, match="N must be an integer"):
        build_prompts(tiny_llama, source="random", T=8, N=1.5)
    assert check_count("T", 8.0) == 8 and check_layers(np.int64(2), 3) == [2]


@pytest.mark.fault(area="options", given="a layer outside the model, an empty layer list, or a query range "
                                         "that selects no query",
                   happens="refused: BadInputError with the valid range, the same message from every analysis")
def test_layer_and_query_range_checks_are_the_same_everywhere(tiny_llama):
    tokens = _tokens().index_fill(1, torch.tensor([0]), BOS_ID)
    messages = set()
    for call in (lambda: decompose.decompose(tiny_llama, tokens, layers=[3], progress=False),
                 lambda: probes.position_probe(tiny_llama, tokens, layers=[3], ridge=1.0, progress=False),
                 lambda: trajectory.trajectory_patching(tiny_llama, tokens, layers=[3])):
        with pytest.raises(BadInputError) as error:
            call()
        messages.add(str(error.value))
    assert len(messages) == 1 and "out of range" in messages.pop()
    with pytest.raises(BadInputError, match="empty"):
        check_layers([], 3)
    with pytest.raises(BadInputError, match="selects no queries"):
        sinks.sink_heads(tiny_llama, tokens, query_range=(12, 20))
    assert check_query_range((0, 32), 12) == (0, 12)


@pytest.mark.fault(area="prompts", given="a batch padded by model.to_tokens(list_of_texts) (right or left "
                                         "padding)",
                   happens="refused: PaddedPromptsError (a BadInputError) saying to pass the list of strings "
                           "or build_prompts(text=...)")
@pytest.mark.parametrize("side", ["right", "left"])
def test_a_padded_to_tokens_batch_is_refused_with_how_to_build_prompts(tiny_llama, forward_passes, side):
    padded = tiny_llama.model.to_tokens(TEXTS, padding_side=side)
    assert (padded == PAD_ID).any()  # the batch really is padded
    with pytest.raises(PaddedPromptsError, match="list of strings"):
        decompose.decompose(tiny_llama, padded, progress=False)
    assert forward_passes == []


@pytest.mark.fault(area="prompts", given="input_ids with an attention_mask that marks padding",
                   happens="refused: PaddedPromptsError; a mask of all ones is accepted")
def test_an_attention_mask_with_padding_is_refused_and_all_ones_accepted(tiny_llama):
    encoded = tiny_llama.tokenizer(TEXTS, padding=True, return_tensors="pt")
    with pytest.raises(PaddedPromptsError, match="attention mask"):
        checked_prompts(tiny_llama, encoded)
    same_length = tiny_llama.tokenizer(["abcd", "efgh"], return_tensors="pt")
    checked = checked_prompts(tiny_llama, same_length)
    assert torch.equal(checked.tokens, same_length["input_ids"])


@pytest.mark.fault(area="prompts", given="a list of strings of different lengths",
                   happens="analysed: each prompt gets the default BOS at position 0 and all are cut to the "
                           "shortest length; the cut is recorded in the provenance")
def test_a_list_of_strings_is_cut_to_a_common_length_and_analysed_as_text(tiny_llama):
    result = decompose.decompose(tiny_llama, TEXTS, progress=False)
    built = prompts_from_texts(tiny_llama, TEXTS)
    lengths = [1 + len(text.encode()) for text in TEXTS]  # byte tokenizer + BOS
    assert built.tokens.shape == (3, min(lengths))
    assert (built.tokens[:, 0] == BOS_ID).all() and built.spec.bos == DEFAULT_BOS
    for row, text in zip(built.tokens, TEXTS):
        assert row[1:].tolist() == [3 + b for b in text.encode()[:min(lengths) - 1]]
    assert built.spec.extra["cut_tokens"] == sum(lengths) - 3 * min(lengths)
    same = decompose.decompose(tiny_llama, built.tokens, progress=False)
    np.testing.assert_allclose(result.heads["R"], same.heads["R"])
    assert result.provenance["data"]["source"] == "texts"
    assert result.provenance["data"]["extra"]["lengths"] == lengths


def test_a_list_of_strings_with_an_explicit_T_refuses_prompts_shorter_than_T(tiny_llama):
    with pytest.raises(BadInputError, match="fewer than T=30"):
        prompts_from_texts(tiny_llama, TEXTS, T=30)
    with pytest.raises(BadInputError, match="empty"):
        prompts_from_texts(tiny_llama, ["fine", "  "])
    with pytest.raises(BadInputError, match="list of strings"):
        checked_prompts(tiny_llama, "one string")


@pytest.mark.fault(area="prompts", given="a raw token tensor",
                   happens="analysed as given; its provenance records the tensor's SHA-256, shape and what "
                           "sits at position 0")
def test_a_raw_tensor_gets_a_content_hash_in_its_provenance(tiny_llama):
    tokens = _tokens()
    checked = checked_prompts(tiny_llama, tokens)
    assert checked.spec.extra["tokens_sha256"] == hashlib.sha256(tokens.numpy().tobytes()).hexdigest()
    assert checked.spec.position0 == "content" and checked.spec.seed is None
    with_bos = checked_prompts(tiny_llama, tokens.index_fill(1, torch.tensor([0]), BOS_ID))
    assert with_bos.has_bos
    prompt_set = build_prompts(tiny_llama, source="random", T=8, N=2)
    checked_set = checked_prompts(tiny_llama, prompt_set)
    assert torch.equal(checked_set.tokens, prompt_set.tokens) and checked_set.spec == prompt_set.spec
    assert checked_prompts(tiny_llama, checked_set) is checked_set


@pytest.mark.fault(area="prompts", given="prompts longer than the model's context n_ctx",
                   happens="refused before any forward pass: ContextLengthError saying how to extend n_ctx")
def test_prompts_longer_than_the_context_are_refused(tiny_llama, forward_passes):
    n_ctx = tiny_llama.model.cfg.n_ctx
    with pytest.raises(ContextLengthError, match="n_ctx"):
        sinks.sink_heads(tiny_llama, torch.full((1, n_ctx + 1), 5))
    assert forward_passes == []


@pytest.mark.fault(area="prompts", given="token ids as floats or booleans",
                   happens="refused: BadInputError, token ids must be integers")
def test_float_token_ids_are_refused(tiny_llama):
    with pytest.raises(BadInputError, match="integers"):
        checked_prompts(tiny_llama, _tokens().float())


@pytest.mark.fault(area="prompts", given="token ids on the meta device (shapes without values), any analysis",
                   happens="refused before any forward pass: BadInputError naming the meta device")
@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_token_ids_on_the_meta_device_are_refused_before_any_forward_pass(tiny_llama, forward_passes, analysis):
    with pytest.raises(BadInputError, match="meta device"):
        ANALYSES[analysis](tiny_llama, _tokens().to("meta"))
    assert forward_passes == []


@pytest.mark.fault(area="options", given="a negative or huge seed",
                   happens="refused: BadInputError with the valid range")
@pytest.mark.parametrize("seed", [-1, 2**64, 0.5])
def test_bad_seeds_are_refused(tiny_llama, seed):
    with pytest.raises(BadInputError, match="seed"):
        build_prompts(tiny_llama, source="random", T=8, N=2, seed=seed)
    assert check_seed(2**63 - 1) == 2**63 - 1


@pytest.mark.fault(area="options", given="PositionBins with a zero or negative argument, e.g. PositionBins(16, -1)",
                   happens="refused at construction: BadInputError, both must be integers >= 1")
@pytest.mark.parametrize("args", [(16, -1), (0, 4), (16, 0), (16.5, 4)])
def test_bad_position_bins_are_refused(args):
    with pytest.raises(BadInputError, match="PositionBins"):
        PositionBins(*args)


@pytest.mark.fault(area="BOS", given="the same model analysed with default options from Python and from the "
                                     "command line",
                   happens="the same BOS policy, 'force', recorded with its reason in every prompt spec (the "
                           "defaults used to differ: 'tokenizer' in Python, 'force' on the command line)")
def test_one_bos_default_in_python_the_command_line_and_the_pipeline(tiny_llama):
    import inspect

    from lens_position.cli.commands import build_parser
    from lens_position.pipeline.config import DataOptions

    assert inspect.signature(build_prompts).parameters["bos"].default == DEFAULT_BOS == "force"
    assert inspect.signature(sinks.sink_rate).parameters["bos"].default == DEFAULT_BOS
    assert build_parser().parse_args(["decompose", "tiny-llama"]).bos == DEFAULT_BOS
    assert DataOptions().bos == DEFAULT_BOS
    spec = build_prompts(tiny_llama, source="random", T=8, N=2).spec
    assert spec.bos == DEFAULT_BOS and spec.position0 == "bos" and "Gemma-3" in spec.extra["bos_default_reason"]
    assert prompts_from_texts(tiny_llama, TEXTS).spec.extra["bos_default"] == DEFAULT_BOS


def test_rows_of_different_lengths_pass_the_door_in_one_look(tiny_llama):
    rows = [torch.tensor([5, 6, 7]), torch.tensor([8, 9, 10, 11, 12], dtype=torch.int32)]
    checked = checked_rows(tiny_llama, rows, min_length=3)
    assert [r.tolist() for r in checked] == [r.tolist() for r in rows]
    assert all(r.dtype == torch.int64 for r in checked)


BAD_ROWS = st.one_of(
    st.just([]).map(lambda r: (r, "non-empty list")),
    st.integers(1, 4).map(lambda n: ([torch.tensor([5] * n)], "needs T >=")),
    st.integers(-50, -1).map(lambda i: ([torch.tensor([5, 6, i, 7, 8])], "vocabulary")),
    st.integers(VOCAB_SIZE, VOCAB_SIZE + 1000).map(lambda i: ([torch.tensor([5, 6, i, 7, 8])], "vocabulary")),
    st.just(([torch.tensor([5.0, 6.0, 7.0, 8.0, 9.0])], "integers")),
    st.just(([torch.tensor([[5, 6, 7, 8, 9]])], "one sequence")),
    st.just(([[5, 6, 7, 8, 9]], "not a tensor")),
    st.just((torch.tensor([[5, 6, 7, 8, 9]]), "non-empty list")),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=BAD_ROWS, position=st.integers(0, 3))
def test_bad_rows_are_refused_by_what_is_wrong_and_which_row(tiny_llama, bad, position):
    rows, reason = bad
    if isinstance(rows, list) and rows:
        rows = [torch.tensor([5, 6, 7, 8, 9])] * position + rows
    with pytest.raises(BadInputError, match=reason) as error:
        checked_rows(tiny_llama, rows, min_length=5)
    if isinstance(rows, list) and rows and reason != "non-empty list":
        assert f"row {position}" in str(error.value)


def test_a_row_longer_than_the_context_is_refused(tiny_llama):
    n_ctx = tiny_llama.spec.n_ctx
    with pytest.raises(ContextLengthError):
        checked_rows(tiny_llama, [torch.tensor([5] * 8), torch.full((n_ctx + 1,), 5)])


@pytest.mark.fault(area="prompts", given="an analysis called inside torch.inference_mode() (tokens and activations "
                                         "are inference tensors, which keep no version counter)",
                   happens="analysed as outside it, with the same numbers")
@pytest.mark.parametrize("analysis", sorted(ANALYSES))
def test_every_analysis_runs_under_inference_mode(tiny_llama, analysis):
    tokens = build_prompts(tiny_llama, source="random", T=12, N=3, bos="force").tokens
    with torch.inference_mode():
        inside = ANALYSES[analysis](tiny_llama, tokens.clone())
    outside = ANALYSES[analysis](tiny_llama, tokens)
    if hasattr(outside, "layers") and isinstance(outside.layers, pd.DataFrame):
        pd.testing.assert_frame_equal(inside.layers, outside.layers)


def test_tokens_written_to_under_inference_mode_are_checked_again(tiny_llama):
    with torch.inference_mode():
        tokens = _tokens()
        checked = checked_prompts(tiny_llama, tokens)
        checked.tokens[0, 3] = -1
        with pytest.raises(BadInputError, match="vocabulary"):
            checked_prompts(tiny_llama, checked)
