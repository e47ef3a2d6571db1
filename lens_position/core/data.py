"""Prompt sets that say exactly what they are.

One call builds ``N`` sequences of ``T`` tokens (``T`` counts every position, position 0
included) from one of Gu et al.'s three conditions:

- ``"natural"``: windows of real text. The embedded default corpus is the English prose
  shipped with every CPython (``pydoc_data.topics``, topics joined in sorted order); pass
  ``text=`` (a string), or ``corpus=`` a text file, a folder of ``.txt/.md/.rst`` files or a
  ``datasets`` split ``"hf:<name or saved folder>:<split>[:<column>]"`` (local cache only).
  The corpus is tokenised once (no special tokens) and cut into non-overlapping windows;
  ``seed`` picks which ``N`` windows.
- ``"random"``: tokens drawn uniformly from the ordinary vocabulary (special and added
  tokens excluded).
- ``"repeated"``: each sequence is one randomly drawn token repeated.

Position 0 follows an explicit BOS policy, recorded in the spec:

- ``"force"`` (the default, :data:`DEFAULT_BOS`): the tokenizer's ``bos_token_id`` at
  position 0;
- ``"tokenizer"``: whatever the tokenizer does by itself (Gemma-3 prepends ``<bos>``,
  SmolLM2 does not);
- ``"none"``: no BOS, position 0 holds content like every other position;
- ``"token:<id>"`` or ``"token:<text>"``: the chosen token at position 0 (the text must be
  a single token).

Why ``"force"`` is the default everywhere (Python, the command line, the notebooks): the
claims are about what position 0 does when it holds BOS (sinks, BOS replacement, the
fingerprint), and the tokenizers disagree on whether to put it there (Gemma-3's does,
SmolLM2's does not). With ``"tokenizer"`` the same analysis would measure a BOS model on
Gemma-3 and a no-BOS model on SmolLM2 (a sink rate of 57% against 0% on SmolLM2). Every
prompt set records its policy and this reason in its spec.

Same arguments, same tokens: every random choice comes from ``seed``.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import torch
from jaxtyping import Int

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

from lens_position.core.checks import check_count, check_seed
from lens_position.ground.errors import BadInputError, ResourceError
from lens_position.ground.memory import host_available_bytes
from lens_position.models.backends import is_model, vocabulary_size
from lens_position.models.corpus import read_corpus
from lens_position.models.spec import LoadedModel, ModelLike, tokenizer_prepends_bos, tokenizer_sha256

Source = Literal["natural", "random", "repeated"]
DEFAULT_BOS = "force"
BOS_DEFAULT_REASON = ("'force' puts the tokenizer's BOS at position 0 on every model, so sinks, BOS "
                      "replacement and the fingerprint study the same thing everywhere; the tokenizers "
                      "disagree on adding BOS themselves (Gemma-3 does, SmolLM2 does not)")


@dataclass(frozen=True)
class PromptSpec:
    """Everything needed to rebuild a prompt set, and to report what it was.

    ``position0`` is ``"bos"`` (the tokenizer's BOS token), ``"token"`` (a chosen token),
    or ``"content"`` (text or random tokens, like any other position); ``first_token_id``
    is the token placed at position 0 by the policy (None for ``"content"``).
    ``window_starts`` are the corpus token offsets of the natural-text windows. ``seed`` is
    None where nothing was drawn (token ids or texts handed in as they are).
    """

    source: str
    T: int
    N: int
    bos: str
    seed: int | None
    position0: str
    first_token_id: int | None
    tokenizer: str
    vocab_size: int
    corpus: str | None = None
    corpus_sha256: str | None = None
    corpus_tokens: int | None = None
    window_starts: tuple[int, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: sha256 of the tokenizer that made the ids (``models.spec.tokenizer_sha256``); the input door
    #: refuses the set for a model whose tokenizer hashes otherwise. None: no tokenizer was used.
    tokenizer_sha256: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["window_starts"] = list(self.window_starts) if self.window_starts is not None else None
        return d


@dataclass
class PromptSet:
    """``tokens``: ``Int[Tensor, "N T"]`` (int64); ``spec``: how they were made."""

    tokens: Int[torch.Tensor, "N T"]
    spec: PromptSpec
    bos_token_id: int | None = None  # the tokenizer's BOS id (whether or not it is used)

    @property
    def has_bos(self) -> bool:
        """Whether position 0 holds the tokenizer's BOS token in every sequence."""
        return self.spec.position0 == "bos"

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def first(self, T: int) -> PromptSet:
        """The first ``T`` positions of every sequence, as a prompt set whose spec says so
        (``extra["first_of"]``: the length they were cut from). Under causal attention a query
        ``i < T`` sees the same keys in either set, so an analysis of early queries (BOS replacement,
        sink heads at Gu et al.'s T = 64) reads the same tokens whether it is given the whole set or
        its first positions: the reproduction and :func:`lens_position.analyze` use these."""
        if T >= self.tokens.shape[1]:
            return self
        extra = {**self.spec.extra, "first_of": self.spec.extra.get("first_of", self.spec.T)}
        return PromptSet(self.tokens[:, :T].clone(), dataclasses.replace(self.spec, T=T, extra=extra),
                         self.bos_token_id)

    def to_dict(self) -> dict[str, Any]:
        return self.spec.to_dict()


# ---------------------------------------------------------------------------------------
# Tokenizer access
# ---------------------------------------------------------------------------------------


def _unpack(model_or_tokenizer: Any) -> tuple[Any, int | None, int | None]:
    """(tokenizer, model vocabulary size or None, BOS id from the model spec or None)."""
    if isinstance(model_or_tokenizer, LoadedModel):
        return (model_or_tokenizer.tokenizer, model_or_tokenizer.backend.d_vocab,
                model_or_tokenizer.spec.bos_token_id)
    if is_model(model_or_tokenizer):
        return model_or_tokenizer.tokenizer, vocabulary_size(model_or_tokenizer), None
    return model_or_tokenizer, None, None


def _distinct_picks(n: int, N: int, generator: torch.Generator) -> torch.Tensor:
    """``N`` draws from ``range(n)``, with any repeat replaced by an unused value (drawn in order
    from a permutation), so sequences made of one token each are distinct where ``N <= n``."""
    picks = torch.randint(n, (N,), generator=generator)
    if N > n or len(picks.unique()) == N:
        return picks
    used = set(picks.tolist())
    spare = [v for v in torch.randperm(n, generator=generator).tolist() if v not in used]
    seen: set[int] = set()
    for i, value in enumerate(picks.tolist()):
        if value in seen:
            picks[i] = spare.pop(0)
        seen.add(int(picks[i]))
    return picks


def _tokenizer_hash(model_or_tokenizer: Any, tokenizer: Any) -> str | None:
    """The sha256 of the tokenizer that makes a prompt set's ids (None without one)."""
    if isinstance(model_or_tokenizer, LoadedModel):
        return model_or_tokenizer.tokenizer_sha256
    return tokenizer_sha256(tokenizer)


def _encode(tokenizer: Any, text: str, special: bool = False) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special, verbose=False)["input_ids"])


@functools.lru_cache(maxsize=4)
def _encode_corpus(tokenizer: Any, text: str) -> torch.Tensor:
    """The corpus as one token stream (memoised: the default corpus is ~110k tokens, seconds
    to encode, and experiments build several prompt sets from it). Callers copy, never mutate."""
    return torch.tensor(_encode(tokenizer, text), dtype=torch.int64)


def _ordinary_ids(tokenizer: Any, vocab: int, exclude: set[int]) -> torch.Tensor:
    """Ids of ordinary tokens: below ``vocab``, not special, not added."""
    if tokenizer is not None:
        exclude = exclude | set(getattr(tokenizer, "all_special_ids", []))
        exclude |= set(getattr(tokenizer, "added_tokens_decoder", {}).keys())
    keep = torch.ones(vocab, dtype=torch.bool)
    keep[[i for i in exclude if 0 <= i < vocab]] = False
    return keep.nonzero().squeeze(1)


def _resolve_bos(policy: str, tokenizer: Any, bos_id: int | None, vocab: int) -> tuple[str, int | None]:
    """(position0 kind, token id placed at position 0) for a BOS policy."""
    if policy == "none":
        return "content", None
    if policy == "tokenizer":
        if tokenizer is None:
            raise BadInputError("bos='tokenizer' needs a tokenizer; this model has none: use "
                                "bos='force', 'none' or 'token:<id>'")
        return ("bos", bos_id) if tokenizer_prepends_bos(tokenizer) else ("content", None)
    if policy == "force":
        if bos_id is None:
            raise BadInputError("bos='force' but the tokenizer has no BOS token: use bos='none' "
                                "or a chosen token, bos='token:<id>'")
        return "bos", bos_id
    if policy.startswith("token:"):
        value = policy[len("token:"):]
        if value.strip().lstrip("-").isdigit():
            token = int(value)
        else:
            if tokenizer is None:
                raise BadInputError(f"bos={policy!r}: a token given as text needs a tokenizer; give its id")
            ids = _encode(tokenizer, value)
            if len(ids) != 1:
                raise BadInputError(f"bos={policy!r}: {value!r} is {len(ids)} tokens {ids}, not one; "
                                    "give a single-token text or the token id, bos='token:<id>'")
            token = ids[0]
        if not 0 <= token < vocab:
            raise BadInputError(f"bos={policy!r}: token id {token} is outside the vocabulary 0..{vocab - 1}")
        return ("bos" if token == bos_id else "token"), token
    raise BadInputError(f"unknown BOS policy {policy!r}: use 'tokenizer', 'force', 'none' or 'token:<id or text>'")


# ---------------------------------------------------------------------------------------
# Corpora
# ---------------------------------------------------------------------------------------


def default_corpus() -> str:
    """CPython's English help text (``pydoc_data.topics``), topics joined in sorted order."""
    return read_corpus(None).text


def load_corpus(corpus: str | os.PathLike | None) -> tuple[str, str]:
    """(text, description) for a corpus: None (CPython's help text), a file, a folder or
    ``"hf:<name>:<split>[:<column>]"`` (read by :func:`lens_position.models.corpus.read_corpus`)."""
    read = read_corpus(corpus)
    return read.text, read.name


# ---------------------------------------------------------------------------------------
# The prompt set
# ---------------------------------------------------------------------------------------


def _bos_note(bos: str) -> dict[str, Any]:
    """What a spec records about its BOS policy: the reason, when it is the default."""
    return {"bos_default": DEFAULT_BOS, "bos_default_reason": BOS_DEFAULT_REASON} if bos == DEFAULT_BOS else {}



_TEXT_FILE = re.compile(r"[^\s]+\.(txt|md|rst|text|json|jsonl|csv)", re.IGNORECASE)


def check_not_a_path(text: str) -> None:
    """Refuse a ``text=`` that names a file instead of holding text (an existing path, or one word
    ending in a text file's suffix): ``text=`` is the text itself, ``corpus=`` reads a file."""
    candidate = text.strip()
    if not candidate or any(space in candidate for space in " \t\n") or len(candidate) > 4096:
        return  # text with spaces is text
    exists = os.path.exists(os.path.expanduser(candidate))
    if exists or _TEXT_FILE.fullmatch(candidate):
        where = "" if exists else " (no such file here, either)"
        raise BadInputError(f"text={candidate!r} looks like a file name{where}: text= takes the text itself; to "
                            f"read a file or a folder, pass corpus={candidate!r}")


def _natural_windows(tokenizer: Any, text: str | None, corpus: str | os.PathLike | None, N: int, length: int,
                     seed: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """``N`` windows of ``length`` tokens of natural text (``text``, or the ``corpus``) drawn with
    ``seed``, and what the prompt spec records of the corpus."""
    if tokenizer is None:
        raise BadInputError("natural text needs a tokenizer; this model has none: pass a model with "
                            "a tokenizer, or use source='random'/'repeated'")
    if text is not None and corpus is not None:
        raise BadInputError("pass either text= or corpus=, not both")
    if text is not None:
        check_not_a_path(text)
        if not text.strip():
            raise BadInputError("text= is empty: pass some text, or leave it out for the default corpus")
        corpus_text, description = text, "text"
    else:
        corpus_text, description = load_corpus(corpus)
    stream = _encode_corpus(tokenizer, corpus_text)
    n_windows = len(stream) // length
    if n_windows < N:
        raise BadInputError(
            f"too little text: {description} has {len(stream)} tokens, {N} windows of {length} need "
            f"{N * length}; pass more text, or lower N or T")
    chosen = np.sort(np.random.default_rng(seed).choice(n_windows, size=N, replace=False))
    starts = tuple(int(c) * length for c in chosen)
    body = torch.stack([stream[s:s + length] for s in starts])
    corpus_fields = dict(corpus=description, corpus_sha256=hashlib.sha256(corpus_text.encode()).hexdigest(),
                         corpus_tokens=len(stream), window_starts=starts)
    return body, corpus_fields


#: Token tensors a prompt set holds at once while it is built (the draw, its indexing, the BOS column joined).
_BUILD_COPIES = 3


def _check_tokens_fit(N: int, T: int, available: int | None) -> None:
    """ResourceError when ``N`` sequences of ``T`` int64 tokens cannot be built in ``available`` bytes of
    host memory (None: unknown, not checked), with the largest ``N`` that fits."""
    needed = _BUILD_COPIES * N * T * 8
    if available is None or needed <= available:
        return
    fits = available // (_BUILD_COPIES * T * 8)
    raise ResourceError(f"N = {N:,} sequences of T = {T:,} tokens need about {needed / 2**30:,.1f} GiB while they are "
                        f"built, and the host has {available / 2**30:,.1f} GiB available: use N <= {fits:,}, or a "
                        "machine with more memory")


def build_prompts(
    model_or_tokenizer: ModelLike | PreTrainedTokenizerBase,
    *,
    source: str = "natural",
    T: int = 128,
    N: int = 16,
    bos: str = DEFAULT_BOS,
    seed: int = 0,
    text: str | None = None,
    corpus: str | os.PathLike | None = None,
) -> PromptSet:
    """Build ``N`` sequences of ``T`` tokens (module docstring: sources and BOS policies).

    Args:
        model_or_tokenizer: a ``LoadedModel``, a ``HookedTransformer`` or a Hugging Face
            tokenizer. A model without a tokenizer supports ``"random"``/``"repeated"`` with
            ``bos="force"``/``"none"``/``"token:<id>"`` (ids from its vocabulary).
        source: ``"natural"``, ``"random"`` or ``"repeated"``.
        T: positions per sequence, position 0 included.
        N: number of sequences.
        bos: BOS policy for position 0 (default ``"force"``: module docstring says why).
        seed: every random choice (which text windows, which tokens).
        text: natural text given directly (instead of ``corpus``).
        corpus: file, folder or ``"hf:<name>:<split>[:<column>]"`` (default: CPython's help text).

    Raises:
        BadInputError: too little text for ``N`` windows, an empty file, a bad BOS token, ...
    """
    tokenizer, model_vocab, spec_bos = _unpack(model_or_tokenizer)
    if source not in ("natural", "random", "repeated"):
        raise BadInputError(f"source must be 'natural', 'random' or 'repeated', got {source!r}")
    N, T, seed = check_count("N", N), check_count("T", T), check_seed(seed)
    _check_tokens_fit(N, T, host_available_bytes())
    bos_id = getattr(tokenizer, "bos_token_id", None) if tokenizer is not None else spec_bos
    vocab = model_vocab if model_vocab is not None else len(tokenizer)
    if tokenizer is not None and model_vocab is not None:
        vocab = min(vocab, len(tokenizer))
    position0, first_token = _resolve_bos(bos, tokenizer, bos_id, vocab)
    if first_token is not None and T < 2:
        raise BadInputError(f"T={T} leaves no room after the token at position 0; use T >= 2")
    length = T - 1 if first_token is not None else T
    generator = torch.Generator().manual_seed(seed)
    corpus_fields: dict[str, Any] = {}

    if source == "natural":
        body, corpus_fields = _natural_windows(tokenizer, text, corpus, N, length, seed)
    else:
        exclude = {bos_id} if bos_id is not None else set()
        allowed = _ordinary_ids(tokenizer, vocab, exclude)
        if source == "random":
            body = allowed[torch.randint(len(allowed), (N, length), generator=generator)]
        else:
            body = allowed[_distinct_picks(len(allowed), N, generator)][:, None].expand(N, length).clone()

    tokens = body if first_token is None else torch.cat([torch.full((N, 1), first_token), body], dim=1)
    if isinstance(model_or_tokenizer, LoadedModel):
        tokenizer_name = f"{model_or_tokenizer.spec.name} ({model_or_tokenizer.spec.source})"
    elif tokenizer is not None:
        tokenizer_name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    else:
        tokenizer_name = "none"
    spec = PromptSpec(source=source, T=T, N=N, bos=bos, seed=seed, position0=position0,
                      first_token_id=first_token, tokenizer=tokenizer_name, vocab_size=vocab, **corpus_fields,
                      extra=_bos_note(bos),
                      tokenizer_sha256=_tokenizer_hash(model_or_tokenizer, tokenizer) if source == "natural" else None)
    return PromptSet(tokens=tokens.to(torch.int64).contiguous(), spec=spec, bos_token_id=bos_id)


def prompts_from_texts(
    model_or_tokenizer: ModelLike | PreTrainedTokenizerBase,
    texts: list[str],
    *,
    bos: str | None = None,
    T: int | None = None,
) -> PromptSet:
    """A researcher's own prompts as one prompt set, **cut to a common length**.

    Each text is tokenised (no special tokens), the BOS policy ``bos`` (default
    :data:`DEFAULT_BOS`) puts its token at position 0, and every prompt is cut to ``T``
    positions (default: the shortest prompt's length), so the analyses see equal-length
    sequences of real text and no padding. The tokens cut off are counted in the spec
    (``extra["cut_tokens"]``), with each prompt's full length and the texts' SHA-256.

    Raises:
        BadInputError: no texts, an empty text, a prompt shorter than ``T``, or a common
            length below 2 positions.
    """
    tokenizer, model_vocab, spec_bos = _unpack(model_or_tokenizer)
    bos = DEFAULT_BOS if bos is None else bos
    if tokenizer is None:
        raise BadInputError("prompts given as text need a tokenizer; this model has none: pass token ids")
    if not texts:
        raise BadInputError("the list of prompts is empty; pass at least one string")
    empty = [i for i, text in enumerate(texts) if not isinstance(text, str) or not text.strip()]
    if empty:
        raise BadInputError(f"prompts {empty[:5]} are empty or not strings; every prompt needs some text")
    bos_id = getattr(tokenizer, "bos_token_id", None)
    vocab = len(tokenizer) if model_vocab is None else min(model_vocab, len(tokenizer))
    position0, first_token = _resolve_bos(bos, tokenizer, bos_id if bos_id is not None else spec_bos, vocab)
    bodies = [_encode(tokenizer, text) for text in texts]
    prefix = [] if first_token is None else [first_token]
    lengths = [len(prefix) + len(body) for body in bodies]
    if T is None:
        T = min(lengths)
    T = check_count("T", T, minimum=2)
    short = [i for i, n in enumerate(lengths) if n < T]
    if short:
        raise BadInputError(f"prompts {short[:5]} have fewer than T={T} positions ({[lengths[i] for i in short[:5]]}); "
                            "pass a smaller T or longer prompts")
    if T < 2:
        raise BadInputError("the shortest prompt has fewer than 2 positions; pass longer prompts")
    tokens = torch.tensor([(prefix + body)[:T] for body in bodies], dtype=torch.int64)
    digest = hashlib.sha256("\x00".join(texts).encode()).hexdigest()
    if isinstance(model_or_tokenizer, LoadedModel):
        tokenizer_name = f"{model_or_tokenizer.spec.name} ({model_or_tokenizer.spec.source})"
    else:
        tokenizer_name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    spec = PromptSpec(source="texts", T=T, N=len(texts), bos=bos, seed=None, position0=position0,
                      first_token_id=first_token, tokenizer=tokenizer_name, vocab_size=vocab,
                      corpus="texts", corpus_sha256=digest,
                      extra={"lengths": lengths, "cut_to": T, "cut_tokens": sum(n - T for n in lengths),
                             **_bos_note(bos)},
                      tokenizer_sha256=_tokenizer_hash(model_or_tokenizer, tokenizer))
    return PromptSet(tokens=tokens, spec=spec, bos_token_id=bos_id)


# ---------------------------------------------------------------------------------------
# Documents (Gu et al.'s protocol)
# ---------------------------------------------------------------------------------------


def load_documents(corpus: str | os.PathLike | None = None, text: str | None = None) -> tuple[list[str], str]:
    """(documents, description): the default corpus's topics one by one, a folder's files, a
    ``datasets`` split's rows, or the blank-line-separated paragraphs of a file or of ``text``."""
    if text is not None and corpus is not None:
        raise BadInputError("pass either text= or corpus=, not both")
    if text is not None:
        check_not_a_path(text)
        return [p for p in text.split("\n\n") if p.strip()], "text (paragraphs)"
    read = read_corpus(corpus)
    if read.unit in ("topic", "file"):
        return list(read.documents), f"{read.name} (one document per {read.unit})"
    return [p for p in read.text.split("\n\n") if p.strip()], f"{read.name} (paragraphs)"


def build_document_prompts(
    model: LoadedModel,
    *,
    T: int = 64,
    N: int = 16,
    seed: int = 0,
    corpus: str | os.PathLike | None = None,
    text: str | None = None,
) -> PromptSet:
    """The first ``T`` tokens of ``N`` documents, each tokenised on its own with the
    tokenizer's special tokens (so with its own BOS when it prepends one), as Gu et al.
    2025 measure sinks (``eval_sink_open_source.py``: ``tokenizer(prompt)[:, :64]``).

    Documents shorter than ``T`` tokens are skipped, as the authors assert; ``seed`` picks
    which ``N`` of the long-enough documents (in corpus order).
    """
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise BadInputError("document prompts need a tokenizer; this model has none: use source='random'")
    docs, description = load_documents(corpus, text)
    long_enough = [(k, ids[:T]) for k, ids in enumerate(_encode(tokenizer, d, special=True) for d in docs)
                   if len(ids) >= T]
    encoded = [ids for _, ids in long_enough]
    if len(encoded) < N:
        raise BadInputError(f"only {len(encoded)} of the {len(docs)} documents in {description} have at least "
                            f"T = {T} tokens, {N} are needed; lower N or T, or pass a corpus with more documents")
    chosen = np.sort(np.random.default_rng(seed).choice(len(encoded), size=N, replace=False))
    tokens = torch.tensor([encoded[i] for i in chosen], dtype=torch.int64)
    bos_id = getattr(tokenizer, "bos_token_id", None)
    has_bos = bos_id is not None and bool((tokens[:, 0] == bos_id).all())
    spec = PromptSpec(source="natural", T=T, N=N, bos="tokenizer", seed=seed,
                      position0="bos" if has_bos else "content", first_token_id=bos_id if has_bos else None,
                      tokenizer=f"{model.spec.name} ({model.spec.source})", vocab_size=model.backend.d_vocab,
                      corpus=description, extra={"protocol": "documents: the first T tokens of each document",
                                                 "documents": [long_enough[i][0] for i in chosen]},
                      tokenizer_sha256=model.tokenizer_sha256)
    return PromptSet(tokens=tokens, spec=spec, bos_token_id=bos_id)
