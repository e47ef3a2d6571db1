"""A run's findings as one frozen value: the claims, C3 at each length and the console's sentences,
each computed once from the run's tables.

``Findings.of(tables)`` splits the tables into the main models' and the zoo's once
(:attr:`lens_position.core.run_tables.RunTables.split`), evaluates the claims on the main ones
(:func:`lens_position.analyses.claims.claims_table`) and C3 at every length both sides were
measured at (:func:`lens_position.analyses.claims.c3_by_length`), and the zoo's claims where the
zoo stands beside other models. The reproduction writes ``claims.csv`` and ``claims_by_length.csv``
from these values, the report renders them, and the command line prints :meth:`Findings.summary_lines`.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from lens_position.analyses.claims import NOT_MEASURED, Criteria, c3_by_length, claims_table
from lens_position.analyses.sentences import (
    UNTRAINED_NOTE,
    answer_line,
    bos_sentence,
    components_sentence,
    convergence_sentence,
    leakage_sentence,
    rotary_bands_sentence,
    sinks_sentence,
    window_sinks_sentence,
)
from lens_position.core.run_tables import RunTables
from lens_position.core.summaries import is_untrained

#: More architectures than this and the console summary gives one line each (the rest is in the report).
COMPACT_AFTER = 1  # two architectures or more: a line each, so a two-model run fits one screen
WIDTH = 110


@dataclass(frozen=True, eq=False)
class Findings:
    """``tables`` (every table of the run), ``main`` and ``zoo`` (its split), ``claims`` (the claims
    table of the main models: ``claims.csv``), ``by_length`` (C3 at each length), ``zoo_claims`` (the
    zoo's claims table; None without zoo models) and the ``criteria`` they were decided by."""

    tables: RunTables
    main: RunTables
    zoo: RunTables
    claims: pd.DataFrame
    by_length: pd.DataFrame
    zoo_claims: pd.DataFrame | None
    criteria: Criteria

    @classmethod
    def of(cls, tables: Mapping[str, pd.DataFrame], criteria: Criteria = Criteria()) -> Findings:
        """The findings of a run's ``tables``, each computed here once."""
        run = RunTables.of(tables)
        main, zoo = run.split
        claims = claims_table(main, criteria)
        zoo_claims = None if not zoo else (claims if main.has_zoo_models else claims_table(zoo, criteria))
        return cls(run, main, zoo, claims, c3_by_length(main), zoo_claims, criteria)

    @property
    def architectures(self) -> list[str]:
        """Every architecture of the run, in order of first appearance."""
        return [arch for arch, _ in self.tables.architectures]

    def sentences(self, architecture: str) -> list[str]:
        """What the run measured on one architecture, in the sentences the report opens with: where
        absolute position comes from (R', M'), the sink heads and their readers, BOS replacement, the
        probe, and the instruments' sentences (position-0 convergence, window-aware sinks, rotary
        bands, leakage)."""
        part = self.tables.part
        out = []
        names = {str(m) for frame in self.tables.values() if frame is not None and "model" in frame.columns
                 and "architecture" in frame.columns for m in frame.loc[frame["architecture"] == architecture,
                                                                        "model"]}
        if any(is_untrained({"model": {"name": name}}) for name in names):
            out.append(f"{architecture}: {UNTRAINED_NOTE}")
        layers = part("decompose_layers", architecture)
        if layers is not None:
            out.append(components_sentence(layers.sort_values("layer"), architecture,
                                           part("decompose_replicates", architecture), in_sample=False))
        sinks = part("sink_heads", architecture)
        if sinks is not None:
            out.append(sinks_sentence(sinks, part("sink_reading", architecture), architecture))
        bos = part("bos_overall", architecture)
        if bos is not None:
            out.append(bos_sentence(bos, architecture, part("bos_replicates", architecture)))
        probe = part("probe_layers", architecture)
        if probe is not None:
            best = probe.loc[probe["r2_heldout"].astype(float).idxmax()]
            out.append(f"On {architecture}, the position probe's held-out R² is at most "
                       f"{float(best['r2_heldout']):.3g} (layer {int(best['layer'])}).")
        rate = part("sink_rate", architecture)
        if rate is not None:
            out.append(f"On {architecture}, Gu et al.'s sink rate: " + ", ".join(
                f"{r['condition']} {100 * float(r['sink_rate']):.3g}%" for _, r in rate.iterrows()) + ".")
        convergence = part("convergence_layers", architecture)
        if convergence is not None:
            out.append(convergence_sentence(convergence, part("bos_layers", architecture), bos, architecture,
                                            part("bos_replicates", architecture)))
        window_sinks = part("window_sinks_types", architecture)
        if window_sinks is not None:
            out.append(window_sinks_sentence(window_sinks, architecture))
        bands, band_layers = part("bands_heads", architecture), part("bands_layers", architecture)
        if bands is not None and band_layers is not None:
            out.append(rotary_bands_sentence(bands, band_layers, architecture))
        leakage = part("leakage_heads", architecture)
        if leakage is not None:
            out.append(leakage_sentence(leakage, part("leakage_seeds", architecture), architecture))
        return out

    def answer_lines(self, architectures: list[str] | None = None) -> list[str]:
        """One line per architecture (:func:`lens_position.analyses.sentences.answer_line`; default:
        every one): the held-out total and the shares of it, for a run over many architectures."""
        out = []
        for arch in self.architectures if architectures is None else architectures:
            layers = self.tables.part("decompose_layers", arch)
            if layers is not None:
                out.append(answer_line(layers.sort_values("layer"), arch,
                                       self.tables.part("decompose_replicates", arch)))
        return out

    def summary_lines(self) -> list[str]:
        """The console's summary of a run's numbers: per architecture its sentences (one line each
        beyond :data:`COMPACT_AFTER` architectures, the detail being in the report); the claims'
        verdicts follow (:func:`verdict_lines`)."""
        zoo = [arch for arch, _ in self.zoo.architectures]
        archs = [arch for arch in self.architectures if arch not in zoo] or self.architectures
        lines = []
        if len(archs) > COMPACT_AFTER:
            lines.append("  held-out share of Var(log A) explained by absolute position, and its split (the report "
                         "words each):")
            lines += [f"  {answer}" for answer in self.answer_lines(archs)]
        else:
            for arch in archs:
                for sentence in self.sentences(arch):
                    lines += textwrap.wrap(sentence, WIDTH, initial_indent="  ", subsequent_indent="    ")
        if zoo and archs != self.architectures:
            lines.append(f"  the controlled zoo ({len(zoo)} models): its numbers and C3 from paired seeds are in the "
                         "report's zoo section and zoo_claims.csv")
        return lines


def verdict_lines(claims: pd.DataFrame) -> list[str]:
    """Each claim's overall verdict with what it rests on (one line each); a sweep's claims (one
    table per condition, a ``seed`` column) as one line counting them."""
    overall = claims[(claims["architecture"] == "overall") & (claims["verdict"] != NOT_MEASURED)]
    if "seed" in overall.columns:  # a sweep: one verdict per condition would be too long here
        conditions = overall[["source", "bos", "seed"]].drop_duplicates().shape[0]
        return [f"  {len(overall)} verdicts over {conditions} conditions in claims.csv"]
    return [f"  {row['claim']}: {row['verdict']} ({row['measured']})" for _, row in overall.iterrows()]
