"""The model seam and its bridge backend, checked against the Hugging Face model itself.

Every test here is marked ``tl4``: it runs where TransformerLens has no HookedTransformer (4.x)
as well as on 3.9, so the bridge is checked against an independent reference (the HF model's
own forward pass, a closed form, or the same run without the intervention), never against the
hooked backend (that is tests/unit/models/test_backend_parity.py, 3.x only).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import transformers
from hypothesis import given, settings
from hypothesis import strategies as st

import lens_position.models.backends.bridge as bridge_module
from lens_position.analyses.decompose import DecompositionReducer, check_identity, decompose, visible_keys
from lens_position.core.data import build_prompts
from lens_position.core.inputs import check_prompts
from lens_position.core.intervals import Bootstrap
from lens_position.core.patch import Patch
from lens_position.core.stream import WholeActivations, stream
from lens_position.ground.errors import BadInputError, UnsupportedArchitectureError
from lens_position.models import load_model
from lens_position.models.backends import ModelBackend, hooked_available, resolve_backend
from lens_position.models.backends.bridge import BridgeBackend, check_scores_hook, scores_before_softmax, ungroup_kv
from lens_position.models.spec import as_loaded
from lens_position.models.tiny import TINY_CONFIGS, byte_tokenizer, tiny_hf_model

pytestmark = pytest.mark.tl4

ROOT = Path(__file__).resolve().parents[3]
TINY = sorted(TINY_CONFIGS)
# float32 forward noise: a tiny model's activations are O(1-10) and pass through 3-6 blocks of
# float32 matmuls summed in another order by the bridge (eager attention, HF's own modules):
# measured differences from the HF model are below 1e-5 on logits and 1e-6 on patterns.
LOGIT_TOL = 1e-4
PATTERN_TOL = 1e-5
NO_INTERVALS = Bootstrap(n_resamples=0)


@pytest.fixture(scope="module")
def bridged() -> dict[str, object]:
    return {name: load_model(name, backend="bridge") for name in TINY}


def test_auto_takes_hooked_where_transformerlens_has_it_else_the_bridge():
    assert resolve_backend("auto") == ("hooked" if hooked_available() else "bridge")
    assert resolve_backend("bridge") == "bridge"
    with pytest.raises(BadInputError, match="unknown backend"):
        resolve_backend("vllm")
    if not hooked_available():
        with pytest.raises(BadInputError, match="removed"):
            resolve_backend("hooked")


def test_lens_position_never_imports_a_name_transformerlens_4_removed():
    """Every module of the package imports with HookedTransformer, HookedTransformerConfig,
    ``transformer_lens.pretrained`` and ``transformer_lens.components`` made unimportable (as
    TransformerLens 4.x has them), on whichever TransformerLens is installed."""
    script = textwrap.dedent("""
        import importlib, pkgutil, sys
        import transformer_lens
        removed = ("HookedTransformer", "HookedTransformerConfig", "HookedEncoder")
        for name in removed:
            transformer_lens.__dict__.pop(name, None)
        def gone(name):
            if name in removed:
                raise ImportError(f"{name!r} was removed in TransformerLens 4.0")
            raise AttributeError(name)
        transformer_lens.__getattr__ = gone
        for module in ("transformer_lens.pretrained", "transformer_lens.pretrained.weight_conversions",
                       "transformer_lens.components", "transformer_lens.HookedTransformer"):
            sys.modules[module] = None
        import lens_position
        failed = []
        for info in pkgutil.walk_packages(lens_position.__path__, "lens_position."):
            try:
                importlib.import_module(info.name)
            except ImportError as error:
                failed.append(f"{info.name}: {error}")
        for name in lens_position.__all__:
            try:
                getattr(lens_position, name)
            except ImportError as error:
                failed.append(f"lens_position.{name}: {error}")
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("name", TINY)
def test_the_bridge_computes_what_the_hugging_face_model_computes(name, bridged):
    loaded = bridged[name]
    assert isinstance(loaded.backend, ModelBackend) and loaded.backend.kind == "bridge"
    assert loaded.spec.extra["backend"] == "bridge"
    prompts = build_prompts(loaded, N=3, T=40, source="natural", seed=1)
    hf_model, _ = tiny_hf_model(name)
    hf_model.config._attn_implementation = "eager"
    with torch.no_grad():
        reference = hf_model(prompts.tokens, output_attentions=True)
        logits = loaded.backend.forward(prompts.tokens)
    assert (logits - reference.logits).abs().max() < LOGIT_TOL
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(loaded.spec.n_layers)]
    cache = loaded.backend.run_with_cache(prompts.tokens, names)
    for layer, attention in enumerate(reference.attentions):
        assert (cache[names[layer]] - attention).abs().max() < PATTERN_TOL


@pytest.mark.parametrize("name", TINY)
def test_a_pass_to_the_last_block_returns_its_residual_without_the_unembedding(name, bridged):
    """``stop_at_layer = n_layers`` ends the pass as HookedTransformer does: it returns the residual
    the HF model's last decoder layer puts out, with every hook of the blocks fired and neither the
    final norm nor the unembedding run (the bridge would compute ``[batch, T, d_vocab]`` logits)."""
    loaded = bridged[name]
    backend, n_layers = loaded.backend, loaded.spec.n_layers
    tokens = build_prompts(loaded, N=2, T=24, source="random", seed=2).tokens
    hf_model, _ = tiny_hf_model(name)
    hf_model.config._attn_implementation = "eager"
    last = {}
    hf_model.model.layers[-1].register_forward_hook(
        lambda _m, _a, out: last.setdefault("out", out[0] if isinstance(out, tuple) else out))
    with torch.no_grad():
        hf_model(tokens)
    fired, unembedded = [], []
    post = f"blocks.{n_layers - 1}.hook_resid_post"
    handles = [module.register_forward_pre_hook(lambda *_: unembedded.append(1))
               for name_, module in loaded.model.named_modules()
               if name_.startswith("unembed") and isinstance(module, torch.nn.Linear) or name_ == "ln_final.hook_out"]
    assert handles
    try:
        with torch.no_grad(), backend.hooks([(post, lambda a, hook: fired.append(a.clone()))]):
            residual = backend.forward(tokens, stop_at_layer=n_layers, return_type=None)
    finally:
        for handle in handles:
            handle.remove()
    assert not unembedded
    assert residual.shape == (*tokens.shape, loaded.spec.d_model)
    assert (residual - last["out"]).abs().max() < LOGIT_TOL
    assert len(fired) == 1 and torch.equal(fired[0], residual)
    with torch.no_grad():  # the stop is undone: a full pass still gives the logits
        assert backend.forward(tokens).shape[-1] == backend.d_vocab
        assert torch.equal(backend.forward(tokens, stop_at_layer=n_layers + 3, return_type=None), residual)
        assert backend.forward(tokens, stop_at_layer=n_layers - 1, return_type=None).shape == residual.shape


@pytest.mark.parametrize("name", TINY)
def test_the_decomposition_identity_holds_on_the_bridge(name, bridged):
    """log A = t - z exactly (DESIGN §2.3): the scores the bridge hands over are the ones its
    softmax used, with the causal or window key set of the spec."""
    loaded = bridged[name]
    prompts = build_prompts(loaded, N=2, T=40, source="random", seed=0)
    rows = check_identity(loaded, prompts)
    assert float(rows["max_abs_error_pattern"].max()) < 1e-5
    assert float(rows["max_row_sum_error"].max()) < 1e-5


def test_load_decompose_sinks_and_bos_replacement_run_on_the_bridge(bridged):
    from lens_position.analyses.bos import bos_replacement
    from lens_position.analyses.sinks import sink_heads

    loaded = bridged["tiny-llama"]
    prompts = build_prompts(loaded, N=4, T=24, source="natural", seed=0)
    result = decompose(loaded, prompts)
    total = result.heads["R"] + result.heads["M"] + result.heads["C"]
    assert torch.allclose(torch.tensor(total.to_numpy()), torch.tensor(result.heads["total"].to_numpy()), atol=1e-9)
    sinks = sink_heads(loaded, prompts)
    assert sinks.scores.shape == (loaded.spec.n_layers, loaded.spec.n_heads)
    assert bool(((sinks.scores >= 0) & (sinks.scores <= 1)).all())
    replaced = bos_replacement(loaded, prompts, bootstrap=NO_INTERVALS, progress=False)
    # without intervals too, each row names its replacement (a loop once overwrote the name)
    assert list(replaced.overall["replacement"]) == ["token", "mean", "random"]
    assert set(replaced.frame["replacement"]) == {"token", "mean", "random"}


# ------------------------------------------------------------------------- the known traps


def test_masked_scores_are_read_from_the_mask_whatever_value_marks_them(bridged):
    """A bridge outside compatibility mode masks with finfo.min, inside it with -inf: the
    decomposition is the same either way (key sets come from the spec's mask)."""
    loaded = bridged["tiny-mistral"]  # window 32 < T: both causal and window cells are masked
    prompts = build_prompts(loaded, N=3, T=40, source="random", seed=2)
    names = [f"blocks.{layer}.attn.hook_attn_scores" for layer in range(loaded.spec.n_layers)]

    def as_finfo_min(scores, hook):
        return scores.masked_fill(~torch.isfinite(scores), torch.finfo(scores.dtype).min)

    plain = DecompositionReducer(loaded, check_prompts(loaded, prompts), bootstrap=NO_INTERVALS)
    stream(loaded, prompts, [plain], progress=False)
    finfo = DecompositionReducer(loaded, check_prompts(loaded, prompts), bootstrap=NO_INTERVALS)
    stream(loaded, prompts, [finfo], fwd_hooks=[(name, as_finfo_min) for name in names], progress=False)
    a, b = plain.result().heads, finfo.result().heads
    for column in ("total", "R", "M", "C", "R_rf", "M_rf", "total_heldout"):
        assert (a[column] - b[column]).abs().max() < 1e-9, column


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 12), st.floats(-30, 30), st.integers(0, 10_000))
def test_masks_by_class_are_the_same_key_set(n, fill_shift, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = torch.randn(n, n, generator=generator) * 5 + fill_shift
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    with_inf = scores.masked_fill(~causal, float("-inf"))
    with_min = scores.masked_fill(~causal, torch.finfo(torch.float32).min)
    assert torch.equal(visible_keys(with_inf), causal)
    assert torch.equal(visible_keys(with_min), causal)


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 12), st.floats(0.1, 20), st.integers(0, 10_000))
def test_scores_after_the_softmax_are_told_from_scores_before_it(n, scale, seed):
    generator = torch.Generator().manual_seed(seed)
    scores = (torch.randn(1, 2, n, n, generator=generator) * scale).masked_fill(
        ~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
    pattern = torch.softmax(scores, dim=-1)
    assert scores_before_softmax(scores, pattern)
    assert not scores_before_softmax(pattern, pattern)  # a bridge firing the hook on the weights


def test_a_bridge_whose_scores_hook_fires_after_the_softmax_is_refused():
    loaded = load_model("tiny-llama", backend="bridge")
    original = BridgeBackend.run_with_cache

    def post_softmax(self, tokens, names, *, stop_at_layer=None):
        """What a generic attention bridge hands over: the weights after the softmax as "scores"."""
        cache = original(self, tokens, names, stop_at_layer=stop_at_layer)
        cache["blocks.1.attn.hook_attn_scores"] = cache["blocks.1.attn.hook_pattern"]
        return cache

    BridgeBackend.run_with_cache = post_softmax
    try:
        with pytest.raises(UnsupportedArchitectureError, match="after the softmax"):
            check_scores_hook(loaded.model)
    finally:
        BridgeBackend.run_with_cache = original
    check_scores_hook(loaded.model)  # the real one passes


def test_grouped_query_keys_are_patched_per_query_head(bridged):
    """tiny-llama has 4 query heads over 2 key/value heads: a patch of query head 0's key at
    position 0 changes head 0's pattern and leaves head 1 (same key/value head) alone."""
    loaded = bridged["tiny-llama"]
    assert loaded.spec.n_kv_heads == 2 and loaded.spec.n_heads == 4
    prompts = build_prompts(loaded, N=2, T=16, source="random", seed=3)
    name = "blocks.1.attn.hook_pattern"
    base = WholeActivations([name])
    stream(loaded, prompts, [base], progress=False)
    patched = WholeActivations([name])
    stream(loaded, prompts, [patched], patches=[Patch("blocks.1.attn.hook_k", 0.0, position=0, head=0)],
           progress=False)
    before, after = base.result()[name], patched.result()[name]
    assert (after[:, 0] - before[:, 0]).abs().max() > 1e-3
    assert torch.equal(after[:, 1:], before[:, 1:])


def test_ungrouping_keeps_the_forward_pass():
    hf_model, _ = tiny_hf_model("tiny-llama")
    tokens = torch.randint(3, 259, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = hf_model(tokens).logits
        assert ungroup_kv(hf_model) == 2
        after = hf_model(tokens).logits
    assert hf_model.model.layers[0].self_attn.k_proj.out_features == 4 * 16
    assert (before - after).abs().max() < 1e-5


@pytest.mark.parametrize("grouped", [True, False] if bridge_module._RESOLVES_EVERY_HOOK else [False])
def test_named_hooks_fire_once_in_order_under_their_names(grouped, bridged, monkeypatch):
    """Hooks by name each fire once per pass under the name given (an alias included), a point's
    hooks in the order given, a returned tensor replacing the activation for the next, whether they
    are registered one by one (TransformerLens 4.x) or, on 3.x, as one filter (its ``hooks()``
    rebuilds the alias table for every named hook); a name the bridge lacks raises instead of
    leaving a hook that never fires (3.x's own path ignores it)."""
    real_path = grouped == bridge_module._RESOLVES_EVERY_HOOK
    monkeypatch.setattr(bridge_module, "_RESOLVES_EVERY_HOOK", grouped)
    backend = bridged["tiny-llama"].backend
    tokens = build_prompts(bridged["tiny-llama"], N=2, T=12, source="random", seed=1).tokens
    seen: list[tuple[str, float]] = []

    def record(activation, hook):
        seen.append((hook.name, float(activation.abs().sum())))

    with torch.no_grad(), backend.hooks([
            ("blocks.1.hook_resid_pre", record), ("blocks.1.hook_resid_pre", lambda a, hook: a * 0),
            ("blocks.1.hook_resid_pre", record), ("blocks.0.attn.hook_attn_scores", record)]):
        backend.forward(tokens, stop_at_layer=2, return_type=None)
    assert [name for name, _ in seen] == ["blocks.0.attn.hook_attn_scores", "blocks.1.hook_resid_pre",
                                          "blocks.1.hook_resid_pre"]
    assert seen[1][1] > 0 and seen[2][1] == 0  # the zeroed residual reached the hook after it
    if not real_path:
        return
    with pytest.raises((UnsupportedArchitectureError, KeyError), match="blocks.0.hook_nothing"):
        with backend.hooks([("blocks.0.hook_nothing", record)]):
            pass


@pytest.mark.parametrize("native", [True, False])
def test_start_at_layer_resumes_from_the_residual(native, bridged, monkeypatch):
    """Starting at block 2 from the residual a full pass had there gives block 2's pattern of the
    full pass; where the bridge cannot resume by itself (3.9) the blocks before are run silent."""
    loaded = bridged["tiny-llama"]
    if not native or not loaded.backend.native_start_at_layer:  # 3.9: emulated either way
        monkeypatch.setattr(BridgeBackend, "native_start_at_layer", property(lambda self: False))
    prompts = build_prompts(loaded, N=2, T=16, source="random", seed=4)
    full = WholeActivations(["blocks.2.hook_resid_pre", "blocks.2.attn.hook_pattern"])
    stream(loaded, prompts, [full], progress=False)
    reference = full.result()
    resumed = WholeActivations(["blocks.0.attn.hook_pattern", "blocks.2.attn.hook_pattern"])
    stream(loaded, reference["blocks.2.hook_resid_pre"], [resumed], start_at_layer=2, progress=False)
    out = resumed.result()
    assert "blocks.0.attn.hook_pattern" not in out  # blocks before the start never report
    assert (out["blocks.2.attn.hook_pattern"] - reference["blocks.2.attn.hook_pattern"]).abs().max() < 1e-6


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma3"])
def test_bos_and_padding_are_ours_not_the_bridges(name, bridged):
    loaded = bridged[name]
    assert loaded.model.tokenizer is loaded.tokenizer
    assert loaded.tokenizer.padding_side == "right"
    assert loaded.model.cfg.default_prepend_bos == loaded.spec.tokenizer_prepends_bos == (name == "tiny-gemma3")
    prompts = build_prompts(loaded, N=2, T=12, source="natural", bos="force")
    assert bool((prompts.tokens[:, 0] == loaded.spec.bos_token_id).all())
    assert int((prompts.tokens[:, 1:] == loaded.spec.bos_token_id).sum()) == 0


def test_a_bare_bridge_is_wrapped_once_at_the_door():
    from transformer_lens.model_bridge import TransformerBridge

    hf_model, tokenizer = tiny_hf_model("tiny-qwen2")
    copy_tokenizer = byte_tokenizer(False)
    copy_tokenizer.init_kwargs.update(name_or_path="tiny", add_bos_token=True)
    bridge = TransformerBridge.boot_transformers("tiny", hf_model=hf_model, tokenizer=copy_tokenizer, device="cpu")
    with pytest.raises(BadInputError, match="compatibility mode"):
        as_loaded(bridge)
    bridge.enable_compatibility_mode(no_processing=True)
    loaded = as_loaded(bridge)
    assert as_loaded(loaded) is loaded  # a wrapped model passes the door as it is
    assert as_loaded(bridge).spec == loaded.spec  # wrapping again reads the same facts (no memo kept)
    assert loaded.spec.n_kv_heads == 2 and loaded.spec.extra["backend"] == "bridge"
    prompts = torch.randint(3, 259, (2, 20), generator=torch.Generator().manual_seed(5))
    assert len(decompose(bridge, prompts).heads) == 3 * 4
    # its K/V hooks stay grouped (2 entries): a single query head's key cannot be patched there
    with pytest.raises(BadInputError, match="one entry per key/value head"):
        stream(bridge, prompts, [], patches=[Patch("blocks.0.attn.hook_k", 0.0, position=0, head=1)], progress=False)
    stream(bridge, prompts, [], patches=[Patch("blocks.0.attn.hook_k", 0.0, position=0)], progress=False)


# ------------------------------------------------------------------ models the bridge brings


def _save(folder: Path, config: transformers.PretrainedConfig, model_class: type) -> Path:
    torch.manual_seed(0)
    model_class(config).save_pretrained(folder)
    byte_tokenizer(False).save_pretrained(folder)
    return folder


_SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=259,
              max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def test_a_qwen3_checkpoint_loads_through_the_bridge_and_decomposes(tmp_path):
    folder = _save(tmp_path / "qwen3", transformers.Qwen3Config(num_hidden_layers=2, head_dim=8, **_SMALL),
                   transformers.Qwen3ForCausalLM)
    loaded = load_model(str(folder), backend="bridge")
    assert loaded.spec.n_kv_heads == 2 and loaded.spec.rope_kind == "standard"
    result = decompose(loaded, build_prompts(loaded, N=4, T=20, source="random"))
    assert len(result.layers) == 2 and bool((result.heads["total"] > 0).all())
    if hooked_available():
        with pytest.raises(UnsupportedArchitectureError, match="backend='bridge'"):
            load_model(str(folder), backend="hooked")


def test_a_smollm3_checkpoint_with_nope_layers_loads_and_decomposes(tmp_path):
    config = transformers.SmolLM3Config(num_hidden_layers=4, no_rope_layers=[1, 1, 1, 0], **_SMALL)
    folder = _save(tmp_path / "smollm3", config, transformers.SmolLM3ForCausalLM)
    loaded = load_model(str(folder), backend="bridge")
    assert loaded.spec.extra["rope_layers"] == [True, True, True, False]
    prompts = build_prompts(loaded, N=4, T=20, source="random")
    result = decompose(loaded, prompts)
    assert len(result.layers) == 4
    assert float(check_identity(loaded, prompts)["max_abs_error_pattern"].max()) < 1e-5


def test_an_architecture_neither_backend_supports_names_the_routes_that_work(tmp_path):
    config = transformers.CTRLConfig(n_layer=2, n_embd=32, n_head=4, dff=64, vocab_size=259, n_positions=128)
    folder = _save(tmp_path / "ctrl", config, transformers.CTRLLMHeadModel)
    with pytest.raises(UnsupportedArchitectureError) as bridge_error:
        load_model(str(folder), backend="bridge")
    text = str(bridge_error.value)
    # the family is named, and no route that would refuse it too is suggested
    assert "CTRLLMHeadModel (model_type 'ctrl')" in text and "backend='hooked'" not in text
    assert "No backend of this installation hosts it" in text and len(text) < 1200
    if hooked_available():
        with pytest.raises(UnsupportedArchitectureError, match="backend='bridge'"):
            load_model(str(folder), backend="hooked")
        with pytest.raises(UnsupportedArchitectureError, match="neither backend hosts"):
            load_model(str(folder))
