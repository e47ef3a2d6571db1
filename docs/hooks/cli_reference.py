"""MkDocs hook: write the command line reference from the argparse parser itself.

`docs/cli.md` holds the marker ``<!-- cli-reference -->``; at build time it is replaced by one
section per sub-command with its usage and a table of its options, read off
``lens_position.cli.commands.build_parser()``. The page cannot drift from the code: a renamed option shows
up renamed, and a build without a parser fails (strict mode turns the logged error into a failure).
"""

from __future__ import annotations

import argparse
import html
import logging

MARKER = "<!-- cli-reference -->"
log = logging.getLogger("mkdocs.hooks.cli_reference")


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) for each sub-command, in declaration order."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, helps.get(name, ""), sub))
    return out


def _escape(text: str) -> str:
    """Table-cell text: HTML-escaped (help strings hold placeholders like ``<id>``), one line."""
    return html.escape(text, quote=False).replace("|", "\\|").replace("\n", " ")


def _option_table(parser: argparse.ArgumentParser) -> str:
    rows = ["| option | default | description |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
            if action.nargs != 0:
                metavar = action.metavar
                if metavar is None:
                    metavar = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else action.dest.upper()
                name += f" `{metavar}`" if isinstance(metavar, str) else ""
        else:
            name = f"`{action.metavar or action.dest}` (positional)"
        default = action.default
        if default is None or default is argparse.SUPPRESS or action.nargs == 0:
            shown = ""
        else:
            shown = f"`{default}`"
        description = action.help or ""
        if description is argparse.SUPPRESS:
            continue
        description = _escape(description.replace("%(default)s", str(default)))
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            description += " Choices: " + ", ".join(f"`{c}`" for c in action.choices) + "."
        rows.append(f"| {name} | {shown} | {description} |")
    return "\n".join(rows) if len(rows) > 2 else "This command takes no options."


def _usage(parser: argparse.ArgumentParser) -> str:
    usage = parser.format_usage().strip()
    return f"```text\n{usage}\n```"


def render(parser: argparse.ArgumentParser) -> str:
    """Markdown for the whole command line: top-level usage, then one section per sub-command."""
    parts = [_usage(parser)]
    if parser.description:
        parts.append(parser.description.strip())
    top_table = _option_table(parser)
    if "|" in top_table:
        parts.append("Options that apply to every command:\n\n" + top_table)
    for name, summary, sub in _subcommands(parser):
        parts.append(f"## `{parser.prog} {name}`")
        text = (sub.description or summary or "").strip()
        if text:
            parts.append(text)
        parts.append(_usage(sub))
        parts.append(_option_table(sub))
        nested = _subcommands(sub)
        for nested_name, nested_summary, nested_sub in nested:
            parts.append(f"### `{parser.prog} {name} {nested_name}`")
            if nested_sub.description or nested_summary:
                parts.append((nested_sub.description or nested_summary).strip())
            parts.append(_usage(nested_sub))
            parts.append(_option_table(nested_sub))
    return "\n\n".join(parts) + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    try:
        from lens_position.cli.commands import build_parser
    except ImportError as exc:
        log.error("cannot build the CLI reference: lens_position.cli.commands.build_parser is missing (%s)", exc)
        return markdown.replace(MARKER, "")
    return markdown.replace(MARKER, render(build_parser()))
