"""Errors a user can act on. Each message says what went wrong and what to do.

The command line prints ``str(error)`` as one line and exits non-zero; library users catch
``LensPositionError`` (or a subclass) or the built-in type it also derives from.
"""


class LensPositionError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class UnknownModelError(LensPositionError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MissingPackageError(LensPositionError, ImportError):
    pass


class ContextLengthError(LensPositionError, ValueError):
    pass


class UnsupportedArchitectureError(LensPositionError, ValueError):
    pass


class CorruptFileError(LensPositionError, OSError):
    pass


class BadInputError(LensPositionError, ValueError):
    pass
