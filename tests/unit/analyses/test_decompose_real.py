"""The decomposition on the real default models: the exact identity log A = t - z against
the model's own pattern, and the sliding-window key sets of Gemma-3 (slow: loads the GGUFs)."""

import numpy as np
import pytest

from lens_position.analyses.decompose import check_identity, decompose
from lens_position.core.data import build_prompts

pytestmark = pytest.mark.slow


def test_identity_log_a_equals_t_minus_z_on_smollm2(smollm2):
    prompts = build_prompts(smollm2, T=96, N=2)
    errors = check_identity(smollm2, prompts)
    assert len(errors) == smollm2.spec.n_layers
    assert (errors.max_abs_error_pattern < 1e-5).all()
    assert (errors.max_abs_error_log < 1e-4).all()
    assert (errors.max_row_sum_error < 1e-9).all()


def test_identity_and_sliding_windows_on_gemma3(gemma3):
    # longer than the window of 512, so the local layers' key sets slide
    prompts = build_prompts(gemma3, T=560, N=2)
    assert prompts.has_bos
    layers = [0, 5]  # a local layer and the first global one
    errors = check_identity(gemma3, prompts, layers=layers)
    assert (errors.max_abs_error_pattern < 1e-5).all() and (errors.max_abs_error_log < 1e-4).all()
    # decompose checks the key set it assumes against the -inf pattern of hook_attn_scores
    result = decompose(gemma3, prompts, layers=layers, progress=False)
    assert list(result.layers.layer_type) == ["local", "global"]
    assert set(result.heads.window.dropna()) == {512}
    np.testing.assert_allclose(result.heads["total"], result.heads.R + result.heads.M + result.heads.C, atol=1e-9)
    assert result.heads["total"].between(0, 1).all()
