"""A fraction ``1 - condition / base`` is printed only where its denominator is resolved from 0:
the rule itself by class (hypothesis), then on BOS replacement's tables and headlines, and on
claim C4, which is inconclusive (never a verdict) when the fraction is not defined."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.claims import INCONCLUSIVE, evaluate
from lens_position.core.data import build_prompts
from lens_position.core.intervals import RATIO_FLOOR, Bootstrap, denominator_resolved
from lens_position.models import load_model


@settings(max_examples=200, deadline=None)
@given(st.floats(-1, 1), st.floats(0.0001, 0.5), st.integers(0, 2**16))
def test_a_denominator_is_resolved_exactly_when_its_interval_excludes_zero_and_it_passes_the_floor(centre, spread,
                                                                                                  seed):
    replicates = centre + spread * np.random.default_rng(seed).standard_normal(400)
    lo, hi = np.quantile(replicates, [0.025, 0.975])
    expected = abs(centre) >= RATIO_FLOOR and (lo > 0 or hi < 0)
    assert denominator_resolved(centre, replicates) == expected
    assert denominator_resolved(centre, None) == (abs(centre) >= RATIO_FLOOR)
    assert not denominator_resolved(math.nan, replicates)


@pytest.fixture(scope="module")
def bos():
    model = load_model("tiny-llama")
    return bos_replacement(model, build_prompts(model, T=40, N=8), bootstrap=Bootstrap(n_resamples=100),
                           progress=False)


def test_every_printed_fraction_has_a_resolved_denominator(bos):
    for frame in (bos.frame, bos.overall):
        for name, stem in (("fraction_removed", "R"), ("fraction_removed_rf", "R_rf"),
                           ("fraction_removed_rf_heldout", "R_rf_heldout")):
            resolved = frame[f"{name}_resolved"].astype(bool)
            assert frame.loc[~resolved, [name, f"{name}_lo", f"{name}_hi"]].isna().all().all()
            assert frame.loc[resolved, name].notna().all()
            assert (frame.loc[resolved, f"{stem}_base"].abs() >= RATIO_FLOOR).all()
            replaced = frame[f"{stem}_replaced"] if f"{stem}_replaced" in frame else frame[f"{stem}_condition"]
            assert np.allclose(frame.loc[resolved, name], 1 - replaced[resolved] / frame.loc[resolved, f"{stem}_base"])
    # this model's held-out R' is small: a case where the fraction is not defined, and says so
    assert not bos.overall["fraction_removed_rf_heldout_resolved"].any()
    printed = [line for line in repr(bos).splitlines() if line.strip().startswith("R' removed")]
    assert len(printed) == 3 and all(line.rstrip().endswith("not defined") for line in printed)


def test_c4_is_inconclusive_when_the_fraction_is_not_defined(bos):
    tables = {"bos_overall": bos.overall.assign(architecture="standard"),
              "bos_replicates": bos.replicates.assign(architecture="standard")}
    rows = [row for row in evaluate(tables) if row.claim == "C4"]
    assert rows and all(row.verdict.startswith(INCONCLUSIVE.split()[0]) for row in rows)  # per model and overall
    assert any("not defined" in row.explanation for row in rows)
