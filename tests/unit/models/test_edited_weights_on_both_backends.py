"""An edited weight is never reported under the load-time hash, on either backend: edited before
the first analysis, in place after one, through ``.data`` after one (no version counter moves), and
on the bridge through the Hugging Face model it wraps. Each next result's provenance carries the
sha256 of the weights as they are (:func:`lens_position.models.weights.model_weights_sha256`).

Marked ``tl4``: it runs on TransformerLens 3.9 (both backends) and 4.3 (the bridge)."""

from __future__ import annotations

import pytest
import torch

from lens_position.analyses.decompose import decompose
from lens_position.core.data import build_prompts
from lens_position.core.intervals import NO_INTERVALS
from lens_position.models import load_model
from lens_position.models.backends import hooked_class
from lens_position.models.weights import model_weights_sha256

pytestmark = pytest.mark.tl4

BACKENDS = ["bridge"] + (["hooked"] if hooked_class() is not None else [])


def _hash(loaded, prompts) -> str:
    return decompose(loaded, prompts, bootstrap=NO_INTERVALS, progress=False).provenance["model"]["weights_sha256"]


def _first_matrix(module: torch.nn.Module) -> torch.Tensor:
    return next(p for p in module.parameters() if p.ndim >= 2)


@pytest.mark.fault(area="provenance", given="weights edited before the first analysis, in place after one, through "
                                            ".data after one, or (bridge) through the wrapped Hugging Face model",
                   happens="each next result's provenance carries the sha256 of the weights as edited, on both "
                           "backends")
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_edit_shows_in_the_next_results_hash(backend):
    loaded = load_model("tiny-llama", backend=backend)
    at_load = loaded.spec.weights_sha256
    prompts = build_prompts(loaded, T=8, N=2, source="random")
    seen = [at_load]

    def edited(edit) -> None:
        with torch.no_grad():
            edit()
        now = _hash(loaded, prompts)
        assert now == model_weights_sha256(loaded.model) and now not in seen
        seen.append(now)

    weight = _first_matrix(loaded.model)
    edited(lambda: weight.data.__setitem__((0, 0), weight.data[0, 0] + 1.0))  # before any analysis
    edited(lambda: weight.mul_(1.5))  # in place, after a first analysis
    edited(lambda: weight.data.__setitem__((1, 1), -3.0))  # through .data: no version counter moves
    if backend == "bridge":
        edited(lambda: _first_matrix(loaded.model.original_model).data.__setitem__((0, 1), 7.0))
    assert loaded.spec.extra["weights_sha256_at_load"] == at_load
