"""Per-cell intervals of a patching sweep, and the multiplicity step over its cells.

Coverage on null cells: sweeps whose every cell's per-prompt effect is drawn with mean zero (normal,
Laplace, Student t with 3 degrees of freedom), 2,000 cells each, through the sweep's own interval
code. A 95% interval must contain 0 in 93-97% of them at N = 8 and 12 prompts (the binomial sd of
the coverage over 2,000 cells is 0.5 points); the plain percentile bootstrap, without the Student
calibration, falls below that band at N = 8 (so this harness sees the defect it guards against).

Benjamini-Hochberg: against the textbook definition written out independently, by class
(hypothesis), and on null sweeps, where it declares (almost) nothing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lens_position.core.intervals as intervals
from lens_position.analyses.patching.sweeps import PatchSweep, _add_intervals
from lens_position.core.intervals import Bootstrap, benjamini_hochberg

LAYERS, POSITIONS = 40, 50


def _null_sweep_frame(n_prompts: int, noise: str, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    shape = (LAYERS, POSITIONS, n_prompts)
    values = {"normal": lambda: rng.standard_normal(shape), "laplace": lambda: rng.laplace(size=shape),
              "t3": lambda: rng.standard_t(3, size=shape)}[noise]()
    frame = pd.DataFrame({"layer": np.repeat(np.arange(LAYERS), POSITIONS),
                          "position": np.tile(np.arange(POSITIONS), LAYERS)})
    sweep = PatchSweep(values=torch.tensor(values), frame=frame, reduced=False, baseline=torch.zeros(n_prompts))
    _add_intervals(sweep, frame, Bootstrap())
    return frame


def _coverage(frame: pd.DataFrame) -> float:
    return float(((frame["effect_lo"] <= 0) & (frame["effect_hi"] >= 0)).mean())


@pytest.mark.parametrize("n_prompts", [8, 12])
@pytest.mark.parametrize("noise", ["normal", "laplace", "t3"])
def test_cell_intervals_cover_a_zero_effect_at_their_level(n_prompts, noise):
    frame = _null_sweep_frame(n_prompts, noise, seed=n_prompts)
    assert 0.93 <= _coverage(frame) <= 0.97
    assert (frame["q_value"] < 0.05).sum() <= 2  # a false discovery rate of 5% on a sweep with none


def test_without_the_student_calibration_the_intervals_are_too_narrow(monkeypatch):
    monkeypatch.setattr(intervals, "student_factor", lambda n_units, level=intervals.LEVEL: 1.0)
    assert _coverage(_null_sweep_frame(8, "normal", seed=8)) < 0.93


def test_the_student_factor_is_t_over_z():
    assert intervals.student_factor(8) == pytest.approx(2.3646 / 1.95996, abs=2e-4)
    assert intervals.student_factor(1000) == pytest.approx(1.0, abs=2e-3)


def _textbook_bh(p: list[float]) -> list[float]:
    """q_i = min over the p-values at least p_i of m p_j / rank_j (ranks of the ascending order,
    ties given their highest rank), capped at 1."""
    m = len(p)
    return [min(1.0, min(m * pj / sum(pk <= pj for pk in p) for pj in p if pj >= pi)) for pi in p]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_q_values_are_the_textbook_benjamini_hochberg(p):
    q = benjamini_hochberg(np.array(p))
    assert np.allclose(q, _textbook_bh(p))
    assert (q >= np.array(p) - 1e-12).all() and (q <= 1).all()
    order = np.argsort(p, kind="stable")
    assert (np.diff(q[order]) >= -1e-12).all()  # monotone in p


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.floats(0.0, 1.0), st.just(float("nan"))), min_size=1, max_size=30))
def test_missing_p_values_stay_missing_and_are_not_counted(p):
    q = benjamini_hochberg(np.array(p))
    finite = [x for x in p if x == x]
    assert np.isnan(q[[x != x for x in p]]).all()
    if finite:
        assert np.allclose(q[[x == x for x in p]], _textbook_bh(finite))


def test_bh_keeps_the_shape_and_finds_a_strong_signal_among_nulls():
    rng = np.random.default_rng(0)
    p = rng.uniform(size=(20, 30))
    p[3, 4], p[7, 8] = 1e-6, 2e-6
    q = benjamini_hochberg(p)
    assert q.shape == p.shape
    assert set(zip(*np.nonzero(q < 0.05))) == {(3, 4), (7, 8)}
