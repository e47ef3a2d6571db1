"""The rotary-band split and position-0 convergence on either backend (marked tl4: these run on
TransformerLens 4.x, where only the bridge exists, as well as on 3.9).

Each bridge result is checked against an independent reference: the closed-form RoPE
frequencies of the model's config, the split's own identity (bands plus cross terms equal ``R``),
the Hugging Face model's own forward pass. The two backends are compared with each other in
test_instruments_backend_parity.py (TransformerLens 3.x, where both exist).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata

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
from lens_position.models.family_checkpoints import write_family_checkpoint
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

    def doubled(self, layer, length=None):
        import dataclasses
        layout = real(self, layer, length)
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


# TransformerLens 3.x's bridge does not compute Cohere's or HunYuan's attention exactly (refused at load
# there, in the family matrix's test): their rotations are checked on the 4.x line.
ON_4 = int(importlib.metadata.version("transformer_lens").split(".")[0]) >= 4


@pytest.fixture(scope="module", params=["phi3", "gpt_neox", *(["cohere"] if ON_4 else [])])
def fused_or_interleaved(request, tmp_path_factory):
    """Families whose rotation the bridge hides (fused QKV: Phi-3; fused and partial rotary: GPT-NeoX)
    or tables in the interleaved layout (Cohere)."""
    folder = write_family_checkpoint(request.param, tmp_path_factory.mktemp(request.param) / "model")
    model = load_model(folder, backend="bridge")
    return request.param, model, build_prompts(model, T=12, N=4, source="random")


def test_bands_of_hidden_or_interleaved_rotations_add_up_to_the_models_scores(fused_or_interleaved):
    family, model, prompts = fused_or_interleaved
    layout = model.backend.rotary_layout(0)
    assert layout.rotated_here == (family in ("phi3", "gpt_neox"))
    assert layout.interleaved_table == (family == "cohere")
    assert layout.rotary_dim == (4 if family == "gpt_neox" else model.spec.d_head)  # partial_rotary_factor 0.25
    result = rotary_bands(model, prompts, n_bands=2, bootstrap=FEW, progress=False)
    heads = result.heads
    assert (heads["R_split_error"].abs() <= 1e-6 * heads["R"].abs().clip(lower=1e-3)).all()
    assert heads["score_error"].max() < 1e-4
    assert (family == "gpt_neox") == ("unrotated" in set(result.bands["band"]))


@pytest.mark.parametrize("fused_or_interleaved", ["phi3", "gpt_neox"], indirect=True)
def test_a_hidden_rotation_in_the_wrong_pairs_is_refused_not_split(fused_or_interleaved, monkeypatch):
    """Where lens_position turns q and k itself, the split's check against the model's scores is
    what catches a wrong pair layout."""
    family, model, prompts = fused_or_interleaved
    backend = model.backend
    real = type(backend).rotary_layout

    def other_pairs(self, layer, length=None):
        layout = real(self, layer, length)
        return dataclasses.replace(layout, adjacent_pairs=not layout.adjacent_pairs)

    monkeypatch.setattr(type(backend), "rotary_layout", other_pairs)
    with pytest.raises(UnsupportedArchitectureError, match="hook_attn_scores"):
        rotary_bands(model, prompts, n_bands=2, bootstrap=FEW, progress=False)


def test_a_norm_after_the_rotation_is_refused_by_name(tmp_path):
    folder = write_family_checkpoint("hunyuan_v1_dense", tmp_path / "hunyuan")
    if not ON_4:
        with pytest.raises(UnsupportedArchitectureError, match="does not compute what its Hugging Face source"):
            load_model(folder, backend="bridge")
        return
    with pytest.raises(UnsupportedArchitectureError, match="a norm after the rotation"):
        frequency_bands(load_model(folder, backend="bridge"), 0)
