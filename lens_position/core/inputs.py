"""The one input door: whatever a researcher hands to an analysis becomes a checked prompt set.

Every public analysis (``decompose``, ``position_probe``, the patching entry points,
``bos_replacement``, the sink functions, ``trajectory_patching``, ``fingerprint``) calls
:func:`checked_prompts` once, at its entry, before any forward pass. It accepts:

- a :class:`~lens_position.core.data.PromptSet` (from ``build_prompts``): its tokens are checked
  against the model and it is returned as is;
- integer token ids, ``Int[Tensor, "N T"]`` (or one sequence ``[T]``, or a numpy array):
  wrapped in a PromptSet whose provenance records the tensor's SHA-256, shape and what sits
  at position 0. A batch padded by ``model.to_tokens(list_of_texts)`` is refused (see below);
- a dict or Hugging Face ``BatchEncoding`` with ``input_ids`` and ``attention_mask``: taken
  when the mask is all ones, refused when it marks padding;
- a list of strings: each is tokenised with this model's tokenizer and the BOS policy
  ``bos`` (default :data:`~lens_position.core.data.DEFAULT_BOS`), then **cut to a common length**
  (:func:`lens_position.core.data.prompts_from_texts`).

What is checked: ids are integers inside the model's vocabulary ``0 .. d_vocab - 1`` (a
``-1`` would otherwise index the last embedding row), there is at least one sequence of at
least ``min_length`` positions, and ``T`` fits the model's context ``n_ctx``.

**Once.** The door returns a :class:`CheckedPrompts`: a PromptSet that carries what it was
checked against (the vocabulary size and context of the model, the identity and version of its
token tensor). Handed one back (an entry point passing its checked prompts to the analyses it
calls) for a model with the same vocabulary and a context it fits, tokens not replaced or modified
in place, it returns it as it is: the type says it was checked.

**Padding.** The analyses read every position of every sequence as content: they have no
attention mask. A padded batch would be analysed with its pad tokens as text, so it is
refused, with the error naming how to build equal-length prompts instead: pass the list of
strings itself (cut to a common length), or ``build_prompts(model, text=...)``. A tensor is
taken as padded when its rows start or end with runs of the tokenizer's pad token of
different lengths, which is what padding to the longest row produces.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import torch

from lens_position.core import positions
from lens_position.core.data import PromptSet, PromptSpec, prompts_from_texts
from lens_position.ground.errors import BadInputError, PaddedPromptsError
from lens_position.models.spec import LoadedModel, public

TENSOR_BOS_POLICY = "as given (token tensor)"

#: What the door accepts as prompts (module docstring).
Prompts: TypeAlias = PromptSet | torch.Tensor | np.ndarray | Mapping[str, Any] | Sequence[str]


@dataclass
class CheckedPrompts(PromptSet):
    """A :class:`PromptSet` the input door has checked (module docstring): its ids lie in a vocabulary
    of ``d_vocab`` tokens, its length fits a context of ``n_ctx``, it is not padded. The door hands it
    back unchecked to a model of the same vocabulary whose context it fits, as long as its token tensor
    is the one checked and was not written to since."""

    d_vocab: int = field(default=0, repr=False, compare=False)
    n_ctx: int = field(default=0, repr=False, compare=False)
    tokens_identity: tuple[int, int | str] = field(default=(0, -1), repr=False, compare=False)
    #: whether the door also found every sequence distinct (:func:`check_distinct`)
    distinct: bool = field(default=False, repr=False, compare=False)

    def fits(self, loaded: LoadedModel) -> bool:
        """Whether the checks made on these prompts hold for ``loaded`` as they stand."""
        return (self.d_vocab == loaded.backend.d_vocab and self.tokens.shape[1] <= loaded.spec.n_ctx
                and self.tokens_identity == _identity(self.tokens))

    def first(self, T: int) -> CheckedPrompts:
        """The first ``T`` positions (:meth:`PromptSet.first`), still checked: ids and padding hold for a
        prefix, and its length fits where the whole did; whether its sequences are still distinct is
        checked here, where the whole's were."""
        cut = PromptSet.first(self, T)
        if cut is self:
            return self
        distinct = self.distinct and len(torch.unique(cut.tokens, dim=0)) == len(cut.tokens)
        return CheckedPrompts(cut.tokens, cut.spec, cut.bos_token_id, d_vocab=self.d_vocab, n_ctx=self.n_ctx,
                              tokens_identity=_identity(cut.tokens), distinct=distinct)


def _identity(tokens: torch.Tensor) -> tuple[int, int | str]:
    """Which token tensor, and whether it was written to: its version counter, or the hash of its bytes
    for a tensor made under ``torch.inference_mode()`` (which keeps no counter)."""
    if tokens.is_inference():
        return id(tokens), hashlib.sha256(tokens.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    return id(tokens), tokens._version


def _mark_checked(prompts: PromptSet, loaded: LoadedModel, distinct: bool) -> CheckedPrompts:
    fields = {f.name: getattr(prompts, f.name) for f in dataclasses.fields(PromptSet)}
    return CheckedPrompts(**fields, d_vocab=loaded.backend.d_vocab, n_ctx=loaded.spec.n_ctx,
                          tokens_identity=_identity(prompts.tokens), distinct=distinct)


_WIDE_UNSIGNED = tuple(getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name))

_HOW_TO_BUILD = ("pass the list of strings itself (the analyses cut them to a common length), or build "
                 "equal-length prompts with lens_position.core.data.build_prompts(model, text=..., T=...)")


def _tokens_of(prompts: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(token ids, attention mask or None) of a tensor, array or ``input_ids`` mapping."""
    mask = None
    if isinstance(prompts, Mapping) or hasattr(prompts, "input_ids") and hasattr(prompts, "keys"):
        if "input_ids" not in prompts:
            raise BadInputError(f"a mapping of prompts needs 'input_ids', got keys {sorted(prompts.keys())}")
        ids, mask = prompts["input_ids"], prompts.get("attention_mask")
    else:
        ids = prompts
    if isinstance(ids, np.ndarray):
        ids = torch.from_numpy(ids)
    if not isinstance(ids, torch.Tensor):
        raise BadInputError(f"token ids must be a tensor, got {type(ids).__name__}")
    if mask is not None and not isinstance(mask, torch.Tensor):
        mask = torch.as_tensor(np.asarray(mask))
    return ids, mask


def _check_dtype_and_shape(tokens: torch.Tensor) -> torch.Tensor:
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.dtype == torch.bool or tokens.dtype.is_floating_point or tokens.dtype.is_complex:
        raise BadInputError(f"token ids must be integers, got dtype {tokens.dtype}; {_HOW_TO_BUILD}")
    if tokens.ndim != 2:
        raise BadInputError(f"token ids must have shape [N, T] (or [T] for one sequence), got "
                            f"{tuple(tokens.shape)}")
    if tokens.is_meta:
        raise BadInputError("the token ids are on the meta device, which holds shapes but no values: pass the ids "
                            "themselves (a tensor on the CPU or the model's device)")
    if tokens.dtype in _WIDE_UNSIGNED:  # torch cannot take their min/max; an id beyond int64 wraps negative
        tokens = tokens.to(torch.int64)  # and is refused as outside the vocabulary
    return tokens


def _check_tokens(loaded: LoadedModel, tokens: torch.Tensor, min_length: int, what: str) -> None:
    """Ids in the vocabulary, at least one sequence of ``min_length`` positions, within n_ctx."""
    _check_length(tokens, min_length, what)
    d_vocab = loaded.backend.d_vocab
    low, high = int(tokens.min()), int(tokens.max())
    if low < 0 or high >= d_vocab:
        raise BadInputError(
            f"{what} hold token ids in [{low}, {high}] but the model's vocabulary is 0..{d_vocab - 1}: "
            "a negative id is not a token, and a larger one comes from another tokenizer; build the "
            "prompts with this model's tokenizer (lens_position.core.data.build_prompts)")
    loaded.spec.check_context(tokens.shape[1])


def _check_length(tokens: torch.Tensor, min_length: int, what: str) -> None:
    n_seq, length = tokens.shape
    if n_seq < 1:
        raise BadInputError(f"{what} hold no sequences (shape {tuple(tokens.shape)}); pass at least one")
    if length < min_length:
        raise BadInputError(f"{what} have T={length} positions; this analysis needs T >= {min_length}")


def _check_origin(loaded: LoadedModel, prompts: PromptSet, what: str) -> None:
    """BadInputError unless ``prompts`` were made with this model's tokenizer (its BOS id and, where
    recorded, its hash) and position 0 still holds the token their spec says it does."""
    model_bos = loaded.spec.bos_token_id
    if loaded.tokenizer is not None and getattr(loaded.tokenizer, "bos_token_id", None) is not None:
        model_bos = loaded.tokenizer.bos_token_id
    if prompts.bos_token_id is not None and model_bos is not None and prompts.bos_token_id != model_bos:
        raise BadInputError(
            f"{what} were built with a tokenizer whose BOS id is {prompts.bos_token_id}, but this model's is "
            f"{model_bos}: they come from another model's tokenizer; build them with this model "
            "(build_prompts(model, ...))")
    recorded = prompts.spec.tokenizer_sha256
    if recorded is not None and loaded.tokenizer is not None and recorded != loaded.tokenizer_sha256:
        raise BadInputError(
            f"{what} were built with another tokenizer ({prompts.spec.tokenizer}) than this model's: the same "
            "ids would be other text; build them with this model (build_prompts(model, ...))")
    first = prompts.spec.first_token_id
    if prompts.spec.position0 in ("bos", "token") and first is not None:
        wrong = (prompts.tokens[:, 0] != first).nonzero().flatten().tolist()
        if wrong:
            held = sorted({int(prompts.tokens[i, 0]) for i in wrong})[:5]
            raise BadInputError(
                f"{what}: position 0 of sequences {wrong[:5]}{' ...' if len(wrong) > 5 else ''} holds token(s) "
                f"{held}, but the prompt set says every sequence starts with token {first} ({prompts.spec.position0}); "
                "its tokens were edited after it was built: build it again, or pass the token tensor itself "
                "(then position 0 is read as it is)")


def check_distinct(tokens: torch.Tensor, what: str = "prompts") -> None:
    """BadInputError when a sequence repeats another: every interval treats the sequences as
    independent samples, and copies would narrow them without adding evidence (8 copies of one
    sequence give intervals of width 0)."""
    if tokens.shape[0] < 2 or tokens.shape[1] < 2:
        return
    unique, inverse = torch.unique(tokens, dim=0, return_inverse=True)
    if len(unique) == len(tokens):
        return
    counts = torch.bincount(inverse)
    repeated = int((counts > 1).nonzero()[0, 0])
    rows = (inverse == repeated).nonzero().flatten().tolist()
    raise BadInputError(
        f"{what} hold {len(tokens)} sequences but only {len(unique)} distinct ones (sequences {rows[:5]} are the "
        "same): the intervals take each sequence as an independent sample, and copies would make them falsely "
        "narrow; pass distinct sequences (build_prompts draws distinct windows; a repetitive text gives few)")


def _run_lengths(tokens: torch.Tensor, token: int, *, from_end: bool) -> torch.Tensor:
    """Per row, how many positions at the start (or end) hold ``token`` in a row."""
    hits = (tokens.flip(1) if from_end else tokens) == token
    return hits.to(torch.int64).cumprod(dim=1).sum(dim=1)


def _check_not_padded(loaded: LoadedModel, tokens: torch.Tensor, mask: torch.Tensor | None) -> None:
    if mask is not None:
        if tuple(mask.shape) != tuple(tokens.shape):
            raise BadInputError(f"attention_mask has shape {tuple(mask.shape)} but input_ids {tuple(tokens.shape)}")
        if not bool((mask != 0).all()):
            raise PaddedPromptsError(
                "the attention mask marks padding: the analyses read every position as content and would "
                f"analyse the pad tokens as text; {_HOW_TO_BUILD}")
        return
    pad = getattr(loaded.tokenizer, "pad_token_id", None)
    if pad is None or len(tokens) < 2 or tokens.shape[1] < 2:  # one row or one position: nothing padded
        return
    for side, from_end in (("right", True), ("left", False)):
        runs = _run_lengths(tokens, int(pad), from_end=from_end)
        if int(runs.max()) > 0 and int(runs.min()) != int(runs.max()):
            raise PaddedPromptsError(
                f"these token ids look padded on the {side} (rows {'end' if from_end else 'start'} with "
                f"{int(runs.min())} to {int(runs.max())} pad tokens, id {pad}), as model.to_tokens(list) "
                "makes them; the analyses have no attention mask and would read the pad tokens as text; "
                f"{_HOW_TO_BUILD}")


def _tokenizer_name(loaded: LoadedModel) -> str:
    return f"{loaded.spec.name} ({loaded.spec.source})"


def _tensor_prompt_set(loaded: LoadedModel, tokens: torch.Tensor, bos_id: int | None) -> PromptSet:
    tokens = tokens.to(torch.int64).cpu().contiguous()
    first = tokens[:, 0]
    same_first = bool((first == first[0]).all())
    if bos_id is not None and same_first and int(first[0]) == bos_id:
        position0, first_token = "bos", bos_id
    elif same_first and len(tokens) > 1:
        position0, first_token = "token", int(first[0])
    else:
        position0, first_token = "content", None
    n_seq, length = tokens.shape
    digest = hashlib.sha256(tokens.numpy().tobytes()).hexdigest()
    spec = PromptSpec(source="tokens", T=length, N=n_seq, bos=TENSOR_BOS_POLICY, seed=None,
                      position0=position0, first_token_id=first_token, tokenizer=_tokenizer_name(loaded),
                      vocab_size=loaded.backend.d_vocab,
                      extra={"tokens_sha256": digest, "shape": [n_seq, length]})
    return PromptSet(tokens=tokens, spec=spec, bos_token_id=bos_id)


def checked_rows(loaded: LoadedModel, rows: Sequence[torch.Tensor], *, min_length: int = 1,
                 what: str = "texts") -> list[torch.Tensor]:
    """Sequences of different lengths (``[T_k]`` token ids each, analysed one at a time) through the
    door in one pass: each row checked as :func:`checked_prompts` checks
    token ids (integers, in the vocabulary, at least ``min_length`` positions, within the context).
    Returns the rows as ``int64`` tensors. Error messages name the row by its index."""
    if isinstance(rows, torch.Tensor) or not isinstance(rows, Sequence) or not rows:
        raise BadInputError(f"{what}: pass a non-empty list of token id rows [T], got {type(rows).__name__}")
    out = []
    for k, row in enumerate(rows):
        if not isinstance(row, torch.Tensor):
            raise BadInputError(f"{what} row {k} is a {type(row).__name__}, not a tensor of token ids")
        if row.ndim != 1:
            raise BadInputError(f"{what} row {k} has shape {tuple(row.shape)}; each row is one sequence [T]")
        try:
            tokens = _check_dtype_and_shape(row)
        except BadInputError as error:
            raise BadInputError(f"{what} row {k}: {error}") from None
        _check_tokens(loaded, tokens, min_length, f"{what} row {k}")
        out.append(tokens[0].to(torch.int64))
    return out


def _checked_texts(loaded: LoadedModel, texts: list[str], *, bos: str | None, T: int | None, min_length: int,
                   what: str, distinct: bool, hygiene: bool) -> CheckedPrompts:
    """A list of strings through the door: tokenised under ``bos``, cut to ``T``, checked, and the
    position warnings its BOS policy does not decide (a doubled BOS, BOS inside a row)."""
    built = prompts_from_texts(loaded, texts, bos=bos, T=T)
    _check_tokens(loaded, built.tokens, min_length, what)
    if hygiene:
        positions.warn(positions.position_warnings(loaded, built.tokens, bos_expected=False),
                       only=("bos_doubled", "bos_inside"))
    if distinct:
        check_distinct(built.tokens, what)
    return _mark_checked(built, loaded, distinct)


def checked_prompts(
    loaded: LoadedModel,
    prompts: Prompts,
    *,
    min_length: int = 1,
    bos: str | None = None,
    T: int | None = None,
    what: str = "prompts",
    distinct: bool = False,
    hygiene: bool = True,
) -> CheckedPrompts:
    """Turn ``prompts`` (module docstring: what is accepted) into a :class:`CheckedPrompts` whose
    tokens are checked against ``loaded``.

    Args:
        loaded: the model the prompts will run through (through the model door: a public function's).
        prompts: a PromptSet, token ids (tensor/array, ``[N, T]`` or ``[T]``), a mapping with
            ``input_ids`` (and ``attention_mask``), or a list of strings.
        min_length: fewest positions per sequence the calling analysis can use.
        bos: BOS policy for a list of strings (default ``DEFAULT_BOS``); only strings take it.
        T: positions to cut a list of strings to (default: the shortest prompt's length).
        what: how the error messages name these prompts (``"source prompts"``, ...).
        distinct: refuse sequences that repeat another (:func:`check_distinct`): every analysis
            that computes intervals asks for it (``distinct=bootstrap.enabled``), as the intervals
            take the sequences as independent samples; without intervals a repeated sequence only
            weighs twice in a mean.
        hygiene: issue the position warnings (:mod:`lens_position.core.positions`: every check on
            token ids, those their BOS policy leaves open on strings, none on a PromptSet).

    Raises:
        BadInputError: ids outside the vocabulary, no sequences, too short, not integers; a
            PromptSet made with another tokenizer (another BOS id or vocabulary) or whose position 0
            no longer holds the token its spec says; a sequence repeated.
        PaddedPromptsError: a padded batch (a ``BadInputError``).
        ContextLengthError: ``T`` longer than the model's context.
    """
    if isinstance(prompts, PromptSet):
        if bos is not None or T is not None:
            raise BadInputError("bos= and T= apply to a list of strings; a PromptSet already has both")
        tokens = prompts.tokens
        if not isinstance(tokens, torch.Tensor) or tokens.ndim != 2:
            raise BadInputError(f"a PromptSet's tokens must be a tensor [N, T], got {type(tokens).__name__} "
                                f"{tuple(getattr(tokens, 'shape', ()))}")
        if isinstance(prompts, CheckedPrompts) and prompts.fits(loaded) and (prompts.distinct or not distinct):
            _check_length(tokens, min_length, what)
            return prompts
        _check_tokens(loaded, _check_dtype_and_shape(tokens), min_length, what)
        _check_origin(loaded, prompts, what)
        if distinct:
            check_distinct(tokens, what)
        return _mark_checked(prompts, loaded, distinct)
    if isinstance(prompts, str):
        raise BadInputError(f"{what} is one string; pass a list of strings (or build_prompts(model, text=...))")
    if isinstance(prompts, Sequence) and prompts and all(isinstance(p, str) for p in prompts):
        return _checked_texts(loaded, list(prompts), bos=bos, T=T, min_length=min_length, what=what,
                              distinct=distinct, hygiene=hygiene)
    if bos is not None or T is not None:
        raise BadInputError("bos= and T= apply to a list of strings; token ids are taken as given")
    if isinstance(prompts, Sequence) and not isinstance(prompts, torch.Tensor):
        raise BadInputError(
            f"{what}: a {type(prompts).__name__} of {len(prompts)} items is not a prompt set; pass a PromptSet, "
            f"token ids [N, T], or a non-empty list of strings")
    if not (isinstance(prompts, (torch.Tensor, np.ndarray, Mapping)) or hasattr(prompts, "input_ids")):
        raise BadInputError(
            f"{what} must be a PromptSet, token ids [N, T], input_ids with an attention_mask, or a list of "
            f"strings; got {type(prompts).__name__}")
    tokens, mask = _tokens_of(prompts)
    tokens = _check_dtype_and_shape(tokens)
    if mask is not None and mask.ndim == 1:
        mask = mask[None]
    _check_tokens(loaded, tokens, min_length, what)
    _check_not_padded(loaded, tokens, mask)
    if distinct:
        check_distinct(tokens, what)
    if hygiene:
        positions.warn(positions.position_warnings(loaded, tokens))
    bos_id = getattr(loaded.tokenizer, "bos_token_id", None) if loaded.tokenizer is not None else None
    checked = _tensor_prompt_set(loaded, tokens, bos_id if bos_id is not None else loaded.spec.bos_token_id)
    return _mark_checked(checked, loaded, distinct)


@public
def check_prompts(loaded: LoadedModel, prompts: Prompts, *, min_length: int = 1,
                  distinct: bool = False) -> CheckedPrompts:
    """``prompts`` through the input door for ``model`` (:func:`checked_prompts`): the checked prompt set
    the reducers take (:mod:`lens_position.core.stream`), and any public analysis takes as it is.

    Args:
        model: a ``LoadedModel`` or a bare model.
        prompts: a PromptSet, token ids ``[N, T]``, ``input_ids`` with an all-ones mask, or a list of strings.
        min_length: fewest positions per sequence.
        distinct: refuse sequences that repeat another (what intervals over sequences need).
    """
    return checked_prompts(loaded, prompts, min_length=min_length, distinct=distinct)


def require_checked(loaded: LoadedModel, prompts: Any, who: str, *, min_length: int = 1,
                    distinct: bool = False) -> CheckedPrompts:
    """``prompts`` as a reducer or helper takes them: a :class:`CheckedPrompts` the door made for this
    model, at least ``min_length`` positions long (and, with ``distinct``, without a repeated sequence,
    checked here only when the door did not check it). Anything else is refused with the route, and
    nothing is checked twice: the door's checks are the public function's."""
    if not isinstance(loaded, LoadedModel):
        raise BadInputError(f"{who} takes a LoadedModel, got a {type(loaded).__name__}: pass "
                            "lens_position.as_loaded(model) (or a model from lens_position.load_model)")
    if not (isinstance(prompts, CheckedPrompts) and prompts.fits(loaded)):
        state = ("checked for another model or modified since" if isinstance(prompts, CheckedPrompts)
                 else f"a {type(prompts).__name__}")
        raise BadInputError(f"{who} takes prompts checked for this model, got {state}: pass "
                            "lens_position.check_prompts(model, prompts)")
    _check_length(prompts.tokens, min_length, "prompts")
    if distinct and not prompts.distinct:
        check_distinct(prompts.tokens, "prompts")
    return prompts
