"""Parity of the two backends on Gemma-3-270M beyond its window (T = 600): a file of its own, so it
runs on another test worker than SmolLM2's (test_backend_parity.py); each takes minutes."""

from __future__ import annotations

import pytest
from parity import check_real_model_parity
from test_backend_parity import PAGE, TABLE


@pytest.mark.slow
def test_the_backends_agree_on_gemma3_beyond_its_window():
    assert set(TABLE.REAL_MODELS) == {"smollm2-135m", "gemma3-270m"}  # both are checked
    check_real_model_parity("gemma3-270m", TABLE, PAGE)
