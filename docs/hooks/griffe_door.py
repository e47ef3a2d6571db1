"""Griffe extension: a public function's page shows the signature its callers use.

A public function is a body decorated with ``@public`` (:func:`lens_position.models.spec.public`):
the body's first parameter is ``loaded: LoadedModel``, the door's is ``model: ModelLike`` (a
``LoadedModel`` or a bare model, loaded once per call). ``help()`` shows the door through
``__signature__``; griffe reads the source, so this extension gives the rendered page the same
first parameter, and the docstring's ``model:`` entry then matches it.
"""

from __future__ import annotations

from typing import Any

import griffe


class PublicDoor(griffe.Extension):
    """Rename the first parameter of every ``@public`` function to the door's ``model: ModelLike``."""

    def on_function_instance(self, *, node: Any, func: griffe.Function, agent: Any, **kwargs: Any) -> None:
        if not any(str(d.value).split(".")[-1] == "public" for d in func.decorators):
            return
        first = next(iter(func.parameters), None)
        if first is not None and first.name == "loaded":
            first.name = "model"
            first.annotation = "ModelLike"
