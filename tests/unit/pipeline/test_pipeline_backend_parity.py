"""A reproduction on the bridge backend gives the hooked backend's tables and verdicts
(TransformerLens 3.x, where both exist), within the parity tolerances of tests/helpers/parity.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from lens_position.pipeline import Compute, RunConfig, run

MODELS = ("tiny-llama", "tiny-gemma3")
STEPS = ("decompose", "sink_rate", "bos")


def _config(out: Path, executor: str, backend: str = "bridge") -> RunConfig:
    return RunConfig(out=out, models=MODELS, quick=True, T=24, N=4, executor=executor,
                     compute=Compute(threads=1, backend=backend), steps=STEPS, browser_check=False, progress=False)


def test_the_bridge_run_gives_the_hooked_runs_tables_and_verdicts(tmp_path):
    serial_bridge = run(_config(tmp_path / "bridge", "serial"))
    from parity import TOLERANCES

    hooked = run(_config(tmp_path / "out", "serial", backend="hooked"))
    # the loosest statistic of the parity table (BOS replacement's: its changes of R are differences of
    # two fits), absolute and relative: a table's columns run from fractions to changes of O(1)
    tolerance = TOLERANCES["BOS replacement (fraction removed, per layer and overall)"]
    for name, frame in hooked.tables.items():
        other = serial_bridge.tables[name]
        numbers = frame.select_dtypes("number").columns
        a, b = frame[numbers].to_numpy(float), other[numbers].to_numpy(float)
        # a fraction removed is 1 - R_replaced / R on a random model whose R is near 0 in some layers:
        # its interval bounds reach +-160, where float32 noise in R is amplified by the same factor
        rtol = np.array([1e-3 if column.startswith("fraction_removed") else 2 * tolerance for column in numbers])
        close = np.isclose(a, b, atol=tolerance, rtol=rtol, equal_nan=True)
        worst = {numbers[j]: (a[i, j], b[i, j]) for i, j in zip(*np.nonzero(~close))}
        assert close.all(), (name, worst)
    pd.testing.assert_frame_equal(hooked.claims[["claim", "architecture", "verdict"]],
                                  serial_bridge.claims[["claim", "architecture", "verdict"]])
