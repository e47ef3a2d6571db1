"""Model adapters: load Llama, Mistral, Qwen2 and Gemma-3 checkpoints into HookedTransformer.

``load_model(name_or_path, **options) -> LoadedModel`` is the entry point; ``KNOWN_MODELS``
lists the registry names (the embedded SmolLM2 / Gemma-3 defaults and tiny in-code models).
"""

from lens_position.models.load import describe, load_model
from lens_position.models.registry import DEFAULT_MODELS, KNOWN_MODELS
from lens_position.models.spec import LoadedModel, ModelSpec, as_loaded, check_length, spec_from_config

__all__ = ["DEFAULT_MODELS", "KNOWN_MODELS", "LoadedModel", "ModelSpec", "as_loaded", "check_length",
           "describe", "load_model", "spec_from_config"]
