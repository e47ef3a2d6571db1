"""C4 is decided on an estimate that does not drift with N.

On ``c4_model`` all of R' comes from the BOS marker (its docstring), so replacing the BOS
token removes a known fraction, 1. The in-sample R' of the replaced run still fits part of the
query noise as absolute position, more so with fewer prompts: the in-sample fraction sits below
1, climbs with N, and its interval misses the truth. The held-out fraction, on which C4 is now
decided, holds the truth in its interval at every N."""

import pandas as pd
import pytest
from c4_model import c4_model

from lens_position.analyses import claims
from lens_position.analyses.bos import bos_replacement
from lens_position.models.toy import toy_tokens

SIZES = (8, 16, 32, 64)
TRUE_FRACTION = 1.0


@pytest.fixture(scope="module")
def overall():
    model = c4_model()
    rows = []
    for n in SIZES:
        result = bos_replacement(model, toy_tokens(n, 24, bos=True, seed=n), replacements=("token",),
                                 query_range=(0, 16), progress=False)
        rows.append(result.overall.assign(N=n))
    return pd.concat(rows, ignore_index=True).set_index("N")


def test_the_heldout_fraction_holds_the_known_fraction_at_every_n(overall):
    for n in SIZES:
        row = overall.loc[n]
        assert row["fraction_removed_rf_heldout_lo"] <= TRUE_FRACTION <= row["fraction_removed_rf_heldout_hi"], n


def test_the_in_sample_fraction_drifts_with_n_and_misses_the_known_fraction(overall):
    in_sample = overall["fraction_removed_rf"]
    assert in_sample.loc[SIZES[-1]] - in_sample.loc[SIZES[0]] > 0.1
    assert (in_sample < TRUE_FRACTION).all()
    assert (overall["fraction_removed_rf_hi"] < TRUE_FRACTION).sum() >= 2  # its interval excludes the truth


def test_c4_is_decided_on_the_heldout_fraction(overall):
    table = overall.reset_index().rename(columns={"condition": "replacement"})
    for n in SIZES:
        part = table[table["N"] == n].assign(architecture="toy", role="standard", model="toy")
        (evaluation,) = [e for e in claims._evaluate_c4({"bos_overall": part}, claims.Criteria())]
        assert evaluation.estimate.value == pytest.approx(float(part["fraction_removed_rf_heldout"].iloc[0]))
        assert "held-out" in evaluation.quantity
