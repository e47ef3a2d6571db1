"""The rotary-band split and position-0 convergence on either backend (marked tl4: these run on
TransformerLens 4.x, where only the bridge exists, as well as on 3.9).

Each bridge result is checked against an independent reference: the closed-form RoPE
frequencies of the model's config, the split's own identity (bands plus cross terms equal ``R``),
the Hugging Face model's own forward pass. The two backends are compared with each other in
test_instruments_backend_parity.py (TransformerLens 3.x, where both exist).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from lens_position.analyses.convergence import _instances, position0_convergence
from lens_position.analyses.rotary_bands import frequency_bands, rotary_bands, rotary_frequencies
from lens_position.core.data import build_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.tiny import byte_tokenizer

pytestmark = pytest.mark.tl4

FEW = Bootstrap(n_resamples=20)


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-gemma3"])
def bridged(request):
    model = load_model(request.param, backend="bridge")
    return model, build_prompts(model, T=20, N=4)


def test_bridge_frequencies_are_the_closed_form_of_each_layers_base(bridged):
    model, _ = bridged
    spec = model.spec
    d = spec.d_head
    for layer in range(spec.n_layers):
        base = spec.rotary_base_local if spec.is_local(layer) and spec.rotary_base_local else spec.rotary_base
        expected = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        assert torch.allclose(rotary_frequencies(model, layer), expected, rtol=1e-5, atol=1e-7), layer


def test_bridge_bands_plus_cross_terms_equal_r_and_match_the_models_scores(bridged):
    model, prompts = bridged
    result = rotary_bands(model, prompts, n_bands=2, bootstrap=FEW, progress=False)
    heads = result.heads
    assert np.isfinite(heads["R"]).all()
    assert (heads["R_split_error"].abs() <= 1e-6 * heads["R"].abs().clip(lower=1e-3)).all()
    assert result.heads["score_error"].max() < 1e-4


def test_a_wrong_score_scale_is_refused_not_split(bridged, monkeypatch):
    model, prompts = bridged
    backend = model.backend
    real = type(backend).rotary_layout

    def doubled(self, layer):
        import dataclasses
        layout = real(self, layer)
        return dataclasses.replace(layout, scale=layout.scale * 2)

    monkeypatch.setattr(type(backend), "rotary_layout", doubled)
    with pytest.raises(UnsupportedArchitectureError, match="hook_attn_scores"):
        rotary_bands(model, prompts, n_bands=2, bootstrap=FEW, progress=False)


def test_a_nope_layer_has_no_bands_and_the_rope_layers_still_split(tmp_path):
    config = transformers.SmolLM3Config(vocab_size=259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                        no_rope_layers=[1, 0], pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    transformers.SmolLM3ForCausalLM(config).save_pretrained(tmp_path / "smollm3")
    byte_tokenizer(False).save_pretrained(tmp_path / "smollm3")
    model = load_model(tmp_path / "smollm3", backend="bridge")
    with pytest.raises(UnsupportedArchitectureError, match="no rotary embedding"):
        frequency_bands(model, 1)
    result = rotary_bands(model, build_prompts(model, T=16, N=4), layers=[0], n_bands=2, bootstrap=FEW,
                          progress=False)
    assert set(result.heads["layer"]) == {0}


def test_bridge_convergence_cosines_are_the_hf_models_own_hidden_states(bridged):
    model, prompts = bridged
    result = position0_convergence(model, prompts, n_tokens=2, n_random=1, bootstrap=FEW, progress=False)
    hf = model.backend.model.original_model
    tokens0 = torch.unique(prompts.tokens[:, :1], dim=0)
    instances = _instances(model, tokens0, ("token", "mean", "random"), 2, 1, 0)
    embed = model.backend.W_E
    with torch.no_grad():
        base = hf(inputs_embeds=embed[tokens0[:, 0]][:, None], output_hidden_states=True).hidden_states
        for label, vector in instances:
            replaced = hf(inputs_embeds=vector[:, None].to(embed.dtype), output_hidden_states=True).hidden_states
            rows = result.per_replacement[result.per_replacement["replacement"] == label].sort_values("layer")
            for layer in range(model.spec.n_layers - 1):  # HF's last hidden state is after the final norm
                a, b = replaced[layer + 1][:, 0].double(), base[layer + 1][:, 0].double()
                cosine = float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())
                assert rows["cosine"].iloc[layer] == pytest.approx(cosine, abs=1e-5), (label, layer)
