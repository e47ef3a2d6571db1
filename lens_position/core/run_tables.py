"""A run's tables as one frozen value, split and sliced once.

A reproduction writes one table per kind of result, every model's rows stacked and tagged with its
``model``, ``architecture`` and ``role``. Whatever reads a run by architecture (the claims, the
findings, the report, the console summary) asks :class:`RunTables` for ``part(table,
architecture)``, and whatever treats the controlled zoo apart asks it for ``split``: the main
models' tables and the zoo's, made once. So one question has one slice, wherever it is asked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cached_property

import pandas as pd

__all__ = ["RunTables", "is_zoo_request"]


def is_zoo_request(model: str) -> bool:
    """Whether a run's model request names a zoo checkpoint (``zoo:<variant>[@seed]``)."""
    return str(model).startswith("zoo:")


@dataclass(frozen=True, eq=False)
class RunTables(Mapping[str, pd.DataFrame]):
    """``tables`` (name → frame), read as a mapping, with each slice made once: ``architectures``
    (label and role, in order of first appearance), ``part(table, architecture)`` and ``split``
    (main and zoo)."""

    tables: Mapping[str, pd.DataFrame]
    _slices: dict[tuple[str, str], pd.DataFrame | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, tables: Mapping[str, pd.DataFrame]) -> RunTables:
        """``tables`` as a :class:`RunTables` (itself when it is one already, so its slices are kept)."""
        return tables if isinstance(tables, RunTables) else cls(dict(tables))

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tables)

    def __len__(self) -> int:
        return len(self.tables)

    @cached_property
    def architectures(self) -> tuple[tuple[str, str], ...]:
        """(architecture label, role) in order of first appearance over all tables ("standard" where a
        table has no ``role``)."""
        seen: dict[str, str] = {}
        for frame in self.tables.values():
            if frame is None or "architecture" not in frame.columns:
                continue
            roles = frame["role"].tolist() if "role" in frame.columns else ["standard"] * len(frame)
            for arch, role in zip(frame["architecture"].tolist(), roles):
                seen.setdefault(arch, role)
        return tuple(seen.items())

    def part(self, table: str, architecture: str | None) -> pd.DataFrame | None:
        """The rows of ``table`` of one architecture (all rows of a table without an ``architecture``
        column, or for ``architecture=None``), index reset; None where the table is missing or has no
        such rows."""
        key = (table, str(architecture))
        if key not in self._slices:
            frame = self.tables.get(table)
            if frame is not None and architecture is not None and "architecture" in frame.columns:
                frame = frame[frame["architecture"] == architecture].reset_index(drop=True)
            self._slices[key] = frame if frame is not None and len(frame) else None
        return self._slices[key]

    @property
    def has_zoo_models(self) -> bool:
        """Whether the run holds a decomposition of at least one zoo model."""
        layers = self.tables.get("decompose_layers")
        return layers is not None and "model" in layers.columns and bool(layers["model"].map(is_zoo_request).any())

    @cached_property
    def split(self) -> tuple[RunTables, RunTables]:
        """``(main, zoo)``: the run's tables without and with only its zoo models. The paper's claims
        compare architectures (C3: every NTK model against every standard one), so in a run that
        also has other models the main claims and figures are theirs and the zoo gets its own
        section; in a run of zoo models alone, ``main`` is every table. ``zoo`` is empty without zoo
        models."""
        if not self.has_zoo_models:
            return self, RunTables({})

        def part(keep_zoo: bool) -> RunTables:
            return RunTables({name: frame[frame["model"].map(is_zoo_request) == keep_zoo].reset_index(drop=True)
                              if "model" in frame.columns else frame for name, frame in self.tables.items()})

        zoo = part(True)
        others = any("model" in f.columns and not f["model"].map(is_zoo_request).all() for f in self.tables.values())
        return (part(False) if others else self), zoo
