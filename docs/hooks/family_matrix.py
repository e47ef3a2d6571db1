"""MkDocs hook: the family matrix, read from ``docs/data/family_matrix.json``.

That file holds, per TransformerLens line, what ``python -m lens_position.pipeline.family_matrix``
found for every decoder family of the installed transformers (a tiny random checkpoint through
load, the load-time verification, a decomposition, sink scores, a one-head K/V patch, the
rotary-band split and ``ntk_alpha=4``); the tests replay its rows. This hook replaces the marker
``<!-- family-matrix -->`` with one table row per family; a missing or unreadable file fails the
build.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

MARKER = "<!-- family-matrix -->"
log = logging.getLogger("mkdocs.hooks.family_matrix")


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    status = row["status"]
    if status == "works":
        notes = [f"{step} {outcome.split(':')[0].split(' (')[0]}" for step, outcome in sorted(row["steps"].items())
                 if outcome != "ok" and not outcome.startswith("n/a")]
        return f"works ({row['backend']})" + (f"; {', '.join(notes)}" if notes else "")
    if status == "refused":
        return f"refused: {row['reason']}"
    if status == "not built":
        return "not built from a small config"
    return f"**{status}**: {row.get('message', '')[:80]}"


def family_table(path: Path) -> str:
    data = json.loads(path.read_text(encoding="utf-8"))
    lines = sorted(data)
    versions = {line: data[line]["versions"] for line in lines}
    header = ["family (`model_type`)"] + [f"TransformerLens {versions[line]['transformer_lens']}" for line in lines]
    families = sorted({name for line in lines for name in data[line]["rows"]})
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name in families:
        out.append("| " + " | ".join([f"`{name}`"] + [_cell(data[line]["rows"].get(name)) for line in lines]) + " |")
    counts = []
    for line in lines:
        rows = data[line]["rows"].values()
        works = sum(row["status"] == "works" for row in rows)
        refused = sum(row["status"] == "refused" for row in rows)
        counts.append(f"TransformerLens {versions[line]['transformer_lens']} (transformers "
                      f"{versions[line]['transformers']}): {works} work, {refused} refused by name")
    return "; ".join(counts) + ".\n\n" + "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER in markdown:
        path = Path(config["config_file_path"]).parent / "docs" / "data" / "family_matrix.json"
        try:
            markdown = markdown.replace(MARKER, family_table(path))
        except Exception as exc:  # strict mode turns the logged error into a failed build
            log.error("cannot generate the family matrix on %s: %s", page.file.src_uri, exc)
    return markdown
