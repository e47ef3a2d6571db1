"""Errors a user can act on. Each message says what went wrong and what to do.

The command line prints ``str(error)`` as one line and exits non-zero; library users catch
``LensPositionError`` (or a subclass) or the built-in type it also derives from.
"""


class LensPositionError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class UnknownModelError(LensPositionError, KeyError):
    """A model name that is neither in the registry (``KNOWN_MODELS``) nor an existing path."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingPackageError(LensPositionError, ImportError):
    """An optional package (an embedded model's, ``datasets``, ...) is not installed."""


class ContextLengthError(LensPositionError, ValueError):
    """Sequences longer than the model's context ``n_ctx`` (positions, position 0 included)."""


class UnsupportedArchitectureError(LensPositionError, ValueError):
    """A model family, layer type or attention mask the adapters or analyses do not handle."""


class CorruptFileError(LensPositionError, OSError):
    """A model or cache file that exists but cannot be read (truncated, wrong format)."""


class ResourceError(LensPositionError, OSError):
    """What the machine refused: no space left, a read-only or foreign folder, a path that is not a
    folder, too many open files, not enough memory. The message names the path and what to do
    (:func:`lens_position.ground.files.resource_error` writes it)."""


class BadInputError(LensPositionError, ValueError):
    """An argument or input that is invalid as given: a bad option, shape, range or file."""


class NonFiniteError(BadInputError):
    """A NaN or infinite value where the analysis needs finite numbers (an activation of the
    forward pass, a statistic, a patch value, a load option); the message names where it
    appeared (layer, head, prompt) and the likely cause."""


class PaddedPromptsError(BadInputError):
    """A padded batch (``model.to_tokens(list_of_texts)``): the analyses have no attention mask
    and would read the pad tokens as text."""


def is_input_error(error: BaseException) -> bool:
    """Whether ``error`` is the user's to act on (bad input, missing memory), not a bug:
    a LensPositionError, or running out of memory (``MemoryError``, torch's
    ``OutOfMemoryError``), which asks for smaller N, T or batch size."""
    return isinstance(error, (LensPositionError, MemoryError)) or type(error).__name__ == "OutOfMemoryError"
