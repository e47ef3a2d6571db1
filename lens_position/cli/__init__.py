"""The command line: ``lens-position`` (``main``), its sub-commands and the zoo's."""

from lens_position.cli.commands import main

__all__ = ["main"]
