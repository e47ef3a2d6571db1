"""The console's summary of a run fits one screen: one line per architecture from two on, the zoo
in one line, each line a function of the run's tables."""

from __future__ import annotations

from fake_results import fake_results

from lens_position.findings import Findings
from lens_position.findings.run import WIDTH


def _only(tables: dict, architectures: set[str]) -> dict:
    return {name: frame[frame["architecture"].isin(architectures)] if "architecture" in frame.columns else frame
            for name, frame in tables.items()}


def test_two_architectures_print_a_line_each():
    tables = fake_results()
    two = set(Findings.of(tables).architectures[:2])
    lines = Findings.of(_only(tables, two)).summary_lines()
    assert len(lines) == 3  # the heading, then one line per architecture
    assert all(any(line.strip().startswith(f"{arch} at T = ") for line in lines) for arch in two)


def test_one_architecture_prints_its_sentences_wrapped_to_the_console():
    tables = fake_results()
    one = {Findings.of(tables).architectures[0]}
    lines = Findings.of(_only(tables, one)).summary_lines()
    assert len(lines) > 3 and all(len(line) <= WIDTH for line in lines)
