"""Load-time verification (lens_position.models.verify): a booted model that does not compute what its
source computes, a window the spec misreads, K/V hooks on the wrong axes and an NTK scaling that is
not NTK-aware are refused at load, by class (hypothesis) and on the known cases; the models that are
exact load with the verdict in their spec. Marked ``tl4``: the same on TransformerLens 3.9 and 4.x."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import lens_position.models.backends.bridge as bridge_backend
import lens_position.models.bridged as bridged_module
from lens_position.core.patch import Patch
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.backends import hooked_available
from lens_position.models.family_checkpoints import write_family_checkpoint
from lens_position.models.verify import (
    EquivalenceError,
    Reference,
    check_key_sets,
    check_kv_layout,
    compare_with_reference,
)

pytestmark = pytest.mark.tl4
TL3 = hooked_available()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("verified")
    def folder(model_type: str, **settings: Any):
        name = hashlib.sha256(repr(sorted(settings.items())).encode()).hexdigest()[:10]
        path = root / f"{model_type}-{name}"
        return path if path.exists() else write_family_checkpoint(model_type, path, **settings)

    return folder


def _reference(length: int, true_window: int | None, n_heads: int = 3, seed: int = 0) -> Reference:
    """Softmax patterns of random scores under a causal mask with ``true_window`` (None: none)."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, n_heads, length, length, generator=generator) * 3
    query, key = torch.arange(length).unsqueeze(1), torch.arange(length).unsqueeze(0)
    inside = key <= query
    if true_window is not None:
        inside &= query - key < true_window
    pattern = torch.softmax(scores.masked_fill(~inside, float("-inf")), dim=-1)
    rows = torch.arange(length)
    return Reference(tokens=torch.arange(length), rows=rows, logits=torch.zeros(length, 2), patterns=pattern)


@settings(max_examples=40, deadline=None)
@given(st.integers(10, 24), st.one_of(st.none(), st.integers(1, 9)), st.one_of(st.none(), st.integers(1, 9)),
       st.integers(0, 1000))
def test_key_sets_are_refused_exactly_when_the_spec_misstates_the_window(length, true_window, spec_window, seed):
    reference = _reference(length, true_window, seed=seed)
    if true_window == spec_window:
        check_key_sets(reference, [spec_window], family="f")
    else:
        with pytest.raises(EquivalenceError, match="layer 0"):
            check_key_sets(reference, [spec_window], family="f")


class _Transposed:
    """A backend whose hook_k / hook_v are [batch, head, pos, d_head] (DeepSeek-V3's on the 4.3 bridge)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _flip(self, name: str, fn):
        if not (isinstance(name, str) and name.endswith(("hook_k", "hook_v"))):
            return fn

        def flipped(activation, hook):
            out = fn(activation.transpose(1, 2), hook)
            return None if out is None else out.transpose(1, 2)
        return flipped

    def hooks(self, fwd_hooks):
        return self._inner.hooks([(name, self._flip(name, fn)) for name, fn in fwd_hooks])

    def run_with_cache(self, tokens, names, **kwargs):
        cache = self._inner.run_with_cache(tokens, names, **kwargs)
        return {k: (v.transpose(1, 2) if k.endswith(("hook_k", "hook_v")) else v) for k, v in cache.items()}


def test_k_v_hooks_on_the_wrong_axes_are_refused(tiny_llama):
    assert check_kv_layout(tiny_llama.backend, 259, family="tiny") == {}
    with pytest.raises(EquivalenceError, match=r"hook_k has shape \(1, 4, 7, 16\)"):
        check_kv_layout(_Transposed(tiny_llama.backend), 259, family="tiny")


@settings(max_examples=12, deadline=None)
@given(st.floats(1e-2, 10.0), st.sampled_from(["logits", "pattern"]))
def test_a_model_off_its_reference_beyond_round_off_is_refused_naming_the_size(tiny_llama, size, where):
    from lens_position.models.tiny import tiny_hf_model
    from lens_position.models.verify import check_tokens, reference_of

    hf_model, _ = tiny_hf_model("tiny-llama")
    reference = reference_of(hf_model, check_tokens(259, [None], 1024), 3)
    compare_with_reference(tiny_llama.backend, reference, family="tiny", routes="")  # exact: passes
    if where == "logits":
        off = Reference(reference.tokens, reference.rows, reference.logits * (1 + size), reference.patterns)
    else:
        patterns = reference.patterns.clone()
        patterns[1, 0, -1, 0] += 2e-3 + size / 10  # past the 1e-3 tolerance
        off = Reference(reference.tokens, reference.rows, reference.logits, patterns)
    with pytest.raises(EquivalenceError, match=r"tiny: the booted model does not compute .* relative off"):
        compare_with_reference(tiny_llama.backend, off, family="tiny", routes="Routes that work: x.")


def test_every_load_records_its_verdict(tiny_llama):
    verified = tiny_llama.spec.extra["verified"]
    assert verified["equivalence"]["logits_rel"] < 1e-5 and verified["kv_layout"].startswith("[batch, pos, head")


@pytest.mark.parametrize("model_type", ["starcoder2", "phi3", "mixtral"])
def test_a_window_declared_by_sliding_window_alone_is_read_and_verified(model_type, folders):
    loaded = load_model(str(folders(model_type)), backend="bridge")
    assert loaded.spec.window == 6 and all(loaded.spec.is_local(layer) for layer in range(loaded.spec.n_layers))
    assert loaded.spec.extra["verified"]["equivalence"]["tokens"] == 10  # past the window
    wider = load_model(str(folders(model_type)), backend="bridge", window=9)
    assert wider.spec.window == 9 and wider.spec.extra["verified"]["equivalence"]["tokens"] == 13


def test_window_on_a_model_without_one_is_refused_not_ignored_on_the_bridge(folders):
    with pytest.raises(BadInputError, match="has no sliding-window layers"):
        load_model(str(folders("phi")), backend="bridge", window=4)


@pytest.mark.parametrize("model_type", ["phi", "gpt_neox", "stablelm", "llama"])
def test_ntk_alpha_divides_the_lowest_frequency_by_exactly_alpha_partial_rotary_included(model_type, folders):
    plain = load_model(str(folders(model_type)), backend="bridge")
    scaled = load_model(str(folders(model_type)), backend="bridge", ntk_alpha=4)
    assert scaled.spec.extra["verified"]["ntk_alpha"].startswith("lowest frequency")
    # the Hugging Face model's own rotary tables, read here independently of the check
    before, after = ([buffer for name, buffer in loaded.model.original_model.named_buffers()
                      if name.endswith(".inv_freq")] for loaded in (plain, scaled))
    assert before and len(before) == len(after)
    for old, new in zip(before, after, strict=True):
        assert old.shape == new.shape and math.isclose(float(old.min() / new.min()), 4.0, rel_tol=1e-5)


def test_an_ntk_scaling_over_the_wrong_dimensions_is_refused(folders, monkeypatch):
    # the old reading: partial_rotary_factor from the config attribute only (transformers 5 moved it)
    monkeypatch.setattr(bridged_module, "partial_rotary_factor", lambda config: 1.0)
    with pytest.raises(EquivalenceError, match="not the unscaled .* divided by 4 .*not NTK-aware"):
        load_model(str(folders("phi")), backend="bridge", ntk_alpha=4)


def test_a_key_norm_over_all_heads_loads_and_refuses_one_head_key_patches(folders):
    loaded = load_model(str(folders("olmo2")), backend="bridge")
    assert "k" in loaded.spec.extra["verified"]["kv_single_head"]
    with pytest.raises(BadInputError, match="moves heads"):
        Patch("blocks.0.attn.hook_k", position=1, head=0, value=torch.zeros(16)).validate(loaded.backend, 8)
    Patch("blocks.0.attn.hook_v", position=1, head=0, value=torch.zeros(16)).validate(loaded.backend, 8)


def test_multi_query_in_a_fused_projection_is_refused_by_name(folders):
    with pytest.raises(UnsupportedArchitectureError, match=r"FalconForCausalLM .*hook_k has shape \(1, 7, 1, 16\)"):
        load_model(str(folders("falcon")), backend="bridge")


def test_a_learned_sink_logit_is_named_as_the_reason(folders):
    with pytest.raises(UnsupportedArchitectureError, match="learned sink logit per head"):
        load_model(str(folders("gpt_oss")), backend="bridge")


def test_a_crash_inside_transformerlens_becomes_a_sentence_naming_it(folders, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("The size of tensor a (32) must match the size of tensor b (8)")

    monkeypatch.setattr("lens_position.models.backends.bridge.boot_bridge", crash)
    with pytest.raises(UnsupportedArchitectureError, match=r"TransformerLens .*'s TransformerBridge failed on "
                                                           r"LlamaForCausalLM \(model_type 'llama'\) \(RuntimeError"):
        load_model(str(folders("llama")), backend="bridge")


def test_cohere_is_refused_where_transformerlens_computes_it_wrongly_and_exact_where_it_does_not(folders):
    folder = str(folders("cohere"))
    if TL3:  # TransformerLens 3.9's bridge: logits far from Hugging Face's
        with pytest.raises(EquivalenceError, match=r"CohereForCausalLM .*relative off.*transformer_lens>=4.3"):
            load_model(folder, backend="bridge")
    else:
        loaded = load_model(folder, backend="bridge")
        assert loaded.spec.extra["verified"]["equivalence"]["logits_rel"] < 1e-5


def test_a_verdict_is_kept_by_content_and_a_second_load_does_not_run_the_reference(folders, monkeypatch, tmp_path):
    folder = str(folders("llama"))
    first = load_model(folder, backend="bridge", cache_dir=str(tmp_path))

    def no_reference(*args, **kwargs):
        raise AssertionError("the reference ran again")

    monkeypatch.setattr(bridged_module, "reference_of", no_reference)
    monkeypatch.setattr(bridge_backend, "check_scores_hook", no_reference)  # recorded in the verdict too
    second = load_model(folder, backend="bridge", cache_dir=str(tmp_path))
    assert second.spec.extra["verified"] == first.spec.extra["verified"]
    with pytest.raises(AssertionError, match="ran again"):  # other options: another verdict
        load_model(folder, backend="bridge", cache_dir=str(tmp_path), ntk_alpha=2)
    # the same weights under an edited config (another RoPE base) compute something else: verified anew
    edited = tmp_path / "edited"
    shutil.copytree(folder, edited)
    config = json.loads((edited / "config.json").read_text(encoding="utf-8"))
    config["rope_parameters"] = {**(config.get("rope_parameters") or {}), "rope_theta": 123.0}
    (edited / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(AssertionError, match="ran again"):
        load_model(str(edited), backend="bridge", cache_dir=str(tmp_path))


def test_auto_means_whatever_works(folders):
    loaded = load_model(str(folders("qwen3")))  # no adapter: the bridge, on either line
    assert loaded.spec.extra["backend"] == "bridge"
    if TL3:
        assert "hooked backend" in loaded.spec.extra["auto"]
    assert load_model(str(folders("llama"))).spec.extra["backend"] == ("hooked" if TL3 else "bridge")


def test_longrope_loads_on_the_bridge_verified(folders):
    longrope = {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0 + 0.1 * i for i in range(8)],
                "long_factor": [2.0 + 0.1 * i for i in range(8)], "original_max_position_embeddings": 64}
    loaded = load_model(str(folders("phi3", rope_parameters=longrope, sliding_window=None)))
    assert loaded.spec.rope_kind == "longrope" and loaded.spec.role == "interpolated"
    assert loaded.spec.extra["rope_scaling"]["short_factor"][1] == pytest.approx(1.1)
    assert loaded.spec.extra["verified"]["equivalence"]["logits_rel"] < 1e-5


def test_llama_with_attention_bias_loads_where_it_is_hosted(folders):
    loaded = load_model(str(folders("llama", attention_bias=True)))
    assert loaded.spec.extra["verified"]["equivalence"]["logits_rel"] < 1e-5


def test_a_gguf_tokenizer_without_bos_takes_the_files_bos_id():
    from types import SimpleNamespace

    from lens_position.models.sources import adopt_config_bos
    from lens_position.models.tiny import byte_tokenizer

    tokenizer = byte_tokenizer(False)
    tokenizer.bos_token = None
    assert tokenizer.bos_token_id is None
    adopt_config_bos(tokenizer, SimpleNamespace(bos_token_id=1))
    assert tokenizer.bos_token_id == 1 and tokenizer("ab")["input_ids"][0] != 1  # named, not prepended


def test_the_command_line_names_its_options_in_refusals(folders, capsys):
    from lens_position.cli.commands import main

    folder = str(folders("gpt_oss"))
    assert main(["decompose", folder, "--quick", "--no-progress", "--out", folder + "-out"]) != 0
    error = capsys.readouterr().err
    assert "learned sink logit" in error and "backend='" not in error and "load_model(" not in error


def test_the_bridges_config_states_the_models_rotary_base(folders):
    loaded = load_model(str(folders("qwen3", rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
                        backend="bridge")
    assert loaded.spec.rotary_base == 100000.0 and loaded.model.cfg.rotary_base == 100000.0
