"""Every option of ``load_model`` on every backend this TransformerLens has: applied (its effect is
seen on the loaded model itself, not only in its spec) or refused with an error that names the
option, never accepted and ignored. The list of options is read off ``load_model``'s signature: a
new option fails this test until it is classified here. Marked ``tl4``: run on TransformerLens
3.9 (both backends) and 4.x (the bridge)."""

from __future__ import annotations

import inspect

import pytest
import torch

from lens_position.ground.errors import BadInputError, ContextLengthError, LensPositionError
from lens_position.models import load_model
from lens_position.models.backends import hooked_available

pytestmark = pytest.mark.tl4

BACKENDS = (["hooked"] if hooked_available() else []) + ["bridge"]
# The model options: what the loaded model computes or where it runs.
MODEL_OPTIONS = {"ntk_alpha", "ntk_by_parts", "window", "n_ctx", "device", "dtype", "n_devices", "device_map",
                 "max_memory", "offload_folder"}
# Not options of the model: what to load, from where, and with which backend.
NOT_MODEL_OPTIONS = {"name_or_path", "cache_dir", "offline", "backend"}


def test_every_option_of_load_model_is_classified_here():
    assert set(inspect.signature(load_model).parameters) == MODEL_OPTIONS | NOT_MODEL_OPTIONS


def _lowest_frequency(loaded) -> float:
    return float(loaded.backend.rotary_layout(0).frequencies.abs().min())


def _applied_or_refused(load, option: str, applied) -> str:
    """``"applied"`` after checking ``applied(model)``, or ``"refused"`` with the option named."""
    try:
        loaded = load()
    except LensPositionError as refusal:
        assert option in str(refusal), f"the refusal does not name {option}: {refusal}"
        return "refused"
    applied(loaded)
    return "applied"


@pytest.fixture(scope="module", params=BACKENDS)
def plain(request):
    return request.param, load_model("tiny-llama", backend=request.param)


def test_ntk_alpha_divides_the_models_own_lowest_frequency(plain):
    backend, base = plain

    def applied(loaded):
        assert loaded.spec.ntk_alpha == 4 and loaded.spec.role == "ntk"
        assert _lowest_frequency(loaded) == pytest.approx(_lowest_frequency(base) / 4, rel=1e-4)

    assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, ntk_alpha=4), "ntk_alpha",
                               applied) == "applied"


def test_ntk_by_parts_changes_the_models_own_frequencies(plain):
    backend, base = plain

    def applied(loaded):
        assert loaded.spec.rope_kind == "ntk-by-parts"
        assert _lowest_frequency(loaded) < _lowest_frequency(base) * 0.99

    assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, ntk_by_parts={"factor": 8}),
                               "ntk_by_parts", applied) == "applied"


@pytest.mark.parametrize("option", [{"ntk_by_parts": {"factor": 8}}, {"ntk_alpha": 4}, {"n_ctx": 24}])
def test_an_option_changes_that_load_only(plain, option):
    """A load's options edit that model's own config: a later load without them is the plain model
    (the tiny models' config dicts were once shared, and an NTK load made every later load NTK-scaled)."""
    backend, base = plain
    load_model("tiny-llama", backend=backend, **option)
    again = load_model("tiny-llama", backend=backend)
    assert again.spec.rope_kind == base.spec.rope_kind and again.spec.n_ctx == base.spec.n_ctx
    assert torch.equal(again.backend.rotary_layout(0).frequencies, base.backend.rotary_layout(0).frequencies)


def test_window_is_applied_to_the_models_attention_or_refused(plain):
    backend, _ = plain
    tokens = torch.arange(1, 21).unsqueeze(0)

    def applied(loaded):
        assert loaded.spec.window == 5
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(loaded.spec.n_layers)]
        cache = loaded.backend.run_with_cache(tokens, names)
        for layer, window in enumerate(loaded.spec.layer_windows):
            if window is not None:  # a local layer: no attention to keys further back than the window
                pattern = cache[names[layer]][0]
                query, key = torch.arange(20)[:, None], torch.arange(20)[None, :]
                assert float(pattern[:, query - key >= 5].abs().max()) == 0.0

    # a model with local layers: on every backend the window is that of its local layers
    assert _applied_or_refused(lambda: load_model("tiny-mistral", backend=backend, window=5), "window",
                               applied) == "applied"
    # a model with none: the hooked backend makes every layer local; the bridge refuses, by name
    outcome = _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, window=5), "window", applied)
    assert outcome == ("applied" if backend == "hooked" else "refused")


def test_n_ctx_bounds_the_models_forward_pass(plain):
    backend, _ = plain

    def applied(loaded):
        assert loaded.spec.n_ctx == 24
        loaded.backend.forward(torch.arange(1, 25).unsqueeze(0))
        with pytest.raises(ContextLengthError):
            loaded.backend.forward(torch.arange(1, 26).unsqueeze(0))

    assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, n_ctx=24), "n_ctx",
                               applied) == "applied"


def test_dtype_is_the_dtype_the_model_computes_in(plain):
    backend, _ = plain

    def applied(loaded):
        assert loaded.backend.dtype == torch.bfloat16
        assert loaded.backend.forward(torch.arange(1, 9).unsqueeze(0)).dtype == torch.bfloat16

    assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, dtype="bfloat16"), "dtype",
                               applied) == "applied"


def test_device_is_where_the_model_runs_or_a_missing_one_is_refused(plain):
    backend, _ = plain

    def on_cpu(loaded):
        assert loaded.backend.device.type == "cpu"
        assert all(p.device.type == "cpu" for p in loaded.backend.model.parameters())

    assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, device="cpu"), "device",
                               on_cpu) == "applied"
    if not torch.cuda.is_available():
        def on_gpu(loaded):
            raise AssertionError("loaded on a GPU this machine does not have")

        assert _applied_or_refused(lambda: load_model("tiny-llama", backend=backend, device="cuda"), "cuda",
                                   on_gpu) == "refused"


def test_n_devices_beyond_this_machines_gpus_is_refused_by_name(plain):
    backend, _ = plain
    more = torch.cuda.device_count() + 2
    with pytest.raises(BadInputError, match=f"n_devices={more}") as refusal:
        load_model("tiny-llama", backend=backend, n_devices=more, device="cuda" if more > 2 else "cpu")
    assert "backend='hooked'" not in str(refusal.value)  # a route, if any, this installation has
    for wrong in (0, -1, 1.5, True, "2"):
        with pytest.raises(BadInputError, match="n_devices"):
            load_model("tiny-llama", backend=backend, n_devices=wrong)


@pytest.mark.parametrize("option, value", [("device_map", "balanced"), ("max_memory", {"cpu": "1GiB"}),
                                           ("offload_folder", "/tmp/offload")])
def test_placement_options_are_applied_by_the_bridge_or_refused_by_name(plain, option, value):
    """Applied on the bridge to a checkpoint folder (tests/unit/models/test_placement.py); here, on a
    model built in code, on the hooked backend, or without a map, each is refused naming it."""
    backend, _ = plain
    with pytest.raises(BadInputError, match="device_map"):
        load_model("tiny-llama", backend=backend, **{option: value})
