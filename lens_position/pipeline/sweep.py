"""Sweeps: models x data sources x BOS policies x seeds x steps from one TOML file.

A sweep spec::

    models = ["tiny-llama", "tiny-gemma3"]      # model requests, as --models takes them
    sources = ["natural"]                       # natural, random, repeated (default: natural)
    bos = ["force", "tokenizer"]                # BOS policies (default: force)
    seeds = [0, 1]                              # (default: [0])
    steps = ["decompose", "probe"]              # (default: every step)
    text = "my_corpus/"                         # optional: the natural text (file, folder, hf:...)
    quick = true                                # optional sizes: quick, T, N
    T = 64
    N = 8

runs every (model, source, BOS policy, seed, step) cell on the chosen executor, one step
cache for all of them, and writes one tidy table per step table with a column per factor
(``source``, ``bos``, ``seed``; ``model``, ``architecture`` and ``role`` as in a run), the
claims per condition (``claims.csv``, with the factor columns), a report per condition
(``report-<source>-<bos>-seed<seed>.html``) and the sweep's ``report.html`` that links them.
"""

from __future__ import annotations

import html
import itertools
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from lens_position.ground.errors import BadInputError
from lens_position.ground.files import read_text
from lens_position.ground.paths import checked_path
from lens_position.models.registry import REGISTRY
from lens_position.pipeline.config import Compute, DataOptions, RunConfig

FACTORS: tuple[str, ...] = ("source", "bos", "seed")
_KEYS = {"models", "sources", "bos", "seeds", "steps", "text", "quick", "T", "N"}


def _strings(spec: Mapping[str, Any], key: str, default: list[Any], kind: type) -> list[Any]:
    value = spec.get(key, default)
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool)
                                                           for v in value):
        raise BadInputError(f"sweep spec: {key} must be a non-empty list of {kind.__name__}s, got {value!r}")
    if len(set(value)) != len(value):
        raise BadInputError(f"sweep spec: {key} lists a value twice: {value!r}")
    return value


#: The most (model, data condition) runs one spec plans: each is a whole reproduction of one model.
MAX_RUNS = 2_000


def read_spec(path: Path) -> dict[str, Any]:
    """Read and check a sweep spec (BadInputError naming the problem)."""
    path = checked_path(path, "the sweep spec")
    if path.is_dir():
        raise BadInputError(f"sweep spec {path} is a folder; pass the spec's .toml file")
    if not path.exists():
        raise BadInputError(f"sweep spec {path} does not exist")
    text = read_text(path, "sweep spec").removeprefix("\ufeff")  # a FIFO or device is refused; a BOM is dropped
    try:
        spec = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise BadInputError(f"sweep spec {path} is not valid TOML: {error}") from None
    except RecursionError:
        raise BadInputError(f"sweep spec {path} nests its tables too deep to read; write a plain spec") from None
    unknown = set(spec) - _KEYS
    if unknown:
        raise BadInputError(f"sweep spec {path}: unknown keys {sorted(unknown)}; use {sorted(_KEYS)}")
    if "models" not in spec:
        raise BadInputError(f"sweep spec {path} names no models: add models = [\"...\"]")
    checked = {
        "models": _strings(spec, "models", [], str),
        "sources": _strings(spec, "sources", ["natural"], str),
        "bos": _strings(spec, "bos", ["force"], str),
        "seeds": _strings(spec, "seeds", [0], int),
        "steps": _strings(spec, "steps", [], str) if "steps" in spec else None,
        "text": spec.get("text"),
        "quick": spec.get("quick", False),
        "T": spec.get("T"),
        "N": spec.get("N"),
    }
    for key in ("T", "N"):
        if checked[key] is not None and (not isinstance(checked[key], int) or checked[key] < 1):
            raise BadInputError(f"sweep spec: {key} must be a positive whole number, got {checked[key]!r}")
    if not isinstance(checked["quick"], bool):
        raise BadInputError(f"sweep spec: quick must be true or false, got {checked['quick']!r}")
    if checked["text"] is not None:
        if not isinstance(checked["text"], str):
            raise BadInputError(f"sweep spec: text must be a path string, got {checked['text']!r}")
        if not checked["text"].startswith("hf:"):
            checked_path(checked["text"], "sweep spec: text")  # "" would be the spec's own folder
        if not checked["text"].startswith("hf:"):
            text_path = Path(checked["text"]).expanduser()  # ~ is the user's home, as in a model's path
            checked["text"] = str(text_path if text_path.is_absolute() else (path.parent / text_path).resolve())
    checked["models"] = [_model_from_spec(name, path.parent) for name in checked["models"]]
    runs = len(checked["models"]) * len(checked["sources"]) * len(checked["bos"]) * len(checked["seeds"])
    if runs > MAX_RUNS:
        sizes = (f"{len(checked['models'])} models x {len(checked['sources'])} sources x {len(checked['bos'])} BOS "
                 f"policies x {len(checked['seeds'])} seeds")
        raise BadInputError(f"sweep spec {path}: {sizes} = {runs:,} runs of the reproduction, more than the "
                            f"{MAX_RUNS:,} one spec plans; split it into several specs "
                            "(one per model or per range of seeds), each with its own --out")
    return checked


def _model_from_spec(name: str, folder: Path) -> str:
    """A model entry of a spec in ``folder``: a relative path is read from the spec's folder (as its
    ``text`` is), whatever the working folder; registry names, ``zoo:`` names and hub ids are kept."""
    if name in REGISTRY or name.startswith("zoo:") or Path(name).expanduser().is_absolute() or name.startswith("~"):
        return name
    beside = folder / name
    looks_like_path = name.startswith(("./", "../")) or name.lower().endswith(".gguf") or Path(name).exists()
    if beside.exists() or looks_like_path:
        if not beside.exists():
            raise BadInputError(f"sweep spec: model {name!r} is read from the spec's folder, {beside.resolve()}, "
                                "which does not exist; write the path relative to the spec's folder (as text is), "
                                "or an absolute one")
        return str(beside.resolve())
    return name


def sweep_config(spec: Mapping[str, Any], *, out: Path, compute: Compute = Compute(), executor: str = "serial",
                 **options: Any) -> RunConfig:
    """The ``RunConfig`` of a checked sweep spec: one data condition per (source, BOS, seed)."""
    conditions = tuple(DataOptions(source=source, corpus=spec["text"], bos=bos, seed=seed)
                       for source, bos, seed in itertools.product(spec["sources"], spec["bos"], spec["seeds"]))
    return RunConfig(out=out, models=tuple(spec["models"]), steps=tuple(spec["steps"]) if spec["steps"] else None,
                     data=conditions[0], conditions=conditions, factors=FACTORS, T=spec["T"], N=spec["N"],
                     quick=spec["quick"], compute=compute, executor=executor, **options)


def condition_slug(values: Mapping[str, Any]) -> str:
    """``natural-force-seed0``: a file-name-safe name of a condition."""
    text = f"{values['source']}-{values['bos']}-seed{values['seed']}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


def split_by_condition(tables: Mapping[str, pd.DataFrame]) -> list[tuple[dict[str, Any], dict[str, pd.DataFrame]]]:
    """(factor values, the tables of that condition without the factor columns), in sweep order."""
    first = next(iter(tables.values()))
    out = []
    for values, _ in first.groupby(list(FACTORS), sort=False):
        named = dict(zip(FACTORS, values))
        subset = {}
        for name, frame in tables.items():
            mask = pd.Series(True, index=frame.index)
            for factor, value in named.items():
                mask &= frame[factor] == value
            subset[name] = frame[mask].drop(columns=list(FACTORS)).reset_index(drop=True)
        out.append((named, subset))
    return out


def sweep_index_html(claims: pd.DataFrame, reports: Mapping[str, str], provenance: Mapping[str, Any]) -> str:
    """The sweep's ``report.html``: per condition, its claims table and a link to its report."""
    from lens_position.report import html as report_module

    sections = []
    for values, part in claims.groupby(list(FACTORS), sort=False):
        named = dict(zip(FACTORS, values))
        slug = condition_slug(named)
        title = f"source {named['source']} · BOS {named['bos']} · seed {named['seed']}"
        sections.append(
            f'<section class="condition" id="condition-{html.escape(slug)}"><h2>{html.escape(title)}</h2>'
            f'<p><a href="{html.escape(reports[slug])}">the report of this condition (figures)</a></p>'
            f'{report_module.claims_html(part.drop(columns=list(FACTORS)))}</section>')
    models = ", ".join(html.escape(m["request"]) for m in provenance.get("models", []))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>lens_position sweep</title>"
            "<style>body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;vertical-align:top}.yes{background:#e6f4e6}"
            ".no{background:#fbe9e9}.na{color:#777}</style></head><body>"
            "<h1>lens_position sweep</h1>"
            f"<p>Models: {models}. Factors: {', '.join(FACTORS)}; {len(sections)} conditions. Every table in "
            "this folder has a column per factor; the claims below are decided per condition.</p>"
            f"{''.join(sections)}</body></html>\n")
