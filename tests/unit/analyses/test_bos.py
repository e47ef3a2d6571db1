"""BOS replacement (C4) on hand-set models where the answer is known.

In ``offset_only_model(bos_bonus=b)`` the only residual component is the bonus ``b`` that
the BOS marker (an embedding direction only the BOS token has) gives the key at position 0.
Replacing the BOS embedding by another token's removes the marker, hence all of ``R``; the
mean embedding over the 8-token vocabulary keeps 1/8 of the marker, so it behaves exactly
like a model with bonus ``b/8``.
"""

import pytest
import torch

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.decompose import decompose
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import TOY_VOCAB, offset_only_model, toy_tokens

BONUS = 2.0


@pytest.fixture(scope="module")
def model():
    return offset_only_model(n_layers=2, bos_bonus=BONUS)


@pytest.fixture(scope="module")
def tokens():
    return toy_tokens(4, 24, bos=True, seed=0)


@pytest.fixture(scope="module")
def result(model, tokens):
    return bos_replacement(model, tokens, query_range=(0, 32), seed=0)


def test_replacing_bos_by_another_token_removes_all_of_the_residual_component(result):
    token = result.frame[result.frame["replacement"] == "token"]
    assert (token["R_base"] > 0.05).all()
    assert token["R_replaced"].abs().max() < 1e-12
    assert token["fraction_removed"].to_numpy() == pytest.approx(1.0, abs=1e-10)
    overall = result.overall.set_index("replacement")
    assert overall.loc["token", "fraction_removed"] == pytest.approx(1.0, abs=1e-10)


def test_mean_embedding_keeps_one_vocabulary_share_of_the_bos_marker(result, tokens):
    weaker = offset_only_model(n_layers=2, bos_bonus=BONUS / TOY_VOCAB)
    expected = decompose(weaker, tokens, query_range=(0, 24), progress=False).layers
    mean = result.frame[result.frame["replacement"] == "mean"].sort_values("layer")
    assert mean["R_replaced"].to_numpy() == pytest.approx(expected["R"].to_numpy(), abs=1e-10)
    # the bonus is linear in the marker, so the raw variance shrinks by (1/8)^2
    assert mean["fraction_removed_raw"].to_numpy() == pytest.approx(1 - 1 / TOY_VOCAB**2, abs=1e-9)


def test_every_replacement_is_reported_per_layer_and_overall_with_provenance(result):
    assert list(result.overall["replacement"]) == ["token", "mean", "random"]
    assert len(result.frame) == 3 * 2
    for column in ("replacement", "layer", "R_base", "R_replaced", "fraction_removed", "fraction_removed_raw"):
        assert column in result.frame.columns
    for column in ("replacement", "R_base", "R_replaced", "fraction_removed"):
        assert column in result.overall.columns
    row = result.frame.iloc[0]
    assert row["fraction_removed"] == pytest.approx(1 - row["R_replaced"] / row["R_base"])
    options = result.provenance["options"]
    assert options["query_range"] == [0, 24]
    assert options["position0_token_ids"] == [1]
    assert options["replacement_token"] not in (1,)


def test_prompts_without_bos_are_refused(model):
    with pytest.raises(BadInputError, match="bos='force'"):
        bos_replacement(model, toy_tokens(2, 8, bos=False))
    with pytest.raises(BadInputError, match="unknown replacements"):
        bos_replacement(model, toy_tokens(2, 8), replacements=("zeros",))


@pytest.mark.slow
def test_bos_replacement_runs_on_smollm2(smollm2):
    from lens_position.core.data import build_prompts

    prompts = build_prompts(smollm2, source="natural", T=40, N=2, bos="force", seed=0)
    result = bos_replacement(smollm2, prompts, query_range=(0, 32), replacements=("token", "mean"))
    assert len(result.frame) == 2 * smollm2.model.cfg.n_layers
    assert torch.isfinite(torch.tensor(result.overall["fraction_removed"].to_numpy())).all()
    assert result.provenance["options"]["bos_policy"] == "force"
