"""Which routes work for a family another route refused: what a refusal may suggest.

A refusal names only routes that can work: the hooked backend only where TransformerLens has
``HookedTransformer`` and lens_position has an adapter for the family; the bridge only where
TransformerLens has ``TransformerBridge`` and the refusal did not come from it; TransformerLens 4.x
only for families whose 3.x bridge is known to compute them wrongly and whose 4.x bridge computes
them exactly (measured against Hugging Face on tiny checkpoints).
"""

from __future__ import annotations

import importlib.metadata
from typing import Any, Literal

from lens_position.models.backends import bridge_class, hooked_available

# Families whose TransformerBridge in TransformerLens 3.x gives logits far from Hugging Face's, and
# whose 4.x bridge gives them within float round-off.
FIXED_IN_TRANSFORMER_LENS_4 = frozenset({"cohere", "cohere2", "hunyuan_v1_dense"})


def _transformer_lens_major() -> int:
    try:
        return int(importlib.metadata.version("transformer_lens").split(".")[0])
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return 0


def model_type_of(hf_config: Any) -> str | None:
    """A Hugging Face config's ``model_type`` (its text part's, for a multimodal config)."""
    config = getattr(hf_config, "text_config", None) or hf_config
    return getattr(config, "model_type", None) or getattr(hf_config, "model_type", None)


def has_adapter(model_type: str | None) -> bool:
    """Whether the hooked backend can host ``model_type`` here (an adapter, and HookedTransformer)."""
    from lens_position.models.adapters import ADAPTERS

    return hooked_available() and model_type in ADAPTERS


def working_routes(model_type: str | None, *, refused_by: Literal["hooked", "bridge"]) -> str:
    """One sentence naming the routes that can host ``model_type`` after ``refused_by`` refused it,
    or saying that none does in this environment."""
    routes = []
    if refused_by == "bridge" and has_adapter(model_type):
        routes.append("the hooked backend (load_model(..., backend='hooked'))")
    if refused_by == "hooked" and bridge_class() is not None:
        routes.append("the bridge (load_model(..., backend='bridge'), TransformerBridge running the Hugging Face "
                      "model itself)")
    if model_type in FIXED_IN_TRANSFORMER_LENS_4 and _transformer_lens_major() < 4:
        routes.append("TransformerLens 4.3 or later (pip install 'transformer_lens>=4.3'), whose bridge computes "
                      f"model_type {model_type!r} exactly")
    if not routes:
        return ("No backend of this installation hosts it exactly; lens_position refuses it rather than give "
                "numbers that differ from the model's own.")
    return "Routes that work: " + "; or ".join(routes) + "."
