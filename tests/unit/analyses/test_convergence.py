"""Position-0 convergence against the hand-set models of ``convergence_model`` (its docstring):
a block whose attention or MLP writes ``-x + c`` makes the state at position 0 the same whatever
its embedding; one whose attention writes ``(c - x) / 2`` takes it half way there; blocks writing 0
leave the state the embedding. Expected values are closed forms of those constructions."""

import pytest
import torch
from convergence_model import TARGET, convergence_model
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.convergence import Position0Convergence, position0_convergence
from lens_position.analyses.patching import default_replacement_token
from lens_position.core.results import load_result
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import BOS_TOKEN_ID, offset_only_model, toy_tokens

TOKENS = toy_tokens(4, 6, bos=True)


def _run(kind, **kwargs):
    return position0_convergence(convergence_model(kind), TOKENS, progress=False, **kwargs)


def test_a_state_rewritten_by_attention_converges_at_layer_0_and_the_attention_closes_the_gap():
    result = _run("attention")
    assert result.first_converged_layer == 0
    torch.testing.assert_close(torch.tensor(result.layers["cosine"].to_numpy()), torch.ones(3, dtype=torch.float64))
    restoration = result.restoration.set_index(["layer", "component"])
    assert restoration.loc[(0, "attn"), "closed_in_run"] == pytest.approx(1.0)
    # converged: nothing left for a patch to restore
    assert restoration["closed_here"].isna().all()


def test_a_state_rewritten_by_the_mlp_of_block_1_converges_from_layer_1():
    result = _run("mlp")
    assert result.first_converged_layer == 1
    assert not result.layers.loc[0, "converged"] and result.layers.loc[1:, "converged"].all()
    restoration = result.restoration.set_index(["layer", "component"])
    assert restoration.loc[(1, "mlp"), "closed_in_run"] == pytest.approx(1.0)
    assert restoration.loc[(1, "attn"), "closed_in_run"] == pytest.approx(0.0)
    assert restoration.loc[(0, "mlp"), "closed_here"] == pytest.approx(0.0)  # block 0 writes 0 in both runs


def test_untouched_states_keep_the_cosine_of_the_embeddings_at_every_layer():
    model = convergence_model(None)
    result = position0_convergence(model, TOKENS, replacements=("token",), n_tokens=1, progress=False)
    token = default_replacement_token(model, TOKENS, position=0, seed=0)
    w_e = model.model.W_E.detach()
    expected = torch.nn.functional.cosine_similarity(w_e[token], w_e[BOS_TOKEN_ID], dim=0)
    torch.testing.assert_close(torch.tensor(result.layers["cosine"].to_numpy()), expected.repeat(3))
    norms = w_e[token].norm() / w_e[BOS_TOKEN_ID].norm()
    torch.testing.assert_close(torch.tensor(result.layers["rel_norm"].to_numpy()), norms.repeat(3))
    assert result.first_converged_layer is None
    assert (result.restoration["closed_here"] == 0).all()


def test_an_attention_that_goes_half_way_to_a_fixed_state_closes_its_closed_form_share_of_the_gap():
    model = convergence_model("half")
    restoration = position0_convergence(model, TOKENS, progress=False).restoration.set_index(["layer", "component"])
    # the gap halves, the unreplaced state becomes (x_base + c) / 2: relative to its norm the gap shrinks by
    # ||x_base|| / ||x_base + c||
    x_base = model.model.W_E.detach()[BOS_TOKEN_ID]
    expected = 1 - float(x_base.norm() / (x_base + TARGET).norm())
    assert restoration.loc[(0, "attn"), "closed_in_run"] == pytest.approx(expected)
    # the unreplaced run's attention output put into the replaced run doubles the gap after block 0
    assert restoration.loc[(0, "attn"), "closed_here"] == pytest.approx(-1.0)


def test_the_per_replacement_rows_average_to_the_layer_means():
    result = _run("mlp")
    means = result.per_replacement.groupby("layer")["cosine"].mean().to_numpy()
    torch.testing.assert_close(torch.tensor(result.layers["cosine"].to_numpy()), torch.tensor(means))
    assert result.per_replacement["replacement"].nunique() == 3 + 1 + 2  # 3 tokens, the mean, 2 random


def test_the_result_saves_and_loads(tmp_path):
    result = _run("mlp")
    again = load_result(result.save(tmp_path / "convergence"))
    assert isinstance(again, Position0Convergence)
    assert again.layers.equals(result.layers) and again.first_converged_layer == result.first_converged_layer


def test_a_model_without_mlps_is_refused():
    with pytest.raises(BadInputError, match="attn_only"):
        position0_convergence(offset_only_model(), TOKENS, progress=False)


@settings(max_examples=15, deadline=None)
@given(tolerance=st.one_of(st.floats(max_value=0.0, allow_nan=False), st.floats(min_value=1.0, allow_nan=False)))
def test_a_tolerance_outside_0_1_is_refused(tolerance):
    with pytest.raises(BadInputError):
        position0_convergence(convergence_model(None), TOKENS, tolerance=tolerance, progress=False)


@pytest.mark.parametrize("replacements", [(), ("zero",)])
def test_unknown_or_no_replacements_are_refused(replacements):
    with pytest.raises(BadInputError):
        position0_convergence(convergence_model(None), TOKENS, replacements=replacements, progress=False)


@pytest.mark.parametrize("rows_per_pass", [512, 5])  # one pass for every condition, and chunks of them
def test_the_batched_restoration_runs_equal_one_patched_run_each(monkeypatch, rows_per_pass):
    """Each (layer, sub-block) patch, put through one batched pass with the others, gives the
    position-0 states of its own patched run."""
    from lens_position.analyses import convergence
    from lens_position.models import load_model

    monkeypatch.setattr(convergence, "MAX_PATCHED_ROWS", rows_per_pass)
    backend = load_model("tiny-llama").backend
    tokens = torch.tensor([[1], [5], [9]], device=backend.device)
    embedding = torch.randn(3, backend.d_model, generator=torch.Generator().manual_seed(0))
    base = convergence._run(backend, tokens, None)
    patches = [(f"blocks.{layer}.hook_{component}_out", base[f"{component}_out"][layer])
               for layer in range(backend.n_layers) for component in convergence.COMPONENTS]
    batched = convergence._run_patched(backend, tokens, embedding, patches)
    assert batched.shape == (len(patches), backend.n_layers, 3, backend.d_model)
    for k, (name, value) in enumerate(patches):
        kept = []

        def replace(activation, hook):
            activation[:, 0] = embedding.to(activation.dtype)
            return activation

        def set_value(activation, hook, value=value):
            activation[:, 0] = value.to(activation.dtype)
            return activation

        def keep(activation, hook, kept=kept):
            kept.append(activation[:, 0].to(torch.float64))

        hooks = [("hook_embed", replace), (name, set_value),
                 *((f"blocks.{layer}.hook_resid_post", keep) for layer in range(backend.n_layers))]
        with torch.no_grad(), backend.hooks(hooks):
            backend.forward(tokens, return_type=None)
        alone = torch.stack(kept)
        assert torch.allclose(batched[k], alone, atol=1e-5, rtol=1e-5), (name, (batched[k] - alone).abs().max())
    # a patch changes the run: patched states differ from the replaced run's where the patch sits
    replaced = convergence._run(backend, tokens, embedding)["resid_post"]
    assert not torch.allclose(batched[0][0], replaced[0])
