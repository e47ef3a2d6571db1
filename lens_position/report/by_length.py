"""The report's "C3 at each sequence length" section: every comparison of claim C3 made at each T
both sides were measured at (:func:`lens_position.analyses.claims.c3_by_length`), as a table and,
per comparison, the lengths at which its verdict holds, fails or is undecided."""

from __future__ import annotations

import html

import pandas as pd

from lens_position.analyses.claims import FAILS, HOLDS, INCONCLUSIVE
from lens_position.report.markup import verdict_class

__all__ = ["by_length_html", "verdict_lengths"]


def verdict_lengths(frame: pd.DataFrame) -> dict[tuple[str, str, str], dict[str, list[int]]]:
    """Per comparison (architecture, versus, quantity), the lengths T of each verdict, in order."""
    out: dict[tuple[str, str, str], dict[str, list[int]]] = {}
    for row in frame.sort_values("seq_len").itertuples():
        key = (row.architecture, row.versus, row.quantity)
        out.setdefault(key, {}).setdefault(row.verdict, []).append(int(row.seq_len))
    return out


def _sentence(by_verdict: dict[str, list[int]]) -> str:
    words = {HOLDS: "holds", FAILS: "fails", INCONCLUSIVE: "undecided"}
    return "; ".join(f"{words.get(v, v)} at T = {', '.join(map(str, ts))}" for v, ts in by_verdict.items())


def by_length_html(frame: pd.DataFrame) -> str:
    """The section, from the run's C3-by-length table (:attr:`lens_position.findings.Findings.by_length`;
    empty, and the section too, when the run has no NTK-scaled or sliding-window model beside a
    standard one, or measured them at no common T)."""
    if frame.empty:
        return ""
    summary = "".join(
        f"<li>{html.escape(arch)}: {html.escape(quantity)}"
        f"{' against ' + html.escape(versus) if versus else ''}: {_sentence(by_verdict)}</li>"
        for (arch, versus, quantity), by_verdict in verdict_lengths(frame).items())
    rows = "".join(
        f"<tr><td>{html.escape(row.architecture)}</td><td>{html.escape(row.versus or '(its own)')}</td>"
        f"<td>{html.escape(row.quantity)}</td><td>{int(row.seq_len)}</td>"
        f"<td>{row.value:+.3f} [{row.value_lo:+.3f}, {row.value_hi:+.3f}]</td>"
        f'<td class="{verdict_class(row.verdict)}">{html.escape(row.verdict)}</td>'
        f"<td>{'' if pd.isna(row.n_sequences) else int(row.n_sequences)}</td><td>{html.escape(row.source)}</td></tr>"
        for row in frame.itertuples())
    return ('<section id="c3-by-length"><h2>C3 at each sequence length</h2><p class="caption">The claims table '
            "decides each comparison of C3 at one T; here each is made again at every T both models were measured at "
            "(their own decompositions and their length sweeps; a sliding-window model only beyond its window), with "
            "the 95% interval of the difference over bootstrap replicates. NTK scaling is made for lengths beyond "
            "the original training length (a static scaling rotates every position differently, a dynamic one "
            "only past that length), and the mask component shrinks as T grows, so a verdict may hold at some T "
            f"and not at others.</p><ul>{summary}</ul><table class=\"compact\"><thead><tr><th>model</th>"
            "<th>against</th><th>quantity</th><th>T</th><th>value [95% interval]</th><th>verdict</th><th>N</th>"
            "<th>from</th></tr>"
            f"</thead><tbody>{rows}</tbody></table></section>")
