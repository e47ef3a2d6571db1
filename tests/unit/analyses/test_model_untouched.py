"""The user's model is returned as it was, always: every config flag, hook, training mode, grad flag,
dtype and weight, and the next forward pass, after every public analysis, on every backend, also
when an analysis is interrupted or fails part-way."""

from __future__ import annotations

import pytest
import torch

from lens_position.analyses.bos import bos_replacement
from lens_position.analyses.decompose import decompose
from lens_position.analyses.patching import Patch, run_patches
from lens_position.analyses.probes import position_probe
from lens_position.analyses.rotary_bands import rotary_bands
from lens_position.analyses.sinks import sink_heads
from lens_position.core.intervals import NO_INTERVALS
from lens_position.models import load_model
from lens_position.models.backends import hooked_available
from lens_position.models.weights import state_dict_sha256

pytestmark = pytest.mark.tl4


def bare_grouped_hooked():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=32, n_ctx=32, d_head=8, n_heads=4, n_key_value_heads=2,
                                  d_vocab=60, act_fn="gelu", positional_embedding_type="rotary",
                                  normalization_type="RMS", model_name="my-gqa", seed=0)
    return HookedTransformer(cfg)


MODELS = {"tiny-llama on the default backend": lambda: load_model("tiny-llama"),
          "tiny-llama on the bridge": lambda: load_model("tiny-llama", backend="bridge")}
if hooked_available():
    MODELS["a bare grouped-query HookedTransformer"] = bare_grouped_hooked


def bare(model):
    return getattr(model, "model", model)


def state_of(model) -> dict:
    module = bare(model)
    return {
        "cfg": {name: repr(value) for name, value in sorted(vars(module.cfg).items())},
        "hooks": sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
                     for m in module.modules()),
        "training": [m.training for m in module.modules()],
        "requires_grad": [p.requires_grad for p in module.parameters()],
        "dtypes": [p.dtype for p in module.parameters()],
        "weights": state_dict_sha256(module.state_dict()),
    }


def tokens_for(model) -> torch.Tensor:
    vocab = bare(model).cfg.d_vocab
    tokens = torch.randint(3, min(vocab, 250), (4, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    return tokens


class Stop(Exception):
    pass


def interrupted(model, tokens):
    def stop(activation, hook):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        decompose(model, tokens, fwd_hooks=[("blocks.1.hook_resid_pre", stop)], bootstrap=NO_INTERVALS,
                  progress=False)


def failing_metric(model, tokens):
    def metric(logits):
        raise Stop

    with pytest.raises(Stop):
        run_patches(model, tokens, [[Patch("blocks.1.hook_resid_pre", 0.0, position=2)]], metric, progress=False)


ANALYSES = {
    "decompose": lambda m, t: decompose(m, t, bootstrap=NO_INTERVALS, progress=False),
    "bos_replacement": lambda m, t: bos_replacement(m, t, query_range=(0, 8), bootstrap=NO_INTERVALS,
                                                    progress=False),
    "sink_heads": lambda m, t: sink_heads(m, t, bootstrap=NO_INTERVALS, progress=False),
    "position_probe": lambda m, t: position_probe(m, t, ridge=1.0, bootstrap=NO_INTERVALS, progress=False),
    "rotary_bands": lambda m, t: rotary_bands(m, t, n_bands=2, bootstrap=NO_INTERVALS, progress=False),
    "run_patches": lambda m, t: run_patches(m, t, [[Patch("blocks.0.attn.hook_v", 0.0, position=1, head=1)]],
                                            lambda logits: logits[:, -1, 3].mean(), progress=False),
    "interrupted by a hook": interrupted,
    "a metric that fails": failing_metric,
}


@pytest.mark.fault(area="your model", given="any public analysis on your model (bare, loaded or bridged; in train "
                                            "mode), finished, interrupted or failed",
                   happens="every cfg flag, hook, training mode, grad flag, dtype and weight is as it was, and the "
                           "next forward pass gives the same logits")
@pytest.mark.parametrize("make", list(MODELS.values()), ids=list(MODELS))
def test_every_analysis_returns_the_model_as_it_was(make):
    model = make()
    bare(model).train()  # the owner's mode, whatever it is, is theirs
    tokens = tokens_for(model)
    with torch.no_grad():
        before_logits = bare(model)(tokens)
    before = state_of(model)
    for name, run in ANALYSES.items():
        run(model, tokens)
        after = state_of(model)
        changed = {key for key in before if before[key] != after[key]}
        if "cfg" in changed:
            changed_flags = {k for k in before["cfg"] if before["cfg"][k] != after["cfg"].get(k)}
            raise AssertionError(f"{name} changed the model's cfg: {sorted(changed_flags)}")
        assert not changed, f"{name} changed the model's {sorted(changed)}"
    with torch.no_grad():
        torch.testing.assert_close(bare(model)(tokens), before_logits, rtol=0, atol=0)
