"""The one corpus reader: the texts prompts are built from and the zoo trains on.

A :class:`Corpus` is a named list of documents; its text is the documents joined by a blank
line and its identity the sha256 of that text. :func:`read_corpus` reads every kind:

- ``None`` or ``"pydoc_data.topics"``: CPython's English help text, one document per topic
  in sorted order (the analyses' default text);
- ``"stdlib"``: every docstring (module, class, function; at least 40 characters) and every
  block of consecutive ``#`` comment lines (at least 60 characters) in the ``.py`` files of
  the running interpreter's standard library (``site-packages`` excluded), files in sorted
  order: the zoo's training text (:mod:`lens_position.models.zoo.corpus`), built once and
  cached under ``$LENS_POSITION_CACHE/zoo/``;
- a text file (one document), a folder of ``.txt/.md/.rst`` files (one document per file), or
  a ``datasets`` split ``"hf:<name or saved folder>:<split>[:<column>]"`` from the local cache
  (one document per row).
"""

from __future__ import annotations

import ast
import hashlib
import io
import logging
import os
import platform
import sysconfig
import tokenize
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from lens_position.ground.errors import BadInputError, MissingPackageError
from lens_position.ground.files import read_bytes, resource_error
from lens_position.ground.paths import checked_path
from lens_position.models.sources import hub_offline

log = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".md", ".rst")
DEFAULT_CORPUS = "pydoc_data.topics"
STDLIB_CORPUS = "stdlib"
SEPARATOR = "\n\n"
MIN_DOCSTRING_CHARS = 40
MIN_COMMENT_CHARS = 60


@dataclass(frozen=True)
class Corpus:
    """A text as documents. ``name``: what was read (``"file:/abs/path"``, ``"folder:..."``,
    ``"hf:..."``, ``"pydoc_data.topics"``, ``"stdlib"``); ``unit``: what one document is
    (``"topic"``, ``"file"``, ``"row"``, ``"docstring or comment"``, ``"text"``)."""

    name: str
    documents: tuple[str, ...]
    unit: str

    @cached_property
    def text(self) -> str:
        """The documents joined by a blank line."""
        return SEPARATOR.join(self.documents)

    @cached_property
    def sha256(self) -> str:
        """sha256 of :attr:`text` (UTF-8), the corpus's identity."""
        return hashlib.sha256(self.text.encode()).hexdigest()


def read_corpus(source: str | os.PathLike | None = None) -> Corpus:
    """The corpus ``source`` names (module docstring); BadInputError for one that is missing,
    empty or not UTF-8 text."""
    if source is None or source == DEFAULT_CORPUS:
        from pydoc_data.topics import topics

        return Corpus(DEFAULT_CORPUS, tuple(topics[name].strip() for name in sorted(topics)), "topic")
    if source == STDLIB_CORPUS:
        return Corpus(STDLIB_CORPUS, tuple(_cached_stdlib_documents()), "docstring or comment")
    if isinstance(source, str) and source.startswith("hf:"):
        return Corpus(source, tuple(_read_datasets_split(source)), "row")
    path = checked_path(source, "corpus")
    if path.is_file():
        return Corpus(f"file:{path.resolve()}", (_read_text_file(path),), "text")
    if path.is_dir():
        return Corpus(f"folder:{path.resolve()}", tuple(_read_folder(path)), "file")
    if path.exists():
        read_bytes(path, "corpus")  # a FIFO, socket or device: refused, naming what it is
    raise BadInputError(f"corpus {str(source)!r} is neither a file, a folder nor 'hf:<name>:<split>'")


def _read_text_file(path: Path) -> str:
    try:
        text = read_bytes(path, "corpus").decode("utf-8")
    except UnicodeDecodeError as error:
        raise BadInputError(f"{path} is not UTF-8 text ({error}); convert it or pass another file") from error
    if not text.strip():
        raise BadInputError(f"{path} is empty: pass a file with text in it")
    return text


def _read_folder(path: Path) -> list[str]:
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise BadInputError(f"folder {path} has no {'/'.join(TEXT_SUFFIXES)} files")
    texts, unreadable = [], []
    for file in files:
        try:
            texts.append(read_bytes(file, "corpus file").decode("utf-8"))
        except UnicodeDecodeError:
            unreadable.append(str(file.relative_to(path)))
    if unreadable:
        shown = ", ".join(unreadable[:5]) + (f" and {len(unreadable) - 5} more" if len(unreadable) > 5 else "")
        raise BadInputError(f"folder {path} holds files that are not UTF-8 text ({shown}); convert or "
                            "remove them (they would be read with replacement characters)")
    if not any(t.strip() for t in texts):
        raise BadInputError(f"every text file in {path} is empty")
    return [t for t in texts if t.strip()]


def _read_datasets_split(spec: str) -> list[str]:
    parts = spec.split(":")
    if len(parts) not in (3, 4) or not parts[1] or not parts[2]:
        raise BadInputError(f"corpus {spec!r}: use 'hf:<name or saved folder>:<split>[:<column>]'")
    name, split = parts[1], parts[2]
    column = parts[3] if len(parts) == 4 else "text"
    try:
        import datasets
    except ImportError as error:
        raise MissingPackageError("corpus 'hf:...' needs the `datasets` package: pip install datasets") from error
    try:
        with hub_offline():  # set where huggingface_hub reads it, not only in os.environ (read at import)
            if name.strip() and Path(name).is_dir():
                loaded = datasets.load_from_disk(name)
                table = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
            else:
                table = datasets.load_dataset(name, split=split)
    except Exception as error:  # datasets raises many types for "not available offline"
        raise BadInputError(f"corpus {spec!r} could not be loaded from the local cache ({error}); lens_position "
                            "never downloads: fetch it where there is network, or pass a text file") from error
    if column not in table.column_names:
        raise BadInputError(f"corpus {spec!r} has no column {column!r}; columns: {table.column_names}")
    return [str(row) for row in table[column] if row]


# ----------------------------------------------------------------------- the standard library's prose


def _stdlib() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _documents_of(source: bytes) -> list[str]:
    """Docstrings (ast) and comment blocks (tokenize) of one source file, in file order
    (docstrings first). A file that does not parse contributes what could be read."""
    documents: list[str] = []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        tree = None
    if tree is not None:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= MIN_DOCSTRING_CHARS:
                    documents.append(doc)
    comments: list[str] = []
    block: list[str] = []
    last_line = -2
    try:
        for token in tokenize.tokenize(io.BytesIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            text = token.string.lstrip("#").strip()
            if token.start[0] != last_line + 1 and block:
                comments.append(" ".join(block))
                block = []
            block.append(text)
            last_line = token.start[0]
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError):
        pass
    if block:
        comments.append(" ".join(block))
    return documents + [c for c in comments if len(c) >= MIN_COMMENT_CHARS]


def stdlib_documents(root: Path | None = None) -> list[str]:
    """Every document of the standard library at ``root`` (default: this interpreter's)."""
    root = root or _stdlib()
    documents: list[str] = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative.startswith("site-packages/") or "/site-packages/" in relative:
            continue
        documents.extend(_documents_of(path.read_bytes()))
    return documents


def _stdlib_cache_path() -> Path:
    from lens_position.models.cache import default_cache_dir

    root = default_cache_dir()
    tag = hashlib.sha256(str(_stdlib().resolve()).encode()).hexdigest()[:10]
    return root / "zoo" / f"stdlib-corpus-{platform.python_version()}-{tag}.txt"


def _cached_stdlib_documents() -> list[str]:
    """This interpreter's standard-library documents (built in ~10 s once, then read from the
    cache; the cached text is checked against a rebuild's hash only by its name, so delete
    the file to force a rebuild)."""
    cache = _stdlib_cache_path()
    if cache.is_file():
        return cache.read_text(encoding="utf-8").split("\x00")
    documents = stdlib_documents()
    partial = cache.with_suffix(f".{os.getpid()}.partial")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial.write_text("\x00".join(documents), encoding="utf-8")
        partial.replace(cache)
    except OSError as error:  # a read-only home or cache: the documents are built again next time
        if partial.parent.is_dir():
            partial.unlink(missing_ok=True)
        log.warning("%s; the corpus is used without caching it", resource_error(error, cache, "caching the corpus"))
    return documents
