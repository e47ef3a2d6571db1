"""Shared fixtures. Tests never touch the network: the hub is switched off for the session.

Real models (``smollm2``, ``gemma3``) are loaded once per session through the weight cache
(``$LENS_POSITION_CACHE``, default ``~/.cache/lens_position``): the first run converts the
GGUFs (about two minutes), later runs read the cache in seconds. Use them only in tests
marked ``@pytest.mark.slow``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

from lens_position.models import LoadedModel, load_model  # noqa: E402


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
