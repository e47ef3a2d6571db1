"""Position-0 trajectory patching on the hand-set sink-reading model (tests/unit/analyses/test_sinks.py):
removing BOS from the position-0 residual before layer 1 silences the sink-reading head
(1, 0) and, through it, the residual component of head (2, 0); patching after layer 1
changes nothing, because nothing downstream reads position 0 any more."""

import pytest
from sink_model import sink_reading_model

from lens_position.analyses.trajectory import trajectory_patching
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import toy_tokens


@pytest.fixture(scope="module")
def result():
    return trajectory_patching(sink_reading_model(), toy_tokens(4, 32, bos=True, seed=1),
                               counterfactual="no-bos", query_range=(0, 32), batch_size=2)


def head(result, patch_layer, layer, h):
    return result.frame.set_index(["patch_layer", "layer", "head"]).loc[(patch_layer, layer, h)]


def test_patching_position0_before_the_sink_reader_removes_its_pattern_and_R(result):
    for patch_layer in (0, 1):
        reader = head(result, patch_layer, 1, 0)
        assert reader["pattern_change"] > 0.3
        assert reader["R_base"] > 0.05
        assert reader["R_patched"] == pytest.approx(0.0, abs=1e-10)
        downstream = head(result, patch_layer, 2, 0)
        assert downstream["R_base"] > 1e-3
        assert downstream["R_patched"] == pytest.approx(0.0, abs=1e-10)


def test_heads_that_do_not_read_position0_do_not_move(result):
    for patch_layer, layer, h in [(0, 0, 0), (0, 0, 1), (0, 1, 1), (0, 2, 1), (2, 2, 0), (2, 2, 1)]:
        row = head(result, patch_layer, layer, h)
        assert row["pattern_change"] < 1e-12
        assert abs(row["R_change"]) < 1e-10


def test_frame_lists_only_downstream_heads_with_provenance(result):
    frame = result.frame
    assert (frame["layer"] >= frame["patch_layer"]).all()
    assert len(frame) == 2 * (3 + 2 + 1)
    assert list(frame.columns[:3]) == ["patch_layer", "layer", "head"]
    assert {"pattern_change", "R_change"} <= set(frame.columns)
    assert list(result.by_patch_layer["patch_layer"]) == [0, 1, 2]
    assert result.provenance["options"]["counterfactual"] == "no-bos"


def test_bad_layers_are_refused():
    with pytest.raises(BadInputError, match="layers"):
        trajectory_patching(sink_reading_model(), toy_tokens(2, 8), layers=[3])


@pytest.mark.parametrize("batch_size", [1, 3])
def test_no_pass_holds_more_sequences_than_the_batch_size_and_the_numbers_stay(result, batch_size):
    """At long T a pass's scores are what memory holds: the pattern change, like the decompositions,
    runs ``batch_size`` sequences at a time (it ran every prompt of every patch layer in one pass), with
    the same numbers."""
    model, passes = sink_reading_model(), []
    hook = model.model.embed.register_forward_pre_hook(lambda module, args: passes.append(tuple(args[0].shape)))
    try:
        again = trajectory_patching(model, toy_tokens(4, 32, bos=True, seed=1), counterfactual="no-bos",
                                    query_range=(0, 32), batch_size=batch_size)
    finally:
        hook.remove()
    assert max(n for n, length in passes if length > 1) <= batch_size  # one-token runs hold no T x T scores
    for column in ("pattern_change", "R_base", "R_patched"):
        assert again.frame[column].to_numpy() == pytest.approx(result.frame[column].to_numpy(), rel=1e-9, abs=1e-12)
