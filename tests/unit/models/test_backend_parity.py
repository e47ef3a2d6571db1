"""Parity of the two backends: the same prompts through ``hooked`` and ``bridge`` on the tiny
models give the same numbers within the float32 tolerances of tests/helpers/parity.py (3.x
only: it needs HookedTransformer, so it is not marked tl4)."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest
import torch
from parity import TOLERANCES

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import resid_pre_sweep
from lens_position.analyses.sinks import sink_heads
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.models import load_model
from lens_position.models.tiny import TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[3]
TINY = sorted(TINY_CONFIGS)
T = 40  # beyond tiny-mistral's window (32) and tiny-gemma3's (16): the windows bite
DECOMPOSITION = re.compile(r"^(total|R|M|C|R_rf|M_rf|C_rf)(_heldout)?(_lo|_hi)?$")


def _max_difference(a: pd.DataFrame, b: pd.DataFrame, columns: list[str]) -> float:
    assert len(a) == len(b) and columns
    return float((a[columns].reset_index(drop=True) - b[columns].reset_index(drop=True)).abs().max().max())


@pytest.fixture(scope="module", params=TINY)
def both(request) -> dict[str, dict]:
    out = {}
    for backend in ("hooked", "bridge"):
        loaded = load_model(request.param, backend=backend)
        assert loaded.spec.extra["backend"] == backend
        prompts = build_prompts(loaded, N=4, T=T, source="natural", seed=0)
        names = [f"blocks.{layer}.attn.hook_{kind}" for layer in range(loaded.spec.n_layers)
                 for kind in ("attn_scores", "pattern")]
        out[backend] = dict(loaded=loaded, prompts=prompts, cache=loaded.backend.run_with_cache(prompts.tokens, names),
                            logits=loaded.backend.forward(prompts.tokens))
    assert torch.equal(out["hooked"]["prompts"].tokens, out["bridge"]["prompts"].tokens)
    return out


def test_the_specs_agree(both):
    a, b = both["hooked"]["loaded"].spec, both["bridge"]["loaded"].spec
    for field in ("n_layers", "n_heads", "n_kv_heads", "d_model", "d_head", "rope_kind", "rotary_base",
                  "rotary_base_local", "window", "layer_types", "tokenizer_prepends_bos", "bos_token_id"):
        assert getattr(a, field) == getattr(b, field), field


def test_logits_scores_and_patterns_agree(both):
    assert (both["hooked"]["logits"] - both["bridge"]["logits"]).abs().max() < TOLERANCES["logits"]
    for name, hooked in both["hooked"]["cache"].items():
        bridged = both["bridge"]["cache"][name]
        visible = torch.isfinite(hooked)
        assert torch.equal(visible, torch.isfinite(bridged)), name  # the same masks
        key = "attention pattern" if name.endswith("pattern") else "attention scores (visible keys)"
        assert (hooked[visible] - bridged[visible]).abs().max() < TOLERANCES[key], name


def test_the_decomposition_agrees_column_by_column(both):
    a, b = (decompose(both[k]["loaded"], both[k]["prompts"], progress=False) for k in ("hooked", "bridge"))
    for frame in ("heads", "layers"):
        columns = [c for c in getattr(a, frame).columns if DECOMPOSITION.match(c)]
        assert {"total", "R_rf", "R_heldout", "M_rf_heldout_lo"} <= set(columns)
        assert _max_difference(getattr(a, frame), getattr(b, frame), columns) < \
            TOLERANCES["decomposition columns (T, R, M, C, both splits, held-out, intervals)"]


def test_sink_scores_and_bos_replacement_agree(both):
    a, b = (sink_heads(both[k]["loaded"], both[k]["prompts"], progress=False) for k in ("hooked", "bridge"))
    assert (a.scores - b.scores).abs().max() < TOLERANCES["sink scores"]
    no_intervals = Bootstrap(n_resamples=0)
    a, b = (bos_replacement(both[k]["loaded"], both[k]["prompts"], bootstrap=no_intervals, progress=False)
            for k in ("hooked", "bridge"))
    for frame in ("frame", "overall"):
        assert list(getattr(a, frame)["replacement"]) == list(getattr(b, frame)["replacement"])
        assert _max_difference(getattr(a, frame), getattr(b, frame), ["fraction_removed", "R_base", "R_replaced"]) < \
            TOLERANCES["BOS replacement (fraction removed, per layer and overall)"]


def test_a_patching_sweep_agrees(both):
    def metric(logits):
        return logits[:, -1].log_softmax(-1).max(-1).values.mean()

    sweeps = []
    for k in ("hooked", "bridge"):
        prompts = both[k]["prompts"].tokens
        sweeps.append(resid_pre_sweep(both[k]["loaded"], prompts[:2], prompts[2:], metric, positions=[0, 1, 5],
                                      progress=False))
    assert sweeps[0].values.shape == sweeps[1].values.shape
    assert (sweeps[0].values - sweeps[1].values).abs().max() < TOLERANCES["resid_pre patching sweep (metric)"]


def test_the_docs_state_the_tolerances_the_tests_use():
    page = (ROOT / "docs" / "howto" / "which-transformerlens.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (.+?) \| ([0-9.e-]+) \|", page, flags=re.MULTILINE))
    assert {name: float(value) for name, value in rows.items() if name in TOLERANCES} == TOLERANCES
