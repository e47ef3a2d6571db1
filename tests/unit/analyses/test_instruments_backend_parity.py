"""The rotary-band split and position-0 convergence give the same tables on the hooked and the
bridge backend (TransformerLens 3.x, where both exist), within float32 forward noise."""

from __future__ import annotations

import numpy as np
import pytest

from lens_position.analyses.convergence import position0_convergence
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.models import load_model

FEW = Bootstrap(n_resamples=20)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_both_backends_give_the_same_bands_and_convergence(name):
    results = {}
    for backend in ("hooked", "bridge"):
        model = load_model(name, backend=backend)
        prompts = build_prompts(model, T=20, N=4)
        results[backend] = (rotary_bands(model, prompts, n_bands=2, bootstrap=FEW, progress=False),
                            position0_convergence(model, prompts, n_tokens=2, n_random=1, bootstrap=FEW,
                                                  progress=False))
    (bands_h, conv_h), (bands_b, conv_b) = results["hooked"], results["bridge"]
    for table in ("heads", "bands", "cross"):
        a, b = getattr(bands_h, table).select_dtypes("number"), getattr(bands_b, table).select_dtypes("number")
        assert np.allclose(a.to_numpy(), b.to_numpy(), atol=2e-6, equal_nan=True), table
    for table in ("layers", "per_replacement", "restoration"):
        a, b = getattr(conv_h, table).select_dtypes("number"), getattr(conv_b, table).select_dtypes("number")
        assert np.allclose(a.to_numpy(), b.to_numpy(), atol=2e-6, equal_nan=True), table
