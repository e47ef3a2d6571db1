"""Bad input by class, not by example: hypothesis draws prompts (lengths, ids, batch shapes, dtypes),
query ranges and key sets, batch sizes, load options, patch values and poisoned weights, and every
public analysis must either raise the package's own error (``LensPositionError``) or return finite
numbers, equal to the dense reference (``decompose_dense``) where there is one. Tiny models and a
modest number of examples keep the whole file to a few minutes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lens_position.analyses.decompose import decompose, decompose_dense
from lens_position.analyses.sinks import sink_heads
from lens_position.core.intervals import NO_INTERVALS
from lens_position.core.patch import Patch
from lens_position.ground.errors import LensPositionError
from lens_position.models.rope import apply_position_options, check_position_options
from lens_position.models.toy import random_model

VOCAB = 50
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
COMPONENTS = ["total", "R", "M", "C", "total_heldout", "R_heldout", "M_heldout", "C_heldout", "var_logA", "var_abs_t",
              "var_abs_z", "cov_abs_tz"]
_MODEL = {}


def model():
    """One tiny model (a local and a global layer, grouped key/value heads), built once."""
    if "clean" not in _MODEL:
        _MODEL["clean"] = random_model(n_layers=2, n_heads=2, n_kv_heads=1, d_model=16, d_head=4, window=4,
                                       d_vocab=VOCAB, n_ctx=32)
    return _MODEL["clean"]


@st.composite
def prompts(draw):
    """Token ids as a user might pass them: mostly valid, sometimes out of the vocabulary,
    negative, float, 1-D or 3-D, empty, or longer than the context."""
    n = draw(st.integers(0, 5))
    length = draw(st.integers(0, 36))
    low, high = draw(st.sampled_from([(0, VOCAB - 1), (0, VOCAB - 1), (0, VOCAB - 1), (-2, VOCAB + 2)]))
    ids = draw(st.lists(st.integers(low, high), min_size=n * length, max_size=n * length))
    tokens = torch.tensor(ids, dtype=torch.int64).reshape(n, length)
    form = draw(st.sampled_from(["tensor", "tensor", "int32", "float", "1d", "3d", "list"]))
    if form == "int32":
        return tokens.to(torch.int32)
    if form == "float":
        return tokens.to(torch.float32) + draw(st.sampled_from([0.0, 0.5]))
    if form == "1d":
        return tokens[0] if n else tokens.reshape(-1)
    if form == "3d":
        return tokens[None]
    if form == "list":
        return tokens.tolist()
    return tokens


query_ranges = st.one_of(st.none(), st.tuples(st.integers(-2, 40), st.integers(-2, 40)),
                         st.tuples(st.floats(allow_nan=True), st.integers(0, 40)))


def finite_table(frame, columns):
    values = frame[columns].to_numpy(dtype=float)
    return np.isfinite(values).all()


@SETTINGS
@given(tokens=prompts(), query_range=query_ranges, keys=st.sampled_from(["all", "no-bos", "bos", None]),
       batch_size=st.sampled_from([1, 3, 8, 0, -1, 2.5]))
def test_decompose_raises_the_packages_error_or_equals_the_dense_reference(tokens, query_range, keys, batch_size):
    try:
        streamed = decompose(model(), tokens, query_range=query_range, keys=keys, batch_size=batch_size,
                             bootstrap=NO_INTERVALS, progress=False)
    except LensPositionError:
        return
    heldout = streamed.heads["n_sequences"].iloc[0] >= 2
    columns = COMPONENTS if heldout else [c for c in COMPONENTS if "heldout" not in c]
    assert finite_table(streamed.heads, columns), streamed.heads[columns]
    dense = decompose_dense(model(), tokens, query_range=query_range, keys=keys)
    np.testing.assert_allclose(streamed.heads[columns].to_numpy(float), dense.heads[columns].to_numpy(float),
                               rtol=0, atol=1e-6)


@SETTINGS
@given(tokens=prompts(), query_range=query_ranges, eps=st.one_of(st.floats(-1, 2), st.just(math.nan)))
def test_sink_heads_raise_the_packages_error_or_give_attention_fractions(tokens, query_range, eps):
    try:
        result = sink_heads(model(), tokens, query_range=query_range, eps=eps, bootstrap=NO_INTERVALS,
                            progress=False)
    except LensPositionError:
        return
    scores = result.frame["sink_score"].to_numpy(float)
    assert np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1 + 1e-6).all()
    assert 0 <= eps <= 1


POISONS = st.sampled_from(["W_Q", "_W_K", "W_E", "_W_V", "b_Q"])  # grouped K/V: the stored weights


@SETTINGS
@given(where=POISONS, layer=st.integers(0, 1), head=st.integers(0, 1), value=st.sampled_from(
    [math.nan, math.inf, -math.inf]), seed=st.integers(0, 3))
def test_poisoned_weights_never_give_a_table(where, layer, head, value, seed):
    """NaN or an infinity in one head's weights, or in one embedding row a prompt holds: every
    analysis refuses with the package's error (a number from such a model is not a measurement)."""
    poisoned = random_model(n_layers=2, n_heads=2, n_kv_heads=1, d_model=16, d_head=4, window=4, d_vocab=VOCAB,
                            n_ctx=32)
    tokens = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if where == "W_E":
            poisoned.model.embed.W_E[int(tokens[seed % 4, seed + 1])] = value
        else:
            weights = getattr(poisoned.model.blocks[layer].attn, where)
            weights[min(head, weights.shape[0] - 1)].view(-1)[seed] = value
    for analysis in (lambda: decompose(poisoned, tokens, bootstrap=NO_INTERVALS, progress=False),
                     lambda: decompose_dense(poisoned, tokens),
                     lambda: sink_heads(poisoned, tokens, bootstrap=NO_INTERVALS, progress=False)):
        try:
            result = analysis()
        except LensPositionError:
            continue
        heads = getattr(result, "heads", None)
        numbers = result.frame[["sink_score"]] if heads is None else heads[COMPONENTS]
        # a weight that does not reach the scores (W_V of the last layer) leaves them finite
        assert np.isfinite(numbers.to_numpy(float)).all(), (where, numbers)


@SETTINGS
@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                       st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=16,
                                max_size=16)),
       position=st.integers(-1, 14))
def test_patched_decompositions_raise_or_stay_finite(value, position):
    value = torch.tensor(value, dtype=torch.float32) if isinstance(value, list) else value
    tokens = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
    try:
        patch = Patch("hook_embed", value, position=position)
        result = decompose(model(), tokens, patches=[patch], bootstrap=NO_INTERVALS, progress=False)
    except LensPositionError:
        return
    assert finite_table(result.heads, COMPONENTS)
    finite = torch.isfinite(torch.as_tensor(value)).all()
    assert bool(finite)


option_values = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-3, 1 << 20),
                          st.booleans(), st.text(max_size=3))


@SETTINGS
@given(ntk_alpha=option_values, window=option_values, n_ctx=option_values,
       by_parts=st.one_of(st.none(), st.booleans(), st.dictionaries(
           st.sampled_from(["factor", "low_freq_factor", "high_freq_factor", "original_context", "other"]),
           st.floats(allow_nan=True, allow_infinity=True), max_size=3)))
def test_load_options_are_refused_or_give_a_finite_rotary_config(ntk_alpha, window, n_ctx, by_parts):
    """Every option set is refused with the package's error, or yields a config whose rotary
    bases, factors, window and context are finite and of the right type."""
    cfg = {"positional_embedding_type": "rotary", "rotary_dim": 8, "rotary_base": 10000.0, "n_ctx": 64,
           "n_layers": 2, "rotary_base_local": None}
    try:
        check_position_options(ntk_alpha=ntk_alpha, ntk_by_parts=by_parts, window=window, n_ctx=n_ctx)
        out, facts = apply_position_options(cfg, ntk_alpha=ntk_alpha, ntk_by_parts=by_parts, window=window,
                                            n_ctx=n_ctx)
    except LensPositionError:
        return
    assert math.isfinite(out["rotary_base"]) and out["rotary_base"] > 0
    assert isinstance(out["n_ctx"], int) and out["n_ctx"] >= 2
    if window is not None:
        assert isinstance(out["window_size"], int) and out["window_size"] >= 1
    for key in ("NTK_by_parts_factor", "NTK_by_parts_low_freq_factor", "NTK_by_parts_high_freq_factor"):
        if key in out:
            assert math.isfinite(out[key]) and out[key] > 0
    assert facts["ntk_alpha"] is None or (math.isfinite(facts["ntk_alpha"]) and facts["ntk_alpha"] > 0)


@pytest.mark.parametrize("dtype, scale", [(torch.float16, 1e4), (torch.bfloat16, 1e20)])
def test_half_precision_overflow_is_named_as_such(dtype, scale):
    """Scores that overflow float16/bfloat16 are infinite: the error names dtype overflow."""
    from lens_position.ground.errors import NonFiniteError

    overflowing = random_model(n_layers=1, attn_types=None, window=None, d_vocab=VOCAB, init_range=0.3)
    with torch.no_grad():
        overflowing.model.blocks[0].attn.W_Q.mul_(scale)
        overflowing.model.blocks[0].attn._W_K.mul_(scale)
    overflowing.model.to(dtype)
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(NonFiniteError, match="overflow"):
        sink_heads(overflowing, tokens, bootstrap=NO_INTERVALS, progress=False)
