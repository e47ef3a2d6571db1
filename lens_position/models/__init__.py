"""Model adapters: load Llama, Mistral, Qwen2 and Gemma-3 checkpoints into HookedTransformer."""

from lens_position.models.spec import LoadedModel, ModelSpec, as_loaded, spec_from_config

__all__ = ["LoadedModel", "ModelSpec", "as_loaded", "spec_from_config"]
