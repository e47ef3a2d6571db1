"""Shared fixtures. Tests never touch the network: the hub is switched off for the session.

Real models (``smollm2``, ``gemma3``) are loaded once per session through the weight cache
(``$LENS_POSITION_CACHE``, default ``~/.cache/lens_position``): the first run converts the
GGUFs (about two minutes), later runs read the cache in seconds. Use them only in tests
marked ``@pytest.mark.slow``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs the suite on one pytest-xdist worker per core: each worker (and every process it
# starts) computes on one thread, so the workers do not compete for the cores.
if "PYTEST_XDIST_WORKER" in os.environ:
    for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_variable, "1")

import pytest  # noqa: E402

from lens_position.models import LoadedModel, load_model  # noqa: E402
from lens_position.models.backends import hooked_class  # noqa: E402

# TransformerLens 4.x has no HookedTransformer: there, only the test modules that use the `tl4`
# marker (the tests written to pass on both lines) are collected; every other module builds
# HookedTransformers itself and runs in the 3.x environment (`make test` runs both).
TRANSFORMER_LENS_4 = hooked_class() is None


def pytest_ignore_collect(collection_path, config):
    if TRANSFORMER_LENS_4 and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return "tl4" not in collection_path.read_text(encoding="utf-8")
    return None


@pytest.fixture(autouse=True)
def stage_lines_only_where_asked(monkeypatch):
    """A load's stage lines depend on how long each stage takes (a busy machine shows more of
    them): off here, so a test that reads what a call prints reads the same lines on any machine.
    The tests of those lines set their threshold themselves."""
    from lens_position.ground import progress

    monkeypatch.setattr(progress, "STAGE_SHOWN_AFTER_S", 3600.0)


@pytest.fixture(scope="session")
def tiny_llama() -> LoadedModel:
    """Tiny random Llama (3 global layers, d_model 64, byte tokenizer without BOS)."""
    return load_model("tiny-llama")


@pytest.fixture(scope="session")
def tiny_gemma3() -> LoadedModel:
    """Tiny random Gemma-3 (5 local window-16 layers + 1 global, tokenizer prepends BOS)."""
    return load_model("tiny-gemma3")


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """SmolLM2-135M-Instruct from the embedded GGUF (standard RoPE, no BOS from tokenizer)."""
    return load_model("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3() -> LoadedModel:
    """Gemma-3-270M from the embedded GGUF (local window 512 / global, tokenizer prepends BOS)."""
    return load_model("gemma3-270m")
