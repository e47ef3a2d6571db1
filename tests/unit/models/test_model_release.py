"""A model is freed once nothing of the user's holds it: no module-level table keeps a loaded model
alive, a result keeps no reference to the model it was measured on, and a run over several models
releases each before it loads the next (tl4: on both TransformerLens lines)."""

import gc
import weakref

import pytest

from lens_position.analyses.decompose import decompose
from lens_position.analyses.leakage import leakage_texts, positional_leakage
from lens_position.analyses.sinks import sink_heads
from lens_position.core.data import build_prompts
from lens_position.models import load_model
from lens_position.models.backends import bridge_class, hooked_available
from lens_position.pipeline.config import RunConfig
from lens_position.pipeline.runner import run

pytestmark = pytest.mark.tl4
BACKENDS = [b for b, there in (("hooked", hooked_available()), ("bridge", bridge_class() is not None)) if there]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_model_is_collected_once_the_user_drops_it_results_and_all(backend):
    loaded = load_model("tiny-llama", backend=backend)
    prompts = build_prompts(loaded, source="random", T=16, N=4)
    results = [decompose(loaded, prompts, progress=False), sink_heads(loaded, prompts, progress=False),
               positional_leakage(loaded, leakage_texts()[:4], n_samples=2, n_seeds=1, n_perm=20, progress=False)]
    model, spec = weakref.ref(loaded.backend.model), loaded.spec
    del loaded
    gc.collect()
    assert model() is None, "the loaded model outlived its last user reference"
    assert all(r.provenance["model"]["name"] == spec.name for r in results)  # the results are still whole


def test_a_run_over_several_models_releases_each_before_the_next_loads(tmp_path):
    alive = []

    def load(request):
        gc.collect()
        still = [name for name, ref in alive if ref() is not None]
        assert not still, f"{still} still held when {request} loads"
        loaded = load_model(request)
        alive.append((request, weakref.ref(loaded.backend.model)))
        return loaded

    config = RunConfig(out=tmp_path / "out", models=("tiny-llama", "tiny-qwen2", "tiny-mistral"), quick=True, T=24,
                       N=4, steps=("decompose", "sink_heads"), browser_check=False, progress=False)
    run(config, load=load)
    assert [name for name, _ in alive] == ["tiny-llama", "tiny-qwen2", "tiny-mistral"]
