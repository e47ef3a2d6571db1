"""lens_position: where absolute position comes from in decoder-only transformers.

``from lens_position import load_model`` is the same function as ``lens_position.models.load_model``
(imported on first use, so ``import lens_position`` stays cheap); the analyses live in their
modules (``lens_position.decompose``, ``lens_position.probes``, ...).
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lens_position.models import load_model

__version__ = "0.1.0"
__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    """``load_model`` on first use (it pulls in TransformerLens, which the command line's parser must not)."""
    if name == "load_model":
        from lens_position.models import load_model

        return load_model
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
