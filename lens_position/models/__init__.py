"""Model adapters: load Llama, Mistral, Qwen2 and Gemma-3 checkpoints into HookedTransformer.

``load_model(name_or_path, **options) -> LoadedModel`` is the entry point; ``KNOWN_MODELS``
lists the registry names (the embedded SmolLM2 / Gemma-3 defaults and tiny in-code models).
"""

from lens_position.lazy import lazy_exports

_EXPORTS = {
    **dict.fromkeys(["describe", "load_model"], "lens_position.models.load"),
    **dict.fromkeys(["DEFAULT_MODELS", "KNOWN_MODELS"], "lens_position.models.registry"),
    **dict.fromkeys(["LoadedModel", "ModelSpec", "as_loaded", "check_length", "spec_from_config"],
                    "lens_position.models.spec"),
}
__all__ = sorted(_EXPORTS)
# TransformerLens is imported when a name that needs it is first used, not by the registry.
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
