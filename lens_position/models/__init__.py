"""Model adapters: load Llama, Mistral, Qwen2 and Gemma-3 checkpoints into HookedTransformer.

``load_model(name_or_path, **options) -> LoadedModel`` is the entry point; ``KNOWN_MODELS``
lists the registry names (the embedded SmolLM2 / Gemma-3 defaults and tiny in-code models).
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what the lazy names are, for type checkers and the API reference
    from lens_position.models.load import describe, load_model
    from lens_position.models.registry import DEFAULT_MODELS, KNOWN_MODELS
    from lens_position.models.spec import LoadedModel, ModelSpec, as_loaded, check_length, spec_from_config

_EXPORTS = {
    **dict.fromkeys(["describe", "load_model"], "lens_position.models.load"),
    **dict.fromkeys(["DEFAULT_MODELS", "KNOWN_MODELS"], "lens_position.models.registry"),
    **dict.fromkeys(["LoadedModel", "ModelSpec", "as_loaded", "check_length", "spec_from_config"],
                    "lens_position.models.spec"),
}
__all__ = ["DEFAULT_MODELS", "KNOWN_MODELS", "LoadedModel", "ModelSpec", "as_loaded", "check_length",
           "describe", "load_model", "spec_from_config"]


def __getattr__(name: str) -> Any:
    """Import a name's module on first use: the registry (read by the command line's parser)
    must not pull in TransformerLens, which ``load`` and ``spec`` import."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
