"""Render the "what the reproduction measured" section of the README and of the reproduction's
how-to from a run's output folder.

Reads ``<results>/claims.csv`` (and ``provenance.json`` for the run's sizes) and replaces
everything between the markers ``<!-- claims-table:start -->`` and ``<!-- claims-table:end -->``:
one row per claim, one column per architecture, each cell the estimate the claim is decided on
with its 95% interval and the verdict (percentages printed as every door prints them,
:func:`lens_position.core.intervals.format_percent`). The how-to's section adds the explanation of
every verdict other than "holds", as the claims module wrote it; the README's links there.
Nothing in either section is typed by hand.

    python scripts/readme_claims_table.py                 # results/ -> README.md, docs/howto/reproduce.md
    python scripts/readme_claims_table.py --results out --check
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from lens_position.core.intervals import format_percent

START, END = "<!-- claims-table:start -->", "<!-- claims-table:end -->"


def _cell(row: pd.Series) -> str:
    value, lo, hi = (float(row[c]) if pd.notna(row[c]) else math.nan for c in ("value", "value_lo", "value_hi"))
    percent = str(row["claim"]) == "C4"
    if math.isnan(value):
        text = "–"
    elif percent:
        text = format_percent(value, ".0f") + (f" [{format_percent(lo, '.0f')}, {format_percent(hi, '.0f')}]"
                                               if math.isfinite(lo) else "")
    elif str(row["claim"]) == "C5":
        text = f"{value:.1e} (exact)"
    else:
        text = f"{value:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if math.isfinite(lo) else "")
    note = row.get("interval_note")
    if isinstance(note, str) and note:  # the claims module's words (Estimate.note): method, estimate outside
        text += f" ({note})"
    elif math.isfinite(lo) and math.isfinite(hi) and not lo <= value <= hi:  # a claims.csv without the column
        text += " (outside its interval: off-centre bootstrap)"
    length = row.get("seq_len")
    if str(row["claim"]) in ("C2", "C3") and length is not None and pd.notna(length):
        text += f" at T = {int(length)}"  # the comparisons' common length (claims.matched)
    return f"{text}: **{row['verdict']}**"


def render(claims: pd.DataFrame, provenance: dict, notes: bool = True) -> str:
    """The section: the sizes, the table and (``notes``) why each verdict other than "holds" is what it is."""
    archs = [a for a in dict.fromkeys(claims["architecture"]) if a != "overall"]
    lines = ["| claim | what is compared | " + " | ".join(a.split(": ", 1)[-1] for a in archs) + " | overall |",
             "|---|---|" + "---|" * (len(archs) + 1)]
    for claim, part in claims.groupby("claim", sort=True):
        part = part.set_index("architecture")
        quantities = [q for q in dict.fromkeys(part["quantity"].dropna()) if q]
        cells = [_cell(part.loc[a]) if a in part.index else "not measured" for a in archs]
        lines.append(f"| {claim} | {' / '.join(quantities)} | " + " | ".join(cells)
                     + f" | **{part.loc['overall', 'verdict']}** |")
    settings = provenance.get("settings", {})
    # the run time is stated once, measured on a named machine, in docs/performance.md: a wall time
    # of whatever machine made these numbers would be a second, different figure
    head = (f"One run of `make reproduce` (N = {settings.get('N')} sequences of T = {settings.get('T')} positions, "
            f"{settings.get('n_resamples')} bootstrap replicates). Each cell: the estimate the claim is decided on, "
            "its 95% bootstrap interval over whole sequences, and the verdict (held-out values of the "
            "reference-free split; C4 at early queries i < 32; C5's spread is exact). C2 and C3 compare "
            "architectures at one T, named in each cell: a model with a sliding window is decomposed beyond it, "
            "and compared with the others at a length all were measured at (the length sweep, "
            f"T = {', '.join(str(t) for t in settings.get('lengths', []))}). Generated from "
            "`results/claims.csv` by `scripts/readme_claims_table.py`.")
    why = [f"- **{r.claim}, {r.architecture.split(': ', 1)[-1]}** ({r.verdict}): {r.explanation}"
           for r in claims.itertuples() if r.architecture != "overall" and isinstance(r.explanation, str)
           and r.explanation]
    if not notes:  # the README's: short, the how-to says the rest
        head = (f"One run of `make reproduce` (N = {settings.get('N')} sequences of T = {settings.get('T')} positions, "
                f"{settings.get('n_resamples')} bootstrap replicates): each cell the estimate the claim is decided "
                "on, its 95% interval and the verdict. Generated from `results/claims.csv` by "
                "`scripts/readme_claims_table.py`.")
    body = [head, "", *lines]
    if why and notes:
        body += ["", "Where our numbers differ from the paper, or do not yet decide (generated from the numbers):",
                 "", *why]
    elif why:
        body += ["", "Why each verdict other than **holds** is what it is: [the reproduction's how-to]"
                     "(docs/howto/reproduce.md#what-the-reproduction-measured), and the run's own report."]
    return "\n".join(body)


def updated(page: Path, section: str) -> str:
    """``page``'s text with its marked section replaced by ``section``."""
    text = page.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise SystemExit(f"{page} has no {START} ... {END} section")
    before, rest = text.split(START, 1)
    _, after = rest.split(END, 1)
    return f"{before}{START}\n{section}\n{END}{after}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"))
    parser.add_argument("--howto", type=Path, default=Path("docs/howto/reproduce.md"))
    parser.add_argument("--check", action="store_true", help="fail if a section is not what the run says")
    args = parser.parse_args()
    claims = pd.read_csv(args.results / "claims.csv")
    prov_path = args.results / "provenance.json"
    provenance = json.loads(prov_path.read_text()) if prov_path.is_file() else {}
    pages = {args.readme: render(claims, provenance, notes=False), args.howto: render(claims, provenance)}
    for page, section in pages.items():
        text = updated(page, section)
        if args.check and text != page.read_text(encoding="utf-8"):
            print(f"{page}: the claims section differs from {args.results / 'claims.csv'}", file=sys.stderr)
            return 1
        if not args.check:
            page.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
