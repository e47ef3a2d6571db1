"""Every HookedTransformer the package builds goes through one constructor: quiet on 3.9; on 4.x the
models built in code are MiniTransformers, and a HookedTransformer asked for is refused by name.

TransformerLens 3.9 warns "HookedTransformer is deprecated" on every construction. lens_position
chooses its backend itself, so the models it builds (loaded checkpoints, the tiny in-code models,
the hand-set toy models, zoo models) must not print it. Where 4.x removed the class, the toy and zoo
models are built as MiniTransformers, and a HookedTransformer asked for is the package's
UnsupportedArchitectureError saying what works, not 4.x's bare ImportError.
"""

from __future__ import annotations

import warnings

import pytest

from lens_position.ground.errors import UnsupportedArchitectureError
from lens_position.models import backends
from lens_position.models.backends import hooked_available

needs_hooked = pytest.mark.skipif(not hooked_available(), reason="builds HookedTransformers: TransformerLens 3.x")


def _deprecations_while(build) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # whatever the test run's filters say
        build()
    return [str(w.message) for w in caught if "deprecated" in str(w.message).lower()]


def _builds():
    from lens_position.models.load import load_model
    from lens_position.models.toy import offset_only_model, random_model
    from lens_position.models.zoo.architecture import build_model
    from lens_position.models.zoo.recipe import recipe_for

    return {
        "offset_only_model": lambda: offset_only_model(n_layers=1, bos_bonus=1.0),
        "random_model": lambda: random_model(),
        "tiny-llama (hooked)": lambda: load_model("tiny-llama", backend="hooked"),
        "tiny-gemma3 (hooked)": lambda: load_model("tiny-gemma3", backend="hooked"),
        "zoo model": lambda: build_model(recipe_for("rope")),
        "zoo checkpoint (hooked)": lambda: load_model("zoo:rope", backend="hooked"),
    }


@needs_hooked
@pytest.mark.parametrize("what", list(_builds()))
def test_a_model_the_package_builds_prints_no_deprecation_warning(what):
    assert _deprecations_while(_builds()[what]) == []


@needs_hooked
def test_a_hookedtransformer_built_by_hand_still_warns_so_the_check_can_see_one():
    """The check above can fail: TransformerLens's own warning reaches it when the class is named
    directly, as a user's code would."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=8, d_head=4, n_heads=2, n_ctx=8, d_vocab=5, attn_only=True)
    assert any("HookedTransformer is deprecated" in m for m in _deprecations_while(lambda: HookedTransformer(cfg)))


@pytest.mark.tl4
@pytest.mark.fault(area="models", given="a hand-set toy model or a zoo model built on TransformerLens 4.x (no "
                   "HookedTransformer)", happens="a MiniTransformer, HookedTransformer's computation on "
                   "HookedRootModule (tests/unit/models/test_mini.py), not 4.x's ImportError")
@pytest.mark.parametrize("what", ["offset_only_model", "random_model", "zoo model"])
def test_without_hookedtransformer_the_models_built_in_code_are_mini_transformers(what, monkeypatch):
    """On TransformerLens 4.x for real; on 3.x with the class hidden, the same path."""
    from lens_position.models.mini import MiniTransformer

    if hooked_available():
        monkeypatch.setattr(backends, "hooked_class", lambda: None)
    built = _builds()[what]()
    assert isinstance(getattr(built, "model", built), MiniTransformer)
    assert backends.backend_for(getattr(built, "model", built)).kind == "hooked"


@pytest.mark.tl4
def test_without_hookedtransformer_naming_it_is_refused_with_the_routes_that_work(monkeypatch):
    """A HookedTransformer asked for by name (``new_hooked_transformer``) is the package's
    UnsupportedArchitectureError naming TransformerLens 3.x and what loads on 4.x."""
    from lens_position.models.backends.hooked import new_hooked_transformer

    if hooked_available():
        monkeypatch.setattr(backends, "hooked_class", lambda: None)
    with pytest.raises(UnsupportedArchitectureError) as refused:
        new_hooked_transformer(dict(n_layers=1, d_model=4, d_head=4, n_heads=1, n_ctx=8, d_vocab=8, attn_only=True),
                               what="a model")
    message = str(refused.value)
    assert "HookedTransformer" in message and "TransformerLens 3.x" in message
    assert not isinstance(refused.value, ImportError)
    assert "load_model" in message and "tiny-llama" in message
