"""MkDocs hook: tables that are read off the code at build time, so the docs cannot drift.

- ``<!-- model-registry -->``: every name in ``lens_position.models.registry.REGISTRY`` with
  its kind, description and default load options.
- ``<!-- result-tables -->``: the tables a reproduction writes (``lens_position.pipeline.steps.TABLES``:
  each step's result class declares its own).
- ``<!-- column-reference -->``: every column of every result table with its meaning
  (``lens_position.core.columns.COLUMNS``), the recommended ones first.
"""

from __future__ import annotations

import logging

log = logging.getLogger("mkdocs.hooks.generated_tables")


def _escape(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def model_registry() -> str:
    from lens_position.models.registry import REGISTRY

    rows = ["| name | kind | what it is | load options |", "|---|---|---|---|"]
    for entry in REGISTRY.values():
        options = ", ".join(f"`{k}={v!r}`" for k, v in entry.options.items()) or "none"
        rows.append(f"| `{entry.name}` | {entry.kind} | {_escape(entry.description)} | {options} |")
    return "\n".join(rows)


def result_tables() -> str:
    from lens_position.pipeline.steps import STEPS

    rows = ["| table | step | produced by |", "|---|---|---|"]
    for step in STEPS.values():
        for table in step.tables:
            rows.append(f"| `{table.name}` | `{step.name}` | {_escape(table.meaning)} |")
    return "\n".join(rows)


def column_reference() -> str:
    from lens_position.core.columns import COLUMNS, RECOMMENDED
    from lens_position.pipeline.steps import TABLES

    # the shared registry, and the columns a table declares itself (Table.columns)
    columns = {**COLUMNS, **{name: doc for table in TABLES.values() for name, doc in table.columns.items()}}
    rows = ["| column | meaning |", "|---|---|"]
    first = [c for c in RECOMMENDED if c in columns]
    for name in first + sorted((c for c in columns if c not in first), key=str.lower):
        mark = " **(recommended)**" if name in first else ""
        rows.append(f"| `{name}`{mark} | {_escape(columns[name])} |")
    return "\n".join(rows)


GENERATORS = {"<!-- model-registry -->": model_registry, "<!-- result-tables -->": result_tables,
              "<!-- column-reference -->": column_reference}


def on_page_markdown(markdown: str, page, config, files) -> str:
    for marker, generate in GENERATORS.items():
        if marker in markdown:
            try:
                markdown = markdown.replace(marker, generate())
            except Exception as exc:  # strict mode turns the logged error into a failed build
                log.error("cannot generate %s on %s: %s", marker, page.file.src_uri, exc)
    return markdown
