"""The zoo's training text: the prose that ships inside every CPython, byte-level.

**What.** The ``"stdlib"`` corpus of the one corpus reader
(:func:`lens_position.models.corpus.read_corpus`): every docstring (module, class, function;
at least 40 characters) and every block of consecutive ``#`` comment lines (at least 60
characters) in the ``.py`` files of the running interpreter's standard library
(``site-packages`` excluded), files in sorted order. About 4 MB of English technical prose, present on every machine
with no download.
CPython's pydoc topics (``pydoc_data.topics``, the analyses' default text) are **not** in
it, so the reproduction reads the zoo on text it never trained on.

**Split.** A document (one docstring or comment block) is held out when the first byte of
its sha256 is below 13 (13/256 ≈ 5 %): the split depends on the text only, not on order.

**Tokens.** Byte-level: token ``3 + b`` for UTF-8 byte ``b``, with ``<bos>`` = 1 (the tiny
models' tokenizer, ``lens_position.models.tiny.byte_tokenizer``). Bytes need no trained
tokenizer and no file, encode any input losslessly, and cost only sequence length, which
these position questions do not need to spare.

**Identity.** The corpus is recorded by the sha256 of its text. A different Python version
ships a different standard library, so the hash differs; a recipe refuses to train on a
corpus whose hash is not the one it names (the shipped checkpoints stay loadable anywhere).
"""

from __future__ import annotations

import hashlib
import math
import platform
from dataclasses import dataclass
from functools import lru_cache

import torch
from jaxtyping import Int, UInt8

from lens_position.ground.errors import BadInputError
from lens_position.models.corpus import SEPARATOR, STDLIB_CORPUS, read_corpus
from lens_position.models.tiny import BOS_ID, N_SPECIAL

HELD_OUT_BELOW = 13  # sha256 first byte < 13: ~5 % of documents held out


@dataclass(frozen=True)
class TrainingSplit:
    """The zoo's text as byte streams. ``train`` and ``held_out``: ``UInt8[Tensor, "n"]``
    (raw UTF-8 bytes; add ``N_SPECIAL`` for token ids). ``sha256``: hash of the whole text
    (train and held-out documents joined in source order: the corpus's ``Corpus.sha256``)."""

    train: UInt8[torch.Tensor, n_train]
    held_out: UInt8[torch.Tensor, n_held_out]
    sha256: str
    n_documents: int
    n_held_out_documents: int
    python: str

    def describe(self) -> str:
        return (f"CPython {self.python} standard-library docstrings and comments: "
                f"{self.n_documents} documents, {len(self.train) / 1e6:.2f} MB train / "
                f"{len(self.held_out) / 1e6:.2f} MB held out, sha256 {self.sha256[:12]}")


def is_held_out(document: str) -> bool:
    """Whether a document belongs to the held-out split (by its own hash)."""
    return hashlib.sha256(document.encode()).digest()[0] < HELD_OUT_BELOW


@lru_cache(maxsize=1)
def training_split() -> TrainingSplit:
    """The zoo's training text of this interpreter: the ``"stdlib"`` corpus of
    :func:`lens_position.models.corpus.read_corpus`, split and as bytes."""
    return corpus_of(list(read_corpus(STDLIB_CORPUS).documents))


def corpus_of(documents: list[str]) -> TrainingSplit:
    """A ``TrainingSplit`` of any list of documents, split and hashed as the zoo corpus is (tests
    use it to train minute-sized models on a small text)."""
    text = SEPARATOR.join(documents)
    held = [is_held_out(d) for d in documents]
    train = SEPARATOR.join(d for d, h in zip(documents, held) if not h)
    held_out = SEPARATOR.join(d for d, h in zip(documents, held) if h)
    return TrainingSplit(
        train=torch.frombuffer(bytearray(train.encode()), dtype=torch.uint8),
        held_out=torch.frombuffer(bytearray(held_out.encode()), dtype=torch.uint8),
        sha256=hashlib.sha256(text.encode()).hexdigest(), n_documents=len(documents),
        n_held_out_documents=sum(held), python=platform.python_version())


#: The unit of :func:`train_subset`: long enough to keep documents whole in the main, short
#: enough that a subset samples the whole standard library (the train split is ~60 blocks).
SUBSET_BLOCK = 64 * 1024


def train_subset(stream: UInt8[torch.Tensor, n], fraction: float) -> UInt8[torch.Tensor, m]:
    """The share ``fraction`` of ``stream``: its ``SUBSET_BLOCK``-byte blocks ``i`` for which
    ``floor((i + 1) * fraction) > floor(i * fraction)`` (evenly spaced over the stream, so a
    subset spans every part of the standard library), joined. ``fraction`` = 1: the stream."""
    if fraction >= 1:
        return stream
    n_blocks = -(-len(stream) // SUBSET_BLOCK)
    kept = [i for i in range(n_blocks) if math.floor((i + 1) * fraction) > math.floor(i * fraction)]
    if not kept:
        raise BadInputError(f"train_fraction {fraction} keeps no {SUBSET_BLOCK}-byte block of a "
                            f"{len(stream)}-byte train split; use a larger fraction")
    return torch.cat([stream[i * SUBSET_BLOCK:(i + 1) * SUBSET_BLOCK] for i in kept])


def sample_batch(stream: UInt8[torch.Tensor, n], *, batch: int, context: int, bos: bool,
                 generator: torch.Generator) -> Int[torch.Tensor, "batch context"]:
    """``batch`` windows of ``context`` tokens at uniformly random offsets of ``stream``
    (byte ids shifted by ``N_SPECIAL``); with ``bos`` the first position is ``<bos>`` and
    the window holds ``context - 1`` bytes."""
    length = context - 1 if bos else context
    starts = torch.randint(len(stream) - length, (batch,), generator=generator)
    tokens = stream[starts[:, None] + torch.arange(length)].to(torch.int64) + N_SPECIAL
    if bos:
        tokens = torch.cat([torch.full((batch, 1), BOS_ID, dtype=torch.int64), tokens], dim=1)
    return tokens


def evaluation_batch(stream: UInt8[torch.Tensor, n], *, n: int, context: int,
                     bos: bool) -> Int[torch.Tensor, "n context"]:
    """``n`` windows of ``stream`` at evenly spaced offsets (deterministic, no RNG)."""
    length = context - 1 if bos else context
    if len(stream) < n * length:
        raise BadInputError(f"held-out text of {len(stream)} bytes is too short for {n} windows of "
                            f"{length}; lower the recipe's n_eval_sequences or context, or use more text")
    starts = torch.linspace(0, len(stream) - length - 1, n).long()
    tokens = stream[starts[:, None] + torch.arange(length)].to(torch.int64) + N_SPECIAL
    if bos:
        tokens = torch.cat([torch.full((n, 1), BOS_ID, dtype=torch.int64), tokens], dim=1)
    return tokens


def unigram_bits_per_byte(corpus: TrainingSplit) -> float:
    """Cross-entropy (bits per byte) of the held-out bytes under the train split's byte
    frequencies (add-one smoothed): the loss of a model that ignores context."""
    counts = torch.bincount(corpus.train.to(torch.int64), minlength=256).to(torch.float64) + 1
    log_p = torch.log2(counts / counts.sum())
    held = torch.bincount(corpus.held_out.to(torch.int64), minlength=256).to(torch.float64)
    return float(-(held * log_p).sum() / held.sum())
