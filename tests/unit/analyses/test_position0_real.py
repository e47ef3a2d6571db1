"""The position-0 audit on the embedded models (slow): SmolLM2's sink is position-driven and
Gemma-3's BOS-driven, decided from intervals; the massive activations are the plain-hook computation
and sit where the literature and the model say (SmolLM2: dimension 507 at position 0); setting them to
zero or to their mean reports its effects with intervals."""

from __future__ import annotations

import numpy as np
import pytest

from lens_position.analyses.massive import massive_activations, massive_intervention
from lens_position.analyses.sink_origin import sink_origin
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap

pytestmark = pytest.mark.slow

EXPECTED = {"smollm2": "position-driven", "gemma3": "BOS-driven"}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_sink_origin_of_each_embedded_model(name, request):
    model = request.getfixturevalue(name)
    result = sink_origin(model, conditions=["bos", "no_bos", "bos_moved"], T=64, N=16, progress=False)
    verdict = result.verdict.iloc[0]
    assert result.origin == EXPECTED[name], verdict["reason"]
    assert verdict["kept_lo"] <= verdict["kept"] <= verdict["kept_hi"]
    if name == "gemma3":  # its sink goes with BOS: at a BOS moved to position 8, not at position 0
        assert result.rate("bos_moved", "bos").lo > 0.5 and result.rate("bos_moved").hi < 0.02
    else:  # SmolLM2's stays at position 0 and ignores a moved BOS
        assert result.rate("bos_moved").lo > 0.5 and result.rate("bos_moved", "bos").hi < 0.02


@pytest.mark.parametrize("name", list(EXPECTED))
def test_the_massive_activations_are_the_plain_hook_computation(name, request):
    model = request.getfixturevalue(name)
    prompts = build_prompts(model, T=32, N=6)
    result = massive_activations(model, prompts, bootstrap=Bootstrap(n_resamples=50), progress=False)
    _, cache = model.model.run_with_cache(prompts.tokens, names_filter=lambda n: n.endswith("hook_resid_post"))
    for layer in range(model.spec.n_layers):
        flat = cache[f"blocks.{layer}.hook_resid_post"].double().abs().flatten(1)
        row = result.layers.iloc[layer]
        assert row["top1"] == pytest.approx(float(flat.max(1).values.mean()), rel=1e-5)
        assert row["median_abs"] == pytest.approx(float(flat.median(1).values.mean()), rel=1e-5)
        massive = (flat >= 100) & (flat >= 1000 * flat.median(1).values[:, None])
        assert row["n_massive"] == pytest.approx(float(massive.sum(1).double().mean()))
    top = result.layers.loc[result.layers["top1"].idxmax()]
    assert top["ratio"] > 1000 and top["top1_position"] == 0
    if name == "smollm2":
        assert top["top1_dim"] == 507 and 20_000 < top["top1"] < 30_000
    effects = massive_intervention(model, prompts, massive=result, bootstrap=Bootstrap(n_resamples=50),
                                   progress=False).frame
    assert list(effects["intervention"]) == ["set_zero", "set_mean"]
    for column in ("sink_rate_change", "R_rf_change", "loss_change"):
        assert np.isfinite(effects[[f"{column}_lo", f"{column}_hi"]].to_numpy()).all()
        assert (effects[f"{column}_lo"] <= effects[f"{column}_hi"]).all()
