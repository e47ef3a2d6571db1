"""Weights too large for the normalisation are refused on either backend (HookedTransformer on
TransformerLens 3.x, TransformerBridge on 3.9 and 4.x): the pass checks every normalisation scale
it runs through, so the next layer never reads the zeros an overflowing scale would hand it."""

from __future__ import annotations

import pytest
import torch

from lens_position.analyses.decompose import decompose
from lens_position.analyses.sinks import sink_heads
from lens_position.core.intervals import NO_INTERVALS
from lens_position.ground.errors import NonFiniteError
from lens_position.models.load import load_model

pytestmark = pytest.mark.tl4


@pytest.mark.parametrize("backend", ["auto", "bridge"])
def test_an_embedding_too_large_to_normalise_is_refused_on_either_backend(backend):
    loaded = load_model("tiny-llama", backend=backend)
    tokens = torch.randint(1, 200, (4, 12), generator=torch.Generator().manual_seed(0))
    before = decompose(loaded, tokens, bootstrap=NO_INTERVALS, progress=False).layers["R"]
    assert before.notna().all()
    embedding = loaded.model.get_input_embeddings().weight if hasattr(loaded.model, "get_input_embeddings") \
        else loaded.model.embed.W_E
    with torch.no_grad():
        embedding.mul_(1e20)
    for analysis in (decompose, sink_heads):
        with pytest.raises(NonFiniteError, match=r"blocks\.0\.ln1\.hook_scale.*too large for the normalisation"):
            analysis(loaded, tokens, bootstrap=NO_INTERVALS, progress=False)
