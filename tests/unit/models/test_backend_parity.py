"""Parity of the two backends: the same prompts through ``hooked`` and ``bridge`` give the same
numbers within the float32 tolerances of tests/helpers/parity.py, and the same claim verdicts
(3.x only: it needs HookedTransformer, so it is not marked tl4). The measurement is
:func:`parity.measure_parity`, the one scripts/parity_table.py writes into the docs; the docs
table is checked against it here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from parity import REAL_TOLERANCES, TOLERANCES, Parity, check_real_model_parity, measure_parity

from lens_position.models.tiny import TINY_CONFIGS

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "howto" / "which-transformerlens.md"


def _table_script():
    spec = importlib.util.spec_from_file_location("parity_table", ROOT / "scripts" / "parity_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("parity_table", module)
    spec.loader.exec_module(module)
    return module


TABLE = _table_script()
TINY = sorted(TINY_CONFIGS)
assert set(TINY) == set(TABLE.TINY_MODELS), "the docs table and the tests measure the same tiny models"


@pytest.fixture(scope="module", params=TINY)
def parity(request) -> Parity:
    return measure_parity(request.param, **TABLE.TINY_SETTINGS)


def test_the_specs_agree(parity):
    assert parity.spec_mismatches == []


def test_every_quantity_agrees_within_its_tolerance(parity):
    """Logits, visible scores and patterns (the same masks), every decomposition column, sink
    scores and rates, BOS replacement, a resid_pre patching sweep."""
    assert set(parity.differences) == set(TOLERANCES)
    assert parity.over_tolerance() == {}, parity.over_tolerance()


def test_the_claim_verdicts_are_identical(parity):
    assert len(parity.verdicts["hooked"]) == 2 * 5  # C1-C5, for the model and overall
    assert parity.verdicts["hooked"] == parity.verdicts["bridge"]


def test_the_docs_table_states_the_tolerances_the_tests_use():
    tolerances, real, _ = TABLE.parse_block(PAGE.read_text(encoding="utf-8"))
    assert tolerances == TOLERANCES and real == REAL_TOLERANCES


def test_the_docs_table_records_what_the_measurement_gives_now(parity):
    """The recorded differences of this tiny model are within a factor of ten of the ones measured
    now, at the same T and N: the table cannot drift from the code."""
    _, _, recorded = TABLE.parse_block(PAGE.read_text(encoding="utf-8"))
    assert parity.model in recorded, f"the docs table has no column for {parity.model}"
    row = recorded[parity.model]
    assert (row["T"], row["N"]) == (parity.T, parity.N)
    assert set(row["values"]) == set(TOLERANCES)
    page = PAGE.read_text(encoding="utf-8")
    if f"({TABLE.versions()}, CPU" not in page:
        # another build than the recorded one (the table names its versions): float32 round-off differs
        # from build to build, so only the tolerances hold (the test above); the orders of magnitude are
        # those of the tested build
        assert parity.over_tolerance() == {}
        return
    off = {q: (row["values"][q], measured) for q, measured in parity.differences.items()
           if not TABLE.within_a_factor_of_ten(row["values"][q], measured)}
    assert off == {}, f"recorded vs measured now: {off}; rerun python scripts/parity_table.py"


def test_the_order_of_magnitude_check_tells_a_drift():
    assert TABLE.within_a_factor_of_ten(3e-6, 9e-6) and TABLE.within_a_factor_of_ten(0.0, 1e-12)
    assert not TABLE.within_a_factor_of_ten(1e-7, 2e-6) and not TABLE.within_a_factor_of_ten(0.0, 1.0)


@pytest.mark.slow
def test_the_backends_agree_on_smollm2_beyond_gemma3s_window():
    """SmolLM2-135M at T = 600 (Gemma-3-270M, the other real model, is in
    test_backend_parity_real.py: each takes minutes, and a file runs on one test worker)."""
    check_real_model_parity("smollm2-135m", TABLE, PAGE)
