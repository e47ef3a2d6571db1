"""Argument types shared by the command line's parsers: each turns one option's text into a checked
value, or raises ``argparse.ArgumentTypeError`` (a usage error, exit status 2) saying what to pass."""

from __future__ import annotations

import argparse
from pathlib import Path

from lens_position.core.checks import check_seed
from lens_position.ground.errors import BadInputError
from lens_position.ground.paths import checked_path


def positive_int(text: str) -> int:
    """A size option (``--T``, ``--N``, ``--batch-size``, ``--threads``): a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def seed_option(text: str) -> int:
    """A seed option (``--seed``): a whole number in ``0 .. 2**63 - 1``."""
    try:
        return check_seed(int(text))
    except (ValueError, BadInputError) as error:
        raise argparse.ArgumentTypeError(f"expected a whole number in 0..2**63-1, got {text!r}") from error


def path_option(text: str) -> Path:
    """A path option: never the empty or blank path, which ``Path`` would turn into the current folder."""
    try:
        return checked_path(text, "the value")
    except BadInputError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
