"""Where the sink comes from: hand-set models built to be each kind come out as built, the scores at
each location are the model's own attention, the verdict never says more than its interval, and
bad inputs are refused by name. The embedded models are in test_position0_real.py (slow)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.sink_origin import (
    KEPT_HIGH,
    KEPT_LOW,
    NONE_FLOOR,
    origin_verdict,
    sink_origin,
    sink_origin_tokens,
)
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.ground.errors import BadInputError
from lens_position.models.toy import BOS_TOKEN_ID, sink_origin_model, toy_tokens

BUILT = {"position": "position-driven", "bos": "BOS-driven", "mixed": "mixed", "none": "none"}


@pytest.mark.parametrize("kind", list(BUILT))
def test_each_hand_set_model_comes_out_as_built(kind):
    result = sink_origin(sink_origin_model(kind), toy_tokens(12, 32, bos=False, seed=3), progress=False)
    assert result.origin == BUILT[kind], result.verdict["reason"].iloc[0]
    verdict = result.verdict.iloc[0]
    if kind == "position":  # the sink stays at 0 when BOS moves, and does not go with it
        assert result.rate("bos_moved").value == 1.0 and verdict["followed"] == 0.0
    if kind == "bos":  # the sink goes with BOS, and doubled BOS shares it between keys 0 and 1
        assert result.rate("bos_moved", "bos").value == 1.0 and verdict["followed"] == 1.0
        assert result.rate("no_bos").value == 0.0 and result.rate("bos_doubled", "bos").value == 1.0
    if kind == "mixed":  # one head of each kind: half the heads keep their sink without BOS
        assert verdict["kept"] == pytest.approx(0.5) and verdict["kept_lo"] > KEPT_LOW
    if kind == "none":
        assert (result.frame["sink_rate"].dropna() == 0).all()


def test_the_scores_at_each_location_are_the_models_attention(tiny_gemma3):
    # tiny-gemma3's tokenizer has a BOS; read the moved and doubled BOS's attention by hand
    model = tiny_gemma3
    body = build_prompts(model, T=24, N=4, bos="none").tokens
    result = sink_origin(model, body, moved_to=5, eps=0.05, bootstrap=Bootstrap(n_resamples=0), progress=False)
    bos_id = model.tokenizer.bos_token_id
    tokens = sink_origin_tokens(body, bos_id, 5)
    assert (tokens["bos_moved"][:, 5] == bos_id).all() and (tokens["bos_moved"][:, :5] == body[:, :5]).all()
    _, cache = model.model.run_with_cache(tokens["bos_moved"], names_filter=lambda n: n.endswith("hook_pattern"))
    heads = result.heads[(result.heads["condition"] == "bos_moved") & (result.heads["location"] == "bos")]
    for layer in range(model.spec.n_layers):
        by_hand = cache[f"blocks.{layer}.attn.hook_pattern"][:, :, 5:, 5].double().mean(-1).mean(0)
        ours = heads[heads["layer"] == layer].sort_values("head")["sink_score"].to_numpy()
        np.testing.assert_allclose(ours, by_hand.numpy(), atol=1e-6)


def _rates(kept_share: float, base: float, n: int, noise: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    with_bos = np.clip(base + noise * rng.standard_normal(n), 0, 1)
    without = np.clip(kept_share * with_bos + noise * rng.standard_normal(n), 0, 1)
    return with_bos, without


def _table(*rates: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame([{"sink_rate_lo": max(r.mean() - 0.05, 0), "sink_rate_hi": r.mean() + 0.05,
                          "n_prompts": len(r)} for r in rates])


@settings(max_examples=150, deadline=None)
@given(kept=st.floats(0, 1.5), base=st.floats(0, 1), n=st.integers(1, 40), noise=st.floats(0, 0.3),
       seed=st.integers(0, 2**16))
def test_the_verdict_never_says_more_than_its_interval(kept, base, n, noise, seed):
    with_bos, without = _rates(kept, base, n, noise, seed)
    verdict, share, _ = origin_verdict(_table(with_bos, without), with_bos, without, Bootstrap())
    if n < 4:
        assert verdict == "inconclusive"
    if verdict == "position-driven":
        assert share.lo >= KEPT_HIGH
    elif verdict == "BOS-driven":
        assert share.hi <= KEPT_LOW
    elif verdict == "mixed":
        assert KEPT_LOW < share.lo and share.hi < KEPT_HIGH
    elif verdict == "none":
        assert with_bos.mean() + 0.05 < NONE_FLOOR and without.mean() + 0.05 < NONE_FLOOR
    if verdict in ("position-driven", "BOS-driven", "mixed"):  # a share of a resolved sink, never of noise
        assert np.isfinite(share.value) and with_bos.mean() > NONE_FLOOR


def test_a_near_zero_with_bos_rate_gives_no_share():
    with_bos = np.array([0.0, 0.01, 0.0, 0.02, 0.0, 0.0, 0.01, 0.0])
    without = np.array([0.6, 0.7, 0.65, 0.6, 0.7, 0.6, 0.62, 0.68])
    verdict, share, reason = origin_verdict(_table(with_bos, without), with_bos, without, Bootstrap())
    assert verdict == "inconclusive" and np.isnan(share.value) and "near-zero denominator" in reason


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), length=st.integers(3, 40), data=st.data())
def test_the_conditions_hold_the_same_text_and_one_bos_where_built(n, length, data):
    moved = data.draw(st.integers(1, length - 2))
    body = torch.randint(2, 8, (n, length))
    tokens = sink_origin_tokens(body, BOS_TOKEN_ID, moved)
    assert all(t.shape == body.shape for t in tokens.values())
    assert ((tokens["bos"] == BOS_TOKEN_ID).sum(1) == 1).all() and (tokens["bos"][:, 1:] == body[:, :-1]).all()
    assert ((tokens["bos_moved"] == BOS_TOKEN_ID).nonzero()[:, 1] == moved).all()
    assert (tokens["bos_moved"][:, moved + 1:] == body[:, moved:-1]).all()
    assert (tokens["bos_doubled"][:, :2] == BOS_TOKEN_ID).all() and (tokens["no_bos"] == body).all()


def test_bad_inputs_are_refused_by_name(tiny_llama):
    model = sink_origin_model("bos")
    body = toy_tokens(6, 16, bos=False)
    with pytest.raises(BadInputError, match="hold the BOS token"):
        sink_origin(model, toy_tokens(6, 16, bos=True), progress=False)
    with pytest.raises(BadInputError, match="moved_to"):
        sink_origin(model, body, moved_to=15, progress=False)
    with pytest.raises(BadInputError, match="must include 'bos' and 'no_bos'"):
        sink_origin(model, body, conditions=["bos", "bos_moved"], progress=False)
    with pytest.raises(BadInputError, match="named once"):
        sink_origin(model, body, conditions=["bos", "no_bos", "bos_sideways"], progress=False)
    with pytest.raises(BadInputError, match="eps"):
        sink_origin(model, body, eps=1.5, progress=False)
    no_bos = dataclasses.replace(model, spec=dataclasses.replace(model.spec, bos_token_id=None))
    with pytest.raises(BadInputError, match="has no BOS token"):
        sink_origin(no_bos, body, progress=False)
