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
